//! The short conv of a batched step: several sequences' tokens in one dispatch, each sequence
//! with its own ring of `Bx` rows.
//!
//! A step's tokens are grouped by sequence (a decode row is one token, a prefill chunk more).
//! [`ConvSeqs`] uploads, once per step, four words per token: the sequence's ring slot, the
//! position of its first token in the step, the token's index inside its sequence's run, and the
//! run's length. The rings of all slots sit in one buffer `[slots][ring][ch]`.
//!
//! The kernel is the one-sequence kernel of [`super::ShortConv`] applied per run: for each
//! (run, channel) the invocation of the run's first token owns the ring (it reads the history,
//! computes the run's first `kernel - 1` outputs and then writes the run's last rows into the
//! ring); every other invocation computes one later output from the step's rows alone. No
//! invocation reads a ring word another writes, so a step is one dispatch whatever the number of
//! sequences, and a sequence's outputs are the ones it gets alone.

use numr::gpu::{Access, Binding, BufferKind, GpuBuffer, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, StepValues};
use std::sync::{Arc, Mutex};

use super::{MAX_CONV_KERNEL, ShortConv};
use crate::ops_common::{GpuView, OpPlan, Result, bad, check_n_tok, env_of, mul, step_grid, to_u32};

const OP: &str = "batched short conv plan";

/// One sequence's run of tokens in a batched step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvSeq {
    /// Its ring (`0 .. slots`).
    pub slot: usize,
    /// Position of its first token in the step.
    pub pos: usize,
    /// Its tokens in the step (at least 1).
    pub n_tok: usize,
}

/// The per-token words of a step's runs, in a GPU buffer made once (`[slot, pos, index, n_tok]`
/// per token, in the order the runs are given).
#[derive(Debug)]
pub struct ConvSeqs {
    rows: Arc<GpuBuffer>,
    max_tokens: usize,
    slots: usize,
    scratch: Mutex<Vec<u32>>,
}

impl ConvSeqs {
    /// Buffers for steps of at most `max_tokens` tokens over rings `0 .. slots`.
    pub fn new(ctx: &GpuContext, max_tokens: usize, slots: usize) -> Result<ConvSeqs> {
        if max_tokens == 0 || slots == 0 {
            return Err(bad("ConvSeqs::new", "tokens and slots must be positive"));
        }
        let rows = ctx.alloc(mul("ConvSeqs::new", "4 words per token", max_tokens, 16)? as u64, BufferKind::Storage)?;
        ctx.with_stream(|rec| rec.clear(&rows))?;
        Ok(ConvSeqs { rows, max_tokens, slots, scratch: Mutex::new(Vec::with_capacity(4 * max_tokens)) })
    }

    /// The most tokens a step carries.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The rings' count.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The per-token words.
    pub fn binding(&self) -> Binding {
        Binding::whole(&self.rows)
    }

    /// Uploads a step's runs (ordered after everything recorded or submitted before). Returns
    /// the step's token count. Typed errors for a run of no tokens, a slot out of range, two runs
    /// of one slot, or more tokens than the buffer holds.
    pub fn set(&self, ctx: &GpuContext, seqs: &[ConvSeq]) -> Result<u32> {
        const OP: &str = "ConvSeqs::set";
        let mut rows = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        rows.clear();
        for (i, s) in seqs.iter().enumerate() {
            if s.n_tok == 0 || s.slot >= self.slots {
                return Err(bad(OP, format!("run {i}: {} tokens in slot {} of {}", s.n_tok, s.slot, self.slots)));
            }
            if seqs[..i].iter().any(|o| o.slot == s.slot) {
                return Err(bad(OP, format!("run {i}: slot {} appears twice in one step", s.slot)));
            }
            if rows.len() / 4 + s.n_tok > self.max_tokens {
                return Err(bad(OP, format!("the step needs more than {} tokens (the buffer's size)", self.max_tokens)));
            }
            let (slot, pos, n) = (to_u32(OP, "slot", s.slot)?, to_u32(OP, "pos", s.pos)?, to_u32(OP, "n_tok", s.n_tok)?);
            s.pos.checked_add(s.n_tok).and_then(|e| u32::try_from(e).ok()).ok_or_else(|| bad(OP, "positions over 32 bits"))?;
            for t in 0..n {
                rows.extend_from_slice(&[slot, pos, t, n]);
            }
        }
        if rows.is_empty() {
            return Err(bad(OP, "a step of no tokens"));
        }
        ctx.write(&self.rows, 0, bytemuck::cast_slice(&rows))?;
        Ok((rows.len() / 4) as u32)
    }
}

/// The batched short-conv kernel's variant (the taps, as [`ShortConv`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShortConvBatch {
    /// Taps (LFM2: 3), in `2..=MAX_CONV_KERNEL`.
    pub kernel: u32,
}

impl ShortConvBatch {
    /// The variants the tests validate with naga (2, 3 and 4 taps).
    pub fn all() -> Vec<ShortConvBatch> {
        ShortConv::all().into_iter().map(|c| ShortConvBatch { kernel: c.kernel }).collect()
    }

    /// Errors unless the tap count is supported.
    pub fn check(&self) -> Result<()> {
        ShortConv { kernel: self.kernel }.check()
    }

    /// WGSL. Bindings `bcx`, `w` (`[ch][kernel]`), `seqs` (the [`ConvSeqs`] words), `state`
    /// (rw, the rings `[slots][ring][ch]`), `out` (rw); params `n_tok, ch, ring, in_off,
    /// in_stride, w_off, s_off, out_off`.
    ///
    /// Bounds: invocations `i < n_tok * ch`; token `r < n_tok` reads `seqs[4r .. 4r + 4]` and
    /// `bcx[in_off + r * in_stride + (0..3) * ch + c]`, writes `out[out_off + r * ch + c]`;
    /// `w[w_off + c * kernel + j]`; `state[s_off + (slot * ring + q) * ch + c]` for `q < ring`,
    /// `slot` below the slots [`ConvSeqs::set`] admits. [`ShortConvBatchPlan::new`] checks every
    /// binding holds its extent for the largest step.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let k = self.kernel.clamp(2, MAX_CONV_KERNEL);
        let pre = format!(
            "const K: u32 = {k}u;
const KM1: u32 = {km1}u;
fn bx(r: u32, c: u32) -> f32 {{
    let b = p.in_off + r * p.in_stride;
    return bcx[b + c] * bcx[b + 2u * p.ch + c];
}}
fn y(r: u32, c: u32, acc: f32) {{
    out[p.out_off + r * p.ch + c] = bcx[p.in_off + r * p.in_stride + p.ch + c] * acc;
}}
",
            km1 = k - 1
        );
        let body = "    let i = wg_linear * 256u + lidx;
    let ch = p.ch;
    let r = i / ch;
    let c = i - r * ch;
    if (r >= p.n_tok) { return; }
    let pos = seqs[4u * r + 1u];
    let t = seqs[4u * r + 2u];
    let n = seqs[4u * r + 3u];
    if (t == 0u) {
        // Owner of (run, c): history from the ring, the run's first KM1 outputs, then the ring.
        let s_off = p.s_off + seqs[4u * r] * p.ring * ch;
        var hist: array<f32, KM1>;
        for (var q = 0u; q < KM1; q++) {
            var v = 0.0;
            if (pos + q >= KM1) { v = state[s_off + ((pos + q - KM1) % p.ring) * ch + c]; }
            hist[q] = v;
        }
        let head = min(KM1, n);
        for (var u = 0u; u < head; u++) {
            var acc = 0.0;
            for (var j = 0u; j < K; j++) {
                let s = u + j;
                var v: f32;
                if (s < KM1) { v = hist[s]; } else { v = bx(r + s - KM1, c); }
                acc += w[p.w_off + c * K + j] * v;
            }
            y(r + u, c, acc);
        }
        for (var u = n - min(n, p.ring); u < n; u++) {
            state[s_off + ((pos + u) % p.ring) * ch + c] = bx(r + u, c);
        }
        return;
    }
    if (t < KM1) { return; }
    var acc = 0.0;
    for (var j = 0u; j < K; j++) { acc += w[p.w_off + c * K + j] * bx(r - KM1 + j, c); }
    y(r, c, acc);
";
        KernelBuilder::new(format!("short_conv_batch_k{k}"), *env)
            .workgroup(256, 1, 1)
            .storage("bcx", Access::Read, "array<f32>")
            .storage("w", Access::Read, "array<f32>")
            .storage("seqs", Access::Read, "array<u32>")
            .storage("state", Access::ReadWrite, "array<f32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "ch", "ring", "in_off", "in_stride", "w_off", "s_off", "out_off"])
            .prelude(&pre)
            .body(body)
            .build()
    }

    /// CPU reference: each run through [`ShortConv::reference`] on its slot's ring (`rings`:
    /// `[slots][ring][ch]`); returns the outputs `[Σ n_tok][ch]` in run order.
    pub fn reference(&self, bcx: &[f32], w: &[f32], rings: &mut [f32], ring: usize, seqs: &[ConvSeq], ch: usize) -> Result<Vec<f32>> {
        let one = ShortConv { kernel: self.kernel };
        let mut out = Vec::new();
        let mut row = 0;
        for s in seqs {
            let r = rings
                .get_mut(s.slot * ring * ch..(s.slot + 1) * ring * ch)
                .ok_or_else(|| bad("short_conv_batch reference", format!("slot {} past the rings", s.slot)))?;
            let x = bcx
                .get(row * 3 * ch..(row + s.n_tok) * 3 * ch)
                .ok_or_else(|| bad("short_conv_batch reference", format!("rows {row}..{} past the input", row + s.n_tok)))?;
            out.extend(one.reference(x, w, r, s.pos, s.n_tok, ch)?);
            row += s.n_tok;
        }
        Ok(out)
    }
}

/// The buffers of a batched short conv (f32 views; the rings and the output are given).
#[derive(Clone, Debug)]
pub struct ShortConvBatchIo {
    /// The input projection's rows `[max_tok, 3 * ch]` (`[B | C | x]`).
    pub bcx: GpuView,
    /// Weight `[ch, kernel]`.
    pub w: GpuView,
    /// The rings `[slots][ring][ch]`.
    pub state: GpuView,
    /// Output rows `[max_tok, ch]`.
    pub out: GpuView,
}

/// The short conv of a batched step over the runs [`ConvSeqs::set`] uploaded, recorded with the
/// step values whose `n_tok` is the step's token count.
#[derive(Clone, Debug)]
pub struct ShortConvBatchPlan {
    plan: Plan,
    max_tok: u32,
}

impl ShortConvBatchPlan {
    /// Builds the plan over `ch` channels and the rings of `seqs.slots()` sequences of `ring`
    /// rows each (at least `kernel - 1`); every view is checked to hold its extent.
    pub fn new(ctx: &GpuContext, cfg: &ShortConvBatch, io: &ShortConvBatchIo, seqs: &ConvSeqs, ch: usize, ring: usize) -> Result<ShortConvBatchPlan> {
        cfg.check()?;
        let max_tok = seqs.max_tokens();
        if ch == 0 {
            return Err(bad(OP, "no channels"));
        }
        if ring < cfg.kernel as usize - 1 {
            return Err(bad(OP, format!("a ring of {ring} rows for {} taps (at least {} rows)", cfg.kernel, cfg.kernel - 1)));
        }
        io.bcx.need(OP, "bcx", mul(OP, "max_tok x 3 ch", max_tok, mul(OP, "3 ch", 3, ch)?)?)?;
        io.w.need(OP, "the weight", mul(OP, "ch x kernel", ch, cfg.kernel as usize)?)?;
        io.state.need(OP, "the rings", mul(OP, "slots x ring x ch", seqs.slots(), mul(OP, "ring x ch", ring, ch)?)?)?;
        io.out.need(OP, "the output", mul(OP, "max_tok x ch", max_tok, ch)?)?;
        let (ch32, max32) = (to_u32(OP, "ch", ch)?, to_u32(OP, "max_tok", max_tok)?);
        to_u32(OP, "the largest step's invocations", mul(OP, "max_tok x ch", max_tok, ch)?)?;
        let kernel = ctx.kernel(&cfg.source(&env_of(ctx)))?;
        let group = ctx.bind(&kernel, &[io.bcx.binding.clone(), io.w.binding.clone(), seqs.binding(), io.state.binding.clone(), io.out.binding.clone()])?;
        let base = PlanDispatch::new(&kernel, group, [1, 1, 1])?
            .set("ch", ch32)?
            .set("ring", to_u32(OP, "ring", ring)?)?
            .set("in_off", io.bcx.offset_u32(OP)?)?
            .set("in_stride", 3 * ch32)?
            .set("w_off", io.w.offset_u32(OP)?)?
            .set("s_off", io.state.offset_u32(OP)?)?
            .set("out_off", io.out.offset_u32(OP)?)?;
        let grid = step_grid(ctx, max32 as u64 * ch32 as u64, 256, move |s| s.n_tok.min(max32) as u64 * ch32 as u64)?;
        let step = base.per_step("n_tok", move |s| s.n_tok.min(max32))?.grid_per_step(grid);
        Ok(ShortConvBatchPlan { plan: Plan::from(step), max_tok: max32 })
    }
}

impl OpPlan for ShortConvBatchPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_n_tok(OP, step, self.max_tok)
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

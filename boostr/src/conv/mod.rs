//! LFM2's gated short convolution (Hugging Face `Lfm2ShortConv`): the input projection gives one
//! row `[B | C | x]` of `3 * ch` per token; `Bx = B * x` goes through a causal depthwise conv1d of
//! `kernel` taps (3 in LFM2, no bias), and the output is `y = C * conv(Bx)`:
//!
//! `y[t][c] = C[t][c] * Σ_j w[c][j] * Bx[t - (kernel - 1) + j][c]`
//!
//! The state is a **ring of `Bx` rows indexed by position**: `ring` rows (at least `kernel - 1`),
//! the row of position `p` at `p % ring`. A step at `pos` reads positions `pos - kernel + 1 ..
//! pos - 1` from it (positions below 0 read as zeros, so a sequence starting at 0 needs no reset)
//! and writes its own last `min(n_tok, ring)` rows. Rolling a sequence back is therefore free:
//! a step may start at any `pos` whose `kernel - 1` predecessors are still in the ring, which
//! holds while `pos >= last + kernel - ring`, `last` being the latest position written. An
//! engine that discards a few speculatively run tokens (pipelined decode) or reuses a prefix
//! only re-runs from 0 when it backs up further than that.
//!
//! One kernel serves prefill (a chunk of tokens) and decode (one token), and updates the ring
//! **in place** in the same dispatch: for each channel one "owner" invocation reads the ring,
//! computes the chunk's first `kernel - 1` outputs (the only ones that read it) and then writes
//! the chunk's rows; every other invocation computes one later output from the chunk alone. So
//! no invocation reads a state word another one writes.
//!
//! [`ShortConvPlan`] owns the ring (or takes a given one) and is recorded per step of
//! `step.n_tok` tokens at `step.pos`; chunked prefill then decode gives the same as one pass.
//! [`ShortConv::run`] is the eager path, [`ShortConv::reference`] the CPU reference.
//!
//! A batched step of several sequences, each with its own ring, is [`ShortConvBatchPlan`]
//! (one dispatch for all of them; see `batch.rs`).

mod batch;
mod plan;

pub use batch::{ConvSeq, ConvSeqs, ShortConvBatch, ShortConvBatchIo, ShortConvBatchPlan};
pub use plan::{ShortConvIo, ShortConvPlan};

use crate::ops_common::OpPlan;
use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource, StepValues};
use numr::{DType, Tensor};

use crate::ops_common::{OpsError, Result, bad, tensor_view, to_u32};

/// Largest number of taps the kernel supports.
pub const MAX_CONV_KERNEL: u32 = 16;

/// The short-conv kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShortConv {
    /// Taps (LFM2: 3), in `2..=MAX_CONV_KERNEL`.
    pub kernel: u32,
}

impl ShortConv {
    /// The variants the tests validate with naga (2, 3 and 4 taps).
    pub fn all() -> Vec<ShortConv> {
        vec![ShortConv { kernel: 2 }, ShortConv { kernel: 3 }, ShortConv { kernel: 4 }]
    }

    /// Errors unless the tap count is supported.
    pub fn check(&self) -> Result<()> {
        if !(2..=MAX_CONV_KERNEL).contains(&self.kernel) {
            return Err(OpsError::Unsupported { what: "short conv kernel size", reason: format!("{} taps (2..={MAX_CONV_KERNEL})", self.kernel) });
        }
        Ok(())
    }

    /// WGSL. Bindings `bcx`, `w` (`[ch][kernel]`), `state` (rw, the ring `[ring][ch]`), `out`
    /// (rw); params `n_tok, ch, pos, ring, in_off, in_stride, w_off, s_off, out_off`. An
    /// unsupported tap count is clamped here ([`Self::check`] rejects it where a plan is built).
    ///
    /// Bounds: invocations `i < ch * (1 + max(n_tok - (kernel - 1), 0))`; token `t < n_tok` reads
    /// `bcx[in_off + t * in_stride + (0..3) * ch + c]`, writes `out[out_off + t * ch + c]`;
    /// `w[w_off + c * kernel + j]`, `state[s_off + r * ch + c]` for `c < ch`, `r < ring`.
    /// [`ShortConvPlan::new`] checks every binding holds its extent for the largest step.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let k = self.kernel.clamp(2, MAX_CONV_KERNEL);
        let km1 = k - 1;
        let pre = format!(
            "const K: u32 = {k}u;
const KM1: u32 = {km1}u;
fn bx(t: u32, c: u32) -> f32 {{
    let b = p.in_off + t * p.in_stride;
    return bcx[b + c] * bcx[b + 2u * p.ch + c];
}}
fn y(t: u32, c: u32, acc: f32) {{
    out[p.out_off + t * p.ch + c] = bcx[p.in_off + t * p.in_stride + p.ch + c] * acc;
}}
"
        );
        let body = "    let i = wg_linear * 256u + lidx;
    let ch = p.ch;
    if (i < ch) {
        // Owner of channel c: rows [hist ; chunk] in one index s (s < KM1: positions before pos).
        let c = i;
        var hist: array<f32, KM1>;
        for (var r = 0u; r < KM1; r++) {
            // Position pos - KM1 + r; below 0 it reads as zero.
            var v = 0.0;
            if (p.pos + r >= KM1) { v = state[p.s_off + ((p.pos + r - KM1) % p.ring) * ch + c]; }
            hist[r] = v;
        }
        let head = min(KM1, p.n_tok);
        for (var t = 0u; t < head; t++) {
            var acc = 0.0;
            for (var j = 0u; j < K; j++) {
                let s = t + j;
                var v: f32;
                if (s < KM1) { v = hist[s]; } else { v = bx(s - KM1, c); }
                acc += w[p.w_off + c * K + j] * v;
            }
            y(t, c, acc);
        }
        // The chunk's last min(n_tok, ring) rows, each at its position's slot.
        for (var t = p.n_tok - min(p.n_tok, p.ring); t < p.n_tok; t++) {
            state[p.s_off + ((p.pos + t) % p.ring) * ch + c] = bx(t, c);
        }
        return;
    }
    let j0 = i - ch;
    let t = KM1 + j0 / ch;
    let c = j0 - (j0 / ch) * ch;
    if (t >= p.n_tok) { return; }
    var acc = 0.0;
    for (var j = 0u; j < K; j++) { acc += w[p.w_off + c * K + j] * bx(t - KM1 + j, c); }
    y(t, c, acc);
";
        KernelBuilder::new(format!("short_conv_k{k}"), *env)
            .workgroup(256, 1, 1)
            .storage("bcx", Access::Read, "array<f32>")
            .storage("w", Access::Read, "array<f32>")
            .storage("state", Access::ReadWrite, "array<f32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "ch", "pos", "ring", "in_off", "in_stride", "w_off", "s_off", "out_off"])
            .prelude(&pre)
            .body(body)
            .build()
    }

    /// Runs on GPU tensors (eagerly, through a [`ShortConvPlan`] over the given ring) for the
    /// tokens at positions `pos ..`: `bcx` `[n_tok, 3 * ch]`, `w` `[ch, kernel]`, `state` the ring
    /// `[ring, ch]` with `ring >= kernel - 1` (read and updated in place), all f32 and contiguous.
    /// Returns `y` `[n_tok, ch]`.
    pub fn run(&self, ctx: &GpuContext, bcx: &Tensor, w: &Tensor, state: &Tensor, pos: usize) -> Result<Tensor> {
        const OP: &str = "short_conv";
        self.check()?;
        let &[n_tok, w3] = bcx.shape() else {
            return Err(bad(OP, format!("bcx of shape {:?}, [n_tok, 3 * ch] expected", bcx.shape())));
        };
        let ch = w3 / 3;
        let km1 = self.kernel as usize - 1;
        if ch == 0 || w3 != 3 * ch {
            return Err(bad(OP, format!("bcx rows of {w3} (3 * ch, ch > 0 expected)")));
        }
        let ring = state.numel() / ch.max(1);
        if w.numel() != ch * self.kernel as usize || state.numel() != ring * ch || ring < km1 {
            return Err(bad(
                OP,
                format!(
                    "weight of {} and state of {} elements for {ch} channels of {} taps (the state holds at least {km1} rows of {ch})",
                    w.numel(),
                    state.numel(),
                    self.kernel
                ),
            ));
        }
        let out = Tensor::zeros(&[n_tok, ch], DType::F32, bcx.device())?;
        let io = ShortConvIo {
            bcx: tensor_view(OP, "bcx", bcx, DType::F32)?,
            w: tensor_view(OP, "the weight", w, DType::F32)?,
            state: Some(tensor_view(OP, "the state", state, DType::F32)?),
            out: Some(tensor_view(OP, "out", &out, DType::F32)?),
        };
        if n_tok == 0 {
            return Ok(out);
        }
        let plan = ShortConvPlan::new(ctx, self, &io, ch, n_tok, ring)?;
        plan.run(ctx, &StepValues::chunk(to_u32(OP, "pos", pos)?, to_u32(OP, "n_tok", n_tok)?))?;
        Ok(out)
    }

    /// CPU reference: returns `y` (`n_tok x ch`) of the tokens at positions `pos ..` and updates
    /// the ring `state` (`ring x ch`, `ring >= kernel - 1`) in place, as the kernel does. Lengths
    /// that disagree are [`OpsError::BadArgs`].
    pub fn reference(&self, bcx: &[f32], w: &[f32], state: &mut [f32], pos: usize, n_tok: usize, ch: usize) -> Result<Vec<f32>> {
        const OP: &str = "short_conv reference";
        self.check()?;
        let (k, km1) = (self.kernel as usize, self.kernel as usize - 1);
        let ring = state.len() / ch.max(1);
        if ch == 0 || bcx.len() != n_tok * 3 * ch || w.len() != ch * k || state.len() != ring * ch || ring < km1 {
            return Err(bad(
                OP,
                format!("bcx of {}, weight of {} and state of {} elements for {n_tok} tokens of {ch} channels and {k} taps", bcx.len(), w.len(), state.len()),
            ));
        }
        // Rows of Bx, oldest first: the kernel - 1 positions before pos, then the chunk.
        let mut hist = vec![0.0f32; km1 * ch];
        for r in 0..km1 {
            if pos + r >= km1 {
                let slot = (pos + r - km1) % ring;
                hist[r * ch..(r + 1) * ch].copy_from_slice(&state[slot * ch..(slot + 1) * ch]);
            }
        }
        for t in 0..n_tok {
            for c in 0..ch {
                hist.push(bcx[t * 3 * ch + c] * bcx[t * 3 * ch + 2 * ch + c]);
            }
        }
        let mut y = vec![0.0f32; n_tok * ch];
        for t in 0..n_tok {
            for c in 0..ch {
                let acc: f64 = (0..k).map(|j| w[c * k + j] as f64 * hist[(t + j) * ch + c] as f64).sum();
                y[t * ch + c] = (bcx[t * 3 * ch + ch + c] as f64 * acc) as f32;
            }
        }
        for t in n_tok - n_tok.min(ring)..n_tok {
            let slot = (pos + t) % ring;
            state[slot * ch..(slot + 1) * ch].copy_from_slice(&hist[(km1 + t) * ch..(km1 + t + 1) * ch]);
        }
        Ok(y)
    }
}

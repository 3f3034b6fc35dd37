//! LFM2's gated short convolution (Hugging Face `Lfm2ShortConv`): the input projection gives one
//! row `[B | C | x]` of `3 * ch` per token; `Bx = B * x` goes through a causal depthwise conv1d of
//! `kernel` taps (3 in LFM2, no bias), and the output is `y = C * conv(Bx)`:
//!
//! `y[t][c] = C[t][c] * Σ_j w[c][j] * Bx[t - (kernel - 1) + j][c]`
//!
//! Positions before the chunk come from a rolling state `[kernel - 1][ch]` of the last `Bx` rows
//! (zeros for a fresh sequence). One kernel serves prefill (a chunk of tokens) and decode (one
//! token), and updates the state **in place** in the same dispatch: for each channel one "owner"
//! invocation computes the chunk's first `kernel - 1` outputs (the only ones that read the state)
//! and then writes the channel's new state; every other invocation computes one later output from
//! the chunk alone. So no invocation reads a state word another one writes.
//!
//! [`ShortConvPlan`] owns the state (or takes a given one) and is recorded per step of
//! `step.n_tok` tokens; chunked prefill then decode gives the same as one pass.
//! [`ShortConvPlan::record_reset`] starts a new sequence. [`ShortConv::run`] is the eager path.

mod plan;

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

    /// WGSL. Bindings `bcx`, `w` (`[ch][kernel]`), `state` (rw, `[kernel - 1][ch]`), `out` (rw);
    /// params `n_tok, ch, in_off, in_stride, w_off, s_off, out_off, fresh` (`fresh = 1`: the old
    /// state reads as zeros; with `n_tok = 0` that is a reset). An unsupported tap count is
    /// clamped here ([`Self::check`] rejects it where a plan is built).
    ///
    /// Bounds: invocations `i < ch * (1 + max(n_tok - (kernel - 1), 0))`; token `t < n_tok` reads
    /// `bcx[in_off + t * in_stride + (0..3) * ch + c]`, writes `out[out_off + t * ch + c]`;
    /// `w[w_off + c * kernel + j]`, `state[s_off + r * ch + c]` for `c < ch`, `r < kernel - 1`.
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
        // Owner of channel c: rows [hist ; chunk] in one index s (s < KM1: the old state).
        let c = i;
        var hist: array<f32, KM1>;
        for (var r = 0u; r < KM1; r++) { hist[r] = select(state[p.s_off + r * ch + c], 0.0, p.fresh == 1u); }
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
        for (var r = 0u; r < KM1; r++) {
            let s = p.n_tok + r;
            var v: f32;
            if (s < KM1) { v = hist[s]; } else { v = bx(s - KM1, c); }
            state[p.s_off + r * ch + c] = v;
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
            .params(&["n_tok", "ch", "in_off", "in_stride", "w_off", "s_off", "out_off", "fresh"])
            .prelude(&pre)
            .body(body)
            .build()
    }

    /// Runs on GPU tensors (eagerly, through a [`ShortConvPlan`] over the given state): `bcx`
    /// `[n_tok, 3 * ch]`, `w` `[ch, kernel]`, `state` `[kernel - 1, ch]` (read and updated in
    /// place), all f32 and contiguous. Returns `y` `[n_tok, ch]`.
    pub fn run(&self, ctx: &GpuContext, bcx: &Tensor, w: &Tensor, state: &Tensor) -> Result<Tensor> {
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
        if w.numel() != ch * self.kernel as usize || state.numel() != km1 * ch {
            return Err(bad(OP, format!("weight of {} and state of {} elements for {ch} channels of {} taps", w.numel(), state.numel(), self.kernel)));
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
        let plan = ShortConvPlan::new(ctx, self, &io, ch, n_tok)?;
        plan.run(ctx, &StepValues::chunk(0, to_u32(OP, "n_tok", n_tok)?))?;
        Ok(out)
    }

    /// CPU reference: returns `y` (`n_tok x ch`) and updates `state` (`(kernel - 1) x ch`) in
    /// place. Lengths that disagree are [`OpsError::BadArgs`].
    pub fn reference(&self, bcx: &[f32], w: &[f32], state: &mut [f32], n_tok: usize, ch: usize) -> Result<Vec<f32>> {
        const OP: &str = "short_conv reference";
        self.check()?;
        let k = self.kernel as usize;
        if bcx.len() != n_tok * 3 * ch || w.len() != ch * k || state.len() != (k - 1) * ch {
            return Err(bad(
                OP,
                format!("bcx of {}, weight of {} and state of {} elements for {n_tok} tokens of {ch} channels and {k} taps", bcx.len(), w.len(), state.len()),
            ));
        }
        let mut hist: Vec<f32> = state.to_vec(); // rows of Bx, oldest first
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
        state.copy_from_slice(&hist[n_tok * ch..]);
        Ok(y)
    }
}

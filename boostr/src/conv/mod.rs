//! LFM2's gated short convolution (Hugging Face `Lfm2ShortConv`): the input projection gives one
//! row `[B | C | x]` of `3 * ch` per token; `Bx = B * x` goes through a causal depthwise conv1d of
//! `kernel` taps (3 in LFM2, no bias), and the output is `y = C * conv(Bx)`:
//!
//! `y[t][c] = C[t][c] * Σ_j w[c][j] * Bx[t - (kernel - 1) + j][c]`
//!
//! Positions before the chunk come from a rolling state `[kernel - 1][ch]` of the last `Bx` rows
//! (zeros for a fresh sequence). One kernel serves prefill (a chunk of tokens) and decode (one
//! token): it reads `state_in` and writes the updated state to `state_out` (a different buffer;
//! engines ping-pong two).

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource};
use numr::{DType, Tensor};

use crate::ops_common::{Result, bad, dispatch, env_of, grid_for};

/// The short-conv kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShortConv {
    /// Taps (LFM2: 3).
    pub kernel: u32,
}

impl ShortConv {
    pub fn all() -> Vec<ShortConv> {
        vec![ShortConv { kernel: 2 }, ShortConv { kernel: 3 }, ShortConv { kernel: 4 }]
    }

    /// WGSL. Bindings `bcx`, `w` (`[ch][kernel]`), `state_in`, `state_out` (rw), `out` (rw);
    /// params `n_tok, ch, in_off, in_stride`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let k = self.kernel;
        let km1 = k - 1;
        let body = format!(
            "    let i = wg_linear * 256u + lidx;
    let n_out = p.n_tok * p.ch;
    if (i < n_out) {{
        let t = i / p.ch;
        let c = i - t * p.ch;
        var acc = 0.0;
        for (var j = 0u; j < {k}u; j++) {{ acc += w[c * {k}u + j] * bx(i32(t) - {km1} + i32(j), c); }}
        out[i] = bcx[p.in_off + t * p.in_stride + p.ch + c] * acc;
    }} else if (i < n_out + {km1}u * p.ch) {{
        let r = (i - n_out) / p.ch;
        let c = (i - n_out) - r * p.ch;
        state_out[r * p.ch + c] = bx(i32(p.n_tok) - {km1} + i32(r), c);
    }}
"
        );
        let pre = format!(
            "fn bx(t: i32, c: u32) -> f32 {{
    if (t < 0) {{ return state_in[u32(t + {km1}) * p.ch + c]; }}
    let b = p.in_off + u32(t) * p.in_stride;
    return bcx[b + c] * bcx[b + 2u * p.ch + c];
}}
"
        );
        KernelBuilder::new(format!("short_conv_k{k}"), *env)
            .workgroup(256, 1, 1)
            .storage("bcx", Access::Read, "array<f32>")
            .storage("w", Access::Read, "array<f32>")
            .storage("state_in", Access::Read, "array<f32>")
            .storage("state_out", Access::ReadWrite, "array<f32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "ch", "in_off", "in_stride"])
            .prelude(&pre)
            .body(&body)
            .build()
    }

    /// Runs on GPU tensors: `bcx` `[n_tok, 3 * ch]`, `w` `[ch, kernel]`, `state_in`
    /// `[kernel - 1, ch]`; writes `state_out` (same shape) and returns `y` `[n_tok, ch]`.
    pub fn run(&self, ctx: &GpuContext, bcx: &Tensor, w: &Tensor, state_in: &Tensor, state_out: &Tensor) -> Result<Tensor> {
        let (n_tok, w3) = (bcx.shape()[0], bcx.shape()[1]);
        let ch = w3 / 3;
        let km1 = self.kernel as usize - 1;
        if w3 != 3 * ch || w.numel() != ch * self.kernel as usize || state_in.numel() != km1 * ch || state_out.numel() != km1 * ch {
            return Err(bad("short_conv", "shapes do not agree"));
        }
        let out = Tensor::zeros(&[n_tok, ch], DType::F32, bcx.device())?;
        let (bb, bo) = bcx.gpu_binding(4)?;
        let b: [Binding; 5] = [bb, w.gpu_binding(4)?.0, state_in.gpu_binding(4)?.0, state_out.gpu_binding(4)?.0, out.gpu_binding(4)?.0];
        let total = ((n_tok + km1) * ch) as u64;
        dispatch(ctx, &self.source(&env_of(ctx)), &b, &[n_tok as u32, ch as u32, bo, w3 as u32], grid_for(ctx, total.div_ceil(256))?)?;
        Ok(out)
    }

    /// CPU reference: returns `y` and updates `state` in place.
    pub fn reference(&self, bcx: &[f32], w: &[f32], state: &mut [f32], n_tok: usize, ch: usize) -> Vec<f32> {
        let k = self.kernel as usize;
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
        let n = hist.len() / ch;
        state.copy_from_slice(&hist[(n - (k - 1)) * ch..]);
        y
    }
}

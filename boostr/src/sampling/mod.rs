//! Sampling on the GPU: argmax over the vocabulary, top-k values and indices (k ≤ 128; the host
//! samples from the short list), and the logit transforms applied first: llama.cpp's penalties
//! (repetition: positive logits divided by the penalty, negative multiplied; frequency and
//! presence: `logit -= count * frequency + (count > 0) * presence`) over a window of a GPU id
//! history, the temperature, masking listed ids out ([`MaskPlan`]), and keeping only the ids an
//! allowed-id bitmask sets ([`MaskBitsPlan`], a structured-output constraint).
//!
//! Every op is a plan built once and recorded per step ([`ArgmaxPlan`], [`TopKPlan`],
//! [`PenaltyPlan`]), writing into GPU buffers at the step's token slot, so a decode loop feeds
//! the id of token t into token t+1's embedding with no CPU round trip. The eager functions
//! ([`argmax`], [`top_k`], [`repetition_penalty`], [`penalties`]) run the same plans.
//!
//! Argmax is a two-level tree reduction of `(value, index)` (ties go to the lower index). Top-k
//! sorts chunks of 1024 logits per workgroup with a bitonic network in workgroup memory and keeps
//! each chunk's best `k`; rounds repeat over the survivors until one chunk is left. NaN and -inf
//! logits rank as `-f32::MAX` (below every finite logit, above nothing), in the kernels and in the
//! CPU references alike, as far as the adapter keeps NaN (WGSL lets it assume none).

mod mask;
mod penalty;
mod plan;

pub use mask::{Mask, MaskBits, MaskBitsPlan, MaskPlan, mask_bits_ref, mask_ref};
pub use penalty::{Penalties, Penalty, PenaltyPlan, penalties, penalties_ref, repetition_penalty, repetition_penalty_ref};
pub use plan::{ArgmaxPlan, TopKPlan};

use crate::ops_common::OpPlan;
use std::sync::Arc;

use numr::Tensor;
use numr::gpu::{Access, GpuBuffer, GpuContext, KernelBuilder, KernelEnv, KernelSource, StepValues};

use crate::ops_common::{GpuView, Result, bad, tensor_view, to_u32};

/// Largest k of [`top_k`].
pub const MAX_TOP_K: usize = 128;
const SORT_N: u32 = 1024;
const ARGMAX_PER_WG: u32 = 4096;
/// WGSL: maps NaN and -inf (and anything below `-f32::MAX`) to `-f32::MAX`.
const CLAMP_LOW: &str = "if (!(v >= -3.4028235e38)) { v = -3.4028235e38; }";

/// Argmax pass: `first` reads raw logits (index = position), later passes read `(value, index)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Argmax {
    /// The first pass (reads logits; the index is the position).
    pub first: bool,
}

impl Argmax {
    /// WGSL. Bindings `vals`, `idx`, `out_v` (rw), `out_i` (rw); params `n, per_wg, in_off,
    /// outv_off, outi_off, wg_per_row, in_row, out_row, n_rows` (rows past `n_rows` do nothing): workgroup `w` serves row
    /// `r = w / wg_per_row`, chunk `c = w % wg_per_row` of it (one row: `wg_per_row` = the grid).
    ///
    /// Bounds: workgroup `w` reads `vals[in_off + r * in_row + j]` (and `idx[..]` after the
    /// first pass) for `j < n`, and writes `out_v[outv_off + r * out_row + c]`,
    /// `out_i[outi_off + r * out_row + c]`; [`ArgmaxPlan::new`] and [`ArgmaxPlan::rows`] size the
    /// scratch and check the views (and each step's slot or rows).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let load_i = if self.first { "j" } else { "idx[base + j]" };
        let body = format!(
            "    let row = wg_linear / p.wg_per_row;
    let chunk = wg_linear % p.wg_per_row;
    // Workgroups past the last row (a 2-D grid's rounding) do nothing (uniform per workgroup).
    if (row >= p.n_rows) {{ return; }}
    let base = p.in_off + row * p.in_row;
    let lo = chunk * p.per_wg;
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var j = lo + lidx; j < min(lo + p.per_wg, p.n); j += 256u) {{
        var v = vals[base + j];
        {CLAMP_LOW}
        let i = {load_i};
        if (v > bv || (v == bv && i < bi)) {{ bv = v; bi = i; }}
    }}
    sv[lidx] = bv;
    si[lidx] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {{
        if (lidx < s) {{
            let v = sv[lidx + s];
            let i = si[lidx + s];
            if (v > sv[lidx] || (v == sv[lidx] && i < si[lidx])) {{ sv[lidx] = v; si[lidx] = i; }}
        }}
        workgroupBarrier();
    }}
    if (lidx == 0u) {{ out_v[p.outv_off + row * p.out_row + chunk] = sv[0]; out_i[p.outi_off + row * p.out_row + chunk] = si[0]; }}
"
        );
        KernelBuilder::new(format!("argmax_f{}", self.first as u8), *env)
            .workgroup(256, 1, 1)
            .storage("vals", Access::Read, "array<f32>")
            .storage("idx", Access::Read, "array<u32>")
            .storage("out_v", Access::ReadWrite, "array<f32>")
            .storage("out_i", Access::ReadWrite, "array<u32>")
            .params(&["n", "per_wg", "in_off", "outv_off", "outi_off", "wg_per_row", "in_row", "out_row", "n_rows"])
            .prelude("var<workgroup> sv: array<f32, 256>;\nvar<workgroup> si: array<u32, 256>;\n")
            .body(&body)
            .build()
    }
}

/// One top-k round over chunks of 1024.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopK {
    /// The first round (reads logits, applies the temperature; the index is the position).
    pub first: bool,
}

impl TopK {
    /// WGSL. Bindings `vals`, `idx`, `out_v` (rw), `out_i` (rw); params `n, k, inv_temp, in_off,
    /// outv_off, outi_off, wg_per_row, in_row, out_row, n_rows`. The first round multiplies by
    /// `inv_temp` (divides by the temperature). Workgroup `w` serves row `r = w / wg_per_row`,
    /// chunk `c = w % wg_per_row` of it (one row: `wg_per_row` = the chunks, rows past `n_rows`
    /// do nothing).
    ///
    /// Bounds: workgroup `w` reads `vals[in_off + r * in_row + j]` (and `idx[..]` after the first
    /// round) for `j < n`, and writes `out_v[outv_off + r * out_row + c * k + e]` and `out_i[..]`
    /// for `e < k ≤ 1024`; [`TopKPlan::new`] and [`TopKPlan::rows`] size the scratch and check
    /// the views.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let load = if self.first {
            format!("var v = vals[base + j] * bitcast<f32>(p.inv_temp); {CLAMP_LOW} sv[e] = v; si[e] = j;")
        } else {
            "sv[e] = vals[base + j]; si[e] = idx[base + j];".to_string()
        };
        let body = format!(
            "    let row = wg_linear / p.wg_per_row;
    let chunk = wg_linear % p.wg_per_row;
    // Workgroups past the last row (a 2-D grid's rounding) do nothing (uniform per workgroup).
    if (row >= p.n_rows) {{ return; }}
    let base = p.in_off + row * p.in_row;
    let out = row * p.out_row + chunk * p.k;
    let lo = chunk * {SORT_N}u;
    for (var e = lidx; e < {SORT_N}u; e += 256u) {{
        let j = lo + e;
        if (j < p.n) {{ {load} }} else {{ sv[e] = -3.4028235e38; si[e] = 0xffffffffu; }}
    }}
    workgroupBarrier();
    for (var k = 2u; k <= {SORT_N}u; k <<= 1u) {{
        for (var j = k >> 1u; j > 0u; j >>= 1u) {{
            for (var t = lidx; t < {half}u; t += 256u) {{
                let a = (t / j) * 2u * j + (t % j);
                let b = a + j;
                let b_first = sv[b] > sv[a] || (sv[b] == sv[a] && si[b] < si[a]);
                let up = (a & k) == 0u;
                if (b_first == up) {{
                    let tv = sv[a]; sv[a] = sv[b]; sv[b] = tv;
                    let ti = si[a]; si[a] = si[b]; si[b] = ti;
                }}
            }}
            workgroupBarrier();
        }}
    }}
    for (var e = lidx; e < min(p.k, {SORT_N}u); e += 256u) {{
        out_v[p.outv_off + out + e] = sv[e];
        out_i[p.outi_off + out + e] = si[e];
    }}
",
            half = SORT_N / 2
        );
        KernelBuilder::new(format!("topk_f{}", self.first as u8), *env)
            .workgroup(256, 1, 1)
            .storage("vals", Access::Read, "array<f32>")
            .storage("idx", Access::Read, "array<u32>")
            .storage("out_v", Access::ReadWrite, "array<f32>")
            .storage("out_i", Access::ReadWrite, "array<u32>")
            .params(&["n", "k", "inv_temp", "in_off", "outv_off", "outi_off", "wg_per_row", "in_row", "out_row", "n_rows"])
            .prelude(&format!("var<workgroup> sv: array<f32, {SORT_N}>;\nvar<workgroup> si: array<u32, {SORT_N}>;\n"))
            .body(&body)
            .build()
    }
}

fn f32_logits(logits: &Tensor) -> Result<(GpuView, usize)> {
    let v = tensor_view("sampling", "the logits", logits, numr::DType::F32)?;
    if logits.numel() == 0 {
        return Err(bad("sampling", "empty logits"));
    }
    Ok((v, logits.numel()))
}

/// Records the argmax of `logits` into the implicit stream; the returned buffer's first word is
/// the index once the stream is flushed.
pub fn argmax_record(ctx: &GpuContext, logits: &Tensor) -> Result<Arc<GpuBuffer>> {
    let (lv, n) = f32_logits(logits)?;
    let plan = ArgmaxPlan::new(ctx, &lv, n, None, 1)?;
    plan.run(ctx, &StepValues::decode(0))?;
    Ok(plan.ids().buffer().clone())
}

/// Argmax of `logits` (ties: the lowest index), reading back 4 bytes.
pub fn argmax(ctx: &GpuContext, logits: &Tensor) -> Result<u32> {
    let oi = argmax_record(ctx, logits)?;
    let b = ctx.read_bytes(&oi, 0, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The `k` largest `logits / temperature` with their indices, best first (ties: lower index).
pub fn top_k(ctx: &GpuContext, logits: &Tensor, k: usize, temperature: f32) -> Result<Vec<(u32, f32)>> {
    let (lv, n) = f32_logits(logits)?;
    let plan = TopKPlan::new(ctx, &lv, n, k, temperature, 1, None)?;
    plan.run(ctx, &StepValues::decode(0))?;
    let bytes = k as u64 * 4;
    let v = ctx.read_bytes(plan.values().buffer(), plan.values().byte_offset(), bytes)?;
    let i = ctx.read_bytes(plan.ids().buffer(), plan.ids().byte_offset(), bytes)?;
    let (v, i): (&[f32], &[u32]) = (bytemuck::cast_slice(&v), bytemuck::cast_slice(&i));
    Ok(i.iter().copied().zip(v.iter().copied()).collect())
}

fn rank_value(x: f32) -> f32 {
    if x >= f32::MIN { x } else { f32::MIN }
}

/// CPU reference of [`top_k`] (and of argmax with `k = 1`): `k` must be in `1..=logits.len()`
/// and the temperature positive, else [`crate::ops_common::OpsError::BadArgs`].
pub fn top_k_ref(logits: &[f32], k: usize, temperature: f32) -> Result<Vec<(u32, f32)>> {
    if k == 0 || k > logits.len() || temperature.is_nan() || temperature <= 0.0 {
        return Err(bad("top_k reference", format!("k {k} for {} logits, temperature {temperature}", logits.len())));
    }
    to_u32("top_k reference", "logits", logits.len())?;
    let inv = 1.0 / temperature;
    let mut v: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &x)| (i as u32, rank_value(x * inv))).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(k);
    Ok(v)
}

/// CPU reference of argmax: the index of the largest logit, ties to the lowest index, NaN and
/// -inf ranking as `-f32::MAX`; and that value. Empty logits are
/// [`crate::ops_common::OpsError::BadArgs`].
pub fn argmax_ref(logits: &[f32]) -> Result<(u32, f32)> {
    if logits.is_empty() {
        return Err(bad("argmax reference", "empty logits"));
    }
    to_u32("argmax reference", "logits", logits.len())?;
    let mut best = (0u32, rank_value(logits[0]));
    for (i, &x) in logits.iter().enumerate().skip(1) {
        if rank_value(x) > best.1 {
            best = (i as u32, rank_value(x));
        }
    }
    Ok(best)
}

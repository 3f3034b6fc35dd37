//! Sampling on the GPU: argmax over the vocabulary (4 bytes read back), top-k values and indices
//! (k ≤ 128; the host samples from the short list), and the logit transforms applied first:
//! llama.cpp's repetition penalty (positive logits divided by the penalty, negative multiplied)
//! and the temperature.
//!
//! Argmax is a two-level tree reduction of `(value, index)` (ties go to the lower index). Top-k
//! sorts chunks of 1024 logits per workgroup with a bitonic network in workgroup memory and keeps
//! each chunk's best `k`; rounds repeat over the survivors until one chunk is left.

use std::sync::Arc;

use numr::Tensor;
use numr::gpu::{Access, Binding, BufferKind, GpuBuffer, GpuContext, KernelBuilder, KernelEnv, KernelSource};

use crate::ops_common::{OpsError, Result, bad, dispatch, dummy, env_of, fbits, grid_for, upload_u32};

/// Largest k of [`top_k`].
pub const MAX_TOP_K: usize = 128;
const SORT_N: u32 = 1024;
const ARGMAX_PER_WG: u32 = 4096;

/// Argmax pass: `first` reads raw logits (index = position), later passes read `(value, index)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Argmax {
    pub first: bool,
}

impl Argmax {
    /// WGSL. Bindings `vals`, `idx`, `out_v` (rw), `out_i` (rw); params `n, per_wg`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let load_i = if self.first { "j" } else { "idx[j]" };
        let body = format!(
            "    let lo = wg_linear * p.per_wg;
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var j = lo + lidx; j < min(lo + p.per_wg, p.n); j += 256u) {{
        let v = vals[j];
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
    if (lidx == 0u) {{ out_v[wg_linear] = sv[0]; out_i[wg_linear] = si[0]; }}
"
        );
        KernelBuilder::new(format!("argmax_f{}", self.first as u8), *env)
            .workgroup(256, 1, 1)
            .storage("vals", Access::Read, "array<f32>")
            .storage("idx", Access::Read, "array<u32>")
            .storage("out_v", Access::ReadWrite, "array<f32>")
            .storage("out_i", Access::ReadWrite, "array<u32>")
            .params(&["n", "per_wg"])
            .prelude("var<workgroup> sv: array<f32, 256>;\nvar<workgroup> si: array<u32, 256>;\n")
            .body(&body)
            .build()
    }
}

/// One top-k round over chunks of 1024.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TopK {
    pub first: bool,
}

impl TopK {
    /// WGSL. Bindings `vals`, `idx`, `out_v` (rw), `out_i` (rw); params `n, k, inv_temp`.
    /// The first round divides by the temperature (multiplies by `inv_temp`) and maps NaN to -inf.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let load = if self.first {
            "var v = vals[j] * bitcast<f32>(p.inv_temp); if (v != v) { v = -3.4028235e38; } sv[e] = v; si[e] = j;"
        } else {
            "sv[e] = vals[j]; si[e] = idx[j];"
        };
        let body = format!(
            "    let lo = wg_linear * {SORT_N}u;
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
    for (var e = lidx; e < p.k; e += 256u) {{ out_v[wg_linear * p.k + e] = sv[e]; out_i[wg_linear * p.k + e] = si[e]; }}
",
            half = SORT_N / 2
        );
        KernelBuilder::new(format!("topk_f{}", self.first as u8), *env)
            .workgroup(256, 1, 1)
            .storage("vals", Access::Read, "array<f32>")
            .storage("idx", Access::Read, "array<u32>")
            .storage("out_v", Access::ReadWrite, "array<f32>")
            .storage("out_i", Access::ReadWrite, "array<u32>")
            .params(&["n", "k", "inv_temp"])
            .prelude(&format!("var<workgroup> sv: array<f32, {SORT_N}>;\nvar<workgroup> si: array<u32, {SORT_N}>;\n"))
            .body(&body)
            .build()
    }
}

/// The repetition-penalty kernel (in place on the logits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RepetitionPenalty;

impl RepetitionPenalty {
    /// WGSL. Bindings `logits` (rw), `ids`; params `n_ids, penalty`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        KernelBuilder::new("repetition_penalty", *env)
            .workgroup(256, 1, 1)
            .storage("logits", Access::ReadWrite, "array<f32>")
            .storage("ids", Access::Read, "array<u32>")
            .params(&["n_ids", "penalty"])
            .body(
                "    let i = wg_linear * 256u + lidx;
    if (i >= p.n_ids) { return; }
    let v = logits[ids[i]];
    let pen = bitcast<f32>(p.penalty);
    logits[ids[i]] = select(v * pen, v / pen, v > 0.0);
",
            )
            .build()
    }
}

fn f32_logits(logits: &Tensor) -> Result<(Binding, usize)> {
    if logits.dtype() != numr::DType::F32 || !logits.is_contiguous() {
        return Err(bad("sampling", "logits must be contiguous f32"));
    }
    let (b, off) = logits.gpu_binding(4)?;
    if off != 0 {
        return Err(bad("sampling", "logits must start at an aligned offset"));
    }
    Ok((b, logits.numel()))
}

/// Records the argmax of `logits`; the returned buffer's first word is the index.
pub fn argmax_record(ctx: &GpuContext, logits: &Tensor) -> Result<Arc<GpuBuffer>> {
    let (lb, n) = f32_logits(logits)?;
    if n == 0 {
        return Err(bad("argmax", "empty logits"));
    }
    let env = env_of(ctx);
    let nwg = (n as u32).div_ceil(ARGMAX_PER_WG);
    let (pv, pi) = (ctx.alloc(nwg as u64 * 4, BufferKind::Storage)?, ctx.alloc(nwg as u64 * 4, BufferKind::Storage)?);
    let first = Argmax { first: true }.source(&env);
    dispatch(ctx, &first, &[lb, dummy(ctx)?, Binding::whole(&pv), Binding::whole(&pi)], &[n as u32, ARGMAX_PER_WG], grid_for(ctx, nwg as u64)?)?;
    let (ov, oi) = (ctx.alloc(16, BufferKind::Storage)?, ctx.alloc(16, BufferKind::Storage)?);
    let second = Argmax { first: false }.source(&env);
    dispatch(ctx, &second, &[Binding::whole(&pv), Binding::whole(&pi), Binding::whole(&ov), Binding::whole(&oi)], &[nwg, nwg], [1, 1, 1])?;
    Ok(oi)
}

/// Argmax of `logits` (ties: the lowest index), reading back 4 bytes.
pub fn argmax(ctx: &GpuContext, logits: &Tensor) -> Result<u32> {
    let oi = argmax_record(ctx, logits)?;
    let b = ctx.read_bytes(&oi, 0, 4)?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The `k` largest `logits / temperature` with their indices, best first (ties: lower index).
pub fn top_k(ctx: &GpuContext, logits: &Tensor, k: usize, temperature: f32) -> Result<Vec<(u32, f32)>> {
    let (lb, n) = f32_logits(logits)?;
    if k == 0 || k > MAX_TOP_K || k > n || !(temperature > 0.0) {
        return Err(bad("top_k", format!("k {k} must be in 1..={MAX_TOP_K} and at most {n}; temperature {temperature} must be positive")));
    }
    let env = env_of(ctx);
    let mut vals = lb;
    let mut idx = dummy(ctx)?;
    let mut len = n as u32;
    let mut first = true;
    loop {
        let nwg = len.div_ceil(SORT_N);
        let (ov, oi) = (ctx.alloc(nwg as u64 * k as u64 * 4, BufferKind::Storage)?, ctx.alloc(nwg as u64 * k as u64 * 4, BufferKind::Storage)?);
        let src = TopK { first }.source(&env);
        let params = [len, k as u32, fbits(1.0 / temperature)];
        dispatch(ctx, &src, &[vals, idx, Binding::whole(&ov), Binding::whole(&oi)], &params, grid_for(ctx, nwg as u64)?)?;
        first = false;
        (vals, idx) = (Binding::whole(&ov), Binding::whole(&oi));
        len = nwg * k as u32;
        if nwg == 1 {
            break;
        }
    }
    let v = ctx.read_bytes(&vals.buffer, 0, k as u64 * 4)?;
    let i = ctx.read_bytes(&idx.buffer, 0, k as u64 * 4)?;
    let (v, i): (&[f32], &[u32]) = (bytemuck::cast_slice(&v), bytemuck::cast_slice(&i));
    Ok(i.iter().copied().zip(v.iter().copied()).collect())
}

/// Applies the repetition penalty in place to the logits of `ids` (deduplicated here; each id is
/// checked against the vocabulary).
pub fn repetition_penalty(ctx: &GpuContext, logits: &Tensor, ids: &[u32], penalty: f32) -> Result<()> {
    let (lb, n) = f32_logits(logits)?;
    let mut u = ids.to_vec();
    u.sort_unstable();
    u.dedup();
    if let Some(&id) = u.iter().find(|&&id| id as usize >= n) {
        return Err(OpsError::TokenOutOfRange { id, vocab: n });
    }
    if u.is_empty() || penalty == 1.0 {
        return Ok(());
    }
    let ib = Binding::whole(&upload_u32(ctx, &u)?);
    dispatch(ctx, &RepetitionPenalty.source(&env_of(ctx)), &[lb, ib], &[u.len() as u32, fbits(penalty)], grid_for(ctx, (u.len() as u64).div_ceil(256))?)
}

/// CPU reference of the penalty (llama.cpp semantics), in place.
pub fn repetition_penalty_ref(logits: &mut [f32], ids: &[u32], penalty: f32) {
    let mut u = ids.to_vec();
    u.sort_unstable();
    u.dedup();
    for id in u {
        let v = &mut logits[id as usize];
        *v = if *v > 0.0 { *v / penalty } else { *v * penalty };
    }
}

/// CPU reference of [`top_k`] (and of argmax with `k = 1`).
pub fn top_k_ref(logits: &[f32], k: usize, temperature: f32) -> Vec<(u32, f32)> {
    let inv = 1.0 / temperature;
    let mut v: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &x)| (i as u32, if x.is_nan() { f32::MIN } else { x * inv })).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(k);
    v
}

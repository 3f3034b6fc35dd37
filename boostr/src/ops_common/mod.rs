//! Helpers shared by the decoder-block ops (norms, activations, RoPE, KV cache, attention, short
//! conv, embedding, sampling): the typed error, dispatch helpers, and WGSL snippets.

use std::sync::Arc;

use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, KernelSource, grid_2d};
use numr::{NumrError, Tensor};

/// Every failure of the decoder-block ops.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// Appending would pass the end of the KV cache (or a conv state): nothing was written.
    #[error("context overflow: {needed} positions needed, the cache holds {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    /// A token id at or past the vocabulary size.
    #[error("token id {id} out of range for a vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    /// A configuration the kernels do not support (named, with the reason).
    #[error("unsupported {what}: {reason}")]
    Unsupported { what: &'static str, reason: String },
    /// Shapes, strides or lengths that do not agree.
    #[error("bad arguments to {op}: {reason}")]
    BadArgs { op: &'static str, reason: String },
    #[error(transparent)]
    Numr(#[from] NumrError),
    #[error(transparent)]
    Format(#[from] crate::formats::FormatError),
}

pub type Result<T, E = OpsError> = std::result::Result<T, E>;

pub(crate) fn bad(op: &'static str, reason: impl Into<String>) -> OpsError {
    OpsError::BadArgs { op, reason: reason.into() }
}

/// The kernel environment of a context.
pub fn env_of(ctx: &GpuContext) -> KernelEnv {
    KernelEnv::from_caps(ctx.capabilities())
}

/// A 2-D grid for `n` workgroups within the adapter's per-dimension limit.
pub fn grid_for(ctx: &GpuContext, n: u64) -> Result<[u32; 3]> {
    let max = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
    grid_2d(n, max).ok_or(OpsError::Numr(NumrError::GridTooLarge { workgroups: n, limit: max }))
}

/// Compiles (cached) and records one dispatch into the context's implicit stream.
pub fn dispatch(ctx: &GpuContext, src: &KernelSource, bindings: &[Binding], params: &[u32], grid: [u32; 3]) -> Result<()> {
    let k = ctx.kernel(src)?;
    ctx.with_stream(|rec| rec.dispatch_with(&k, bindings, params, grid))?;
    Ok(())
}

/// The binding of a GPU tensor and the element offset of its first element.
pub fn bind(t: &Tensor) -> Result<(Binding, u32)> {
    Ok(t.gpu_binding(4)?)
}

/// A 4-byte buffer bound where a kernel variant does not use a binding.
pub fn dummy(ctx: &GpuContext) -> Result<Binding> {
    let b = ctx.alloc(16, BufferKind::Storage)?;
    Ok(Binding { buffer: b, offset: 0, size: 16 })
}

/// Uploads u32 words.
pub fn upload_u32(ctx: &GpuContext, words: &[u32]) -> Result<Arc<GpuBuffer>> {
    let data: Vec<u32> = if words.is_empty() { vec![0] } else { words.to_vec() };
    Ok(ctx.upload(bytemuck::cast_slice(&data))?)
}

/// f32 as a parameter word (read in WGSL with `bitcast<f32>(p.x)`).
pub fn fbits(x: f32) -> u32 {
    x.to_bits()
}

/// WGSL: `tanh` safe for large arguments (some drivers compute it through `exp` and overflow).
pub const SAFE_TANH: &str = "fn tanh_s(x: f32) -> f32 { return tanh(clamp(x, -15.0, 15.0)); }\n";

/// WGSL: a tree reduction over a workgroup of `wg` invocations through `var<workgroup>` memory
/// (`red_<op>(v, lidx)`), portable to adapters without subgroups. Must be called from uniform
/// control flow.
pub fn tree_reduce_fns(wg: u32) -> String {
    let mut s = format!("var<workgroup> tred: array<f32, {wg}>;\n");
    for (name, op) in [("sum", "a + b"), ("max", "max(a, b)")] {
        s.push_str(&format!(
            "fn red_{name}(v: f32, lidx: u32) -> f32 {{
    tred[lidx] = v;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s >>= 1u) {{
        if (lidx < s) {{ let a = tred[lidx]; let b = tred[lidx + s]; tred[lidx] = {op}; }}
        workgroupBarrier();
    }}
    let out = tred[0];
    workgroupBarrier();
    return out;
}}
",
            half = wg / 2
        ));
    }
    s
}

/// Rounds through f16 (the KV cache's storage precision) on the CPU.
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Deterministic pseudo-random values in `[-scale, scale)` for tests and benches.
pub fn pseudo_random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

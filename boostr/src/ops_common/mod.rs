//! Helpers shared by the decoder-block ops (norms, activations, RoPE, KV cache, attention, short
//! conv, embedding, sampling): the typed error, dispatch helpers, and WGSL snippets.

use std::sync::Arc;

use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, KernelSource, StepValues, grid_2d};
use numr::{DType, NumrError, Tensor};

/// A decoder-block op built once as a [`Plan`](numr::gpu::Plan) and recorded per step. Implementors
/// give the step check and the plan; recording (into a recorder, or the implicit stream) is shared:
/// the step is checked first, and a step the plan was not built for records nothing.
pub trait OpPlan {
    /// Whether the plan can record `step` (a typed error naming what does not fit).
    fn check(&self, step: &numr::gpu::StepValues) -> Result<()>;

    /// The underlying plan, for appending into a larger one. Recorded directly it skips
    /// [`OpPlan::check`]; its dispatches clamp their per-step values, so they stay in bounds.
    fn plan(&self) -> &numr::gpu::Plan;

    /// Records the step (checked first). Allocates nothing and creates no bind group.
    fn record(&self, rec: &mut numr::gpu::Recorder, step: &numr::gpu::StepValues) -> Result<()> {
        self.check(step)?;
        Ok(self.plan().record(rec, step)?)
    }

    /// Records the step into the context's implicit stream (the eager path).
    fn run(&self, ctx: &GpuContext, step: &numr::gpu::StepValues) -> Result<()> {
        self.check(step)?;
        Ok(self.plan().run(ctx, step)?)
    }
}

/// Every failure of the decoder-block ops.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// Appending would pass the end of the KV cache (or a conv state): nothing was written.
    #[error("context overflow: {needed} positions needed, the cache holds {capacity}")]
    ContextOverflow {
        /// Positions the cache would have to hold after the append.
        needed: usize,
        /// Positions it holds at most.
        capacity: usize,
    },
    /// A paged KV cache has too few free blocks for an append: nothing was allocated.
    #[error("KV cache full: {needed} more blocks needed, {free} free")]
    KvBlocksExhausted {
        /// Blocks the append needs.
        needed: usize,
        /// Blocks free.
        free: usize,
    },
    /// A token id at or past the vocabulary size.
    #[error("token id {id} out of range for a vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Rows of the embedding table (or logits).
        vocab: usize,
    },
    /// A configuration the kernels do not support (named, with the reason).
    #[error("unsupported {what}: {reason}")]
    Unsupported {
        /// The kernel, op or setting.
        what: &'static str,
        /// Why it is refused (the value and the supported range).
        reason: String,
    },
    /// Shapes, strides or lengths that do not agree.
    #[error("bad arguments to {op}: {reason}")]
    BadArgs {
        /// The op or plan that checked.
        op: &'static str,
        /// What does not agree.
        reason: String,
    },
    /// A numr error (device, allocation, kernel compilation, binding limits).
    #[error(transparent)]
    Numr(#[from] NumrError),
    /// A weight-format error (unsupported type, bad block data).
    #[error(transparent)]
    Format(#[from] crate::formats::FormatError),
}

/// `Result` with [`OpsError`] as the default error.
pub type Result<T, E = OpsError> = std::result::Result<T, E>;

pub(crate) fn bad(op: &'static str, reason: impl Into<String>) -> OpsError {
    OpsError::BadArgs { op, reason: reason.into() }
}

/// A size as a u32 kernel parameter, checked (`op` and `what` name it in the error).
pub fn to_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| bad(op, format!("{what} = {v} does not fit 32 bits")))
}

/// `a * b`, checked.
pub fn mul(op: &'static str, what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| bad(op, format!("{what} = {a} x {b} overflows")))
}

/// A run of 4-byte words (f32 or u32 elements) in a GPU buffer: a binding and the word offset of
/// element 0 inside it. Plans take their inputs and outputs as views; a view's extent is its
/// binding's (`binding.size / 4 - offset` words), checked against what the plan reads or writes
/// when the plan is built.
#[derive(Clone, Debug)]
pub struct GpuView {
    /// The buffer range bound to the kernel.
    pub binding: Binding,
    /// Word offset of element 0 inside the binding.
    pub offset: usize,
}

impl GpuView {
    /// A view of `binding` from word `offset`.
    pub fn new(binding: Binding, offset: usize) -> GpuView {
        GpuView { binding, offset }
    }

    /// The whole buffer, from word 0.
    pub fn whole(buffer: &Arc<GpuBuffer>) -> GpuView {
        GpuView { binding: Binding::whole(buffer), offset: 0 }
    }

    /// A view of a contiguous GPU tensor of 4-byte elements (f32, i32, u32).
    pub fn of_tensor(t: &Tensor) -> Result<GpuView> {
        if t.dtype().size() != 4 {
            return Err(bad("gpu view", format!("a tensor of {} (4-byte elements needed)", t.dtype())));
        }
        if !t.is_contiguous() {
            return Err(bad("gpu view", format!("a non-contiguous tensor of shape {:?}", t.shape())));
        }
        let (binding, offset) = t.gpu_binding(4)?;
        Ok(GpuView { binding, offset: offset as usize })
    }

    /// Words from element 0 to the end of the binding.
    pub fn words(&self) -> usize {
        ((self.binding.size / 4) as usize).saturating_sub(self.offset)
    }

    /// The buffer behind the view.
    pub fn buffer(&self) -> &Arc<GpuBuffer> {
        &self.binding.buffer
    }

    /// Byte offset of element 0 in the buffer.
    pub fn byte_offset(&self) -> u64 {
        self.binding.offset + self.offset as u64 * 4
    }

    /// Errors unless the view holds at least `words` words, and the last one's index
    /// (`offset + words - 1`) fits the kernels' u32 index arithmetic.
    pub fn need(&self, op: &'static str, what: &str, words: usize) -> Result<()> {
        if self.words() < words {
            return Err(bad(op, format!("{what} holds {} words, {words} needed", self.words())));
        }
        if (self.offset as u64).saturating_add(words as u64) > 1 << 32 {
            return Err(bad(op, format!("{what}: words up to {} + {words} are past 32-bit indexing", self.offset)));
        }
        Ok(())
    }

    /// The word offset as a kernel parameter.
    pub fn offset_u32(&self, op: &'static str) -> Result<u32> {
        to_u32(op, "view offset", self.offset)
    }
}

impl From<Binding> for GpuView {
    fn from(binding: Binding) -> GpuView {
        GpuView { binding, offset: 0 }
    }
}

impl From<&Arc<GpuBuffer>> for GpuView {
    fn from(b: &Arc<GpuBuffer>) -> GpuView {
        GpuView::whole(b)
    }
}

/// The view of a GPU tensor that must be contiguous and of `dtype` (named errors otherwise).
pub fn tensor_view(op: &'static str, what: &str, t: &Tensor, dtype: DType) -> Result<GpuView> {
    if t.dtype() != dtype {
        return Err(bad(op, format!("{what} is {}, {dtype} expected", t.dtype())));
    }
    if !t.is_contiguous() {
        return Err(bad(op, format!("{what} (shape {:?}) is not contiguous", t.shape())));
    }
    if !t.device().is_gpu() {
        return Err(bad(op, format!("{what} is not on the GPU")));
    }
    GpuView::of_tensor(t)
}

/// A buffer of `words` words owned by a plan (its output or scratch), as a view; zero-filled
/// through the implicit stream (which runs before any later recording).
pub fn owned(ctx: &GpuContext, words: usize) -> Result<GpuView> {
    let bytes = (words.max(1) as u64).checked_mul(4).ok_or_else(|| bad("alloc", format!("{words} words")))?;
    let b = ctx.alloc(bytes, BufferKind::Storage)?;
    ctx.with_stream(|rec| rec.clear(&b))?;
    Ok(GpuView { binding: Binding { buffer: b, offset: 0, size: bytes }, offset: 0 })
}

/// A plan's output: the given view (checked to hold `words`), or a buffer the plan owns.
pub fn out_or_owned(ctx: &GpuContext, op: &'static str, given: Option<&GpuView>, words: usize) -> Result<GpuView> {
    match given {
        Some(o) => {
            o.need(op, "the output", words)?;
            Ok(o.clone())
        }
        None => owned(ctx, words),
    }
}

/// A per-step grid of `ceil(items(step) / per_wg)` workgroups (2-D within the adapter's limit),
/// `items` clamped to `max_items`; checked at build for `max_items`. Zero items skip the dispatch.
pub fn step_grid(
    ctx: &GpuContext,
    max_items: u64,
    per_wg: u64,
    items: impl Fn(&StepValues) -> u64 + Send + Sync + 'static,
) -> Result<impl Fn(&StepValues) -> [u32; 3] + Send + Sync + 'static> {
    let lim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
    grid_for(ctx, max_items.div_ceil(per_wg))?;
    Ok(move |s: &StepValues| grid_2d(items(s).min(max_items).div_ceil(per_wg), lim).unwrap_or([0, 1, 1]))
}

/// Errors unless the step's token count is at most `max` (what a plan was built for).
pub fn check_n_tok(op: &'static str, step: &StepValues, max: u32) -> Result<()> {
    if step.n_tok > max {
        return Err(bad(op, format!("a step of {} tokens, the plan was built for at most {max}", step.n_tok)));
    }
    Ok(())
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

/// Elements per load of an elementwise kernel over rows of `n` at word offsets `offs`: 4 (the
/// `vec4` variant, which counts every length and offset in `vec4`s) when `n` and every offset
/// are multiples of 4, else 1.
pub(crate) fn vec4_lanes(n: u32, offs: &[u32]) -> u32 {
    if n.is_multiple_of(4) && offs.iter().all(|o| o.is_multiple_of(4)) { 4 } else { 1 }
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

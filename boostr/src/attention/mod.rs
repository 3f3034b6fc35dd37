//! Attention over the KV cache: flash-decoding for one token, tiled flash attention for a
//! prefill chunk, and the pass that merges partial softmax results.
//!
//! Both kernels read K/V straight from the cache (`[kv_head][pos][row]`, f16 or q8_0, see
//! [`crate::kv_cache`]) and support GQA/MQA, a sliding window (Gemma 3), logit soft-capping
//! (`cap * tanh(s / cap)`) and head_dim 64, 128 or 256.
//!
//! Masking is aligned to the cache position: query `i` of a chunk whose first token sits at
//! position `p0` attends to keys `0 ..= p0 + i` (and, with a window `w`, only keys with
//! `p0 + i - key < w`), so a chunk prefilled on top of a non-empty cache is correct.
//!
//! # Plans
//! [`DecodePlan`] and [`PrefillPlan`] are built once per (layer, shape): kernels compiled, bind
//! groups made, partial buffers sized for the most splits any step can need, the fused merge's
//! arrival counters zeroed. Every per-step value follows from the [`numr::gpu::StepValues`] given
//! to `record`: decode attends the query at `step.pos` over `kv_len = step.kv_len()` positions
//! (the split count, chunk and grid follow from it); prefill attends `step.n_tok` queries from
//! `p0 = step.pos`. Recording allocates nothing and creates no bind group. The output is the
//! plan's own tensor or a binding given at build (an engine's activation buffer).
//!
//! # Decode ([`DecodeAttnSg`], portable fallback [`DecodeAttn`])
//! The cache is cut into splits of `chunk` positions, enough of them for about
//! [`DECODE_TARGET_WGS`] workgroups; each workgroup handles one split of one KV head for the
//! query heads that share it (one K/V read for the group). Steps over at most
//! [`DECODE_SHORT_KV`] positions run a second variant of the subgroup kernel instead
//! ([`DECODE_SHORT_TUNING`]: a query head per workgroup, a key per slot step, more splits): both
//! are built into the plan and each step records the one its `kv_len` selects. Steps over at
//! most [`DECODE_SINGLE_KV`] positions run a third: one split per query head, which writes the
//! normalised output (and its int8 quantization) itself, with no merge. Each workgroup
//! writes the unnormalised partial
//! output and `(max, sum)`; [`AttnCombine`] merges the splits. Where the adapter has subgroups of
//! at least 8 invocations, [`DecodeAttnSg`] keeps queries, scores and the online softmax in
//! registers (see the [`decode`](mod@decode) module docs); elsewhere [`DecodeAttn`] stages K
//! tiles in workgroup memory. Caches split across buffers ([`crate::kv_cache::KvSegment`]) run
//! one dispatch per segment into the same partial arrays (a segment past `kv_len` is skipped at
//! that step). On an unsegmented cache, where the adapter has `@coherent` storage, the subgroup
//! kernel merges the splits itself (`DecodeAttnSg::fused`: the last workgroup to arrive for a row
//! of heads, counted by an atomic per row, merges them and resets the counter; see
//! [`decode`](mod@decode) for the memory-model argument), so decode is one dispatch; elsewhere,
//! and with [`DecodePlanBuilder::two_pass`], the separate [`AttnCombine`] pass merges (wgpu
//! orders the two dispatches with a barrier).
//!
//! # Prefill
//! Where the adapter has cooperative matrices (f16 16x16x16 with subgroups of 32), the cache is
//! one f16 segment, the head_dim is 64 or 128 and nothing is soft-capped: [`PrefillAttnCoop`], flash attention on the tensor cores (see its module docs).
//! Else, where subgroups allow, [`DecodeAttnSg`] with one query token per grid layer (`z`), one split
//! per cache segment, and the normalised output written directly when the cache has one
//! segment. Elsewhere [`PrefillAttn`]: one workgroup handles 32 queries of one head, K and V
//! tiles of 16 positions staged as f32 in workgroup memory, online softmax per query; only tiles
//! at or below the causal diagonal (and inside the window) are visited.
//!
//! # Partial layout (both kernels)
//! `o_part[(split * rows + row) * head_dim + d]` (unnormalised) and
//! `ml[(split * rows + row) * 2 + {0: max, 1: sum}]`, `row = token * n_q + q_head`.

use crate::ops_common::OpPlan;
use numr::gpu::{Binding, GpuContext, KernelEnv, StepValues};
use numr::{DType, Tensor};

use crate::kv_cache::{KvCache, KvDtype};
use crate::ops_common::{OpsError, Result, env_of};

mod combine;
pub mod decode;
mod decode_plan;
mod decode_tiled;
mod prefill;
mod prefill_coop;
mod prefill_plan;
mod reference;

pub use combine::{AttnCombine, COMBINE_WG};
pub use decode::{DECODE_KEYS_PER_STEP, DECODE_SG_WG, DecodeAttnSg, KEYS_PER_STEP};
pub use decode_plan::{DecodePlan, DecodePlanBuilder};
pub use decode_tiled::{DECODE_WG, DecodeAttn};
pub use prefill::{PREFILL_BK, PREFILL_BQ, PrefillAttn};
pub use prefill_coop::{COOP_BQ, LAZY_RESCALE, PrefillAttnCoop};
pub use prefill_plan::{PrefillPlan, PrefillPlanBuilder};
pub use reference::attention_ref;

/// Decode workgroups the split count aims at (several per compute unit on large GPUs; the best
/// of a sweep on the H200).
pub const DECODE_TARGET_WGS: usize = 512;

/// Decode steps over at most this many positions run the short-context variant of the subgroup
/// kernel ([`DECODE_SHORT_TUNING`]). Measured on the H200 at Llama-3-8B's shape in a dependent
/// chain (`cargo xtask bench --attention`): 6.4 us against the long-context variant's 7.6 at 128
/// positions, 10.0 against 8.0 at 512, 14.0 against 8.8 at 1024, so the crossover lies between
/// 128 and 512.
pub const DECODE_SHORT_KV: u32 = 256;

/// Decode steps over at most this many positions run one split per query head (a workgroup
/// step covers 64 positions with [`DECODE_KEYS_PER_STEP`] keys per slot, so up to two steps),
/// which writes its normalised output itself: no partials, no arrival counter, no merge
/// ([`DecodePlanBuilder::single_split_up_to`]). Measured on the H200 at tg128 (positions
/// 1..=128, medians of 3, two passes): llama-8b 483.8 -> 487.5 tok/s with 64, 489.7 with 128;
/// llama-1b 1,430-1,440 -> 1,455 and 1,466-1,470. Longer single splits were not measured.
pub const DECODE_SINGLE_KV: u32 = 128;

/// The subgroup kernel's tuning for short contexts (`kv_len <= DECODE_SHORT_KV`): one query
/// head per workgroup, one key per slot step, 2048 workgroups aimed at. At a few hundred
/// positions the default's few large workgroups leave the GPU mostly idle, and re-reading K/V
/// per query head costs little: measured on the H200 at tg128 (positions 12..140), llama-8b
/// 390 -> 403 tok/s and llama-1b 1012 -> 1142 tok/s (`CERA_ATTN_TUNING` in cera's plans).
pub const DECODE_SHORT_TUNING: (u32, u32, usize) = (1, 1, 2048);

/// Which decode kernel a plan uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// [`DecodeAttnSg`] (needs subgroups of at least 8 invocations).
    Subgroup,
    /// [`DecodeAttn`] (any adapter).
    Tiled,
    /// [`PrefillAttnCoop`], prefill only: cooperative matrices (f16 16x16x16, subgroups of 32)
    /// over an unsegmented f16 cache.
    Coop,
}

impl DecodeKernel {
    /// The fastest kernel the environment supports.
    pub fn best(env: &KernelEnv) -> Self {
        if env.subgroups && env.subgroup_min_size >= 8 { DecodeKernel::Subgroup } else { DecodeKernel::Tiled }
    }
}

/// Whether the fused split merge is correct by construction on this context: `@coherent`
/// storage (`wgpu::Features::MEMORY_DECORATION_COHERENT`) on a backend where naga lowers
/// `storageBarrier()` to a device-scope fence (SPIR-V `OpControlBarrier` with Device memory scope,
/// HLSL `DeviceMemoryBarrierWithGroupSync`, GLSL `memoryBarrierBuffer`). Metal is left out: there
/// naga emits `threadgroup_barrier(mem_device)`, which Metal documents as ordering device memory
/// for the threadgroup only, so plans merge in a second pass.
pub fn fused_merge_supported(ctx: &GpuContext) -> bool {
    let caps = ctx.capabilities();
    env_of(ctx).coherent && !caps.backend.eq_ignore_ascii_case("metal")
}

/// Score of a masked key.
const NEG: &str = "-1e30";

/// Options shared by prefill and decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnOptions {
    /// Multiplies `q · k` (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// Logit soft-capping: `cap * tanh(s / cap)` after the scale.
    pub softcap: Option<f32>,
    /// Sliding window: a query at position `p` sees keys `p - window + 1 ..= p`.
    pub window: Option<usize>,
}

impl AttnOptions {
    /// Scale `1 / sqrt(head_dim)`, no soft-capping, no window.
    pub fn new(head_dim: usize) -> Self {
        AttnOptions { scale: 1.0 / (head_dim as f32).sqrt(), softcap: None, window: None }
    }
}

/// WGSL `struct V8` and `fn ld8_<name>(row: u32, c: u32) -> V8`: values `8c .. 8c + 8` of cache
/// row `row` of binding `name`.
pub(crate) fn ld8_fn(dtype: KvDtype, name: &str, hd: u32) -> String {
    match dtype {
        KvDtype::F16 => format!(
            "fn ld8_{name}(row: u32, c: u32) -> V8 {{\n    let w = {name}[row * {}u + c];\n    return V8(vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)), vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)));\n}}\n",
            hd / 8
        ),
        KvDtype::Q8_0 => format!(
            "fn ld8_{name}(row: u32, c: u32) -> V8 {{\n    let base = row * {rw}u + (c / 4u) * 9u;\n    let d = unpack2x16float({name}[base + 8u]).x;\n    let w0 = {name}[base + (c % 4u) * 2u];\n    let w1 = {name}[base + (c % 4u) * 2u + 1u];\n    return V8(i8x4(w0) * d, i8x4(w1) * d);\n}}\n",
            rw = KvDtype::Q8_0.row_words(hd as usize)
        ),
    }
}

pub(crate) const V8_DEFS: &str = "struct V8 { a: vec4<f32>, b: vec4<f32> }
fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u) >> 24u, bitcast<i32>(w << 16u) >> 24u, bitcast<i32>(w << 8u) >> 24u, bitcast<i32>(w) >> 24u));
}
";

pub(crate) fn cache_ty(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::F16 => "array<vec4<u32>>",
        KvDtype::Q8_0 => "array<u32>",
    }
}

fn softcap_expr(on: bool) -> &'static str {
    if on { "s = bitcast<f32>(p.softcap) * tanh_s(s / bitcast<f32>(p.softcap));" } else { "" }
}

/// Whether the contiguous cache's kernels ([`DecodePlan`], [`PrefillPlan`]) take a shape: head
/// size 64, 128 or 256 and at most 16 query heads per KV head. Other shapes run through
/// [`crate::paged::PagedAttnPlan::over_contiguous`].
pub fn contiguous_supported(head_dim: usize, group: usize) -> bool {
    [64, 128, 256].contains(&head_dim) && (1..=16).contains(&group)
}

/// head_dim 64, 128 or 256 (every attention kernel).
fn check_head_dim(op: &'static str, hd: u32) -> Result<()> {
    if ![64, 128, 256].contains(&hd) {
        return Err(OpsError::Unsupported {
            what: "attention head size",
            reason: format!("{op}: head size {hd} is not supported on the GPU (64, 128 or 256)"),
        });
    }
    Ok(())
}

/// A size as a kernel parameter word.
fn word(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| OpsError::BadArgs { op, reason: format!("{what} = {v} does not fit 32 bits") })
}

/// `(head_dim, group)` of a query shape against the cache (`layer` must exist).
fn check_heads(cache: &KvCache, layer: usize, n_q: usize) -> Result<(usize, usize)> {
    let c = cache.config();
    cache.segments(layer)?;
    if ![64, 128, 256].contains(&c.head_dim) {
        return Err(OpsError::Unsupported {
            what: "attention head size",
            reason: format!("head size {} is not supported on the GPU (64, 128 or 256)", c.head_dim),
        });
    }
    if n_q == 0 || !n_q.is_multiple_of(c.n_kv_heads) || n_q / c.n_kv_heads > 16 {
        return Err(OpsError::Unsupported {
            what: "attention heads",
            reason: format!("{n_q} query heads over {} KV heads (a whole number of query heads per KV head, at most 16)", c.n_kv_heads),
        });
    }
    Ok((c.head_dim, n_q / c.n_kv_heads))
}

/// The segments of a layer must be `i * seg_len ..` with only the last shorter (as
/// [`KvCache::new`] makes them); the per-step schedules rely on it.
fn check_uniform_segments(cache: &KvCache, layer: usize) -> Result<usize> {
    let segs = cache.segments(layer)?;
    let sl = cache.segment_len();
    let ok = segs.iter().enumerate().all(|(i, s)| s.start == i * sl && (s.len == sl || i + 1 == segs.len()) && s.len > 0);
    if !ok || segs.is_empty() {
        return Err(OpsError::BadArgs { op: "attention", reason: "cache segments are not uniform".into() });
    }
    Ok(segs.len())
}

/// Where a plan writes its `rows * head_dim` f32 output: its own tensor, or a binding given at
/// build and the element offset of the first output value in it.
#[derive(Clone, Debug)]
struct OutTarget {
    binding: Binding,
    off: usize,
    owned: Option<Tensor>,
}

impl OutTarget {
    fn new(ctx: &GpuContext, given: Option<(&Binding, usize)>, shape: &[usize], op: &'static str) -> Result<OutTarget> {
        let n: usize = shape.iter().product();
        match given {
            Some((b, off)) => {
                let end = off.checked_add(n).ok_or_else(|| OpsError::BadArgs { op, reason: "output offset overflows".into() })?;
                if (end as u64).saturating_mul(4) > b.size {
                    return Err(OpsError::BadArgs { op, reason: format!("output binding of {} bytes, needs {n} f32 from element {off}", b.size) });
                }
                word(op, "output offset", off)?;
                Ok(OutTarget { binding: b.clone(), off, owned: None })
            }
            None => {
                let t = Tensor::zeros(shape, DType::F32, &numr::Device::Gpu(ctx.clone()))?;
                let (binding, off) = t.gpu_binding(16)?;
                Ok(OutTarget { binding, off: off as usize, owned: Some(t) })
            }
        }
    }
}

/// Flash-decoding of one token. `q` holds `n_q` heads of `head_dim` f32 at element `q_off`; the
/// cache holds `kv_len` positions of `layer` (the current token's K/V included; the query sits
/// at position `kv_len - 1`). Records into the context's stream; returns `[1, n_q, head_dim]` f32.
/// Engines build a [`DecodePlan`] once per layer instead.
#[allow(clippy::too_many_arguments)]
pub fn decode(ctx: &GpuContext, q: &Binding, q_off: usize, n_q: usize, cache: &KvCache, layer: usize, kv_len: usize, opts: &AttnOptions) -> Result<Tensor> {
    let plan = DecodePlan::new(ctx, q, q_off, n_q, cache, layer, opts)?;
    plan.run(ctx, &DecodePlan::step(kv_len)?)?;
    plan.into_output().ok_or_else(|| OpsError::BadArgs { op: "attention decode", reason: "no owned output".into() })
}

/// Where a prefill chunk's queries live: token `t`, head `h` at element
/// `q_off + t * tok_stride + h * head_dim` of the binding. For a plan, `n_tok` is the most
/// tokens one step carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLayout {
    /// Query tokens (for a plan: the most one step carries).
    pub n_tok: usize,
    /// Query heads per token.
    pub n_q: usize,
    /// Element offset of token 0, head 0 in the binding.
    pub q_off: usize,
    /// Elements from one token's queries to the next (`n_q * head_dim` when dense, larger in a
    /// packed QKV row).
    pub tok_stride: usize,
}

/// Causal attention of a chunk of `n_tok` queries whose first token sits at position `p0`; the
/// cache must already hold positions `0 .. p0 + n_tok` of `layer`. Returns `[n_tok, n_q, head_dim]`.
pub fn prefill(ctx: &GpuContext, q: &Binding, ql: &QueryLayout, cache: &KvCache, layer: usize, p0: usize, opts: &AttnOptions) -> Result<Tensor> {
    let plan = PrefillPlan::new(ctx, q, ql, cache, layer, opts)?;
    let step = StepValues::chunk(word("attention prefill", "p0", p0)?, word("attention prefill", "n_tok", ql.n_tok)?);
    plan.run(ctx, &step)?;
    plan.into_output().ok_or_else(|| OpsError::BadArgs { op: "attention prefill", reason: "no owned output".into() })
}

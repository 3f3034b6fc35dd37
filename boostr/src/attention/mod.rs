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
//! # Decode ([`DecodeAttnSg`], portable fallback [`DecodeAttn`])
//! The cache is cut into splits of `chunk` positions, enough of them for about
//! [`DECODE_TARGET_WGS`] workgroups; each workgroup handles one split of one KV head for the
//! query heads that share it (one K/V read for the group) and writes the unnormalised partial
//! output and `(max, sum)`; [`AttnCombine`] merges the splits. Where the adapter has subgroups of
//! at least 8 invocations, [`DecodeAttnSg`] keeps queries, scores and the online softmax in
//! registers (see [`decode`] module docs); elsewhere [`DecodeAttn`] stages K tiles in workgroup
//! memory. Caches split across buffers ([`crate::kv_cache::KvSegment`]) run one dispatch per
//! segment into the same partial arrays. On an unsegmented cache the subgroup kernel merges the
//! splits itself (`DecodeAttnSg::fused`: the last workgroup to arrive for a row of heads, counted
//! by an atomic per row, merges them and resets the counter), so decode is one dispatch;
//! [`AttnPlan::decode_two_pass`] keeps the separate [`AttnCombine`] pass.
//!
//! # Prefill
//! Where subgroups allow, [`DecodeAttnSg`] with one query token per grid layer (`z`), one split
//! per cache segment, and the normalised output written directly when the cache has one
//! segment. Elsewhere [`PrefillAttn`]: one workgroup handles 32 queries of one head, K and V
//! tiles of 16 positions staged as f32 in workgroup memory, online softmax per query; only tiles
//! at or below the causal diagonal (and inside the window) are visited.
//!
//! # Partial layout (both kernels)
//! `o_part[(split * rows + row) * head_dim + d]` (unnormalised) and
//! `ml[(split * rows + row) * 2 + {0: max, 1: sum}]`, `row = token * n_q + q_head`.

use std::sync::Arc;

use numr::gpu::{Binding, BoundGroup, BufferKind, GpuContext, Kernel, KernelEnv, KernelSource, Recorder};
use numr::{DType, Tensor};

use crate::kv_cache::{KvCache, KvDtype};
use crate::ops_common::{OpsError, Result, SAFE_TANH, env_of, fbits, grid_for};

pub mod decode;
mod decode_tiled;
mod prefill;

pub use decode::{AttnCombine, COMBINE_WG, DECODE_SG_WG, DecodeAttnSg};
pub use decode_tiled::{DECODE_WG, DecodeAttn};
pub use prefill::{PREFILL_BK, PREFILL_BQ, PrefillAttn};

/// Decode workgroups the split count aims at (several per compute unit on large GPUs; the best
/// of a sweep on the H200).
pub const DECODE_TARGET_WGS: usize = 512;

fn decode_target_wgs() -> usize {
    DECODE_TARGET_WGS
}

/// The subgroup decode variant for a shape (other variants: build a [`DecodeAttnSg`] yourself).
fn decode_sg_cfg(hd: u32, group: u32, dtype: KvDtype, softcap: bool) -> DecodeAttnSg {
    DecodeAttnSg::new(hd, group, dtype, softcap)
}

/// Which decode kernel a plan uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// [`DecodeAttnSg`] (needs subgroups of at least 8 invocations).
    Subgroup,
    /// [`DecodeAttn`] (any adapter).
    Tiled,
}

impl DecodeKernel {
    /// The fastest kernel the environment supports.
    pub fn best(env: &KernelEnv) -> Self {
        if env.subgroups && env.subgroup_min_size >= 8 { DecodeKernel::Subgroup } else { DecodeKernel::Tiled }
    }
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
    pub fn new(head_dim: usize) -> Self {
        AttnOptions { scale: 1.0 / (head_dim as f32).sqrt(), softcap: None, window: None }
    }
}

/// WGSL `struct V8` and `fn ld8_<name>(row: u32, c: u32) -> V8`: values `8c .. 8c + 8` of cache
/// row `row` of binding `name`.
fn ld8_fn(dtype: KvDtype, name: &str, hd: u32) -> String {
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

const V8_DEFS: &str = "struct V8 { a: vec4<f32>, b: vec4<f32> }
fn i8x4(w: u32) -> vec4<f32> {
    return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u) >> 24u, bitcast<i32>(w << 16u) >> 24u, bitcast<i32>(w << 8u) >> 24u, bitcast<i32>(w) >> 24u));
}
";

fn cache_ty(dtype: KvDtype) -> &'static str {
    match dtype {
        KvDtype::F16 => "array<vec4<u32>>",
        KvDtype::Q8_0 => "array<u32>",
    }
}

fn softcap_expr(on: bool) -> &'static str {
    if on { "s = bitcast<f32>(p.softcap) * tanh_s(s / bitcast<f32>(p.softcap));" } else { "" }
}

/// One recorded dispatch of a plan.
struct Step {
    kernel: Arc<Kernel>,
    group: BoundGroup,
    params: Vec<u32>,
    grid: [u32; 3],
}

/// Attention dispatches prepared once (kernels compiled, bind groups and partial buffers made),
/// recordable any number of times. Built by [`DecodePlan::new`] or [`PrefillPlan::new`].
pub struct AttnPlan {
    steps: Vec<Step>,
    /// The output, `[n_tok, n_q, head_dim]` f32.
    pub out: Tensor,
}

/// Flash-decoding plan (see [`decode`]).
pub type DecodePlan = AttnPlan;
/// Prefill plan (see [`prefill`]).
pub type PrefillPlan = AttnPlan;

impl AttnPlan {
    fn step(ctx: &GpuContext, src: &KernelSource, bindings: &[Binding], params: Vec<u32>, grid: [u32; 3]) -> Result<Step> {
        let kernel = ctx.kernel(src)?;
        let group = ctx.bind(&kernel, bindings)?;
        Ok(Step { kernel, group, params, grid })
    }

    /// Records the plan's dispatches.
    pub fn record(&self, rec: &mut Recorder) -> numr::Result<()> {
        for s in &self.steps {
            rec.dispatch(&s.kernel, &s.group, &s.params, s.grid)?;
        }
        Ok(())
    }

    /// Dispatches per recording.
    pub fn dispatches(&self) -> usize {
        self.steps.len()
    }

    /// Flash-decoding of one token: see [`decode`].
    #[allow(clippy::too_many_arguments)]
    pub fn decode(
        ctx: &GpuContext,
        q: &Binding,
        q_off: usize,
        n_q: usize,
        cache: &KvCache,
        layer: usize,
        kv_len: usize,
        opts: &AttnOptions,
    ) -> Result<AttnPlan> {
        Self::decode_with(ctx, DecodeKernel::best(&env_of(ctx)), q, q_off, n_q, cache, layer, kv_len, opts)
    }

    /// [`Self::decode`] with a chosen kernel (tests run both; `Subgroup` needs the adapter's
    /// support, see [`DecodeKernel::best`]).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_with(
        ctx: &GpuContext,
        kind: DecodeKernel,
        q: &Binding,
        q_off: usize,
        n_q: usize,
        cache: &KvCache,
        layer: usize,
        kv_len: usize,
        opts: &AttnOptions,
    ) -> Result<AttnPlan> {
        Self::decode_impl(ctx, kind, true, None, q, q_off, n_q, cache, layer, kv_len, opts)
    }

    /// [`Self::decode`] with the subgroup kernel's tuning chosen: query heads per workgroup
    /// (divides the group), keys per slot step (1..=4) and the workgroup count the split count
    /// aims at (for sweeps; the defaults are the best measured on the H200).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_tuned(
        ctx: &GpuContext,
        heads: u32,
        keys: u32,
        target_wgs: usize,
        q: &Binding,
        q_off: usize,
        n_q: usize,
        cache: &KvCache,
        layer: usize,
        kv_len: usize,
        opts: &AttnOptions,
    ) -> Result<AttnPlan> {
        let group = n_q / cache.config().n_kv_heads.max(1);
        if heads == 0 || !group.is_multiple_of(heads as usize) || !(1..=4).contains(&keys) || target_wgs == 0 {
            return Err(OpsError::BadArgs {
                op: "attention decode",
                reason: format!("tuning heads {heads}, keys {keys}, target {target_wgs} for group {group}"),
            });
        }
        Self::decode_impl(ctx, DecodeKernel::Subgroup, true, Some((heads, keys, target_wgs)), q, q_off, n_q, cache, layer, kv_len, opts)
    }

    /// [`Self::decode_with`] without the fused merge: the subgroup kernel writes partials and
    /// [`AttnCombine`] merges them in a second dispatch (the path segmented caches always take;
    /// kept for comparison in the benches and tests).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_two_pass(
        ctx: &GpuContext,
        kind: DecodeKernel,
        q: &Binding,
        q_off: usize,
        n_q: usize,
        cache: &KvCache,
        layer: usize,
        kv_len: usize,
        opts: &AttnOptions,
    ) -> Result<AttnPlan> {
        Self::decode_impl(ctx, kind, false, None, q, q_off, n_q, cache, layer, kv_len, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn decode_impl(
        ctx: &GpuContext,
        kind: DecodeKernel,
        fuse: bool,
        tune: Option<(u32, u32, usize)>,
        q: &Binding,
        q_off: usize,
        n_q: usize,
        cache: &KvCache,
        layer: usize,
        kv_len: usize,
        opts: &AttnOptions,
    ) -> Result<AttnPlan> {
        let (hd, group) = check_heads(cache, layer, n_q)?;
        if kv_len == 0 || kv_len > cache.capacity() {
            return Err(OpsError::ContextOverflow { needed: kv_len, capacity: cache.capacity() });
        }
        if (q.size / 4) < (q_off + n_q * hd) as u64 {
            return Err(OpsError::BadArgs { op: "attention decode", reason: format!("q binding of {} bytes, needs {} f32 from {q_off}", q.size, n_q * hd) });
        }
        let env = env_of(ctx);
        let dtype = cache.config().dtype;
        let softcap = opts.softcap.is_some();
        let n_kv = cache.config().n_kv_heads;
        let segs: Vec<_> = cache.segments(layer).iter().filter(|s| s.start < kv_len).collect();
        let fused = fuse && kind == DecodeKernel::Subgroup && segs.len() == 1;
        let (src, chunk, wg_y) = match kind {
            DecodeKernel::Subgroup => {
                if DecodeKernel::best(&env) != DecodeKernel::Subgroup {
                    return Err(OpsError::Unsupported { what: "subgroup decode", reason: "the adapter lacks subgroups of at least 8".into() });
                }
                let mut cfg = decode_sg_cfg(hd as u32, group as u32, dtype, softcap);
                cfg.fused = fused;
                cfg.keys = decode::DECODE_KEYS_PER_STEP;
                let mut target = decode_target_wgs();
                if let Some((heads, keys, t)) = tune {
                    (cfg.heads, cfg.keys, target) = (heads, keys, t);
                }
                let wg_y = n_kv * (cfg.group / cfg.heads) as usize;
                let step = cfg.step_keys() as usize;
                let splits = target.div_ceil(wg_y).clamp(1, kv_len.div_ceil(step));
                (cfg.source(&env), kv_len.div_ceil(splits).div_ceil(step) * step, wg_y)
            }
            DecodeKernel::Tiled => {
                let cfg = DecodeAttn { head_dim: hd as u32, group: group as u32, dtype, softcap };
                let t = cfg.tile() as usize;
                let want = (kv_len * n_kv).div_ceil(decode_target_wgs()).div_ceil(t) * t;
                (cfg.source(&env), want.clamp(t, cfg.max_chunk() as usize), n_kv)
            }
        };
        let splits: Vec<usize> = segs.iter().map(|s| (s.len.min(kv_len - s.start)).div_ceil(chunk)).collect();
        if fused && splits[0] > DECODE_SG_WG as usize {
            // The fused merge takes one invocation per split; more splits than that merge in a pass.
            return Self::decode_impl(ctx, kind, false, tune, q, q_off, n_q, cache, layer, kv_len, opts);
        }
        let total: usize = splits.iter().sum();
        let dev = numr::Device::Gpu(ctx.clone());
        let o_part = ctx.alloc((total * n_q * hd * 4) as u64, BufferKind::Storage)?;
        let ml = ctx.alloc((total * n_q * 2 * 4) as u64, BufferKind::Storage)?;
        let out = Tensor::zeros(&[1, n_q, hd], DType::F32, &dev)?;
        let mut steps = Vec::new();
        let mut base = 0;
        for (seg, &ns) in segs.iter().zip(&splits) {
            let mut params = vec![
                kv_len as u32,
                (kv_len - 1) as u32,
                seg.start as u32,
                seg.len as u32,
                chunk as u32,
                base as u32,
                q_off as u32,
                n_q as u32,
                fbits(opts.scale),
                fbits(opts.softcap.unwrap_or(0.0)),
                opts.window.unwrap_or(0) as u32,
            ];
            if kind == DecodeKernel::Subgroup {
                params.extend([0, 1, n_q as u32]);
            }
            let mut b = vec![q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), Binding::whole(&o_part), Binding::whole(&ml)];
            if fused {
                // One arrival counter per workgroup row, zero between uses (the last arrival resets it).
                let cnt = ctx.alloc((wg_y * 4) as u64, BufferKind::Storage)?;
                ctx.write(&cnt, 0, &vec![0u8; wg_y * 4])?;
                b.push(Binding::whole(&cnt));
                b.push(out.gpu_binding(4)?.0);
                params.extend([ns as u32, out.gpu_binding(4)?.1]);
            }
            steps.push(Self::step(ctx, &src, &b, params, [ns as u32, wg_y as u32, 1])?);
            base += ns;
        }
        if fused {
            return Ok(AttnPlan { steps, out });
        }
        let comb = AttnCombine { head_dim: hd as u32 }.source(&env);
        let b = [Binding::whole(&o_part), Binding::whole(&ml), out.gpu_binding(4)?.0];
        steps.push(Self::step(ctx, &comb, &b, vec![n_q as u32, total as u32, 0], grid_for(ctx, n_q as u64)?)?);
        Ok(AttnPlan { steps, out })
    }

    /// Causal prefill of a chunk: see [`prefill`].
    pub fn prefill(ctx: &GpuContext, q: &Binding, ql: &QueryLayout, cache: &KvCache, layer: usize, p0: usize, opts: &AttnOptions) -> Result<AttnPlan> {
        let kind = if ql.n_tok <= 65535 { DecodeKernel::best(&env_of(ctx)) } else { DecodeKernel::Tiled };
        Self::prefill_with(ctx, kind, q, ql, cache, layer, p0, opts)
    }

    /// [`Self::prefill`] with a chosen kernel: `Subgroup` runs [`DecodeAttnSg`] with one query
    /// token per grid layer and one split per segment (chunks of at most 65535 tokens);
    /// `Tiled` runs [`PrefillAttn`].
    #[allow(clippy::too_many_arguments)]
    pub fn prefill_with(
        ctx: &GpuContext,
        kind: DecodeKernel,
        q: &Binding,
        ql: &QueryLayout,
        cache: &KvCache,
        layer: usize,
        p0: usize,
        opts: &AttnOptions,
    ) -> Result<AttnPlan> {
        let (hd, group) = check_heads(cache, layer, ql.n_q)?;
        let kv_len = p0 + ql.n_tok;
        if ql.n_tok == 0 || kv_len > cache.capacity() {
            return Err(OpsError::ContextOverflow { needed: kv_len, capacity: cache.capacity() });
        }
        if kind == DecodeKernel::Subgroup {
            return Self::prefill_sg(ctx, q, ql, cache, layer, p0, opts, hd, group);
        }
        let segs: Vec<_> = cache.segments(layer).iter().filter(|s| s.start < kv_len).collect();
        let partial = segs.len() > 1;
        let cfg = PrefillAttn { head_dim: hd as u32, dtype: cache.config().dtype, softcap: opts.softcap.is_some(), partial };
        let rows = ql.n_tok * ql.n_q;
        let dev = numr::Device::Gpu(ctx.clone());
        let out = Tensor::zeros(&[ql.n_tok, ql.n_q, hd], DType::F32, &dev)?;
        let (o_bind, ml) = if partial {
            let o = ctx.alloc((segs.len() * rows * hd * 4) as u64, BufferKind::Storage)?;
            let ml = ctx.alloc((segs.len() * rows * 2 * 4) as u64, BufferKind::Storage)?;
            (Binding::whole(&o), Binding::whole(&ml))
        } else {
            (out.gpu_binding(4)?.0, crate::ops_common::dummy(ctx)?)
        };
        let src = cfg.source(&env_of(ctx));
        let grid = [(ql.n_tok as u32).div_ceil(PREFILL_BQ), ql.n_q as u32, 1];
        let mut steps = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let params = vec![
                ql.n_tok as u32,
                ql.n_q as u32,
                group as u32,
                p0 as u32,
                kv_len as u32,
                seg.start as u32,
                seg.len as u32,
                ql.q_off as u32,
                ql.tok_stride as u32,
                rows as u32,
                i as u32,
                0,
                fbits(opts.scale),
                fbits(opts.softcap.unwrap_or(0.0)),
                opts.window.unwrap_or(0) as u32,
            ];
            let b = [q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), o_bind.clone(), ml.clone()];
            steps.push(Self::step(ctx, &src, &b, params, grid)?);
        }
        if partial {
            let comb = AttnCombine { head_dim: hd as u32 }.source(&env_of(ctx));
            let b = [o_bind, ml, out.gpu_binding(4)?.0];
            steps.push(Self::step(ctx, &comb, &b, vec![rows as u32, segs.len() as u32, 0], grid_for(ctx, rows as u64)?)?);
        }
        Ok(AttnPlan { steps, out })
    }
}

impl AttnPlan {
    #[allow(clippy::too_many_arguments)]
    fn prefill_sg(
        ctx: &GpuContext,
        q: &Binding,
        ql: &QueryLayout,
        cache: &KvCache,
        layer: usize,
        p0: usize,
        opts: &AttnOptions,
        hd: usize,
        group: usize,
    ) -> Result<AttnPlan> {
        let env = env_of(ctx);
        if DecodeKernel::best(&env) != DecodeKernel::Subgroup || ql.n_tok > 65535 {
            return Err(OpsError::Unsupported { what: "subgroup prefill", reason: "needs subgroups of at least 8 and at most 65535 tokens".into() });
        }
        let last = ql.q_off + (ql.n_tok - 1) * ql.tok_stride + ql.n_q * hd;
        if (q.size / 4) < last as u64 {
            return Err(OpsError::BadArgs { op: "attention prefill", reason: format!("q binding of {} bytes, the layout reads {last} f32", q.size) });
        }
        let kv_len = p0 + ql.n_tok;
        let segs: Vec<_> = cache.segments(layer).iter().filter(|s| s.start < kv_len).collect();
        let partial = segs.len() > 1;
        let mut cfg = decode_sg_cfg(hd as u32, group as u32, cache.config().dtype, opts.softcap.is_some());
        cfg.normalised = !partial;
        let n_kv = cache.config().n_kv_heads;
        let wg_y = n_kv * (cfg.group / cfg.heads) as usize;
        let rows = ql.n_tok * ql.n_q;
        let dev = numr::Device::Gpu(ctx.clone());
        let out = Tensor::zeros(&[ql.n_tok, ql.n_q, hd], DType::F32, &dev)?;
        let (o_bind, ml) = if partial {
            let o = ctx.alloc((segs.len() * rows * hd * 4) as u64, BufferKind::Storage)?;
            let ml = ctx.alloc((segs.len() * rows * 2 * 4) as u64, BufferKind::Storage)?;
            (Binding::whole(&o), Binding::whole(&ml))
        } else {
            let (b, off) = out.gpu_binding(16)?;
            if off != 0 {
                return Err(OpsError::BadArgs { op: "attention prefill", reason: "output not at the start of its binding".into() });
            }
            (b, crate::ops_common::dummy(ctx)?)
        };
        let src = cfg.source(&env);
        let mut steps = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let params = vec![
                kv_len as u32,
                p0 as u32,
                seg.start as u32,
                seg.len as u32,
                seg.len as u32,
                i as u32,
                ql.q_off as u32,
                rows as u32,
                fbits(opts.scale),
                fbits(opts.softcap.unwrap_or(0.0)),
                opts.window.unwrap_or(0) as u32,
                ql.tok_stride as u32,
                ql.n_tok as u32,
                ql.n_q as u32,
            ];
            let b = [q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), o_bind.clone(), ml.clone()];
            steps.push(Self::step(ctx, &src, &b, params, [1, wg_y as u32, ql.n_tok as u32])?);
        }
        if partial {
            let comb = AttnCombine { head_dim: hd as u32 }.source(&env);
            let b = [o_bind, ml, out.gpu_binding(4)?.0];
            steps.push(Self::step(ctx, &comb, &b, vec![rows as u32, segs.len() as u32, 0], grid_for(ctx, rows as u64)?)?);
        }
        Ok(AttnPlan { steps, out })
    }
}

fn check_heads(cache: &KvCache, layer: usize, n_q: usize) -> Result<(usize, usize)> {
    let c = cache.config();
    if layer >= c.n_layers || n_q == 0 || !n_q.is_multiple_of(c.n_kv_heads) || n_q / c.n_kv_heads > 16 || ![64, 128, 256].contains(&c.head_dim) {
        return Err(OpsError::Unsupported { what: "attention shape", reason: format!("n_q {n_q}, cache {c:?} (head_dim 64/128/256, group <= 16)") });
    }
    Ok((c.head_dim, n_q / c.n_kv_heads))
}

/// Flash-decoding of one token. `q` holds `n_q` heads of `head_dim` f32 at element `q_off`; the
/// cache holds `kv_len` positions of `layer` (the current token's K/V included; the query sits
/// at position `kv_len - 1`). Records into the context's stream; returns `[1, n_q, head_dim]` f32.
/// Engines build an [`AttnPlan`] once per shape instead.
#[allow(clippy::too_many_arguments)]
pub fn decode(ctx: &GpuContext, q: &Binding, q_off: usize, n_q: usize, cache: &KvCache, layer: usize, kv_len: usize, opts: &AttnOptions) -> Result<Tensor> {
    let plan = AttnPlan::decode(ctx, q, q_off, n_q, cache, layer, kv_len, opts)?;
    ctx.with_stream(|rec| plan.record(rec))?;
    Ok(plan.out)
}

/// Where a prefill chunk's queries live: token `t`, head `h` at element
/// `q_off + t * tok_stride + h * head_dim` of the binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLayout {
    pub n_tok: usize,
    pub n_q: usize,
    pub q_off: usize,
    pub tok_stride: usize,
}

/// Causal attention of a chunk of `n_tok` queries whose first token sits at position `p0`; the
/// cache must already hold positions `0 .. p0 + n_tok` of `layer`. Returns `[n_tok, n_q, head_dim]`.
pub fn prefill(ctx: &GpuContext, q: &Binding, ql: &QueryLayout, cache: &KvCache, layer: usize, p0: usize, opts: &AttnOptions) -> Result<Tensor> {
    let plan = AttnPlan::prefill(ctx, q, ql, cache, layer, p0, opts)?;
    ctx.with_stream(|rec| plan.record(rec))?;
    Ok(plan.out)
}

/// Naive O(n²) CPU reference. `q` is `[n_tok][n_q][hd]`, `k`/`v` are `[n_kv][kv_len][hd]`
/// (as the cache reads back), query `t` sits at position `p0 + t`. Returns `[n_tok][n_q][hd]`.
#[allow(clippy::too_many_arguments)]
pub fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_tok: usize,
    n_q: usize,
    n_kv: usize,
    hd: usize,
    kv_len: usize,
    p0: usize,
    opts: &AttnOptions,
) -> Vec<f32> {
    let g = n_q / n_kv;
    let mut out = vec![0.0f32; n_tok * n_q * hd];
    for t in 0..n_tok {
        let qp = p0 + t;
        for h in 0..n_q {
            let kvh = h / g;
            let qv = &q[(t * n_q + h) * hd..][..hd];
            let mut scores = Vec::new();
            for kp in 0..kv_len.min(qp + 1) {
                if opts.window.is_some_and(|w| qp - kp >= w) {
                    continue;
                }
                let kr = &k[(kvh * kv_len + kp) * hd..][..hd];
                let mut s = qv.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * opts.scale as f64;
                if let Some(c) = opts.softcap {
                    s = c as f64 * (s / c as f64).tanh();
                }
                scores.push((kp, s));
            }
            let m = scores.iter().fold(f64::NEG_INFINITY, |a, &(_, s)| a.max(s));
            let l: f64 = scores.iter().map(|&(_, s)| (s - m).exp()).sum();
            let o = &mut out[(t * n_q + h) * hd..][..hd];
            for &(kp, s) in &scores {
                let w = (s - m).exp() / l;
                for (d, od) in o.iter_mut().enumerate() {
                    *od += (w * v[(kvh * kv_len + kp) * hd + d] as f64) as f32;
                }
            }
        }
    }
    out
}

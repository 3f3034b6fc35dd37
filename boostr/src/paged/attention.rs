//! [`PagedAttn`]: causal attention of a step's tokens (decode rows and prefill chunks of several
//! sequences mixed) over the paged cache, and [`PagedAttnPlan`].
//!
//! [`PagedAttnPlan`] runs the subgroup flash-decoding kernel ([`DecodeAttnSg`] with `paged`) where
//! the shape and the adapter allow it, else the portable [`PagedAttn`] described here.
//!
//! One workgroup handles one token, `heads` query heads sharing one KV head, and one split of the
//! token's keys: the token's `pos + 1` keys are cut into `splits` chunks (whole tiles each), so a
//! long sequence spreads over several workgroups and short ones leave their extra splits empty.
//! Keys are visited in tiles of `tile` positions: K rows are gathered through the block table into
//! workgroup memory, the tile's scores go through an online softmax per head, then V rows are
//! gathered into the same memory and accumulated. Each invocation keeps up to 8 of the
//! `heads * head_dim` output values in registers. With one split and one buffer the kernel writes
//! the normalised output; otherwise it writes partials (`o_part`, `ml`: the layout of
//! [`crate::attention`]) for split `split_base + split` and [`AttnCombine`] merges them. Keys
//! whose block lives in another buffer count as masked in this dispatch (another dispatch, with
//! that buffer bound, covers them).
//!
//! Per-token values read from storage (`tok`, the table) are made uniform with
//! `workgroupUniformLoad` before they bound the loops that hold barriers.

use numr::Tensor;
use numr::gpu::{Access, Binding, BufferKind, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, StepValues};

use super::{PagedBatch, PagedKvCache, PagedKvConfig};
use crate::attention::{AttnCombine, AttnOptions, DecodeAttnSg, DecodeKernel, QueryLayout};
use crate::kv_cache::{KvCache, KvDtype};
use crate::ops_common::{OpPlan, OpsError, Result, SAFE_TANH, bad, env_of, to_u32};

/// Invocations per workgroup.
pub const PAGED_ATTN_WG: u32 = 128;
/// Workgroup-memory floats for the queries (`heads * head_dim`) and for one K/V tile.
const SMEM: u32 = 1024;
/// Most query heads per workgroup.
const MAX_HEADS: u32 = 8;
/// Score of a masked key.
const NEG: &str = "-1e30";

/// The paged attention kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedAttn {
    /// Values per head (see [`PagedKvConfig::supports_head_dim`]).
    pub head_dim: u32,
    /// Query heads per workgroup (a divisor of the GQA group; see [`Self::heads_for`]).
    pub heads: u32,
    /// Storage of the cache.
    pub dtype: KvDtype,
    /// Logit soft-capping (`cap * tanh(s / cap)`, the cap a parameter).
    pub softcap: bool,
    /// Write the normalised output (one split, one buffer) instead of partials.
    pub normalised: bool,
}

impl PagedAttn {
    /// Query heads per workgroup for a head size and GQA group: the largest divisor of the group
    /// with at most 8 heads and `heads * head_dim <= 1024`.
    pub fn heads_for(head_dim: u32, group: u32) -> u32 {
        (1..=group.min(MAX_HEADS)).rev().find(|h| group.is_multiple_of(*h) && h * head_dim <= SMEM).unwrap_or(1)
    }

    /// Key positions per tile.
    pub fn tile(&self) -> u32 {
        (SMEM / (self.head_dim + 1)).min(64)
    }

    /// Every variant the tests validate with naga.
    pub fn all() -> Vec<PagedAttn> {
        let mut v = Vec::new();
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            for head_dim in (8..=256).step_by(8).filter(|&h| PagedKvConfig::supports_head_dim(dtype, h)) {
                let head_dim = head_dim as u32;
                for heads in [1, 2, 3, 4, 8].into_iter().filter(|h| h * head_dim <= SMEM) {
                    for (softcap, normalised) in [(false, false), (true, true), (false, true)] {
                        v.push(PagedAttn { head_dim, heads, dtype, softcap, normalised });
                    }
                }
            }
        }
        v
    }

    fn validate(&self) -> Result<()> {
        if !PagedKvConfig::supports_head_dim(self.dtype, self.head_dim as usize) {
            return Err(OpsError::Unsupported { what: "paged attention", reason: format!("head size {} as {}", self.head_dim, self.dtype) });
        }
        if !(1..=MAX_HEADS).contains(&self.heads) || self.heads * self.head_dim > SMEM {
            return Err(OpsError::Unsupported { what: "paged attention", reason: format!("{} heads of size {} per workgroup", self.heads, self.head_dim) });
        }
        Ok(())
    }

    /// WGSL. Bindings `q`, `tok`, `tables`, `kc`, `vc`, `out` (rw; the output, or `o_part`) and
    /// `ml` (rw; partials' max and sum). Grid `[splits, n_kv * group / heads, n_tok]`. Key `kp`
    /// of KV head `h` lives in block `tables[table offset + kp / block_len]`, at row
    /// `(local block * n_kv + h) * head_stride + kp % block_len` of the bound buffer
    /// (`head_stride = block_len` in a paged cache). With `step_mode = 1`, token `t` sits at
    /// `q_pos + t` with table offset 0 (one sequence, nothing read from `tok`).
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        self.validate()?;
        let (hd, h, t) = (self.head_dim, self.heads, self.tile());
        let c8 = hd / 8;
        let np = (h * hd).div_ceil(PAGED_ATTN_WG);
        let mut pre = format!(
            "var<workgroup> qs: array<f32, {}>;
var<workgroup> kt: array<f32, {}>;
var<workgroup> sc: array<f32, {}>;
var<workgroup> sm: array<f32, {h}>;
var<workgroup> sl: array<f32, {h}>;
var<workgroup> scorr: array<f32, {h}>;
var<workgroup> s_tab: u32;
var<workgroup> s_pos: u32;
",
            h * hd,
            t * (hd + 1),
            h * t
        );
        pre.push_str(crate::attention::V8_DEFS);
        pre.push_str(SAFE_TANH);
        pre.push_str(&crate::attention::ld8_fn(self.dtype, "kc", hd));
        pre.push_str(&crate::attention::ld8_fn(self.dtype, "vc", hd));
        pre.push_str(&format!(
            "// The cache row of key position `kp` of KV head `kvh`, or 0xffffffff when its block lives in
// another buffer.
fn kv_row(tab: u32, kp: u32, kvh: u32) -> u32 {{
    let local = tables[tab + kp / p.block_len] - p.blk_base;
    if (local >= p.blk_count) {{ return 0xffffffffu; }}
    return (local * p.n_kv + kvh) * p.head_stride + kp % p.block_len;
}}
// Gathers the tile's rows at `t0 ..` (below `hi`) into `kt`; `which` 0: K, 1: V.
fn load_tile(tab: u32, t0: u32, hi: u32, kvh: u32, lidx: u32, which: u32) {{
    for (var i = lidx; i < {t}u * {c8}u; i += {wg}u) {{
        let tt = i / {c8}u;
        let c = i - tt * {c8}u;
        var v = V8(vec4<f32>(0.0), vec4<f32>(0.0));
        let kp = t0 + tt;
        if (kp < hi) {{
            let r = kv_row(tab, kp, kvh);
            if (r != 0xffffffffu) {{ if (which == 0u) {{ v = ld8_kc(r, c); }} else {{ v = ld8_vc(r, c); }} }}
        }}
        let o = tt * {hd1}u + c * 8u;
        kt[o] = v.a.x; kt[o + 1u] = v.a.y; kt[o + 2u] = v.a.z; kt[o + 3u] = v.a.w;
        kt[o + 4u] = v.b.x; kt[o + 5u] = v.b.y; kt[o + 6u] = v.b.z; kt[o + 7u] = v.b.w;
    }}
}}
",
            wg = PAGED_ATTN_WG,
            hd1 = hd + 1
        ));
        let cap = if self.softcap { "s = bitcast<f32>(p.softcap) * tanh_s(s / bitcast<f32>(p.softcap));" } else { "" };
        let out = if self.normalised {
            format!("out[p.out_off + row * {hd}u + d] = acc[j] * select(0.0, 1.0 / sl[gi], sl[gi] > 0.0);")
        } else {
            format!(
                "let sidx = p.split_base + wid.x;
            out[(sidx * p.rows + row) * {hd}u + d] = acc[j];
            if (d == 0u) {{ ml[(sidx * p.rows + row) * 2u] = sm[gi]; ml[(sidx * p.rows + row) * 2u + 1u] = sl[gi]; }}"
            )
        };
        let body = format!(
            "    let nhb = p.group / {h}u;
    let kvh = wid.y / nhb;
    let hb = wid.y - kvh * nhb;
    let t = wid.z;
    if (lidx == 0u) {{
        if (p.step_mode == 1u) {{ s_tab = 0u; s_pos = p.q_pos + t; }} else {{ s_tab = tok[2u * t]; s_pos = tok[2u * t + 1u]; }}
    }}
    let tab = workgroupUniformLoad(&s_tab);
    let kv_len = workgroupUniformLoad(&s_pos) + 1u;
    let chunk = (kv_len + p.splits - 1u) / p.splits;
    let chunk_t = (chunk + {t}u - 1u) / {t}u * {t}u;
    var lo = wid.x * chunk_t;
    let hi = min(lo + chunk_t, kv_len);
    if (p.window > 0u && kv_len > p.window) {{ lo = max(lo, kv_len - p.window); }}
    let scale = bitcast<f32>(p.scale);
    let q0 = p.q_off + t * p.tok_stride + (kvh * p.group + hb * {h}u) * {hd}u;
    for (var i = lidx; i < {h}u * {hd}u; i += {wg}u) {{ qs[i] = q[q0 + i] * scale; }}
    if (lidx < {h}u) {{ sm[lidx] = {NEG}; sl[lidx] = 0.0; }}
    var acc: array<f32, {np}>;
    for (var t0 = lo; t0 < hi; t0 += {t}u) {{
        workgroupBarrier();
        load_tile(tab, t0, hi, kvh, lidx, 0u);
        workgroupBarrier();
        for (var i = lidx; i < {h}u * {t}u; i += {wg}u) {{
            let gi = i / {t}u;
            let tt = i - gi * {t}u;
            let kp = t0 + tt;
            var s = 0.0;
            for (var d = 0u; d < {hd}u; d++) {{ s += qs[gi * {hd}u + d] * kt[tt * {hd1}u + d]; }}
            {cap}
            var ok = kp < hi;
            if (ok) {{ ok = kv_row(tab, kp, kvh) != 0xffffffffu; }}
            sc[i] = select({NEG}, s, ok);
        }}
        workgroupBarrier();
        if (lidx < {h}u) {{
            var mt = {NEG};
            for (var tt = 0u; tt < {t}u; tt++) {{ mt = max(mt, sc[lidx * {t}u + tt]); }}
            let mo = sm[lidx];
            let mn = max(mo, mt);
            scorr[lidx] = select(0.0, exp(mo - mn), mo > -1e29);
            sm[lidx] = mn;
        }}
        workgroupBarrier();
        for (var i = lidx; i < {h}u * {t}u; i += {wg}u) {{
            let s = sc[i];
            sc[i] = select(0.0, exp(s - sm[i / {t}u]), s > -1e29);
        }}
        load_tile(tab, t0, hi, kvh, lidx, 1u);
        workgroupBarrier();
        if (lidx < {h}u) {{
            var l = sl[lidx] * scorr[lidx];
            for (var tt = 0u; tt < {t}u; tt++) {{ l += sc[lidx * {t}u + tt]; }}
            sl[lidx] = l;
        }}
        for (var j = 0u; j < {np}u; j++) {{
            let k = lidx + j * {wg}u;
            if (k < {h}u * {hd}u) {{
                let gi = k / {hd}u;
                let d = k - gi * {hd}u;
                var a = acc[j] * scorr[gi];
                for (var tt = 0u; tt < {t}u; tt++) {{ a += sc[gi * {t}u + tt] * kt[tt * {hd1}u + d]; }}
                acc[j] = a;
            }}
        }}
    }}
    workgroupBarrier();
    for (var j = 0u; j < {np}u; j++) {{
        let k = lidx + j * {wg}u;
        if (k < {h}u * {hd}u) {{
            let gi = k / {hd}u;
            let d = k - gi * {hd}u;
            let row = t * p.n_q + kvh * p.group + hb * {h}u + gi;
            {out}
        }}
    }}
",
            wg = PAGED_ATTN_WG,
            hd1 = hd + 1
        );
        let name = format!("paged_attn_hd{hd}_h{h}_{}_c{}_n{}", self.dtype, self.softcap as u8, self.normalised as u8);
        Ok(KernelBuilder::new(name, *env)
            .workgroup(PAGED_ATTN_WG, 1, 1)
            .storage("q", Access::Read, "array<f32>")
            .storage("tok", Access::Read, "array<u32>")
            .storage("tables", Access::Read, "array<u32>")
            .storage("kc", Access::Read, crate::attention::cache_ty(self.dtype))
            .storage("vc", Access::Read, crate::attention::cache_ty(self.dtype))
            .storage("out", Access::ReadWrite, "array<f32>")
            .storage("ml", Access::ReadWrite, "array<f32>")
            .params(&[
                "q_off",
                "tok_stride",
                "n_q",
                "group",
                "n_kv",
                "block_len",
                "head_stride",
                "blk_base",
                "blk_count",
                "splits",
                "split_base",
                "rows",
                "out_off",
                "scale",
                "softcap",
                "window",
                "step_mode",
                "q_pos",
            ])
            .prelude(&pre)
            .body(&body)
            .build())
    }
}

/// How many chunks each token's keys are cut into (each chunk one workgroup per head block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Splits {
    /// Always this many.
    Fixed(usize),
    /// Per step, from its tokens and its longest KV length ([`auto_splits`]), at most `max`.
    Auto {
        /// The most splits any step uses.
        max: usize,
    },
}

impl Splits {
    /// The most splits a step uses.
    pub fn max(&self) -> usize {
        match *self {
            Splits::Fixed(n) | Splits::Auto { max: n } => n,
        }
    }
}

/// Workgroups a step's splits aim at (enough to fill a large GPU several times over).
const AUTO_TARGET_WGS: u32 = 512;
/// Fewest keys per split worth a workgroup of its own.
const AUTO_MIN_KEYS: u32 = 256;

/// The split count [`Splits::Auto`] picks for a step of `n_tok` tokens whose longest sequence
/// reaches `kv_max` positions, with `wg_rows` head blocks per token: enough splits to give about
/// 512 workgroups, none shorter than 256 keys, between 1 and `max`. Measured on an H100 at
/// Llama-3-8B's attention shape (`cargo xtask bench --paged`): one sequence at 4K positions is
/// fastest with 16 splits, 8 sequences at 4K with 4, 64 sequences at 1K or 4K with 1.
pub fn auto_splits(n_tok: u32, kv_max: u32, wg_rows: u32, max: u32) -> u32 {
    let by_wgs = AUTO_TARGET_WGS.div_ceil((n_tok * wg_rows).max(1));
    let by_len = kv_max / AUTO_MIN_KEYS;
    by_wgs.min(by_len).clamp(1, max.max(1))
}

/// Attention of a step's tokens over one layer of a paged cache, built once for the batch's most
/// tokens and recorded per step with `n_tok` = the step's tokens (their positions and sequences
/// come from the [`PagedBatch`]). Writes `[n_tok, n_q, head_dim]` f32: its own tensor or a
/// binding given at build.
#[derive(Clone, Debug)]
pub struct PagedAttnPlan {
    plan: Plan,
    max_tok: u32,
    /// Over a contiguous cache: its positions (a step may not attend past them).
    capacity: Option<usize>,
    owned: Option<Tensor>,
}

/// One buffer a plan attends through: its K and V, the blocks it holds and the positions per KV
/// head in one block of it.
struct Source {
    k: Binding,
    v: Binding,
    first_block: usize,
    n_blocks: usize,
    head_stride: usize,
}

/// Where a plan finds each token's sequence and position.
enum Tokens {
    /// From a [`PagedBatch`] (`tok`, `tables`).
    Batch(Binding, Binding),
    /// One sequence at `step.pos + t`, the identity table given.
    Step(Binding),
}

/// Everything [`PagedAttnPlan::build`] needs besides the adapter.
struct Spec<'a> {
    q: &'a Binding,
    ql: &'a QueryLayout,
    max_tokens: usize,
    n_kv: usize,
    head_dim: usize,
    dtype: KvDtype,
    block_len: usize,
    sources: Vec<Source>,
    tokens: Tokens,
    opts: &'a AttnOptions,
    splits: Splits,
    out: Option<(&'a Binding, usize)>,
    capacity: Option<usize>,
    kernel: Option<DecodeKernel>,
}

impl PagedAttnPlan {
    /// `ql` places each token's queries in `q` (`ql.n_tok` is ignored: the batch's most tokens
    /// count); `splits` cuts each token's keys into chunks, a fixed count or one chosen per step
    /// ([`Splits`]); `out` is an output binding and the element
    /// of its first value, or `None` for a tensor of the plan's own. Typed errors for a head count
    /// that is not a whole GQA group, a layer the cache lacks, and bindings too small.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &GpuContext,
        q: &Binding,
        ql: &QueryLayout,
        cache: &PagedKvCache,
        layer: usize,
        batch: &PagedBatch,
        opts: &AttnOptions,
        splits: Splits,
        out: Option<(&Binding, usize)>,
    ) -> Result<PagedAttnPlan> {
        Self::with_kernel(ctx, q, ql, cache, layer, batch, opts, splits, out, None)
    }

    /// [`Self::new`] with the kernel chosen: `Subgroup` the subgroup flash-decoding kernel of
    /// [`crate::attention`] reading through the tables (head sizes 64, 128, 256, groups up to 16,
    /// subgroups of at least 8), `Tiled` the portable one; `None` the subgroup kernel where it
    /// runs. Typed error for a kernel the shape or the adapter does not allow.
    #[allow(clippy::too_many_arguments)]
    pub fn with_kernel(
        ctx: &GpuContext,
        q: &Binding,
        ql: &QueryLayout,
        cache: &PagedKvCache,
        layer: usize,
        batch: &PagedBatch,
        opts: &AttnOptions,
        splits: Splits,
        out: Option<(&Binding, usize)>,
        kernel: Option<DecodeKernel>,
    ) -> Result<PagedAttnPlan> {
        let c = *cache.config();
        let sources = cache
            .buffers(layer)?
            .iter()
            .map(|b| Source { k: Binding::whole(&b.k), v: Binding::whole(&b.v), first_block: b.first_block, n_blocks: b.n_blocks, head_stride: c.block_len })
            .collect();
        let spec = Spec {
            q,
            ql,
            max_tokens: batch.max_tokens(),
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            dtype: c.dtype,
            block_len: c.block_len,
            sources,
            tokens: Tokens::Batch(batch.tok_binding(), batch.table_binding()),
            opts,
            splits,
            out,
            capacity: None,
            kernel,
        };
        Self::build(ctx, spec)
    }

    /// The same kernel over one sequence's contiguous cache ([`KvCache`]): each cache segment is
    /// a block (`[kv_head][len][row]` is a block's layout), the table is the identity, and step
    /// `s` attends queries `0 .. s.n_tok` at positions `s.pos + t` (the contiguous plans' steps).
    /// It takes every head size the paged kernels take (a multiple of 8 up to 256) and any GQA
    /// group, where [`crate::attention::DecodePlan`] and [`crate::attention::PrefillPlan`] take
    /// head sizes 64, 128 and 256 and groups up to 16. `ql.n_tok` is the most tokens a step
    /// carries.
    #[allow(clippy::too_many_arguments)]
    pub fn over_contiguous(
        ctx: &GpuContext,
        q: &Binding,
        ql: &QueryLayout,
        cache: &KvCache,
        layer: usize,
        opts: &AttnOptions,
        splits: Splits,
        out: Option<(&Binding, usize)>,
    ) -> Result<PagedAttnPlan> {
        let c = *cache.config();
        if !PagedKvConfig::supports_head_dim(c.dtype, c.head_dim) {
            return Err(OpsError::Unsupported { what: "paged attention", reason: format!("head size {} as {}", c.head_dim, c.dtype) });
        }
        let segs = cache.segments(layer)?;
        let ident: Vec<u32> = (0..segs.len() as u32).collect();
        let tables = ctx.upload(bytemuck::cast_slice(&ident))?;
        let sources = segs
            .iter()
            .enumerate()
            .map(|(i, s)| Source { k: Binding::whole(&s.k), v: Binding::whole(&s.v), first_block: i, n_blocks: 1, head_stride: s.len })
            .collect();
        let spec = Spec {
            q,
            ql,
            max_tokens: ql.n_tok,
            n_kv: c.n_kv_heads,
            head_dim: c.head_dim,
            dtype: c.dtype,
            block_len: cache.segment_len(),
            sources,
            tokens: Tokens::Step(Binding::whole(&tables)),
            opts,
            splits,
            out,
            capacity: Some(cache.capacity()),
            kernel: None,
        };
        Self::build(ctx, spec)
    }

    fn build(ctx: &GpuContext, sp: Spec<'_>) -> Result<PagedAttnPlan> {
        const OP: &str = "paged attention";
        let (ql, hd) = (sp.ql, sp.head_dim);
        if ql.n_q == 0 || !ql.n_q.is_multiple_of(sp.n_kv) {
            return Err(OpsError::Unsupported { what: "attention heads", reason: format!("{} query heads over {} KV heads", ql.n_q, sp.n_kv) });
        }
        let group = ql.n_q / sp.n_kv;
        let max_tokens = sp.max_tokens;
        let max_tok = to_u32(OP, "tokens", max_tokens)?;
        let max_dim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let max_splits = sp.splits.max();
        if max_tokens == 0 || max_tok > max_dim || max_splits == 0 || to_u32(OP, "splits", max_splits)? > max_dim {
            return Err(bad(OP, format!("{max_tokens} tokens and {max_splits} splits (1..={max_dim} each)")));
        }
        let last = (max_tokens - 1)
            .checked_mul(ql.tok_stride)
            .and_then(|v| v.checked_add(ql.q_off))
            .and_then(|v| v.checked_add(ql.n_q * hd))
            .ok_or_else(|| bad(OP, "query layout overflows"))?;
        if (last as u64).saturating_mul(4) > sp.q.size {
            return Err(bad(OP, format!("q binding of {} bytes, the layout reads {last} f32", sp.q.size)));
        }
        let rows = max_tokens.checked_mul(ql.n_q).ok_or_else(|| bad(OP, "rows overflow"))?;
        let (out_b, out_off, owned) = match sp.out {
            Some((b, off)) => {
                if (off.saturating_add(rows * hd) as u64).saturating_mul(4) > b.size {
                    return Err(bad(OP, format!("output binding of {} bytes, needs {} f32 from element {off}", b.size, rows * hd)));
                }
                (b.clone(), off, None)
            }
            None => {
                let t = Tensor::zeros(&[max_tokens, ql.n_q, hd], numr::DType::F32, &numr::Device::Gpu(ctx.clone()))?;
                let (b, off) = t.gpu_binding(16)?;
                (b, off as usize, Some(t))
            }
        };
        let env = env_of(ctx);
        let sg_ok = DecodeKernel::best(&env) == DecodeKernel::Subgroup && crate::attention::contiguous_supported(hd, group);
        let use_sg = match sp.kernel {
            None => sg_ok,
            Some(DecodeKernel::Subgroup) if sg_ok => true,
            Some(DecodeKernel::Tiled) => false,
            Some(k) => {
                return Err(OpsError::Unsupported {
                    what: "paged attention kernel",
                    reason: format!("{k:?} for head size {hd}, group {group} on this adapter"),
                });
            }
        };
        // The subgroup kernel stores a normalised output as vec4s.
        let aligned = out_off.is_multiple_of(4) && out_b.size.is_multiple_of(16);
        let normalised = max_splits == 1 && sp.sources.len() == 1 && (!use_sg || aligned);
        let hd32 = to_u32(OP, "head size", hd)?;
        let cfg = PagedAttn {
            head_dim: hd32,
            heads: PagedAttn::heads_for(hd32, to_u32(OP, "group", group)?),
            dtype: sp.dtype,
            softcap: sp.opts.softcap.is_some(),
            normalised,
        };
        let mut sg = DecodeAttnSg::new(hd32, to_u32(OP, "group", group)?, sp.dtype, sp.opts.softcap.is_some());
        if let Ok(c) = &mut sg {
            c.paged = true;
            c.normalised = normalised;
        }
        let (kernel, heads) = if use_sg {
            let c = sg?;
            (ctx.kernel(&c.source(&env)?)?, c.heads)
        } else {
            (ctx.kernel(&cfg.source(&env)?)?, cfg.heads)
        };
        let n_parts = max_splits * sp.sources.len();
        let (part, ml) = if normalised {
            (out_b.clone(), crate::ops_common::dummy(ctx)?)
        } else {
            let o = ctx.alloc((n_parts * rows * hd * 4) as u64, BufferKind::Storage)?;
            let ml = ctx.alloc((n_parts * rows * 2 * 4) as u64, BufferKind::Storage)?;
            (Binding::whole(&o), Binding::whole(&ml))
        };
        let (tok, tables, step_mode) = match sp.tokens {
            Tokens::Batch(tok, tables) => (tok, tables, 0),
            Tokens::Step(tables) => (crate::ops_common::dummy(ctx)?, tables, 1),
        };
        let n_q = to_u32(OP, "query heads", ql.n_q)?;
        let wg_y = to_u32(OP, "grid rows", sp.n_kv * group / heads as usize)?;
        let policy = sp.splits;
        let max_w = max_splits as u32;
        let chosen = move |s: &StepValues| -> u32 {
            match policy {
                Splits::Fixed(n) => n as u32,
                Splits::Auto { .. } => auto_splits(s.n_tok.min(max_tok), s.kv_max(), wg_y, max_w),
            }
        };
        let n_src = sp.sources.len() as u32;
        let mut plan = Plan::new();
        for (i, src) in sp.sources.iter().enumerate() {
            if use_sg {
                let b = [sp.q.clone(), src.k.clone(), src.v.clone(), part.clone(), ml.clone(), tok.clone(), tables.clone()];
                let mut d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [max_w, wg_y, 0])?
                    .set_usize("q_off", ql.q_off)?
                    .set_usize("tok_stride", ql.tok_stride)?
                    .set("n_q", n_q)?
                    .set_usize("n_kv", sp.n_kv)?
                    .set_usize("block_len", sp.block_len)?
                    .set_usize("head_stride", src.head_stride)?
                    .set_usize("blk_base", src.first_block)?
                    .set_usize("blk_count", src.n_blocks)?
                    .per_step("splits", chosen)?
                    .per_step("split_base", move |s| i as u32 * chosen(s))?
                    .set_f32("scale", sp.opts.scale)?
                    .set_f32("softcap", sp.opts.softcap.unwrap_or(0.0))?
                    .set_usize("window", sp.opts.window.unwrap_or(0))?
                    .set("step_mode", step_mode)?
                    .per_step("q_pos", |s| s.pos)?
                    .per_step("n_tok", move |s| s.n_tok.min(max_tok))?
                    .per_step("rows", move |s| s.n_tok.min(max_tok) * n_q)?
                    .grid_per_step(move |s| [chosen(s), wg_y, s.n_tok.min(max_tok)]);
                if normalised {
                    d = d.set_usize("o_base", out_off / 4)?;
                }
                plan.push(d);
                continue;
            }
            let b = [sp.q.clone(), tok.clone(), tables.clone(), src.k.clone(), src.v.clone(), part.clone(), ml.clone()];
            let d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [max_w, wg_y, 0])?
                .set_usize("q_off", ql.q_off)?
                .set_usize("tok_stride", ql.tok_stride)?
                .set("n_q", n_q)?
                .set_usize("group", group)?
                .set_usize("n_kv", sp.n_kv)?
                .set_usize("block_len", sp.block_len)?
                .set_usize("head_stride", src.head_stride)?
                .set_usize("blk_base", src.first_block)?
                .set_usize("blk_count", src.n_blocks)?
                .per_step("splits", chosen)?
                .per_step("split_base", move |s| i as u32 * chosen(s))?
                .set_usize("out_off", out_off)?
                .set_f32("scale", sp.opts.scale)?
                .set_f32("softcap", sp.opts.softcap.unwrap_or(0.0))?
                .set_usize("window", sp.opts.window.unwrap_or(0))?
                .set("step_mode", step_mode)?
                .per_step("q_pos", |s| s.pos)?
                .per_step("rows", move |s| s.n_tok.min(max_tok) * n_q)?
                .grid_per_step(move |s| [chosen(s), wg_y, s.n_tok.min(max_tok)]);
            plan.push(d);
        }
        if !normalised {
            let comb = ctx.kernel(&AttnCombine { head_dim: cfg.head_dim }.source(&env)?)?;
            let b = [part, ml, out_b];
            let d = PlanDispatch::new(&comb, ctx.bind(&comb, &b)?, [0, 1, 1])?
                .per_step("splits", move |s| chosen(s) * n_src)?
                .set_usize("out_off", out_off)?
                .per_step("rows", move |s| s.n_tok.min(max_tok) * n_q)?
                .grid_per_step(move |s| numr::gpu::grid_2d(u64::from(s.n_tok.min(max_tok) * n_q), max_dim).unwrap_or([0, 0, 0]));
            plan.push(d);
        }
        Ok(PagedAttnPlan { plan, max_tok, capacity: sp.capacity, owned })
    }

    /// The plan's own output tensor (`[max tokens, n_q, head_dim]`; a step fills its first
    /// `n_tok` rows), when no output binding was given.
    pub fn output(&self) -> Option<&Tensor> {
        self.owned.as_ref()
    }
}

impl OpPlan for PagedAttnPlan {
    /// At most the batch's tokens; over a contiguous cache, positions inside it.
    fn check(&self, step: &StepValues) -> Result<()> {
        if step.n_tok == 0 || step.n_tok > self.max_tok {
            return Err(bad("paged attention", format!("{} tokens in a step (1..={})", step.n_tok, self.max_tok)));
        }
        if let Some(capacity) = self.capacity
            && step.kv_len() as usize > capacity
        {
            return Err(OpsError::ContextOverflow { needed: step.kv_len() as usize, capacity });
        }
        Ok(())
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

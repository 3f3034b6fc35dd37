//! [`PagedAttnPlan`]: the paged attention of one layer, built once and recorded per step, and
//! how many splits a step's keys are cut into ([`Splits`], [`auto_splits`]). The plan runs the
//! subgroup flash-decoding kernel ([`DecodeAttnSg`] with `paged`) where the shape and the
//! adapter allow it, else the portable [`PagedAttn`] kernel.

use numr::Tensor;
use numr::gpu::{Binding, BufferKind, GpuContext, Plan, PlanDispatch, StepValues};

use super::attention::PagedAttn;
use super::{PagedBatch, PagedKvCache, PagedKvConfig};
use crate::attention::{AttnCombine, AttnOptions, DecodeAttnSg, DecodeKernel, QueryLayout};
use crate::kv_cache::{KvCache, KvDtype};
use crate::ops_common::{OpPlan, OpsError, Result, bad, env_of, to_u32};

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
    /// Per token, from its own KV length: `ceil(kv_len / keys)` chunks, at most `max`. A
    /// token's count, and so its numbers, depend on nothing else in the step, as with
    /// [`Splits::Fixed`], while short tokens take one chunk or few instead of `max` short ones
    /// (each chunk is a workgroup per head block and a partial for the merge to read).
    PerToken {
        /// Keys per chunk (at least 1).
        keys: usize,
        /// The most chunks a token takes (the grid's splits).
        max: usize,
    },
}

impl Splits {
    /// The most splits a step uses.
    pub fn max(&self) -> usize {
        match *self {
            Splits::Fixed(n) | Splits::Auto { max: n } | Splits::PerToken { max: n, .. } => n,
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
        if let Splits::PerToken { keys: 0, .. } = sp.splits {
            return Err(bad(OP, "0 keys per split"));
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
                Splits::Fixed(n) | Splits::PerToken { max: n, .. } => n as u32,
                Splits::Auto { .. } => auto_splits(s.n_tok.min(max_tok), s.kv_max(), wg_y, max_w),
            }
        };
        // Keys per chunk of a token's own count (0: every token takes the step's count).
        let split_keys = match policy {
            Splits::PerToken { keys, .. } => to_u32(OP, "keys per split", keys)?,
            _ => 0,
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
                    .set("split_keys", split_keys)?
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
                .set("split_keys", split_keys)?
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

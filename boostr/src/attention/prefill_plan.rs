//! [`PrefillPlan`]: causal attention of a chunk, built once for the largest chunk and recorded
//! per step with `p0 = step.pos` and `n_tok = step.n_tok`.

use crate::ops_common::OpPlan;
use numr::Tensor;
use numr::gpu::{Binding, BufferKind, GpuContext, Plan, PlanDispatch, StepValues, grid_2d};

use super::*;

/// Causal attention of a chunk of queries over one layer's cache, built once and recorded per
/// step (see the [module docs](super)): step `s` attends queries `0 .. s.n_tok` of the layout,
/// query `t` at position `s.pos + t`, over keys `0 ..= s.pos + t`; the cache must already hold
/// positions `0 .. s.kv_len()`.
#[derive(Clone, Debug)]
pub struct PrefillPlan {
    plan: Plan,
    out: OutTarget,
    max_tok: u32,
    capacity: usize,
    kind: DecodeKernel,
}

/// Options of a [`PrefillPlan`] (from [`PrefillPlan::builder`]).
#[derive(Clone, Debug)]
pub struct PrefillPlanBuilder<'a> {
    ctx: &'a GpuContext,
    q: &'a Binding,
    ql: QueryLayout,
    cache: &'a KvCache,
    layer: usize,
    opts: AttnOptions,
    kind: Option<DecodeKernel>,
    coop: Option<PrefillAttnCoop>,
    f32_only: bool,
    out: Option<(&'a Binding, usize)>,
}

impl<'a> PrefillPlanBuilder<'a> {
    /// The kernel: `Coop` runs [`PrefillAttnCoop`] (cooperative matrices; an unsegmented f16
    /// cache, head_dim 64 or 128, no soft-capping);
    /// `Subgroup` runs [`DecodeAttnSg`] with one query token per grid layer and one split per
    /// segment (chunks of at most 65535 tokens); `Tiled` runs [`PrefillAttn`]. Default: the best
    /// the adapter and the cache allow ([`PrefillPlan::coop_config`] first).
    pub fn kernel(mut self, kind: DecodeKernel) -> Self {
        self.kind = Some(kind);
        self
    }

    /// The coopmat kernel's variant (implies `kernel(Coop)`; default
    /// [`PrefillPlan::coop_config`]): its heads must divide the GQA group, its head_dim match
    /// the cache's, and it must fit the adapter, else `build` gives a typed error.
    pub fn coop_variant(mut self, cfg: PrefillAttnCoop) -> Self {
        self.kind = Some(DecodeKernel::Coop);
        self.coop = Some(cfg);
        self
    }

    /// With no [`kernel`](Self::kernel) chosen: the best of the kernels that compute in f32 (never
    /// the coopmat one, which rounds Q and the softmax weights to f16), so that each row's output
    /// equals a decode step's at its position within f32 rounding: for a few rows verified at
    /// once (speculative decoding), whose logits must pick what decode steps pick.
    pub fn f32_only(mut self) -> Self {
        self.f32_only = true;
        self
    }

    /// Write the `[n_tok, n_q, head_dim]` f32 output into `out` from element `offset` instead of
    /// a tensor of the plan's own. The subgroup kernel on an unsegmented cache stores vec4s there
    /// directly: `offset` must then be a multiple of 4 and the binding's size of 16 bytes.
    pub fn output(mut self, out: &'a Binding, offset: usize) -> Self {
        self.out = Some((out, offset));
        self
    }

    /// Builds the plan: typed errors for a shape the kernels do not support, a layer the cache
    /// lacks, a layout of no tokens, a q or output binding too small, or sizes over 32 bits.
    pub fn build(self) -> Result<PrefillPlan> {
        const OP: &str = "attention prefill";
        let (ctx, cache, ql) = (self.ctx, self.cache, self.ql);
        let (hd, group) = check_heads(cache, self.layer, ql.n_q)?;
        let n_segs = check_uniform_segments(cache, self.layer)?;
        if ql.n_tok == 0 {
            return Err(OpsError::BadArgs { op: OP, reason: "a plan for at least one token per step".into() });
        }
        let env = env_of(ctx);
        let coop = match (PrefillPlan::coop_config(ctx, cache, self.layer, ql.n_q, &self.opts), self.coop) {
            (Some(_), Some(v)) => {
                let caps = ctx.capabilities();
                let fits = v.head_dim as usize == hd
                    && (group as u32).is_multiple_of(v.heads)
                    && v.supported(&env, true, caps.limits.max_compute_workgroup_storage_size);
                if !fits {
                    return Err(OpsError::Unsupported {
                        what: "coopmat prefill variant",
                        reason: format!(
                            "{} heads per workgroup of head size {}, {} keys per tile, for head size {hd} and {group} query heads per KV head on this adapter",
                            v.heads, v.head_dim, v.bk
                        ),
                    });
                }
                Some(v)
            }
            (c, _) => c,
        };
        let kind = self.kind.unwrap_or(if coop.is_some() && !self.f32_only {
            DecodeKernel::Coop
        } else if ql.n_tok <= 65535 {
            DecodeKernel::best(&env)
        } else {
            DecodeKernel::Tiled
        });
        let last = (ql.n_tok - 1)
            .checked_mul(ql.tok_stride)
            .and_then(|x| x.checked_add(ql.q_off))
            .and_then(|x| x.checked_add(ql.n_q * hd))
            .ok_or_else(|| OpsError::BadArgs { op: OP, reason: "query layout overflows".into() })?;
        if (last as u64).saturating_mul(4) > self.q.size {
            return Err(OpsError::BadArgs { op: OP, reason: format!("q binding of {} bytes, the layout reads {last} f32", self.q.size) });
        }
        let c = *cache.config();
        let max_tok = word(OP, "n_tok", ql.n_tok)?;
        let n_q = word(OP, "n_q", ql.n_q)?;
        let rows_max = ql.n_tok.checked_mul(ql.n_q).ok_or_else(|| OpsError::BadArgs { op: OP, reason: "rows overflow".into() })?;
        word(OP, "rows", rows_max)?;
        let seg_len = word(OP, "segment length", cache.segment_len())?;
        let partial = n_segs > 1;
        let out = OutTarget::new(ctx, self.out, &[ql.n_tok, ql.n_q, hd], OP)?;
        let (o_bind, ml) = if partial {
            let o = ctx.alloc((n_segs * rows_max * hd * 4) as u64, BufferKind::Storage)?;
            let ml = ctx.alloc((n_segs * rows_max * 2 * 4) as u64, BufferKind::Storage)?;
            (Binding::whole(&o), Binding::whole(&ml))
        } else {
            (out.binding.clone(), crate::ops_common::dummy(ctx)?)
        };
        let opts = self.opts;
        let max_dim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let n = move |s: &StepValues| s.n_tok.min(max_tok);
        let kv = move |s: &StepValues| s.pos.saturating_add(n(s));
        let mut plan = Plan::new();
        match kind {
            DecodeKernel::Subgroup => {
                if DecodeKernel::best(&env) != DecodeKernel::Subgroup || ql.n_tok > 65535 {
                    return Err(OpsError::Unsupported { what: "subgroup prefill", reason: "needs subgroups of at least 8 and at most 65535 tokens".into() });
                }
                let mut cfg = DecodeAttnSg::new(word(OP, "head_dim", hd)?, word(OP, "group", group)?, c.dtype, opts.softcap.is_some())?;
                cfg.normalised = !partial;
                if cfg.normalised && (!out.off.is_multiple_of(4) || !out.binding.size.is_multiple_of(16)) {
                    return Err(OpsError::BadArgs {
                        op: OP,
                        reason: format!("the output (element {} of {} bytes) must be 16-byte aligned", out.off, out.binding.size),
                    });
                }
                let wg_y = word(OP, "grid rows", c.n_kv_heads * (cfg.group / cfg.heads) as usize)?;
                // SAFETY: the bounds invariant of `decode` (module docs) holds for every dispatch:
                // the kernel clamps key positions into the segment (one split per segment, chunk =
                // segment length) and lanes into the row; the q binding was checked above for the
                // layout's `n_tok` tokens and every step's token count is clamped to it; the
                // partials hold one split per segment of `n_tok * n_q` rows (rows per step are
                // `step tokens * n_q`, no more), and the normalised output (`o_base + row * hd / 4
                // + i`) was checked by `OutTarget::new` and for 16-byte alignment above; grid y is
                // `n_kv * group / heads`.
                let src = unsafe { cfg.source(&env)?.assume_in_bounds() };
                let kernel = ctx.kernel(&src)?;
                for (i, seg) in cache.segments(self.layer)?.iter().enumerate() {
                    let start = word(OP, "segment start", seg.start)?;
                    let b = [self.q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), o_bind.clone(), ml.clone()];
                    let mut d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [0, wg_y, 0])?
                        .set("seg_start", start)?
                        .set_usize("seg_len", seg.len)?
                        .set_usize("chunk", seg.len)?
                        .set_usize("split_base", i)?
                        .set_usize("q_off", ql.q_off)?
                        .set_usize("tok_stride", ql.tok_stride)?
                        .set("n_q", n_q)?
                        .set_f32("scale", opts.scale)?
                        .set_f32("softcap", opts.softcap.unwrap_or(0.0))?
                        .set_usize("window", opts.window.unwrap_or(0))?
                        .per_step("q_pos", |s| s.pos)?
                        .per_step("n_tok", n)?
                        .per_step("rows", move |s| n(s) * n_q)?
                        .grid_per_step(move |s| [(start < kv(s)) as u32, wg_y, n(s)]);
                    if cfg.normalised {
                        d = d.set_usize("o_base", out.off / 4)?;
                    }
                    plan.push(d);
                }
            }
            DecodeKernel::Coop => {
                let Some(cfg) = coop else {
                    return Err(OpsError::Unsupported {
                        what: "coopmat prefill",
                        reason: "needs f16 16x16x16 cooperative matrices with subgroups of 32, one f16 cache segment, head_dim 64 or 128 and no soft-capping"
                            .into(),
                    });
                };
                let heads = cfg.heads as usize;
                let wg_y = word(OP, "grid rows", c.n_kv_heads * group / heads)?;
                let kernel = ctx.kernel(&cfg.source(&env)?)?;
                let seg = &cache.segments(self.layer)?[0];
                let b = [self.q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), out.binding.clone()];
                let d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [0, wg_y, 1])?
                    .set("n_q", n_q)?
                    .set_usize("group", group)?
                    .set_usize("seg_len", seg.len)?
                    .set_usize("q_off", ql.q_off)?
                    .set_usize("tok_stride", ql.tok_stride)?
                    .set_usize("out_off", out.off)?
                    .set_f32("scale", opts.scale)?
                    .set_usize("window", opts.window.unwrap_or(0))?
                    .per_step("n_tok", n)?
                    .per_step("p0", |s| s.pos)?
                    .per_step("kv_len", kv)?
                    .grid_per_step(move |s| [n(s).div_ceil(COOP_BQ), wg_y, 1]);
                plan.push(d);
            }
            DecodeKernel::Tiled => {
                let cfg = PrefillAttn { head_dim: word(OP, "head_dim", hd)?, dtype: c.dtype, softcap: opts.softcap.is_some(), partial };
                let kernel = ctx.kernel(&cfg.source(&env)?)?;
                for (i, seg) in cache.segments(self.layer)?.iter().enumerate() {
                    let start = word(OP, "segment start", seg.start)?;
                    let b = [self.q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), o_bind.clone(), ml.clone()];
                    let d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [0, n_q, 1])?
                        .set("n_q", n_q)?
                        .set_usize("group", group)?
                        .set("seg_start", start)?
                        .set_usize("seg_len", seg.len)?
                        .set_usize("q_off", ql.q_off)?
                        .set_usize("tok_stride", ql.tok_stride)?
                        .set_usize("split_base", i)?
                        .set_usize("out_off", if partial { 0 } else { out.off })?
                        .set_f32("scale", opts.scale)?
                        .set_f32("softcap", opts.softcap.unwrap_or(0.0))?
                        .set_usize("window", opts.window.unwrap_or(0))?
                        .per_step("n_tok", n)?
                        .per_step("p0", |s| s.pos)?
                        .per_step("kv_len", kv)?
                        .per_step("rows", move |s| n(s) * n_q)?
                        .grid_per_step(move |s| [if start < kv(s) { n(s).div_ceil(PREFILL_BQ) } else { 0 }, n_q, 1]);
                    plan.push(d);
                }
            }
        }
        if partial {
            let comb = ctx.kernel(&AttnCombine { head_dim: word(OP, "head_dim", hd)? }.source(&env)?)?;
            let b = [o_bind, ml, out.binding.clone()];
            let d = PlanDispatch::new(&comb, ctx.bind(&comb, &b)?, [0, 1, 1])?
                .set_usize("out_off", out.off)?
                .per_step("rows", move |s| n(s) * n_q)?
                // The segments this step touches (one split each).
                .per_step("splits", move |s| kv(s).saturating_sub(1) / seg_len + 1)?
                .grid_per_step(move |s| grid_2d(n(s) as u64 * n_q as u64, max_dim).unwrap_or([0, 1, 1]));
            plan.push(d);
        }
        Ok(PrefillPlan { plan, out, max_tok, capacity: c.capacity, kind })
    }
}

impl PrefillPlan {
    /// The cooperative-matrix kernel's variant for `n_q` query heads over `layer` of `cache`,
    /// where the adapter, the cache (one f16 segment) and the options (no soft-capping) allow it.
    pub fn coop_config(ctx: &GpuContext, cache: &KvCache, layer: usize, n_q: usize, opts: &AttnOptions) -> Option<PrefillAttnCoop> {
        let c = cache.config();
        let (hd, group) = check_heads(cache, layer, n_q).ok()?;
        let segs = cache.segments(layer).ok()?;
        let cfg = PrefillAttnCoop::for_group(u32::try_from(hd).ok()?, u32::try_from(group).ok()?);
        let caps = ctx.capabilities();
        let coopmat = caps.has_coopmat_f16_16x16x16() && caps.subgroup_max_size == 32;
        let ok = segs.len() == 1
            && c.dtype == KvDtype::F16
            && opts.softcap.is_none()
            && cfg.supported(&env_of(ctx), coopmat, caps.limits.max_compute_workgroup_storage_size);
        ok.then_some(cfg)
    }

    /// The plan with the default options (best kernel, output owned by the plan). `ql.n_tok` is
    /// the most tokens one step carries.
    pub fn new(ctx: &GpuContext, q: &Binding, ql: &QueryLayout, cache: &KvCache, layer: usize, opts: &AttnOptions) -> Result<PrefillPlan> {
        Self::builder(ctx, q, ql, cache, layer, opts).build()
    }

    /// A builder for the other options ([`PrefillPlanBuilder`]).
    pub fn builder<'a>(ctx: &'a GpuContext, q: &'a Binding, ql: &QueryLayout, cache: &'a KvCache, layer: usize, opts: &AttnOptions) -> PrefillPlanBuilder<'a> {
        PrefillPlanBuilder { ctx, q, ql: *ql, cache, layer, opts: *opts, kind: None, coop: None, f32_only: false, out: None }
    }

    /// Dispatches a recording of `step` adds.
    pub fn dispatch_count(&self, step: &StepValues) -> usize {
        self.plan.dispatch_count(step)
    }

    /// The output tensor `[n_tok, n_q, head_dim]` f32 (rows past a step's tokens keep what they
    /// held), unless the plan writes into a given binding.
    pub fn out(&self) -> Option<&Tensor> {
        self.out.owned.as_ref()
    }

    /// [`Self::out`], by value.
    pub fn into_output(self) -> Option<Tensor> {
        self.out.owned
    }

    /// The binding the output is written to and the element offset of its first value.
    pub fn output_binding(&self) -> (&Binding, usize) {
        (&self.out.binding, self.out.off)
    }

    /// The kernel.
    pub fn kernel(&self) -> DecodeKernel {
        self.kind
    }
}

impl OpPlan for PrefillPlan {
    /// Checks a step: `1 <= n_tok <=` the layout's tokens, `pos + n_tok <= capacity`
    /// ([`OpsError::ContextOverflow`]).
    fn check(&self, step: &StepValues) -> Result<()> {
        if step.n_tok == 0 || step.n_tok > self.max_tok {
            return Err(OpsError::BadArgs { op: "attention prefill", reason: format!("a step of {} tokens, the plan takes 1..={}", step.n_tok, self.max_tok) });
        }
        let needed = step.pos as usize + step.n_tok as usize;
        if needed > self.capacity {
            return Err(OpsError::ContextOverflow { needed, capacity: self.capacity });
        }
        Ok(())
    }

    /// The underlying plan (see [`DecodePlan::plan`]; token counts are clamped to the layout).
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

//! [`DecodePlan`]: flash-decoding of one token, built once per (layer, shape) and recorded per
//! step with `kv_len = step.kv_len()`: the split count, chunk and grid of every dispatch follow
//! from it at record time.

use crate::ops_common::OpPlan;
use numr::Tensor;
use numr::gpu::{Binding, BufferKind, GpuContext, Plan, PlanDispatch, StepValues};

use super::*;

/// How a decode plan cuts `kv_len` positions into splits at each step.
#[derive(Clone, Copy, Debug)]
struct Schedule {
    capacity: u32,
    seg_len: u32,
    n_segs: u32,
    kind: SchedKind,
}

#[derive(Clone, Copy, Debug)]
enum SchedKind {
    /// Subgroup kernel: up to `splits` splits per row of workgroups, multiples of `step` positions.
    Subgroup { splits: u32, step: u32 },
    /// Tiled kernel: chunks of about `kv_len * n_kv / target` positions, a multiple of `tile`,
    /// at most `max_chunk`.
    Tiled { n_kv: u32, target: u32, tile: u32, max_chunk: u32 },
}

impl Schedule {
    /// `kv_len` of a step, clamped into `1 ..= capacity` (the plan's check refuses steps outside;
    /// the clamp keeps a raw [`Plan`] recording in bounds).
    fn kv(&self, s: &StepValues) -> u32 {
        s.pos.saturating_add(s.n_tok).clamp(1, self.capacity)
    }

    fn chunk(&self, kv: u32) -> u32 {
        match self.kind {
            SchedKind::Subgroup { splits, step } => {
                let sp = splits.min(kv.div_ceil(step)).max(1);
                kv.div_ceil(sp).div_ceil(step) * step
            }
            SchedKind::Tiled { n_kv, target, tile, max_chunk } => {
                let want = (kv as u64 * n_kv as u64).div_ceil(target as u64).div_ceil(tile as u64) * tile as u64;
                u32::try_from(want.clamp(tile as u64, max_chunk as u64)).unwrap_or(max_chunk)
            }
        }
    }

    /// `(split_base, splits)` of segment `i` at `kv` (no splits when the segment starts at or
    /// past `kv`). Segments are `i * seg_len ..`, only the last shorter, so every segment before
    /// a touched one is full.
    fn seg(&self, kv: u32, i: u32) -> (u32, u32) {
        let start = i * self.seg_len;
        if start >= kv {
            return (0, 0);
        }
        let c = self.chunk(kv);
        ((i * self.seg_len.div_ceil(c)), (kv - start).min(self.seg_len).div_ceil(c))
    }

    /// Splits over all segments at `kv`.
    fn total(&self, kv: u32) -> u32 {
        let (base, n) = self.seg(kv, (kv - 1) / self.seg_len);
        base + n
    }

    /// An upper bound of [`Self::total`] over `kv in 1 ..= capacity`. Over the touched segments
    /// `total <= floor(kv / chunk) + n_segs`, and `kv / chunk` is at most the split target
    /// (subgroup: `chunk >= kv / splits`; tiled: `chunk >= kv * n_kv / target` unless clamped to
    /// `max_chunk`, where `kv / chunk <= capacity / max_chunk`).
    fn max_splits(&self) -> u32 {
        let per_seg = if self.n_segs == 1 { 0 } else { self.n_segs };
        match self.kind {
            SchedKind::Subgroup { splits, .. } => splits + per_seg,
            SchedKind::Tiled { n_kv, target, max_chunk, .. } => target.div_ceil(n_kv).max(self.capacity.div_ceil(max_chunk)) + per_seg.max(1),
        }
    }
}

/// Flash-decoding of one token over one layer's cache, built once and recorded per step (see the
/// [module docs](super)). Step `s` attends the query at position `s.pos` over
/// `kv_len = s.kv_len()` positions (`s.n_tok == 1`).
#[derive(Clone, Debug)]
pub struct DecodePlan {
    plan: Plan,
    out: OutTarget,
    /// Each kernel variant's schedule and the `kv_len` range (inclusive) it runs for.
    scheds: Vec<((u32, u32), Schedule)>,
    kind: DecodeKernel,
    fused: bool,
}

/// One kernel variant of a [`DecodePlan`].
struct Variant {
    plan: Plan,
    sched: Schedule,
    gate: (u32, u32),
    fused: bool,
    single: bool,
}

/// Options of a [`DecodePlan`] (from [`DecodePlan::builder`]).
#[derive(Clone, Debug)]
pub struct DecodePlanBuilder<'a> {
    ctx: &'a GpuContext,
    q: &'a Binding,
    q_off: usize,
    n_q: usize,
    cache: &'a KvCache,
    layer: usize,
    opts: AttnOptions,
    kind: Option<DecodeKernel>,
    two_pass: bool,
    tuning: Option<(u32, u32, usize)>,
    out: Option<(&'a Binding, usize)>,
    quantized: Option<&'a crate::quant::Q8Activations>,
    single_kv: u32,
}

impl<'a> DecodePlanBuilder<'a> {
    /// The decode kernel (default [`DecodeKernel::best`]; `Subgroup` needs the adapter's support).
    pub fn kernel(mut self, kind: DecodeKernel) -> Self {
        self.kind = Some(kind);
        self
    }

    /// Merge the splits in a separate [`AttnCombine`] dispatch even where the fused merge is
    /// available (segmented caches and adapters without `@coherent` storage always do).
    pub fn two_pass(mut self) -> Self {
        self.two_pass = true;
        self
    }

    /// The subgroup kernel's tuning: query heads per workgroup (divides the group), keys per
    /// slot step (1..=4) and the workgroup count the split count aims at (for sweeps; the
    /// defaults are the best measured on the H200).
    pub fn tuning(mut self, heads: u32, keys: u32, target_wgs: usize) -> Self {
        self.tuning = Some((heads, keys, target_wgs));
        self
    }

    /// Steps over at most `kv` positions run one split per query head, written normalised (and
    /// quantized) by the workgroup itself, with no merge (default [`DECODE_SINGLE_KV`]; 0: never).
    /// Applies to the default subgroup schedule on an unsegmented cache with a 16-byte aligned
    /// output; elsewhere the plan keeps its split variants.
    pub fn single_split_up_to(mut self, kv: u32) -> Self {
        self.single_kv = kv;
        self
    }

    /// Write the `[n_q, head_dim]` f32 output into `out` from element `offset` (an engine's
    /// activation buffer) instead of a tensor of the plan's own.
    pub fn output(mut self, out: &'a Binding, offset: usize) -> Self {
        self.out = Some((out, offset));
        self
    }

    /// Also write the output quantized to int8 into `target` (scratch of one row of `n_q *
    /// head_dim` from [`crate::quant::Q8Activations::written_by_producer`], no deferred norm):
    /// the fused merge quantizes each head's blocks as it writes them, the input of an
    /// integer-dot output projection. Needs the fused merge (see
    /// [`DecodePlan::quantized_output_supported`]); `build` gives a typed error otherwise.
    pub fn quantized_output(mut self, target: &'a crate::quant::Q8Activations) -> Self {
        self.quantized = Some(target);
        self
    }

    /// Builds the plan: typed errors for a shape the kernels do not support, a layer the cache
    /// lacks, a q or output binding too small, an invalid tuning, or sizes over 32 bits.
    pub fn build(self) -> Result<DecodePlan> {
        const OP: &str = "attention decode";
        let (hd, _) = check_heads(self.cache, self.layer, self.n_q)?;
        let kind = self.kind.unwrap_or(DecodeKernel::best(&env_of(self.ctx)));
        if kind == DecodeKernel::Coop {
            return Err(OpsError::Unsupported { what: "coopmat attention", reason: "a prefill kernel; decode runs Subgroup or Tiled".into() });
        }
        let out = OutTarget::new(self.ctx, self.out, &[1, self.n_q, hd], OP)?;
        let cap = word(OP, "capacity", self.cache.config().capacity)?;
        let variants = if kind == DecodeKernel::Subgroup && self.tuning.is_none() {
            // The shortest contexts: a split per query head, no merge; short ones: more, smaller
            // workgroups (module docs of `attention`); the long-context variant only where the
            // cache holds more positions.
            // (Not with `two_pass`, which asks for the separate merge pass.)
            let single_ok =
                !self.two_pass && check_uniform_segments(self.cache, self.layer)? == 1 && out.off.is_multiple_of(4) && out.binding.size.is_multiple_of(16);
            let single_hi = if single_ok { self.single_kv.min(cap) } else { 0 };
            let short_hi = if cap > DECODE_SHORT_KV { DECODE_SHORT_KV } else { u32::MAX };
            let mut v = Vec::new();
            if single_hi > 0 {
                v.push(self.build_variant(kind, None, (1, single_hi), &out, true)?);
            }
            if single_hi < short_hi.min(cap) {
                v.push(self.build_variant(kind, Some(DECODE_SHORT_TUNING), (single_hi + 1, short_hi), &out, false)?);
            }
            if cap > DECODE_SHORT_KV && single_hi < cap {
                v.push(self.build_variant(kind, None, ((single_hi + 1).max(DECODE_SHORT_KV + 1), u32::MAX), &out, false)?);
            }
            v
        } else {
            vec![self.build_variant(kind, self.tuning, (1, u32::MAX), &out, false)?]
        };
        let mut plan = Plan::new();
        for v in &variants {
            plan.append(&v.plan);
        }
        // One dispatch per step wherever every variant merges in place or needs no merge.
        let fused = variants.iter().all(|v| v.fused || v.single);
        Ok(DecodePlan { plan, out, scheds: variants.iter().map(|v| (v.gate, v.sched)).collect(), kind, fused })
    }

    /// One kernel variant's dispatches, recorded for the steps whose `kv_len` lies in `gate`
    /// (inclusive; other steps skip them). `single`: one split per query head (subgroup kernel,
    /// unsegmented cache, 16-byte aligned output, all checked by the caller), the normalised
    /// output written by the workgroup itself.
    fn build_variant(&self, kind: DecodeKernel, tuning: Option<(u32, u32, usize)>, gate: (u32, u32), out: &OutTarget, single: bool) -> Result<Variant> {
        const OP: &str = "attention decode";
        let (ctx, cache, n_q) = (self.ctx, self.cache, self.n_q);
        let (hd, group) = check_heads(cache, self.layer, n_q)?;
        let n_segs = check_uniform_segments(cache, self.layer)?;
        let env = env_of(ctx);
        let q_need = self.q_off.checked_add(n_q * hd).ok_or_else(|| OpsError::BadArgs { op: OP, reason: "q offset overflows".into() })?;
        if (q_need as u64).saturating_mul(4) > self.q.size {
            return Err(OpsError::BadArgs { op: OP, reason: format!("q binding of {} bytes, needs {} f32 from {}", self.q.size, n_q * hd, self.q_off) });
        }
        if tuning.is_some() && kind != DecodeKernel::Subgroup {
            return Err(OpsError::BadArgs { op: OP, reason: "a tuning applies to the subgroup kernel only".into() });
        }
        let c = *cache.config();
        let (capacity, seg_len) = (word(OP, "capacity", c.capacity)?, word(OP, "segment length", cache.segment_len())?);
        let n_kv = c.n_kv_heads;
        let softcap = self.opts.softcap.is_some();
        let max_dim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let (src, sched, wg_y, fused) = match kind {
            DecodeKernel::Subgroup => {
                if DecodeKernel::best(&env) != DecodeKernel::Subgroup {
                    return Err(OpsError::Unsupported { what: "subgroup decode", reason: "the adapter lacks subgroups of at least 8".into() });
                }
                let fused = !single && !self.two_pass && n_segs == 1 && fused_merge_supported(ctx);
                let mut cfg = DecodeAttnSg::new(word(OP, "head_dim", hd)?, word(OP, "group", group)?, c.dtype, softcap)?;
                cfg.keys = DECODE_KEYS_PER_STEP;
                cfg.fused = fused;
                cfg.normalised = single;
                cfg.quantize = self.quantized.is_some();
                let mut target = DECODE_TARGET_WGS;
                if single {
                    // A query head per workgroup, every key of the step in it.
                    cfg.heads = 1;
                    target = n_kv * cfg.group as usize;
                }
                if let Some((heads, keys, t)) = tuning {
                    if t == 0 {
                        return Err(OpsError::BadArgs { op: OP, reason: "a target of 0 workgroups".into() });
                    }
                    (cfg.heads, cfg.keys, target) = (heads, keys, t);
                }
                cfg.validate()?;
                let wg_y = n_kv * (cfg.group / cfg.heads) as usize;
                let mut splits = if single { 1 } else { target.div_ceil(wg_y).max(1) };
                if fused {
                    // The fused merge takes one invocation per split.
                    splits = splits.min(DECODE_SG_WG as usize);
                }
                let sched = Schedule {
                    capacity,
                    seg_len,
                    n_segs: n_segs as u32,
                    kind: SchedKind::Subgroup { splits: word(OP, "splits", splits)?, step: cfg.step_keys() },
                };
                // SAFETY: the bounds invariant of `decode` (module docs) holds for every dispatch
                // this plan records: key positions are clamped into each split and segment and
                // lanes into the row by the kernel itself; the q binding was checked above to hold
                // `q_off + n_q * head_dim` f32; `o_part` / `ml` are sized below for
                // `sched.max_splits()` splits of `n_q` rows, an upper bound of the split total of
                // every `kv_len` the schedule can produce (clamped into `1 ..= capacity`), and
                // `split_base + wid.x` stays below that total; grid y is `n_kv * group / heads`
                // (so `kvh < n_kv` and `cnt` has one word per grid row); the fused split count is
                // capped at DECODE_SG_WG; the output binding was checked by `OutTarget::new`.
                let src = unsafe { cfg.source(&env)?.assume_in_bounds() };
                (src, sched, wg_y, fused)
            }
            // Coop was refused by `build`.
            DecodeKernel::Tiled | DecodeKernel::Coop => {
                let cfg = DecodeAttn { head_dim: word(OP, "head_dim", hd)?, group: word(OP, "group", group)?, dtype: c.dtype, softcap };
                let kind = SchedKind::Tiled { n_kv: word(OP, "n_kv", n_kv)?, target: DECODE_TARGET_WGS as u32, tile: cfg.tile(), max_chunk: cfg.max_chunk() };
                (cfg.source(&env)?, Schedule { capacity, seg_len, n_segs: n_segs as u32, kind }, n_kv, false)
            }
        };
        let max_splits = sched.max_splits();
        if max_splits > max_dim || wg_y > max_dim as usize {
            return Err(OpsError::Unsupported { what: "decode grid", reason: format!("{max_splits} splits x {wg_y} rows over {max_dim} per dimension") });
        }
        let wg_y = word(OP, "grid rows", wg_y)?;
        let (lo, hi) = gate;
        let open = move |kv: u32| (lo..=hi).contains(&kv);
        let mut quantized = Vec::new();
        if let Some(t) = self.quantized {
            if !(fused || single) || ctx.capabilities().limits.max_storage_buffers_per_shader_stage < 9 {
                return Err(OpsError::Unsupported {
                    what: "a quantized decode attention output",
                    reason: "needs the fused merge (or a single split) and 9 storage bindings per stage".into(),
                });
            }
            if t.k() != n_q * hd || t.max_rows() < 1 || t.deferred_rms().is_some() || !out.off.is_multiple_of(32) {
                return Err(OpsError::BadArgs {
                    op: OP,
                    reason: format!("int8 output of {} x {} for {n_q} heads of {hd} at element {} (a multiple of 32)", t.max_rows(), t.k(), out.off),
                });
            }
            quantized = vec![t.xq_binding(), t.xs_binding()];
        }
        let part_rows = (max_splits as usize).checked_mul(n_q).ok_or_else(|| OpsError::BadArgs { op: OP, reason: "partials overflow".into() })?;
        let o_part = ctx.alloc((part_rows * hd * 4) as u64, BufferKind::Storage)?;
        let ml = ctx.alloc((part_rows * 2 * 4) as u64, BufferKind::Storage)?;
        let kernel = ctx.kernel(&src)?;
        let cnt = if fused {
            // One arrival counter per workgroup row, zeroed once here; the last arrival of every
            // dispatch resets its counter to 0.
            let cnt = ctx.alloc(wg_y as u64 * 4, BufferKind::Storage)?;
            ctx.write(&cnt, 0, &vec![0u8; wg_y as usize * 4])?;
            Some(Binding::whole(&cnt))
        } else {
            None
        };
        let opts = self.opts;
        let mut plan = Plan::new();
        for (i, seg) in cache.segments(self.layer)?.iter().enumerate() {
            let i = word(OP, "segment", i)?;
            // The single split writes its normalised output where the merge would.
            let o = if single { out.binding.clone() } else { Binding::whole(&o_part) };
            let mut b = vec![self.q.clone(), Binding::whole(&seg.k), Binding::whole(&seg.v), o, Binding::whole(&ml)];
            if let Some(cnt) = &cnt {
                b.push(cnt.clone());
                b.push(out.binding.clone());
            }
            b.extend(quantized.iter().cloned());
            let s = sched;
            let mut d = PlanDispatch::new(&kernel, ctx.bind(&kernel, &b)?, [0, wg_y, 1])?
                .set_usize("seg_start", seg.start)?
                .set_usize("seg_len", seg.len)?
                .set_usize("q_off", self.q_off)?
                .set_usize("rows", n_q)?
                .set_f32("scale", opts.scale)?
                .set_f32("softcap", opts.softcap.unwrap_or(0.0))?
                .set_usize("window", opts.window.unwrap_or(0))?
                .per_step("q_pos", move |st| s.kv(st) - 1)?
                .per_step("chunk", move |st| s.chunk(s.kv(st)))?
                .per_step("split_base", move |st| s.seg(s.kv(st), i).0)?
                .grid_per_step(move |st| {
                    let kv = s.kv(st);
                    if open(kv) { [s.seg(kv, i).1, wg_y, 1] } else { [0, 0, 0] }
                });
            d = match kind {
                DecodeKernel::Subgroup => d.set("tok_stride", 0)?.set("n_tok", 1)?.set_usize("n_q", n_q)?,
                DecodeKernel::Tiled | DecodeKernel::Coop => d.per_step("kv_len", move |st| s.kv(st))?,
            };
            if fused {
                d = d.per_step("splits", move |st| s.total(s.kv(st)))?.set_usize("out_off", out.off)?;
            }
            if single {
                d = d.set_usize("o_base", out.off / 4)?;
            }
            plan.push(d);
        }
        if !fused && !single {
            let comb = ctx.kernel(&AttnCombine { head_dim: word(OP, "head_dim", hd)? }.source(&env)?)?;
            let b = [Binding::whole(&o_part), Binding::whole(&ml), out.binding.clone()];
            let grid = crate::ops_common::grid_for(ctx, n_q as u64)?;
            let s = sched;
            let d = PlanDispatch::new(&comb, ctx.bind(&comb, &b)?, grid)?
                .set_usize("rows", n_q)?
                .set_usize("out_off", out.off)?
                .per_step("splits", move |st| s.total(s.kv(st)))?
                .grid_per_step(move |st| if open(s.kv(st)) { grid } else { [0, 0, 0] });
            plan.push(d);
        }
        Ok(Variant { plan, sched, gate, fused, single })
    }
}

impl DecodePlan {
    /// Whether [`DecodePlanBuilder::quantized_output`] builds for `layer` of `cache` on this
    /// adapter (the subgroup kernel with the fused merge, an unsegmented layer, 9 storage
    /// bindings per stage).
    pub fn quantized_output_supported(ctx: &GpuContext, cache: &KvCache, layer: usize) -> bool {
        let env = env_of(ctx);
        DecodeKernel::best(&env) == DecodeKernel::Subgroup
            && [64, 128, 256].contains(&cache.config().head_dim)
            && fused_merge_supported(ctx)
            && check_uniform_segments(cache, layer).is_ok_and(|n| n == 1)
            && ctx.capabilities().limits.max_storage_buffers_per_shader_stage >= 9
    }

    /// The plan with the default options (best kernel, fused merge where it is correct, output
    /// owned by the plan). `q` holds `n_q` heads of `head_dim` f32 at element `q_off`.
    pub fn new(ctx: &GpuContext, q: &Binding, q_off: usize, n_q: usize, cache: &KvCache, layer: usize, opts: &AttnOptions) -> Result<DecodePlan> {
        Self::builder(ctx, q, q_off, n_q, cache, layer, opts).build()
    }

    /// A builder for the other options ([`DecodePlanBuilder`]).
    pub fn builder<'a>(
        ctx: &'a GpuContext,
        q: &'a Binding,
        q_off: usize,
        n_q: usize,
        cache: &'a KvCache,
        layer: usize,
        opts: &AttnOptions,
    ) -> DecodePlanBuilder<'a> {
        DecodePlanBuilder {
            ctx,
            q,
            q_off,
            n_q,
            cache,
            layer,
            opts: *opts,
            kind: None,
            two_pass: false,
            tuning: None,
            out: None,
            quantized: None,
            single_kv: DECODE_SINGLE_KV,
        }
    }

    /// The step attending over `kv_len` positions (the query at `kv_len - 1`).
    pub fn step(kv_len: usize) -> Result<StepValues> {
        let kv = word("attention decode", "kv_len", kv_len)?;
        if kv == 0 {
            return Err(OpsError::BadArgs { op: "attention decode", reason: "kv_len 0".into() });
        }
        Ok(StepValues::decode(kv - 1))
    }

    /// Dispatches a recording of `step` adds.
    pub fn dispatch_count(&self, step: &StepValues) -> usize {
        self.plan.dispatch_count(step)
    }

    /// The output tensor `[1, n_q, head_dim]` f32, unless the plan writes into a given binding.
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

    /// Whether a step is one dispatch per cache segment: the splits merge inside the decode
    /// dispatch, or the step runs a single split that needs no merge (else an [`AttnCombine`]
    /// pass follows).
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// The decode kernel.
    pub fn kernel(&self) -> DecodeKernel {
        self.kind
    }

    /// Splits (over all segments) a step of `kv_len` positions uses.
    pub fn splits_at(&self, kv_len: usize) -> usize {
        let kv = u32::try_from(kv_len).unwrap_or(u32::MAX).clamp(1, self.capacity());
        self.scheds.iter().find(|((lo, hi), _)| (*lo..=*hi).contains(&kv)).map_or(0, |(_, s)| s.total(kv) as usize)
    }

    /// Splits the partial buffers hold (at least [`Self::splits_at`] of every `kv_len`).
    pub fn max_splits(&self) -> usize {
        self.scheds.iter().map(|(_, s)| s.max_splits() as usize).max().unwrap_or(0)
    }

    fn capacity(&self) -> u32 {
        self.scheds[0].1.capacity
    }
}

impl OpPlan for DecodePlan {
    /// Checks a step: one token, `1 <= kv_len <= capacity` ([`OpsError::ContextOverflow`] past it).
    fn check(&self, step: &StepValues) -> Result<()> {
        if step.n_tok != 1 {
            return Err(OpsError::BadArgs { op: "attention decode", reason: format!("a decode step of {} tokens (1)", step.n_tok) });
        }
        let needed = step.pos as usize + 1;
        if needed > self.capacity() as usize {
            return Err(OpsError::ContextOverflow { needed, capacity: self.capacity() as usize });
        }
        Ok(())
    }

    /// The underlying plan (for appending into a larger one). It skips [`Self::check`]; its
    /// dispatches clamp `kv_len` into `1 ..= capacity`, so they stay in bounds, but a step the
    /// check refuses gives a wrong result there.
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

//! [`QkvRopePlan`]: the fused QK-norm + RoPE + KV write built once per layer and recorded per
//! step, and the eager [`QkvRope::run`] / [`QkvRope::record`] built on it.

use crate::ops_common::OpPlan;
use numr::gpu::{Binding, GpuContext, Plan, PlanDispatch, StepValues, grid_2d};

use super::{QkvLayout, QkvRope, RopeParams};
use crate::kv_cache::KvCache;
use crate::ops_common::{OpsError, Result, bad, dummy, env_of, upload_u32};

/// Where the rotation angle's position comes from.
#[derive(Clone, Debug)]
pub enum RopePositions {
    /// Token `t` of a step sits at `step.pos + t` (computed in the kernel; the default).
    Step,
    /// Token `t` of a step sits at `positions[step.token + t]` of this u32 binding (positions
    /// produced on the GPU, or not contiguous).
    Buffer(Binding),
}

/// What a [`QkvRopePlan`] binds. `x` is the packed activation binding (f32; `layout` describes
/// it, with its element offsets relative to the binding and `layout.n_tok` the most tokens one
/// step carries).
#[derive(Clone, Copy, Debug)]
pub struct QkvRopeInputs<'a> {
    /// The packed activations (Q and K rewritten in place when the variant transforms them).
    pub x: &'a Binding,
    /// Where the heads are in `x`.
    pub layout: QkvLayout,
    /// Rotation parameters (the inverse frequencies are computed from them at build).
    pub rope: &'a RopeParams,
    /// Where each token's position comes from.
    pub positions: &'a RopePositions,
    /// Per-head norm weights (`head_dim` f32 each), with [`QkvRope::qk_norm`].
    pub qw: Option<&'a Binding>,
    /// The K heads' norm weights (`head_dim` f32), with [`QkvRope::qk_norm`].
    pub kw: Option<&'a Binding>,
    /// The QK norm's epsilon.
    pub eps: f32,
    /// The cache and layer K/V are stored to, with [`QkvRope::kv_write`].
    pub cache: Option<(&'a KvCache, usize)>,
}

/// The fused op for one layer, built once (kernel, bind groups, the inverse frequencies uploaded)
/// and recorded per step: token `t < step.n_tok` is rotated at its position (see
/// [`RopePositions`]) and, with a KV write, stored at cache slot `step.pos + t`, one dispatch per
/// cache segment the step touches. Recording allocates nothing and creates no bind group.
#[derive(Clone, Debug)]
pub struct QkvRopePlan {
    plan: Plan,
    max_tok: u32,
    capacity: Option<usize>,
    pos_words: Option<u64>,
}

/// Tokens `t0 .. t1` of a step (first slot `pos`, `n` tokens) whose slots fall in the segment
/// `start .. start + len`, as `(t0, t1)` (`t0 == t1` when none do).
fn seg_tokens(pos: u32, n: u32, start: u32, len: u32) -> (u32, u32) {
    let lo = start.max(pos);
    let hi = start.saturating_add(len).min(pos.saturating_add(n));
    if lo >= hi { (0, 0) } else { (lo - pos, hi - pos) }
}

/// The partial sums a plan adds up: `n` of them (1: none) `off` f32 apart; `v_back`: the V
/// heads' sums written back too.
#[derive(Clone, Copy)]
struct Parts {
    off: usize,
    n: u32,
    v_back: bool,
}

fn to_u32(what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| bad("qkv_rope", format!("{what} = {v} does not fit 32 bits")))
}

impl QkvRopePlan {
    /// Builds the plan for `cfg`. Validates every binding size and parameter: typed errors for a
    /// head_dim over 256, an odd or too large `rot_dim`, norm weights or a cache that do not match
    /// the variant, a cache of another shape or dtype, a layer the cache lacks, an `x` binding
    /// shorter than the layout, and sizes over 32 bits.
    pub fn new(ctx: &GpuContext, cfg: &QkvRope, inp: &QkvRopeInputs) -> Result<QkvRopePlan> {
        let freqs = upload_u32(ctx, bytemuck::cast_slice(&inp.rope.inv_freqs()))?;
        Self::with_freqs(ctx, cfg, inp, &Binding::whole(&freqs))
    }

    /// [`Self::new`] with the inverse frequencies already on the GPU (`rot_dim / 2` f32, checked):
    /// for frequencies [`RopeParams::inv_freqs`] cannot express, such as Llama 3.1's per-frequency
    /// factors as GGUF files store them (`rope_freqs.weight`).
    pub fn with_freqs(ctx: &GpuContext, cfg: &QkvRope, inp: &QkvRopeInputs, freqs: &Binding) -> Result<QkvRopePlan> {
        Self::build(ctx, cfg, inp, freqs, Parts { off: 0, n: 1, v_back: false })
    }

    /// [`Self::with_freqs`] over a projection that was split over K into two partial sums: `x`
    /// holds the first at the layout's offsets and the second `part_off` f32 further on; each
    /// head row is their sum. The variant must write Q and K back ([`QkvRope::transforms`]), so
    /// that what reads them later finds the sums; V goes to the cache. Typed errors as
    /// [`Self::new`], and for an `x` binding shorter than `part_off` plus the layout.
    pub fn with_partial_sum(ctx: &GpuContext, cfg: &QkvRope, inp: &QkvRopeInputs, freqs: &Binding, part_off: usize) -> Result<QkvRopePlan> {
        if !cfg.transforms() || cfg.kv_write.is_none() || part_off == 0 {
            return Err(bad("qkv_rope", format!("a partial sum at {part_off} needs a variant that writes Q/K back and V to the cache")));
        }
        Self::build(ctx, cfg, inp, freqs, Parts { off: part_off, n: 2, v_back: false })
    }

    /// [`Self::with_freqs`] over a projection split over K into `parts` partial sums (2 to
    /// [`crate::quant::split_sum::MAX_SPLITS`]), `part_off` f32 apart in `x` from the layout's
    /// offsets (as [`crate::quant::GemmPlan::with_split_k_partials`] writes them into a binding
    /// of `parts` times the layout): each head row, V's included, is their sum in the order
    /// `((p0 + p1) + p2) + ...` ([`crate::quant::SplitSumPlan`]'s), transformed as the variant
    /// says and written back over the first partial, so what reads `x` afterwards (a paged KV
    /// write, attention) finds the sums. The variant must transform Q/K ([`QkvRope::transforms`]);
    /// with a KV write V also goes to the cache. Typed errors as [`Self::new`], and for an `x`
    /// binding shorter than the partials.
    pub fn with_partials(ctx: &GpuContext, cfg: &QkvRope, inp: &QkvRopeInputs, freqs: &Binding, part_off: usize, parts: u32) -> Result<QkvRopePlan> {
        let most = crate::quant::split_sum::MAX_SPLITS;
        if !cfg.transforms() || part_off == 0 || !(2..=most).contains(&parts) {
            return Err(bad("qkv_rope", format!("{parts} partial sums {part_off} apart need 2..={most} partials and a variant that writes Q/K back")));
        }
        Self::build(ctx, cfg, inp, freqs, Parts { off: part_off, n: parts, v_back: true })
    }

    fn build(ctx: &GpuContext, cfg: &QkvRope, inp: &QkvRopeInputs, freqs: &Binding, parts: Parts) -> Result<QkvRopePlan> {
        let (l, rope) = (&inp.layout, inp.rope);
        let hd = l.head_dim;
        if hd == 0 || hd > 256 || rope.rot_dim > hd || !rope.rot_dim.is_multiple_of(2) || rope.head_dim != hd {
            return Err(bad("qkv_rope", "head_dim 1..=256, rot_dim even and at most head_dim"));
        }
        if l.n_tok == 0 {
            return Err(bad("qkv_rope", "a plan for at least one token per step"));
        }
        if cfg.qk_norm != (inp.qw.is_some() && inp.kw.is_some()) || cfg.kv_write.is_some() != inp.cache.is_some() {
            return Err(bad("qkv_rope", "norm weights or cache do not match the variant"));
        }
        let kv = cfg.kv_write.is_some();
        // V heads in the grid: stored to the cache, or summed and written back.
        let v_heads = kv || parts.v_back;
        let extent = l.extent(v_heads).ok_or_else(|| bad("qkv_rope", "layout overflows"))?;
        let read = parts.off.checked_mul(parts.n as usize - 1).and_then(|o| extent.checked_add(o)).ok_or_else(|| bad("qkv_rope", "layout overflows"))?;
        if (read as u64) * 4 > inp.x.size {
            return Err(bad("qkv_rope", format!("x binding of {} bytes, the layout reads {read} f32", inp.x.size)));
        }
        if cfg.rope && freqs.size < (rope.rot_dim / 2 * 4) as u64 {
            return Err(bad("qkv_rope", "fewer inverse frequencies than rot_dim / 2"));
        }
        for w in [inp.qw, inp.kw].into_iter().flatten() {
            if w.size < (hd * 4) as u64 {
                return Err(bad("qkv_rope", format!("norm weight binding of {} bytes, needs {hd} f32", w.size)));
            }
        }
        let nh = l.n_q + l.n_kv + if v_heads { l.n_kv } else { 0 };
        if nh == 0 {
            return Err(bad("qkv_rope", "no heads"));
        }
        let max_dim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let nh32 = to_u32("heads", nh)?;
        let max_tok = to_u32("n_tok", l.n_tok)?;
        let wgs = l.n_tok as u64 * nh as u64;
        if grid_2d(wgs, max_dim).is_none() {
            return Err(OpsError::Numr(numr::NumrError::GridTooLarge { workgroups: wgs, limit: max_dim }));
        }
        let (pos_binding, pos_mode, pos_words) = match inp.positions {
            RopePositions::Step => (dummy(ctx)?, 0, None),
            RopePositions::Buffer(b) => (b.clone(), 1, Some(b.size / 4)),
        };
        let d = dummy(ctx)?;
        let qw = inp.qw.cloned().unwrap_or(d.clone());
        let kw = inp.kw.cloned().unwrap_or(d.clone());
        let env = env_of(ctx);
        let kernel = ctx.kernel(&cfg.source(&env))?;
        let base = |kc: &Binding, vc: &Binding| -> Result<PlanDispatch> {
            let b = [inp.x.clone(), pos_binding.clone(), freqs.clone(), qw.clone(), kw.clone(), kc.clone(), vc.clone()];
            let group = ctx.bind(&kernel, &b)?;
            Ok(PlanDispatch::new(&kernel, group, [0, 1, 1])?
                .set_usize("n_q", l.n_q)?
                .set_usize("n_kv", l.n_kv)?
                .set_usize("hd", hd)?
                .set_usize("rot", rope.rot_dim)?
                .set_usize("tok_stride", l.tok_stride)?
                .set_usize("x_off", l.x_off)?
                .set_usize("part_off", parts.off)?
                .set("parts", parts.n)?
                .set("nh", nh32)?
                .set("v_back", parts.v_back as u32)?
                .set_usize("q_off", l.q_off)?
                .set_usize("k_off", l.k_off)?
                .set_usize("v_off", l.v_off)?
                .set_f32("eps", inp.eps)?
                .set("pos_mode", pos_mode)?
                .per_step("pos0", |s| s.pos)?
                .per_step("pos_base", |s| s.token)?)
        };
        let grid = move |n: u32| grid_2d(n as u64 * nh32 as u64, max_dim).unwrap_or([0, 1, 1]);
        let mut plan = Plan::new();
        let capacity = match inp.cache {
            None => {
                // Unused cache bindings: buffers of their own (a read-write binding may not share a
                // buffer with the read-only weight dummies in one dispatch).
                let dd = base(&dummy(ctx)?, &dummy(ctx)?)?
                    .set("tok0", 0)?
                    .per_step("tok_end", move |s| s.n_tok.min(max_tok))?
                    .grid_per_step(move |s| grid(s.n_tok.min(max_tok)));
                plan.push(dd);
                None
            }
            Some((cache, layer)) => {
                let c = cache.config();
                if c.head_dim != hd || c.n_kv_heads != l.n_kv || Some(c.dtype) != cfg.kv_write {
                    let writes = cfg.kv_write.map_or_else(|| "nothing".to_string(), |d| format!("{d} rows"));
                    return Err(bad("qkv_rope", format!("the cache ({c}) does not match {} KV heads of head size {hd} (the variant writes {writes})", l.n_kv)));
                }
                let row_words = c.dtype.row_words(hd);
                for seg in cache.segments(layer)? {
                    let (start, len) = (to_u32("segment start", seg.start)?, to_u32("segment length", seg.len)?);
                    // Each token is transformed exactly once: this dispatch covers the tokens
                    // whose slots fall in this segment (none: skipped).
                    let range = move |s: &StepValues| seg_tokens(s.pos, s.n_tok.min(max_tok), start, len);
                    let dd = base(&Binding::whole(&seg.k), &Binding::whole(&seg.v))?
                        .set("seg_start", start)?
                        .set("seg_len", len)?
                        .set_usize("row_words", row_words)?
                        .per_step("tok0", move |s| range(s).0)?
                        .per_step("tok_end", move |s| range(s).1)?
                        .grid_per_step(move |s| {
                            let (t0, t1) = range(s);
                            grid(t1 - t0)
                        });
                    plan.push(dd);
                }
                Some(cache.capacity())
            }
        };
        Ok(QkvRopePlan { plan, max_tok, capacity, pos_words })
    }

    /// The most tokens one step may carry.
    pub fn max_tokens(&self) -> u32 {
        self.max_tok
    }
}

impl OpPlan for QkvRopePlan {
    /// Checks a step against what the plan was built for: at most the layout's tokens, the KV
    /// slots inside the cache ([`OpsError::ContextOverflow`]), the positions inside their buffer.
    fn check(&self, step: &StepValues) -> Result<()> {
        if step.n_tok > self.max_tok {
            return Err(bad("qkv_rope", format!("a step of {} tokens, the plan was built for {}", step.n_tok, self.max_tok)));
        }
        if let Some(cap) = self.capacity {
            let needed = step.pos as usize + step.n_tok as usize;
            if needed > cap {
                return Err(OpsError::ContextOverflow { needed, capacity: cap });
            }
        }
        if let Some(words) = self.pos_words.filter(|&w| step.token as u64 + step.n_tok as u64 > w) {
            return Err(bad("qkv_rope", format!("positions {}..{} of a buffer of {words}", step.token, step.token as u64 + step.n_tok as u64)));
        }
        Ok(())
    }

    /// The underlying plan (for appending into a larger one). It skips [`Self::check`]; its
    /// dispatches still stay in bounds (tokens clamped to the layout, slots outside a segment
    /// dropped), but a step the check refuses gives a wrong result there.
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

impl QkvRope {
    /// The eager op over the implicit stream. `x` is the packed activation binding (`layout`
    /// describes it); `positions` has one entry per token (uploaded here). With `kv_write`, K/V
    /// for `layer` go to slots `cache.reserve(n_tok)..`; the caller commits after all layers.
    /// Engines build a [`QkvRopePlan`] once instead.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        ctx: &GpuContext,
        x: &Binding,
        layout: &QkvLayout,
        rope: &RopeParams,
        positions: &[u32],
        qw: Option<&Binding>,
        kw: Option<&Binding>,
        eps: f32,
        cache: Option<(&KvCache, usize)>,
    ) -> Result<()> {
        if positions.len() != layout.n_tok {
            return Err(bad("qkv_rope", "one position per token"));
        }
        let pos = Binding::whole(&upload_u32(ctx, positions)?);
        let freqs = upload_u32(ctx, bytemuck::cast_slice(&rope.inv_freqs()))?;
        self.record(ctx, x, layout, rope, &pos, &Binding::whole(&freqs), qw, kw, eps, cache)
    }

    /// [`Self::run`] with the positions (`layout.n_tok` u32) and inverse frequencies already on
    /// the GPU.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        ctx: &GpuContext,
        x: &Binding,
        layout: &QkvLayout,
        rope: &RopeParams,
        pos: &Binding,
        freqs: &Binding,
        qw: Option<&Binding>,
        kw: Option<&Binding>,
        eps: f32,
        cache: Option<(&KvCache, usize)>,
    ) -> Result<()> {
        if layout.n_tok == 0 {
            return Ok(());
        }
        let slot0 = match cache {
            Some((c, _)) => c.reserve(layout.n_tok)?,
            None => 0,
        };
        let positions = RopePositions::Buffer(pos.clone());
        let inp = QkvRopeInputs { x, layout: *layout, rope, positions: &positions, qw, kw, eps, cache };
        let plan = QkvRopePlan::with_freqs(ctx, self, &inp, freqs)?;
        plan.run(ctx, &StepValues::chunk(to_u32("slot", slot0)?, plan.max_tok))
    }
}

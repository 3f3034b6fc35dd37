//! [`NormPlan`]: a norm built once (kernel, bind group, output) and recorded per step, with the
//! step's token count as its row count.

use crate::ops_common::OpPlan;
use numr::gpu::{GpuContext, Plan, PlanDispatch, StepValues};

use super::Norm;
use crate::ops_common::{GpuView, Result, bad, check_n_tok, dummy, env_of, mul, out_or_owned, step_grid, to_u32, vec4_lanes};

const OP: &str = "norm plan";

/// The buffers of a norm (f32 views).
#[derive(Clone, Debug)]
pub struct NormIo {
    /// Input rows, `[max_rows, n]`.
    pub x: GpuView,
    /// Weight, `[n]`.
    pub w: GpuView,
    /// Bias, `[n]` (variants with `bias`, else `None`).
    pub b: Option<GpuView>,
    /// The residual stream `[max_rows, n]`, read and updated in place to `x + residual`
    /// (variants with `residual`, else `None`).
    pub residual: Option<GpuView>,
    /// Where the normalised rows go (`[max_rows, n]`): an engine's activation buffer, or `None`
    /// for an output the plan owns ([`NormPlan::out`]). Not `x`'s buffer: a read-only and a
    /// read-write binding of one buffer conflict in a dispatch.
    pub out: Option<GpuView>,
}

/// A norm over `step.n_tok` rows of `n` (at most `max_rows`), eps fixed at build. Recording
/// creates no buffer and no bind group.
#[derive(Clone, Debug)]
pub struct NormPlan {
    plan: Plan,
    out: GpuView,
    max_rows: u32,
}

impl NormPlan {
    /// Builds the plan; every view is checked to hold what `max_rows` rows read or write
    /// (typed [`crate::ops_common::OpsError::BadArgs`] otherwise), and the bias / residual must be
    /// given exactly when the variant uses them.
    pub fn new(ctx: &GpuContext, cfg: &Norm, io: &NormIo, n: usize, max_rows: usize, eps: f32) -> Result<NormPlan> {
        Self::build(ctx, cfg, io, n, max_rows, eps, 1)
    }

    /// As [`NormPlan::new`] for a residual variant whose input `io.x` is `parts` partial sums of
    /// a GEMM split over K (`parts * max_rows * n` f32, partial `z` at element `z * max_rows *
    /// n`, as [`crate::quant::GemmPlan::with_split_k_partials`] writes them): each row's input
    /// is their sum in the order `((p0 + p1) + p2) + ...`, the order
    /// [`crate::quant::SplitSumPlan`] adds them in, so the residual stream and the output are
    /// the bits of that sum followed by [`NormPlan::new`], in one dispatch instead of two.
    /// 1 to [`crate::quant::split_sum::MAX_SPLITS`] parts, with `cfg.residual` (typed errors otherwise).
    pub fn with_partials(ctx: &GpuContext, cfg: &Norm, io: &NormIo, n: usize, max_rows: usize, eps: f32, parts: u32) -> Result<NormPlan> {
        if !(1..=crate::quant::split_sum::MAX_SPLITS).contains(&parts) || !cfg.residual {
            let most = crate::quant::split_sum::MAX_SPLITS;
            return Err(bad(OP, format!("{parts} partial sums into a norm with a residual: {} (1..={most} partials, a residual variant)", cfg.residual)));
        }
        Self::build(ctx, cfg, io, n, max_rows, eps, parts)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(ctx: &GpuContext, cfg: &Norm, io: &NormIo, n: usize, max_rows: usize, eps: f32, parts: u32) -> Result<NormPlan> {
        if n == 0 || max_rows == 0 {
            return Err(bad(OP, format!("rows of {n} and at most {max_rows} rows (both must be positive)")));
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad(OP, format!("eps {eps}")));
        }
        if cfg.bias != io.b.is_some() || cfg.residual != io.residual.is_some() {
            return Err(bad(
                OP,
                format!(
                    "bias given: {}, residual given: {}; the variant takes a bias: {}, a residual: {}",
                    io.b.is_some(),
                    io.residual.is_some(),
                    cfg.bias,
                    cfg.residual
                ),
            ));
        }
        let total = mul(OP, "max_rows x n", max_rows, n)?;
        io.x.need(OP, "x", mul(OP, "the partial sums", total, parts as usize)?)?;
        io.w.need(OP, "the weight", n)?;
        if let Some(b) = &io.b {
            b.need(OP, "the bias", n)?;
        }
        if let Some(r) = &io.residual {
            r.need(OP, "the residual", total)?;
        }
        let out = out_or_owned(ctx, OP, io.out.as_ref(), total)?;
        let (n32, max32) = (to_u32(OP, "n", n)?, to_u32(OP, "max_rows", max_rows)?);
        let (bb, bo) = match &io.b {
            Some(b) => (b.binding.clone(), b.offset_u32(OP)?),
            None => (dummy(ctx)?, 0),
        };
        let (rb, ro) = match &io.residual {
            Some(r) => (r.binding.clone(), r.offset_u32(OP)?),
            None => (dummy(ctx)?, 0),
        };
        let split_off = to_u32(OP, "partial sum elements", total)?;
        // Every index of the last partial fits u32.
        to_u32(OP, "x elements", mul(OP, "the partial sums", total, parts as usize)?)?;
        let offs = [io.x.offset_u32(OP)?, ro, out.offset_u32(OP)?, io.w.offset_u32(OP)?, bo, split_off];
        let l = vec4_lanes(n32, &offs);
        let [xo, ro, oo, wo, bo, so] = offs.map(|o| o / l);
        let env = env_of(ctx);
        let source = if parts > 1 { cfg.source_partials(&env, l == 4) } else { cfg.source_vec(&env, l == 4) };
        let kernel = ctx.kernel(&source)?;
        let group = ctx.bind(&kernel, &[io.x.binding.clone(), io.w.binding.clone(), bb, rb, out.binding.clone()])?;
        let grid = step_grid(ctx, max_rows as u64, 1, move |s| s.n_tok.min(max32) as u64)?;
        let mut d = PlanDispatch::new(&kernel, group, [1, 1, 1])?
            .set("n", n32 / l)?
            .set_f32("eps", eps)?
            .set("x_off", xo)?
            .set("x_stride", n32 / l)?
            .set("res_off", ro)?
            .set("res_stride", n32 / l)?
            .set("out_off", oo)?
            .set("out_stride", n32 / l)?
            .set("w_off", wo)?
            .set("b_off", bo)?
            .per_step("rows", move |s| s.n_tok.min(max32))?
            .grid_per_step(grid);
        if parts > 1 {
            d = d.set("parts", parts)?.set("split_off", so)?;
        }
        Ok(NormPlan { plan: Plan::from(d), out, max_rows: max32 })
    }

    /// The output rows (`[max_rows, n]` f32; a step writes its first `n_tok` rows).
    pub fn out(&self) -> &GpuView {
        &self.out
    }

    /// The most rows one step may carry (`step.n_tok`), as built.
    pub fn max_rows(&self) -> usize {
        self.max_rows as usize
    }
}

impl OpPlan for NormPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_n_tok(OP, step, self.max_rows)
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

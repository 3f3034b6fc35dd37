//! [`SplitSumPlan`]: the partial sums of a GEMM split over K ([`super::GemmPlan::with_split_k`])
//! added up, in a fixed order, into the GEMM's output (plain or its columns of a wider row).
//!
//! Partial `z` of row `r`, column `c` is at `partials[z * split_off + r * n + c]`; the sum is
//! `((p0 + p1) + p2) + ...`, the same order in every step, so a row's result does not depend
//! on which rows share its step ([`super::GemmPlan::with_split_k_sum`]).

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, Recorder, StepValues, grid_2d};

use super::gemv_output::{GemvOutput, out_cols};
use super::kernel_common::grid_for;
use super::validate::{check_binding, check_step, mul, step_rows, to_u32};
use super::{QuantError, Result};

/// Invocations per workgroup; each sums one output.
const WG: u32 = 256;

/// The most partial sums a plan adds (as [`super::GemmPlan::with_split_k`] allows).
pub const MAX_SPLITS: u32 = 8;

/// The kernel: `y[r * stride + offset + c] = sum_z partials[z * split_off + r * n + c]` for the
/// step's `total = m * n` outputs, `splits` partials added from the first.
pub fn split_sum_source(env: &KernelEnv) -> KernelSource {
    KernelBuilder::new("split_sum", *env)
        .workgroup(WG, 1, 1)
        .storage("parts", Access::Read, "array<f32>")
        .storage("y", Access::ReadWrite, "array<f32>")
        .params(&["total", "n", "stride", "offset", "split_off", "splits"])
        .body(
            "    let i = wg_linear * 256u + lidx;
    if (i < p.total) {
        var s = parts[i];
        for (var z = 1u; z < p.splits; z++) {
            s += parts[z * p.split_off + i];
        }
        let r = i / p.n;
        y[r * p.stride + p.offset + (i - r * p.n)] = s;
    }
",
        )
        .build()
}

/// Rows `0..step.n_tok` of `splits` partial sums (each `max_m x n` f32, `max_m * n` elements
/// apart in `partials`) added into `output` ([`GemvOutput::Single`] or
/// [`GemvOutput::Columns`]), built once for at most `max_m` rows (a larger step is
/// [`QuantError::StepTooLarge`]; a step of none records an empty grid).
#[derive(Clone, Debug)]
pub struct SplitSumPlan {
    plan: Plan,
    max_m: usize,
}

impl SplitSumPlan {
    /// Validates the bindings (a short one is [`QuantError::BufferTooSmall`] naming it), the
    /// output (not [`GemvOutput::Qkv`]), `n > 0` and `1..=`[`MAX_SPLITS`] splits.
    pub fn new(ctx: &GpuContext, partials: &Binding, output: &GemvOutput, max_m: usize, n: usize, splits: u32) -> Result<SplitSumPlan> {
        const OP: &str = "split_sum";
        if n == 0 || max_m == 0 || !(1..=MAX_SPLITS).contains(&splits) {
            return Err(QuantError::Shape {
                what: OP,
                reason: format!("{splits} partials of {max_m} x {n} (at least one row and column, 1..={MAX_SPLITS} partials)"),
            });
        }
        let (ys, _) = output.checked(OP, false, max_m, n)?;
        let split_off = mul("partial elements", max_m, n)?;
        check_binding(OP, "partials", partials, mul("partials elements", split_off, splits as usize)?, 4)?;
        let (stride, offset) = out_cols(output, n);
        let kernel = ctx.kernel(&split_sum_source(&KernelEnv::from_caps(ctx.capabilities())))?;
        // The largest step's grid must fit; smaller ones then do too.
        grid_for(ctx, split_off.div_ceil(WG as usize))?;
        let (max, n32) = (to_u32("split sum rows", max_m)?, to_u32("split sum columns", n)?);
        // Every index is below `split_off * splits` or `max_m * stride`, so these fit too.
        to_u32("split sum elements", mul("partials elements", split_off, splits as usize)?.max(mul("y elements", max_m, stride)?))?;
        let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let group = ctx.bind(&kernel, &[partials.clone(), ys[0].clone()])?;
        let d = PlanDispatch::new(&kernel, group, [0, 1, 1])?
            .set_usize("n", n)?
            .set_usize("stride", stride)?
            .set_usize("offset", offset)?
            .set_usize("split_off", split_off)?
            .set_usize("splits", splits as usize)?
            .per_step("total", move |s| step_rows(s, max) * n32)?
            .grid_per_step(move |s| grid_2d((step_rows(s, max) * n32).div_ceil(WG) as u64, limit).unwrap_or([0, 0, 0]));
        Ok(SplitSumPlan { plan: Plan::from(d), max_m })
    }

    /// The dispatch, for an engine to append to its own plan (its row count is `step.n_tok`,
    /// clamped to `max_m`).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the sums of `step.n_tok` rows.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        check_step("split_sum", step, self.max_m)?;
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        check_step("split_sum", step, self.max_m)?;
        Ok(self.plan.run(ctx, step)?)
    }
}

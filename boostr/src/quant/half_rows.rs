//! [`HalfRowsPlan`]: the step's rows of an f32 activation matrix rounded to f16, for a GEMM
//! that reads f16 activations ([`super::QuantGemm::x_f16`]).
//!
//! The coopmat GEMM rounds its f32 activations to f16 as it stages them, in every workgroup of
//! every column block: at Llama-3-8B's shapes and 512 rows, each activation row is read 32 to
//! 224 times, four bytes at a time. Rounded once here, the GEMM reads two bytes a value. The
//! rounding is the same WGSL conversion (`vec4<f16>(vec4<f32>)`) the GEMM applies, so the
//! product is the same.

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, Recorder, StepValues, grid_2d};

use super::kernel_common::grid_for;
use super::validate::{check_binding, check_step, mul, step_rows, to_u32};
use super::{QuantError, Result};

/// Invocations per workgroup; each converts one `vec4`.
const WG: u32 = 256;

/// The kernel: `y[i] = vec4<f16>(x[i])` for the step's `n4` vec4s. Needs `env.f16`.
pub fn half_rows_source(env: &KernelEnv) -> Result<KernelSource> {
    if !env.f16 {
        return Err(QuantError::Config { what: "f16 rows", reason: "needs f16".into() });
    }
    Ok(KernelBuilder::new("half_rows", *env)
        .enable_f16()
        .workgroup(WG, 1, 1)
        .storage("x", Access::Read, "array<vec4<f32>>")
        .storage("y", Access::ReadWrite, "array<vec4<f16>>")
        .params(&["n4"])
        .body("    let i = wg_linear * 256u + lidx;\n    if (i < p.n4) { y[i] = vec4<f16>(x[i]); }\n")
        .build())
}

/// Rows `0..step.n_tok` of `x` (`max_m x k` f32, row-major) rounded to f16 into `y` (`max_m x
/// k` f16), built once for at most `max_m` rows (a larger step is
/// [`QuantError::StepTooLarge`]; a step of none records an empty grid).
#[derive(Clone, Debug)]
pub struct HalfRowsPlan {
    plan: Plan,
    max_m: usize,
}

impl HalfRowsPlan {
    /// Validates both bindings (a short one is [`QuantError::BufferTooSmall`] naming it), `k`
    /// (a positive multiple of 4) and the adapter (shader-f16, [`QuantError::Unsupported`]).
    pub fn new(ctx: &GpuContext, x: &Binding, y: &Binding, max_m: usize, k: usize) -> Result<HalfRowsPlan> {
        Self::build(ctx, x, y, max_m, k, false)
    }

    /// As [`HalfRowsPlan::new`], for the input of a [`super::GemmPlan::beside_decode_rows`]:
    /// a step of decode rows only ([`StepValues::decode_rows`]) records an empty grid, as that
    /// GEMM does.
    pub fn beside_decode_rows(ctx: &GpuContext, x: &Binding, y: &Binding, max_m: usize, k: usize) -> Result<HalfRowsPlan> {
        Self::build(ctx, x, y, max_m, k, true)
    }

    fn build(ctx: &GpuContext, x: &Binding, y: &Binding, max_m: usize, k: usize, skip_decode_only: bool) -> Result<HalfRowsPlan> {
        const OP: &str = "half_rows";
        if k == 0 || !k.is_multiple_of(4) || max_m == 0 {
            return Err(QuantError::Shape { what: OP, reason: format!("{max_m} rows of {k} values (k a positive multiple of 4, at least one row)") });
        }
        if !ctx.capabilities().shader_f16 {
            return Err(QuantError::Unsupported { name: OP.into(), reason: "f16 rows need the adapter's shader-f16 feature".into() });
        }
        let elems = mul("f16 rows elements", max_m, k)?;
        check_binding(OP, "x", x, elems, 4)?;
        check_binding(OP, "y", y, elems, 2)?;
        let kernel = ctx.kernel(&half_rows_source(&KernelEnv::from_caps(ctx.capabilities()))?)?;
        // The largest step's grid must fit; smaller ones then do too.
        grid_for(ctx, (elems / 4).div_ceil(WG as usize))?;
        let (max, k4) = (to_u32("f16 rows", max_m)?, to_u32("f16 row vec4s", k / 4)?);
        let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let group = ctx.bind(&kernel, &[x.clone(), y.clone()])?;
        let d = PlanDispatch::new(&kernel, group, [0, 1, 1])?.per_step("n4", move |s| step_rows(s, max) * k4)?.grid_per_step(move |s| {
            if skip_decode_only && s.decode_rows >= s.n_tok {
                return [0, 0, 0];
            }
            grid_2d((step_rows(s, max) * k4).div_ceil(WG) as u64, limit).unwrap_or([0, 0, 0])
        });
        Ok(HalfRowsPlan { plan: Plan::from(d), max_m })
    }

    /// The dispatch, for an engine to append to its own plan (its row count is `step.n_tok`,
    /// clamped to `max_m`).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Records the rounding of `step.n_tok` rows.
    pub fn record(&self, rec: &mut Recorder, step: &StepValues) -> Result<()> {
        check_step("half_rows", step, self.max_m)?;
        Ok(self.plan.record(rec, step)?)
    }

    /// Records into the context's implicit stream (the eager path).
    pub fn run(&self, ctx: &GpuContext, step: &StepValues) -> Result<()> {
        check_step("half_rows", step, self.max_m)?;
        Ok(self.plan.run(ctx, step)?)
    }
}

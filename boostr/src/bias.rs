//! [`BiasPlan`]: `x[r][i] += b[i]` in place over `step.n_tok` rows of `n` (a projection's bias,
//! such as Qwen2's packed Q/K/V bias), built once and recorded per step; [`bias_reference`] is the
//! CPU reference.

use crate::ops_common::OpPlan;
use numr::gpu::{Access, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch, StepValues};

use crate::ops_common::{GpuView, Result, bad, check_n_tok, env_of, mul, step_grid, to_u32};

const OP: &str = "bias plan";

/// The kernel: one invocation per element, 256 per workgroup.
pub fn bias_source(env: &KernelEnv) -> KernelSource {
    KernelBuilder::new("bias_add", *env)
        .workgroup(256, 1, 1)
        .storage("x", Access::ReadWrite, "array<f32>")
        .storage("b", Access::Read, "array<f32>")
        .params(&["n", "total", "x_off", "b_off"])
        .body(
            "    let i = wg_linear * 256u + lidx;
    if (i >= p.total) { return; }
    x[p.x_off + i] = x[p.x_off + i] + b[p.b_off + i % p.n];
",
        )
        .build()
}

/// The CPU reference: `x[r * n + i] += b[i]` for every row of `x`.
pub fn bias_reference(x: &mut [f32], b: &[f32]) {
    if b.is_empty() {
        return;
    }
    for row in x.chunks_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
    }
}

/// `x += b` over `step.n_tok` rows of `n` (at most `max_rows`), in place.
#[derive(Clone, Debug)]
pub struct BiasPlan {
    plan: Plan,
    max_rows: u32,
}

impl BiasPlan {
    /// Builds the plan; `x` must hold `max_rows` rows of `n`, `b` `n` values.
    pub fn new(ctx: &GpuContext, x: &GpuView, b: &GpuView, n: usize, max_rows: usize) -> Result<BiasPlan> {
        if n == 0 || max_rows == 0 {
            return Err(bad(OP, format!("rows of {n} and at most {max_rows} rows (both must be positive)")));
        }
        let total = mul(OP, "max_rows x n", max_rows, n)?;
        x.need(OP, "x", total)?;
        b.need(OP, "the bias", n)?;
        let (n32, max32) = (to_u32(OP, "n", n)?, to_u32(OP, "max_rows", max_rows)?);
        to_u32(OP, "max_rows x n", total)?;
        let kernel = ctx.kernel(&bias_source(&env_of(ctx)))?;
        let group = ctx.bind(&kernel, &[x.binding.clone(), b.binding.clone()])?;
        let grid = step_grid(ctx, total as u64, 256, move |s| s.n_tok.min(max32) as u64 * n32 as u64)?;
        let d = PlanDispatch::new(&kernel, group, [1, 1, 1])?
            .set("n", n32)?
            .set("x_off", x.offset_u32(OP)?)?
            .set("b_off", b.offset_u32(OP)?)?
            // At most max_rows * n, which fits 32 bits (checked above).
            .per_step("total", move |s| s.n_tok.min(max32) * n32)?
            .grid_per_step(grid);
        Ok(BiasPlan { plan: Plan::from(d), max_rows: max32 })
    }
}

impl OpPlan for BiasPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_n_tok(OP, step, self.max_rows)
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

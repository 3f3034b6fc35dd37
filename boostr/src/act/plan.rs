//! [`ActPlan`]: an activation or GLU built once and recorded per step over `step.n_tok` rows.

use crate::ops_common::OpPlan;
use numr::gpu::{GpuContext, Plan, PlanDispatch, StepValues};

use super::{Act, GluInput};
use crate::ops_common::{GpuView, Result, bad, check_n_tok, dummy, env_of, mul, out_or_owned, step_grid, to_u32, vec4_lanes};

const OP: &str = "act plan";

/// The buffers of an activation (f32 views).
#[derive(Clone, Debug)]
pub struct ActIo {
    /// Input rows: `[max_rows, n]`, or `[max_rows, 2n]` (`[gate | up]`) when packed.
    pub a: GpuView,
    /// The up rows `[max_rows, n]` of a two-tensor GLU (else `None`).
    pub b: Option<GpuView>,
    /// Output rows `[max_rows, n]`, or `None` for an output the plan owns ([`ActPlan::out`]).
    /// Not an input's buffer (a read-only and a read-write binding of one buffer conflict).
    pub out: Option<GpuView>,
}

/// `act(a)` or `act(gate) * up` over `step.n_tok` rows of `n` outputs (at most `max_rows`).
#[derive(Clone, Debug)]
pub struct ActPlan {
    plan: Plan,
    out: GpuView,
    max_rows: u32,
}

impl ActPlan {
    /// Builds the plan; every view is checked to hold `max_rows` rows.
    pub fn new(ctx: &GpuContext, cfg: &Act, io: &ActIo, n: usize, max_rows: usize) -> Result<ActPlan> {
        if n == 0 || max_rows == 0 {
            return Err(bad(OP, format!("rows of {n} and at most {max_rows} rows (both must be positive)")));
        }
        if (cfg.input == GluInput::TwoTensors) != io.b.is_some() {
            return Err(bad(OP, format!("up view given: {}; the variant takes one: {}", io.b.is_some(), cfg.input == GluInput::TwoTensors)));
        }
        let w = cfg.input_width(n);
        let total = mul(OP, "max_rows x n", max_rows, n)?;
        io.a.need(OP, "the input", mul(OP, "max_rows x input width", max_rows, w)?)?;
        if let Some(b) = &io.b {
            b.need(OP, "the up input", total)?;
        }
        let out = out_or_owned(ctx, OP, io.out.as_ref(), total)?;
        let (n32, w32, max32) = (to_u32(OP, "n", n)?, to_u32(OP, "input width", w)?, to_u32(OP, "max_rows", max_rows)?);
        to_u32(OP, "max_rows x n", total)?;
        let (bb, bo) = match &io.b {
            Some(b) => (b.binding.clone(), b.offset_u32(OP)?),
            None => (dummy(ctx)?, 0),
        };
        let offs = [io.a.offset_u32(OP)?, bo, out.offset_u32(OP)?];
        let l = vec4_lanes(n32, &offs);
        let ([ao, bo, oo], n32, w32) = (offs.map(|o| o / l), n32 / l, w32 / l);
        let kernel = ctx.kernel(&cfg.source_vec(&env_of(ctx), l == 4))?;
        let group = ctx.bind(&kernel, &[io.a.binding.clone(), bb, out.binding.clone()])?;
        let grid = step_grid(ctx, total as u64 / l as u64, 256, move |s| s.n_tok.min(max32) as u64 * n32 as u64)?;
        let d = PlanDispatch::new(&kernel, group, [1, 1, 1])?
            .set("n", n32)?
            .set("a_off", ao)?
            .set("a_stride", w32)?
            .set("b_off", bo)?
            .set("b_stride", n32)?
            .set("out_off", oo)?
            // At most max_rows * n, which fits 32 bits (checked above).
            .per_step("total", move |s| s.n_tok.min(max32) * n32)?
            .grid_per_step(grid);
        Ok(ActPlan { plan: Plan::from(d), out, max_rows: max32 })
    }

    /// The output rows (`[max_rows, n]` f32).
    pub fn out(&self) -> &GpuView {
        &self.out
    }

    /// The most rows one step may carry (`step.n_tok`), as built.
    pub fn max_rows(&self) -> usize {
        self.max_rows as usize
    }
}

impl OpPlan for ActPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_n_tok(OP, step, self.max_rows)
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

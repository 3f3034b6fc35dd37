//! [`ShortConvPlan`]: the short conv built once, with its rolling state, recorded per step.

use crate::ops_common::OpPlan;
use numr::gpu::{GpuContext, Plan, PlanDispatch, StepValues};

use super::ShortConv;
use crate::ops_common::{GpuView, Result, bad, check_n_tok, env_of, mul, out_or_owned, step_grid, to_u32};

const OP: &str = "short conv plan";

/// The buffers of a short conv (f32 views).
#[derive(Clone, Debug)]
pub struct ShortConvIo {
    /// The input projection's rows `[max_tok, 3 * ch]` (`[B | C | x]`).
    pub bcx: GpuView,
    /// Weight `[ch, kernel]`.
    pub w: GpuView,
    /// The ring of `Bx` rows `[ring, ch]` (see the module docs), or `None` for one the plan owns.
    pub state: Option<GpuView>,
    /// Output rows `[max_tok, ch]`, or `None` for an output the plan owns.
    pub out: Option<GpuView>,
}

/// The short conv of `step.n_tok` tokens (at most `max_tok`) at positions `step.pos ..` against
/// the ring of earlier `Bx` rows, which the same dispatch advances: recording steps of 5, 1, 1
/// tokens gives what one step of 7 gives, and a step may re-run positions the ring still holds.
#[derive(Clone, Debug)]
pub struct ShortConvPlan {
    plan: Plan,
    state: GpuView,
    out: GpuView,
    max_tok: u32,
    ring: u32,
}

impl ShortConvPlan {
    /// Builds the plan over `ch` channels with a ring of `ring` rows (at least `kernel - 1`; more
    /// rows allow rolling back further); every view is checked to hold its extent.
    pub fn new(ctx: &GpuContext, cfg: &ShortConv, io: &ShortConvIo, ch: usize, max_tok: usize, ring: usize) -> Result<ShortConvPlan> {
        cfg.check()?;
        if ch == 0 || max_tok == 0 {
            return Err(bad(OP, format!("{ch} channels and at most {max_tok} tokens (both must be positive)")));
        }
        if ring < cfg.kernel as usize - 1 {
            return Err(bad(OP, format!("a ring of {ring} rows for {} taps (at least {} rows)", cfg.kernel, cfg.kernel - 1)));
        }
        let k = cfg.kernel as usize;
        io.bcx.need(OP, "bcx", mul(OP, "max_tok x 3 ch", max_tok, mul(OP, "3 ch", 3, ch)?)?)?;
        io.w.need(OP, "the weight", mul(OP, "ch x kernel", ch, k)?)?;
        let state = out_or_owned(ctx, OP, io.state.as_ref(), mul(OP, "ring x ch", ring, ch)?)?;
        let out = out_or_owned(ctx, OP, io.out.as_ref(), mul(OP, "max_tok x ch", max_tok, ch)?)?;
        let (ch32, max32, ring32) = (to_u32(OP, "ch", ch)?, to_u32(OP, "max_tok", max_tok)?, to_u32(OP, "ring", ring)?);
        let km1_32 = cfg.kernel - 1;
        // Invocations: ch owners, and one per output after the first kernel - 1 tokens.
        let threads = move |n_tok: u32| ch32 as u64 * (1 + n_tok.saturating_sub(km1_32) as u64);
        to_u32(OP, "the largest step's invocations", threads(max32) as usize)?;
        let kernel = ctx.kernel(&cfg.source(&env_of(ctx)))?;
        let group = ctx.bind(&kernel, &[io.bcx.binding.clone(), io.w.binding.clone(), state.binding.clone(), out.binding.clone()])?;
        let base = PlanDispatch::new(&kernel, group, [1, 1, 1])?
            .set("ch", ch32)?
            .set("ring", ring32)?
            .set("in_off", io.bcx.offset_u32(OP)?)?
            .set("in_stride", 3 * ch32)?
            .set("w_off", io.w.offset_u32(OP)?)?
            .set("s_off", state.offset_u32(OP)?)?
            .set("out_off", out.offset_u32(OP)?)?;
        let grid = step_grid(ctx, threads(max32), 256, move |s| if s.n_tok == 0 { 0 } else { threads(s.n_tok.min(max32)) })?;
        let step = base.per_step("n_tok", move |s| s.n_tok.min(max32))?.per_step("pos", |s| s.pos)?.grid_per_step(grid);
        Ok(ShortConvPlan { plan: Plan::from(step), state, out, max_tok: max32, ring: ring32 })
    }

    /// The ring (`[ring, ch]` f32: the row of position `p` at `p % ring`).
    pub fn state(&self) -> &GpuView {
        &self.state
    }

    /// Rows of the ring.
    pub fn ring(&self) -> usize {
        self.ring as usize
    }

    /// The output rows (`[max_tok, ch]` f32).
    pub fn out(&self) -> &GpuView {
        &self.out
    }

    /// The most tokens one step may carry (`step.n_tok`), as built.
    pub fn max_tok(&self) -> usize {
        self.max_tok as usize
    }
}

impl OpPlan for ShortConvPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_n_tok(OP, step, self.max_tok)
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }
}

//! [`EmbeddingPlan`]: the gather built once over a GPU id buffer, recorded per step.

use crate::ops_common::OpPlan;
use numr::gpu::{GpuContext, Plan, StepValues};

use super::GpuEmbedding;
use super::matrix::{GatherArgs, matrix_plan};
use crate::ops_common::{GpuView, Result, bad, check_n_tok, env_of, mul, out_or_owned, to_u32};

const OP: &str = "embedding plan";

/// Gathers `step.n_tok` rows (at most `max_tok`) of a [`GpuEmbedding`] whose ids are
/// `ids[step.token .. step.token + step.n_tok]` of a GPU buffer of u32, times `scale`, into rows
/// `0 .. n_tok` of the output. One dispatch per part of the table. A row whose id is at or past the
/// vocabulary, or whose slot lies past the end of `ids`, becomes zeros (see the module docs).
#[derive(Clone, Debug)]
pub struct EmbeddingPlan {
    plan: Plan,
    out: GpuView,
    max_tok: u32,
    id_slots: usize,
}

impl EmbeddingPlan {
    /// Builds the plan: `ids` is the id buffer (u32 words, read from `step.token`), `out` the
    /// output rows `[max_tok, cols]` f32 (`None`: owned by the plan). The plan keeps the table's
    /// buffers alive.
    pub fn new(ctx: &GpuContext, table: &GpuEmbedding, ids: &GpuView, max_tok: usize, scale: f32, out: Option<GpuView>) -> Result<EmbeddingPlan> {
        if max_tok == 0 {
            return Err(bad(OP, "at most 0 tokens"));
        }
        if ids.words() == 0 {
            return Err(bad(OP, "an empty id buffer"));
        }
        ids.need(OP, "the id buffer", ids.words())?;
        let total = mul(OP, "max_tok x cols", max_tok, table.cols())?;
        let out = out_or_owned(ctx, OP, out.as_ref(), total)?;
        let max32 = to_u32(OP, "max_tok", max_tok)?;
        to_u32(OP, "max_tok x cols", total)?;
        let id_end = to_u32(OP, "end of the id buffer", ids.offset + ids.words())?;
        let plan = matrix_plan(ctx, table.matrix(), GatherArgs { ids, id_end, out: &out, max_tok: max32, scale }, &env_of(ctx))?;
        Ok(EmbeddingPlan { plan, out, max_tok: max32, id_slots: ids.words() })
    }

    /// The output rows (`[max_tok, cols]` f32).
    pub fn out(&self) -> &GpuView {
        &self.out
    }

    /// The most tokens one step may carry (`step.n_tok`), as built.
    pub fn max_tok(&self) -> usize {
        self.max_tok as usize
    }
}

impl OpPlan for EmbeddingPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_n_tok(OP, step, self.max_tok)?;
        if step.token as usize + step.n_tok as usize > self.id_slots {
            return Err(bad(OP, format!("ids {}..{} past the id buffer of {}", step.token, step.token as usize + step.n_tok as usize, self.id_slots)));
        }
        Ok(())
    }

    /// The underlying plan (recorded directly, steps are clamped to `max_tok`; slots past the id
    /// buffer give zero rows).
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

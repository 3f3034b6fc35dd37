//! [`ArgmaxPlan`] and [`TopKPlan`]: built once over a logits view, recorded per step, writing at
//! the step's token slot of GPU buffers.

use crate::ops_common::OpPlan;
use numr::gpu::{Binding, GpuContext, Plan, PlanDispatch, StepValues};

use super::{ARGMAX_PER_WG, Argmax, MAX_TOP_K, SORT_N, TopK};
use crate::ops_common::{GpuView, Result, bad, dummy, env_of, mul, out_or_owned, owned, to_u32};

fn check_slot(op: &'static str, step: &StepValues, slots: usize) -> Result<()> {
    if step.token as usize >= slots {
        return Err(bad(op, format!("slot {} of a buffer of {slots} slots", step.token)));
    }
    Ok(())
}

/// Argmax of `n` logits (ties: the lowest index) written as a u32 into `ids[step.token]`, and
/// the winning logit into [`ArgmaxPlan::values`]`[step.token]`. One or two dispatches.
#[derive(Clone, Debug)]
pub struct ArgmaxPlan {
    plan: Plan,
    ids: GpuView,
    values: GpuView,
    slots: usize,
}

impl ArgmaxPlan {
    /// Builds the plan over `logits` (`n` f32). `ids` is the u32 buffer the winners go to (for
    /// example the id buffer an [`crate::embedding::EmbeddingPlan`] reads), holding at least
    /// `slots` words; `None`: the plan owns one of `slots` words. The values buffer (`slots` f32)
    /// and the partials are owned, made here.
    pub fn new(ctx: &GpuContext, logits: &GpuView, n: usize, ids: Option<GpuView>, slots: usize) -> Result<ArgmaxPlan> {
        const OP: &str = "argmax plan";
        if n == 0 || slots == 0 {
            return Err(bad(OP, format!("{n} logits and {slots} output slots (both must be positive)")));
        }
        logits.need(OP, "the logits", n)?;
        let ids = out_or_owned(ctx, OP, ids.as_ref(), slots)?;
        let values = owned(ctx, slots)?;
        let n32 = to_u32(OP, "n", n)?;
        let nwg = n32.div_ceil(ARGMAX_PER_WG);
        let (idx_off, val_off) = (ids.offset_u32(OP)?, values.offset_u32(OP)?);
        let env = env_of(ctx);
        let first = ctx.kernel(&Argmax { first: true }.source(&env))?;
        let mut plan = Plan::new();
        let slot = move |off: u32| move |s: &StepValues| off.saturating_add(s.token);
        let in_off = logits.offset_u32(OP)?;
        if nwg == 1 {
            let g = ctx.bind(&first, &[logits.binding.clone(), dummy(ctx)?, values.binding.clone(), ids.binding.clone()])?;
            let d = PlanDispatch::new(&first, g, [1, 1, 1])?
                .set("n", n32)?
                .set("per_wg", ARGMAX_PER_WG)?
                .set("in_off", in_off)?
                .set("wg_per_row", 1)?
                .set("n_rows", 1)?;
            plan.push(d.per_step("outv_off", slot(val_off))?.per_step("outi_off", slot(idx_off))?);
        } else {
            let (pv, pi) = (owned(ctx, nwg as usize)?, owned(ctx, nwg as usize)?);
            let g = ctx.bind(&first, &[logits.binding.clone(), dummy(ctx)?, pv.binding.clone(), pi.binding.clone()])?;
            let grid = crate::ops_common::grid_for(ctx, nwg as u64)?;
            plan.push(
                PlanDispatch::new(&first, g, grid)?
                    .set("n", n32)?
                    .set("per_wg", ARGMAX_PER_WG)?
                    .set("in_off", in_off)?
                    .set("wg_per_row", nwg)?
                    .set("n_rows", 1)?,
            );
            let second = ctx.kernel(&Argmax { first: false }.source(&env))?;
            let g = ctx.bind(&second, &[pv.binding, pi.binding, values.binding.clone(), ids.binding.clone()])?;
            let d = PlanDispatch::new(&second, g, [1, 1, 1])?.set("n", nwg)?.set("per_wg", nwg)?.set("wg_per_row", 1)?.set("n_rows", 1)?;
            plan.push(d.per_step("outv_off", slot(val_off))?.per_step("outi_off", slot(idx_off))?);
        }
        Ok(ArgmaxPlan { plan, ids, values, slots })
    }

    /// Argmax of each of a step's rows of `logits` (`max_rows` rows of `n` f32 one after
    /// another): row `r < step.n_tok` writes its winner to `ids[r]` and its logit to
    /// [`ArgmaxPlan::values`]`[r]` (ties: the lowest index, as [`Self::new`]). Two dispatches,
    /// whatever the rows; `ids` as in [`Self::new`] with `max_rows` slots.
    pub fn rows(ctx: &GpuContext, logits: &GpuView, n: usize, max_rows: usize, ids: Option<GpuView>) -> Result<ArgmaxPlan> {
        const OP: &str = "argmax rows plan";
        if n == 0 || max_rows == 0 {
            return Err(bad(OP, format!("{n} logits and {max_rows} rows (both must be positive)")));
        }
        logits.need(OP, "the logits", mul(OP, "logits", n, max_rows)?)?;
        let ids = out_or_owned(ctx, OP, ids.as_ref(), max_rows)?;
        let values = owned(ctx, max_rows)?;
        let (n32, rows32) = (to_u32(OP, "n", n)?, to_u32(OP, "rows", max_rows)?);
        let nwg = n32.div_ceil(ARGMAX_PER_WG);
        let (idx_off, val_off, in_off) = (ids.offset_u32(OP)?, values.offset_u32(OP)?, logits.offset_u32(OP)?);
        let env = env_of(ctx);
        let first = ctx.kernel(&Argmax { first: true }.source(&env))?;
        let second = ctx.kernel(&Argmax { first: false }.source(&env))?;
        let (pv, pi) = (owned(ctx, mul(OP, "partials", nwg as usize, max_rows)?)?, owned(ctx, mul(OP, "partials", nwg as usize, max_rows)?)?);
        let rows = move |s: &StepValues| s.n_tok.min(rows32);
        let mut plan = Plan::new();
        let g = ctx.bind(&first, &[logits.binding.clone(), dummy(ctx)?, pv.binding.clone(), pi.binding.clone()])?;
        let d = PlanDispatch::new(&first, g, [1, 1, 1])?
            .set("n", n32)?
            .set("per_wg", ARGMAX_PER_WG)?
            .set("in_off", in_off)?
            .set("wg_per_row", nwg)?
            .set("in_row", n32)?
            .set("out_row", nwg)?
            .per_step("n_rows", rows)?;
        let max_dim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        plan.push(d.grid_per_step(move |s| {
            let total = rows(s) * nwg;
            let x = total.min(max_dim);
            [x, total.div_ceil(x.max(1)), 1]
        }));
        let g = ctx.bind(&second, &[pv.binding, pi.binding, values.binding.clone(), ids.binding.clone()])?;
        let d = PlanDispatch::new(&second, g, [1, 1, 1])?
            .set("n", nwg)?
            .set("per_wg", nwg)?
            .set("wg_per_row", 1)?
            .set("in_row", nwg)?
            .set("out_row", 1)?
            .set("outv_off", val_off)?
            .set("outi_off", idx_off)?
            .per_step("n_rows", rows)?;
        plan.push(d.grid_per_step(move |s| [rows(s), 1, 1]));
        Ok(ArgmaxPlan { plan, ids, values, slots: max_rows })
    }

    /// The u32 winners, one per slot.
    pub fn ids(&self) -> &GpuView {
        &self.ids
    }

    /// The winning logits (f32), one per slot.
    pub fn values(&self) -> &GpuView {
        &self.values
    }

    /// Output slots; a step writes slot `step.token` (which must be below this).
    pub fn slots(&self) -> usize {
        self.slots
    }
}

impl OpPlan for ArgmaxPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_slot("argmax plan", step, self.slots)
    }

    /// The underlying plan (recorded directly, a slot past the buffers is not checked: the
    /// kernel's writes stay bounded by the bindings, but land in the wrong place).
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

/// The `k` largest `logits / temperature` of `n` logits with their ids, best first (ties: the
/// lower id), written at `ids[step.token * k ..]` and `values[step.token * k ..]`. Every round's
/// scratch is made at build.
#[derive(Clone, Debug)]
pub struct TopKPlan {
    plan: Plan,
    ids: GpuView,
    values: GpuView,
    k: usize,
    slots: usize,
}

/// The rounds of a top-k over `n` values: `(input length, workgroups)` each, every workgroup
/// keeping `k` of its `SORT_N`, until one workgroup is left.
fn top_k_rounds(n: u32, k: u32) -> Vec<(u32, u32)> {
    let mut rounds = Vec::new();
    let mut len = n;
    loop {
        let nwg = len.div_ceil(SORT_N);
        rounds.push((len, nwg));
        if nwg == 1 {
            return rounds;
        }
        len = nwg * k;
    }
}

impl TopKPlan {
    /// Builds the plan. `k` in `1..=min(MAX_TOP_K, n)`, `temperature > 0`; `out` = `(ids,
    /// values)` views of at least `slots * k` words each (u32, f32), or `None`: owned.
    pub fn new(ctx: &GpuContext, logits: &GpuView, n: usize, k: usize, temperature: f32, slots: usize, out: Option<(GpuView, GpuView)>) -> Result<TopKPlan> {
        const OP: &str = "top_k plan";
        if k == 0 || k > MAX_TOP_K || k > n || !(temperature > 0.0 && temperature.is_finite()) || slots == 0 {
            return Err(bad(OP, format!("k {k} must be in 1..={MAX_TOP_K} and at most {n}; temperature {temperature} must be positive; {slots} slots")));
        }
        logits.need(OP, "the logits", n)?;
        let words = mul(OP, "slots x k", slots, k)?;
        let (ids, values) = match out {
            Some((i, v)) => (out_or_owned(ctx, OP, Some(&i), words)?, out_or_owned(ctx, OP, Some(&v), words)?),
            None => (owned(ctx, words)?, owned(ctx, words)?),
        };
        let (n32, k32) = (to_u32(OP, "n", n)?, to_u32(OP, "k", k)?);
        let (idx_off, val_off) = (ids.offset_u32(OP)?, values.offset_u32(OP)?);
        let rounds = top_k_rounds(n32, k32);
        let scratch = rounds[0].1 as usize * k;
        let bufs = [(owned(ctx, scratch)?, owned(ctx, scratch)?), (owned(ctx, scratch)?, owned(ctx, scratch)?)];
        let env = env_of(ctx);
        let kernels = [ctx.kernel(&TopK { first: true }.source(&env))?, ctx.kernel(&TopK { first: false }.source(&env))?];
        let mut plan = Plan::new();
        let last = rounds.len() - 1;
        for (r, &(len, nwg)) in rounds.iter().enumerate() {
            let kernel = &kernels[(r > 0) as usize];
            let (vin, iin, in_off): (Binding, Binding, u32) = match r {
                0 => (logits.binding.clone(), dummy(ctx)?, logits.offset_u32(OP)?),
                _ => (bufs[(r - 1) % 2].0.binding.clone(), bufs[(r - 1) % 2].1.binding.clone(), 0),
            };
            let (vout, iout) =
                if r == last { (values.binding.clone(), ids.binding.clone()) } else { (bufs[r % 2].0.binding.clone(), bufs[r % 2].1.binding.clone()) };
            let g = ctx.bind(kernel, &[vin, iin, vout, iout])?;
            let grid = crate::ops_common::grid_for(ctx, nwg as u64)?;
            let mut d = PlanDispatch::new(kernel, g, grid)?
                .set("n", len)?
                .set("k", k32)?
                .set_f32("inv_temp", 1.0 / temperature)?
                .set("in_off", in_off)?
                .set("wg_per_row", nwg)?
                .set("n_rows", 1)?;
            if r == last {
                d = d.per_step("outv_off", move |s| val_off.saturating_add(s.token.saturating_mul(k32)))?;
                d = d.per_step("outi_off", move |s| idx_off.saturating_add(s.token.saturating_mul(k32)))?;
            }
            plan.push(d);
        }
        to_u32(OP, "the output extent", val_off.max(idx_off) as usize + words)?;
        Ok(TopKPlan { plan, ids, values, k, slots })
    }

    /// The `k` largest raw logits (temperature 1) of each of a step's rows of `logits`
    /// (`max_rows` rows of `n` f32 one after another): row `r < step.n_tok` writes its ids to
    /// `ids[r * k ..]` and its values to `values[r * k ..]`, best first (ties: the lower id).
    /// The same rounds as [`Self::new`], each one dispatch whatever the rows.
    pub fn rows(ctx: &GpuContext, logits: &GpuView, n: usize, k: usize, max_rows: usize) -> Result<TopKPlan> {
        const OP: &str = "top_k rows plan";
        if k == 0 || k > MAX_TOP_K || k > n || max_rows == 0 {
            return Err(bad(OP, format!("k {k} must be in 1..={MAX_TOP_K} and at most {n}; {max_rows} rows")));
        }
        logits.need(OP, "the logits", mul(OP, "logits", n, max_rows)?)?;
        let words = mul(OP, "rows x k", max_rows, k)?;
        let (ids, values) = (owned(ctx, words)?, owned(ctx, words)?);
        let (n32, k32, rows32) = (to_u32(OP, "n", n)?, to_u32(OP, "k", k)?, to_u32(OP, "rows", max_rows)?);
        let rounds = top_k_rounds(n32, k32);
        let scratch = mul(OP, "scratch", rounds[0].1 as usize * k, max_rows)?;
        let bufs = [(owned(ctx, scratch)?, owned(ctx, scratch)?), (owned(ctx, scratch)?, owned(ctx, scratch)?)];
        let env = env_of(ctx);
        let kernels = [ctx.kernel(&TopK { first: true }.source(&env))?, ctx.kernel(&TopK { first: false }.source(&env))?];
        let rows = move |s: &StepValues| s.n_tok.min(rows32);
        let max_dim = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
        let mut plan = Plan::new();
        let last = rounds.len() - 1;
        for (r, &(len, nwg)) in rounds.iter().enumerate() {
            let kernel = &kernels[(r > 0) as usize];
            let (vin, iin, in_off, in_row) = match r {
                0 => (logits.binding.clone(), dummy(ctx)?, logits.offset_u32(OP)?, n32),
                _ => (bufs[(r - 1) % 2].0.binding.clone(), bufs[(r - 1) % 2].1.binding.clone(), 0, len),
            };
            let (vout, iout, out_row, outv, outi) = if r == last {
                (values.binding.clone(), ids.binding.clone(), k32, values.offset_u32(OP)?, ids.offset_u32(OP)?)
            } else {
                (bufs[r % 2].0.binding.clone(), bufs[r % 2].1.binding.clone(), nwg * k32, 0, 0)
            };
            let g = ctx.bind(kernel, &[vin, iin, vout, iout])?;
            let d = PlanDispatch::new(kernel, g, [1, 1, 1])?
                .set("n", len)?
                .set("k", k32)?
                .set_f32("inv_temp", 1.0)?
                .set("in_off", in_off)?
                .set("outv_off", outv)?
                .set("outi_off", outi)?
                .set("wg_per_row", nwg)?
                .set("in_row", in_row)?
                .set("out_row", out_row)?
                .per_step("n_rows", rows)?;
            to_u32(OP, "the largest round's workgroups", nwg as usize * max_rows)?;
            plan.push(d.grid_per_step(move |s| {
                let total = rows(s) * nwg;
                let x = total.min(max_dim);
                [x, total.div_ceil(x.max(1)), 1]
            }));
        }
        Ok(TopKPlan { plan, ids, values, k, slots: max_rows })
    }

    /// The same plan (buffers, bind groups) at another temperature: creates nothing on the GPU.
    pub fn with_temperature(&self, temperature: f32) -> Result<TopKPlan> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(bad("top_k plan", format!("temperature {temperature} must be positive")));
        }
        let mut plan = Plan::new();
        for (i, d) in self.plan.dispatches().iter().enumerate() {
            plan.push(if i == 0 { d.clone().set_f32("inv_temp", 1.0 / temperature)? } else { d.clone() });
        }
        Ok(TopKPlan { plan, ..self.clone() })
    }

    /// The ids (u32), `k` per slot, best first.
    pub fn ids(&self) -> &GpuView {
        &self.ids
    }

    /// The values `logits / temperature` (f32), `k` per slot.
    pub fn values(&self) -> &GpuView {
        &self.values
    }

    /// Candidates kept per slot.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output slots; a step writes slot `step.token` (which must be below this).
    pub fn slots(&self) -> usize {
        self.slots
    }
}

impl OpPlan for TopKPlan {
    fn check(&self, step: &StepValues) -> Result<()> {
        check_slot("top_k plan", step, self.slots)
    }

    /// The underlying plan (recorded directly, the slot is not checked).
    fn plan(&self) -> &Plan {
        &self.plan
    }
}

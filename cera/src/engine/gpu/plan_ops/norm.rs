//! RMSNorm dispatches: a norm of its own input, a residual add followed by the norm, or (decode)
//! the norm of the stream that a producing GEMV already added into.

use boostr::norm::{Norm, NormIo, NormPlan};
use boostr::ops_common::{GpuView, OpPlan};
use numr::gpu::Plan;

use super::super::super::EngineError;
use super::super::super::graph::{Slot, VecRef};
use super::super::ops_err;
use super::super::tuning::batch_split_row_elems;
use super::PlanCx;

/// One RMSNorm: `out = rmsnorm(x (+ Hidden)) * w`.
pub(super) struct NormArgs<'a> {
    /// Input.
    pub(super) x: Slot,
    /// The weight.
    pub(super) w: &'a VecRef,
    /// Output.
    pub(super) out: Slot,
    /// `Hidden += x` first (the norm then reads the stream).
    pub(super) add_into_hidden: bool,
    /// With `add_into_hidden`: `x` is this many partial sums of the previous op's split GEMM, in
    /// the plan's partials buffer, added up in order before the add (0: `x` itself).
    pub(super) partial_sums: u32,
}

pub(super) fn norm(cx: &PlanCx, plan: &mut Plan, a: &NormArgs) -> Result<(), EngineError> {
    let (slots, w) = (cx.slots, a.w);
    let residual = a.add_into_hidden.then(|| slots.view(Slot::Hidden));
    let x = match a.partial_sums {
        0 | 1 => slots.view(a.x),
        _ => GpuView::whole(slots.partials(cx.ctx, batch_split_row_elems(cx.ctx, cx.inp, slots.rows()))?),
    };
    let io = NormIo { x, w: cx.inp.weights.vec(&w.name)?.clone(), b: None, residual, out: Some(slots.view(a.out)) };
    let cfg = Norm { residual: a.add_into_hidden, ..Norm::rms() };
    let (eps, rows) = (cx.cfg().norm_eps, cx.rows());
    let p = match a.partial_sums {
        0 | 1 => NormPlan::new(cx.ctx, &cfg, &io, w.len, rows, eps),
        s => NormPlan::with_partials(cx.ctx, &cfg, &io, w.len, rows, eps, s),
    };
    plan.append(p.map_err(ops_err)?.plan());
    Ok(())
}

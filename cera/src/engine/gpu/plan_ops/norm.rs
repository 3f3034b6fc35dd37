//! RMSNorm dispatches: a norm of its own input, a residual add followed by the norm, or (decode)
//! the norm of the stream that a producing GEMV already added into.

use boostr::norm::{Norm, NormIo, NormPlan};
use boostr::ops_common::OpPlan;
use numr::gpu::Plan;

use super::super::super::EngineError;
use super::super::super::graph::{Slot, VecRef};
use super::super::ops_err;
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
}

pub(super) fn norm(cx: &PlanCx, plan: &mut Plan, a: &NormArgs) -> Result<(), EngineError> {
    let (slots, w) = (cx.slots, a.w);
    let residual = a.add_into_hidden.then(|| slots.view(Slot::Hidden));
    let io = NormIo { x: slots.view(a.x), w: cx.inp.weights.vec(&w.name)?.clone(), b: None, residual, out: Some(slots.view(a.out)) };
    let cfg = Norm { residual: a.add_into_hidden, ..Norm::rms() };
    plan.append(NormPlan::new(cx.ctx, &cfg, &io, w.len, cx.rows(), cx.cfg().norm_eps).map_err(ops_err)?.plan());
    Ok(())
}

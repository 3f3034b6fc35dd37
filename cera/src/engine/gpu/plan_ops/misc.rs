//! The ops of one dispatch each with no tuning: the embedding gather, a per-row bias, LFM2's
//! short conv, the GLU.

use boostr::act::{Act, ActIo, ActPlan, GluInput};
use boostr::bias::BiasPlan;
use boostr::conv::{ShortConv, ShortConvBatch, ShortConvBatchIo, ShortConvBatchPlan, ShortConvIo, ShortConvPlan};
use boostr::embedding::EmbeddingPlan;
use boostr::ops_common::{GpuView, OpPlan};
use numr::gpu::Plan;

use super::super::super::EngineError;
use super::super::super::backend::CONV_RING;
use super::super::super::config::GateAct;
use super::super::super::graph::{MatRef, Slot, VecRef};
use super::super::fuse::act_kind;
use super::super::plans::Mode;
use super::super::{dev_err, ops_err};
use super::PlanCx;

/// The embedding op `i`: `Hidden = scale * table[id]`. Prefill reads ids[token ..]; decode
/// reads the one slot the step names.
pub(super) fn embed(cx: &PlanCx, plan: &mut Plan, i: usize, scale: f32) -> Result<(), EngineError> {
    let table = cx.inp.weights.embedding(cx.inp.graph, i)?;
    let ids = GpuView::whole(cx.inp.ids);
    let p = EmbeddingPlan::new(cx.ctx, table, &ids, cx.rows(), scale, Some(cx.slots.view(Slot::Hidden))).map_err(ops_err)?;
    plan.append(p.plan());
    Ok(())
}

/// `x += b` per row, `b` the vectors `bs` concatenated (uploaded here).
pub(super) fn bias(cx: &PlanCx, plan: &mut Plan, x: Slot, bs: &[VecRef]) -> Result<(), EngineError> {
    let (ctx, g) = (cx.ctx, cx.inp.graph);
    let mut b: Vec<f32> = Vec::new();
    for v in bs {
        b.extend_from_slice(cx.inp.weights.host_vec(&v.name)?);
    }
    if b.len() != g.width(x) {
        return Err(EngineError::BadConfig { reason: format!("a bias of {} values for {x:?} ({} wide)", b.len(), g.width(x)) });
    }
    let bb = ctx.upload(bytemuck::cast_slice(&b)).map_err(|e| dev_err(ctx, e))?;
    plan.append(BiasPlan::new(ctx, &cx.slots.view(x), &GpuView::whole(&bb), b.len(), cx.rows()).map_err(ops_err)?.plan());
    Ok(())
}

/// LFM2's short conv over conv layer `state`'s ring, taps `w`; in a batched plan, over each
/// sequence slot's ring of that layer, the runs given per step by the batch's `ConvSeqs`.
pub(super) fn short_conv(cx: &PlanCx, plan: &mut Plan, state: usize, w: &MatRef) -> Result<(), EngineError> {
    let c = cx.cfg();
    if let Mode::Batch { .. } = cx.mode {
        let seqs = cx.inp.conv_seqs.ok_or_else(|| EngineError::Usage("a batched plan of conv layers without its runs".into()))?;
        let io = ShortConvBatchIo {
            bcx: cx.slots.view(Slot::ConvIn),
            w: cx.inp.weights.vec(&w.name)?.clone(),
            state: GpuView::whole(&cx.inp.conv[state]),
            out: cx.slots.view(Slot::Conv),
        };
        let conv = ShortConvBatch { kernel: c.conv_kernel as u32 };
        plan.append(ShortConvBatchPlan::new(cx.ctx, &conv, &io, seqs, c.dim, CONV_RING).map_err(ops_err)?.plan());
        return Ok(());
    }
    let conv = ShortConv { kernel: c.conv_kernel as u32 };
    let io = ShortConvIo {
        bcx: cx.slots.view(Slot::ConvIn),
        w: cx.inp.weights.vec(&w.name)?.clone(),
        state: Some(GpuView::whole(&cx.inp.conv[state])),
        out: Some(cx.slots.view(Slot::Conv)),
    };
    plan.append(ShortConvPlan::new(cx.ctx, &conv, &io, c.dim, cx.rows(), CONV_RING).map_err(ops_err)?.plan());
    Ok(())
}

/// `out = act(gate) * up` from the packed `[gate | up]` rows of `x`.
pub(super) fn glu(cx: &PlanCx, plan: &mut Plan, act: GateAct, x: Slot, out: Slot) -> Result<(), EngineError> {
    let io = ActIo { a: cx.slots.view(x), b: None, out: Some(cx.slots.view(out)) };
    let cfg = Act { kind: act_kind(act), input: GluInput::Packed };
    plan.append(ActPlan::new(cx.ctx, &cfg, &io, cx.cfg().ffn_dim, cx.rows()).map_err(ops_err)?.plan());
    Ok(())
}

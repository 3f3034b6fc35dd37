//! One graph op into plan dispatches: [`record_op`] is the GPU executor's one match over
//! [`Op`], each kind's dispatches built in a file of its own from a named configuration
//! (`norm.rs`: [`norm::NormArgs`], `linear.rs`: [`linear::LinearArgs`] with its
//! [`linear::GemvFusion`], `rope.rs`, `attention.rs`, `misc.rs`: the embedding, the bias, the
//! short conv and the GLU). A new [`Op`] adds one arm here and one function beside the others.

mod attention;
pub(super) mod linear;
mod misc;
mod norm;
mod rope;

use numr::gpu::{GpuContext, KernelEnv, Plan};

use super::super::EngineError;
use super::super::config::ModelConfig;
use super::super::graph::{Op, Slot};
use super::fuse::Fused;
use super::links::Links;
use super::plans::{Mode, PlanInputs, Slots};
use linear::{LinearArgs, gemv_fusion};
use norm::NormArgs;

/// What every op's dispatches are built from: the adapter, the plan's inputs and slots, its
/// mode, and the decode plan's epilogue links.
pub(super) struct PlanCx<'a> {
    pub(super) ctx: &'a GpuContext,
    pub(super) env: &'a KernelEnv,
    pub(super) inp: &'a PlanInputs<'a>,
    pub(super) slots: &'a Slots,
    pub(super) mode: Mode,
    pub(super) links: &'a Links,
}

impl PlanCx<'_> {
    /// The model's configuration.
    fn cfg(&self) -> &ModelConfig {
        &self.inp.graph.cfg
    }

    /// Rows (tokens) of the plan.
    fn rows(&self) -> usize {
        self.mode.rows()
    }
}

/// The LM head as one matrix product over up to `max_rows` rows of `x` (normalised rows of
/// `dim` f32) into `out` (`max_rows` rows of `vocab` logits); a step runs `step.n_tok` rows.
pub(super) fn lm_head_rows(cx: &PlanCx, plan: &mut Plan, x: numr::gpu::Binding, out: numr::gpu::Binding, max_rows: usize) -> Result<(), EngineError> {
    let (g, c) = (cx.inp.graph, cx.cfg());
    let i = g.ops.iter().position(|op| matches!(op, Op::LmHead { .. })).ok_or_else(|| EngineError::BadConfig { reason: "the graph has no LM head".into() })?;
    if let Op::LmHead { softcap: Some(cap), .. } = &g.ops[i] {
        return Err(EngineError::Unsupported { what: format!("final logit soft-capping ({cap}) on the GPU") });
    }
    let fusion = linear::GemvFusion::plain(x, out);
    // A verification plan's head rows are its decode rows; a batched step's take the batch's.
    let mode = if matches!(cx.mode, Mode::Prefill { .. }) { Mode::Prefill { max_tok: max_rows } } else { Mode::Batch { max_tok: max_rows } };
    linear::linear(cx, plan, LinearArgs { op: i, fusion, width: c.vocab, eps: c.norm_eps, mode, partial_sums: 0 })
}

/// Appends the dispatches of op `i` (`op`, fused as `f`) to `plan`.
pub(super) fn record_op(cx: &PlanCx, plan: &mut Plan, i: usize, op: &Op, f: &Fused) -> Result<(), EngineError> {
    let (g, c) = (cx.inp.graph, cx.cfg());
    match op {
        Op::Embed { scale, .. } => misc::embed(cx, plan, i, *scale),
        // The residual add went into the producing GEMV: only the norm of Hidden is left.
        Op::Norm { w, out, .. } | Op::AddNorm { w, out, .. } if f.materialize => {
            norm::norm(cx, plan, &NormArgs { x: Slot::Hidden, w, out: *out, add_into_hidden: false, partial_sums: 0 })
        }
        Op::Norm { x, w, out } => norm::norm(cx, plan, &NormArgs { x: *x, w, out: *out, add_into_hidden: false, partial_sums: 0 }),
        Op::AddNorm { x, w, out } => norm::norm(cx, plan, &NormArgs { x: *x, w, out: *out, add_into_hidden: true, partial_sums: f.partial_sums }),
        Op::Linear { x, out, .. } => {
            let fusion = gemv_fusion(cx.slots, f, *x, *out);
            let args = LinearArgs { op: i, fusion, width: g.width(*out), eps: c.norm_eps, mode: cx.mode, partial_sums: f.partial_sums };
            linear::linear(cx, plan, args)
        }
        Op::LmHead { softcap, .. } => {
            if let Some(cap) = softcap {
                return Err(EngineError::Unsupported { what: format!("final logit soft-capping ({cap}) on the GPU") });
            }
            match cx.mode {
                Mode::Decode | Mode::Head => {
                    let fusion = gemv_fusion(cx.slots, f, Slot::Normed, Slot::Logits);
                    linear::linear(cx, plan, LinearArgs { op: i, fusion, width: c.vocab, eps: c.norm_eps, mode: Mode::Decode, partial_sums: 0 })
                }
                // A verification step: logits at every row (the final norm in their quantizer,
                // where the plan fused it).
                Mode::Prefill { .. } if cx.inp.prefill_gemv => {
                    let fusion = gemv_fusion(cx.slots, f, Slot::Normed, Slot::Logits);
                    linear::linear(cx, plan, LinearArgs { op: i, fusion, width: c.vocab, eps: c.norm_eps, mode: cx.mode, partial_sums: 0 })
                }
                _ => Ok(()),
            }
        }
        Op::QkvRope { layer, qk_norm, rope, neox, .. } => {
            rope::qkv_rope(cx, plan, i, &rope::RopeArgs { layer: *layer, qk_norm: qk_norm.as_ref(), rope, neox: *neox, partial_sums: f.partial_sums })
        }
        Op::Attention { layer, window } => attention::attention(cx, plan, i, *layer, *window),
        Op::Bias { x, bs } => misc::bias(cx, plan, *x, bs),
        Op::ShortConv { state, w } => misc::short_conv(cx, plan, *state, w),
        Op::Glu { act, x, out } => misc::glu(cx, plan, *act, *x, *out),
    }
}

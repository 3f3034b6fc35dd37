//! The QK-norm + RoPE + KV-write dispatch of a layer (where its Q/K/V GEMV does not run it in
//! its epilogue), adding the two partial sums of a prefill Q/K/V GEMM split over K.

use boostr::ops_common::OpPlan;
use boostr::paged::{PagedKvWritePlan, PagedRowsLayout};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopePositions, RopeStyle};
use numr::gpu::{Binding, Plan};

use super::super::super::EngineError;
use super::super::super::config::LayerRope;
use super::super::super::graph::{Op, Slot, VecRef};
use super::super::ops_err;
use super::super::plans::{Mode, rope_params};
use super::super::tuning::qkv_split_k;
use super::PlanCx;

/// One layer's RoPE op: its cache layer, the per-head norm weights of q and k, the rotation.
pub(super) struct RopeArgs<'a> {
    pub(super) layer: usize,
    pub(super) qk_norm: Option<&'a (VecRef, VecRef)>,
    pub(super) rope: &'a LayerRope,
    /// NeoX pairs `(i, i + rot_dim / 2)` instead of `(2i, 2i + 1)`.
    pub(super) neox: bool,
    /// A batched Q/K/V GEMM split over K left this many partial sums in the Q/K/V slot for
    /// this op to add up (`Fused::partial_sums`; 0: none).
    pub(super) partial_sums: u32,
}

/// The RoPE op `i`.
pub(super) fn qkv_rope(cx: &PlanCx, plan: &mut Plan, i: usize, a: &RopeArgs) -> Result<(), EngineError> {
    let (ctx, inp, g, c) = (cx.ctx, cx.inp, cx.inp.graph, cx.cfg());
    let batched = matches!(cx.mode, Mode::Batch { .. });
    let kv_write = if batched { None } else { Some(inp.cache()?.config().dtype) };
    let cfg =
        QkvRope { style: if a.neox { RopeStyle::Neox } else { RopeStyle::Normal }, rope: true, qk_norm: a.qk_norm.is_some(), norm_offset: false, kv_write };
    let rp = rope_params(g, a.rope.base, a.rope.linear_factor, a.neox);
    let (qw, kw) = match a.qk_norm {
        Some((q, k)) => (Some(inp.weights.vec(&q.name)?.binding.clone()), Some(inp.weights.vec(&k.name)?.binding.clone())),
        None => (None, None),
    };
    let x = cx.slots.bind(Slot::Qkv);
    let positions = match inp.paged {
        Some((_, batch)) if batched => RopePositions::Buffer(batch.positions_binding()),
        _ => RopePositions::Step,
    };
    let inputs = QkvRopeInputs {
        x: &x,
        layout: QkvLayout::packed(cx.rows(), c.n_heads, c.n_kv_heads, c.head_dim),
        rope: &rp,
        positions: &positions,
        qw: qw.as_ref(),
        kw: kw.as_ref(),
        eps: c.norm_eps,
        cache: if batched { None } else { Some((inp.cache()?, a.layer)) },
    };
    let freqs = Binding::whole(&inp.freqs[a.layer]);
    // The Q/K/V GEMM before it (a bias at most between) split over K?
    let producer = (0..i).rev().find(|&j| !matches!(g.ops[j], Op::Bias { .. }));
    let p = match (cx.mode, producer) {
        (Mode::Prefill { max_tok }, Some(j)) if qkv_split_k(ctx, inp, j, max_tok) > 1 => {
            QkvRopePlan::with_partial_sum(ctx, &cfg, &inputs, &freqs, max_tok * g.width(Slot::Qkv))
        }
        (Mode::Batch { max_tok }, _) if a.partial_sums > 1 => {
            QkvRopePlan::with_partials(ctx, &cfg, &inputs, &freqs, max_tok * g.width(Slot::Qkv), a.partial_sums)
        }
        _ => QkvRopePlan::with_freqs(ctx, &cfg, &inputs, &freqs),
    };
    plan.append(p.map_err(ops_err)?.plan());
    if batched {
        // K and V of every row into the sequences' blocks.
        let (cache, batch) = inp.paged()?;
        let (q, kv) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let layout = PagedRowsLayout { x_off: 0, tok_stride: g.width(Slot::Qkv), k_off: q, v_off: q + kv };
        let w = PagedKvWritePlan::new(ctx, &x, &layout, cache, a.layer, batch).map_err(ops_err)?;
        plan.append(w.plan());
    }
    Ok(())
}

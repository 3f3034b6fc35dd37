//! Attention dispatches: the decode plan (flash-decoding; its merge may write the output
//! projection's int8 activations) or the prefill plan (tiled, subgroup or cooperative-matrix);
//! for head sizes and GQA groups those do not take, boostr's portable paged kernel over the
//! contiguous cache.

use boostr::attention::{AttnOptions, DecodePlan, PrefillPlan, QueryLayout, contiguous_supported};
use boostr::ops_common::OpPlan;
use boostr::paged::{PagedAttnPlan, Splits};
use numr::gpu::Plan;

use super::super::super::EngineError;
use super::super::super::graph::Slot;
use super::super::ops_err;
use super::super::plans::Mode;
use super::PlanCx;

/// The most key splits per token on the portable path (chosen per step by
/// `boostr::paged::auto_splits`: one split up to 256 positions, more at long contexts).
const GENERIC_DECODE_SPLITS: usize = 64;

/// Key splits per token of a batched step's attention, fixed by the longest sequence it serves
/// (`n_ctx`): one up to 1024 positions, one more per 1024 after that, at most 16.
pub(in super::super) fn batch_attn_splits(n_ctx: usize) -> usize {
    n_ctx.div_ceil(1024).clamp(1, 16)
}

/// The attention op `i` over cache layer `layer`, with a sliding `window` (`None`: global).
pub(super) fn attention(cx: &PlanCx, plan: &mut Plan, i: usize, layer: usize, window: Option<usize>) -> Result<(), EngineError> {
    let (ctx, inp, c) = (cx.ctx, cx.inp, cx.cfg());
    let opts = AttnOptions { scale: c.attn_scale, softcap: c.attn_softcap, window };
    let (q, out) = (cx.slots.bind(Slot::Qkv), cx.slots.bind(Slot::Attn));
    if let Mode::Batch { max_tok } = cx.mode {
        // Every row at its own position through its sequence's blocks; a fixed split count, so
        // that a row's numbers never depend on the rest of the step.
        let (cache, batch) = inp.paged()?;
        let ql = QueryLayout { n_tok: max_tok, n_q: c.n_heads, q_off: 0, tok_stride: c.qkv_dim() };
        let splits = Splits::Fixed(batch_attn_splits(inp.paged_ctx));
        let p = PagedAttnPlan::with_kernel(ctx, &q, &ql, cache, layer, batch, &opts, splits, Some((&out, 0)), None).map_err(ops_err)?;
        plan.append(p.plan());
        return Ok(());
    }
    let cache = inp.cache()?;
    if !contiguous_supported(c.head_dim, c.n_heads / c.n_kv_heads.max(1)) {
        // Head sizes and groups the tuned kernels do not take: the portable paged kernel over
        // the contiguous cache, splitting a decode token's keys for long contexts.
        let (rows, splits) = match cx.mode {
            Mode::Decode | Mode::Head => (1, Splits::Auto { max: GENERIC_DECODE_SPLITS }),
            Mode::Prefill { max_tok } | Mode::Batch { max_tok } => (max_tok, Splits::Auto { max: GENERIC_DECODE_SPLITS }),
        };
        let ql = QueryLayout { n_tok: rows, n_q: c.n_heads, q_off: 0, tok_stride: c.qkv_dim() };
        let p = PagedAttnPlan::over_contiguous(ctx, &q, &ql, cache, layer, &opts, splits, Some((&out, 0))).map_err(ops_err)?;
        plan.append(p.plan());
        return Ok(());
    }
    match cx.mode {
        Mode::Decode | Mode::Head => {
            let mut b = DecodePlan::builder(ctx, &q, 0, c.n_heads, cache, layer, &opts).output(&out, 0);
            if let Some(t) = inp.tuning.attn_tuning {
                b = b.tuning(t.heads, t.keys, t.target_wgs);
            }
            if let Some(kv) = inp.tuning.attn_single_kv {
                b = b.single_split_up_to(kv);
            }
            if let Some(consumer) = cx.links.attention.get(&i) {
                b = b.quantized_output(consumer);
            }
            plan.append(b.build().map_err(ops_err)?.plan());
        }
        Mode::Prefill { max_tok } | Mode::Batch { max_tok } => {
            let ql = QueryLayout { n_tok: max_tok, n_q: c.n_heads, q_off: 0, tok_stride: c.qkv_dim() };
            let mut b = PrefillPlan::builder(ctx, &q, &ql, cache, layer, &opts).output(&out, 0);
            if let Some(kind) = inp.tuning.prefill_attn {
                b = b.kernel(kind);
            } else if inp.prefill_gemv {
                // A verification step's rows attend in f32, as decode steps do (not through f16
                // cooperative matrices), so that they pick what decode steps pick.
                b = b.f32_only();
            }
            plan.append(b.build().map_err(ops_err)?.plan());
        }
    }
    Ok(())
}

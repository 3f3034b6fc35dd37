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

/// Keys per chunk of a batched row's attention in a plan whose rows run through the GEMM (the
/// prompt rows' lane; every row in a batch state of more than `GpuTuning::batch_gemv_max_seqs`
/// sequences): such steps carry many rows (a prompt chunk, tens of decode rows), which fill the
/// GPU without splitting a row's keys.
/// H100, 2026-12-07 (`cargo xtask bench --paged`, Llama-3-8B's shape): 64 decode rows at 1K
/// keys take 124 us in one chunk against 179 us in 4, at 4K 412 against 476 us; a 512-token
/// prompt chunk 281 against 692 us at depth 0 and 1,127 against 1,507 us at depth 1536.
pub(in super::super) const MANY_ROWS_SPLIT_KEYS: usize = 4096;

/// The key splits of a batched step's attention, each row's count from nothing but its own
/// length, so that a row's numbers never depend on the rest of the step:
/// `GpuTuning::batch_attn_split_keys`, else (auto) one chunk per [`MANY_ROWS_SPLIT_KEYS`] keys
/// in a plan whose rows run through the GEMM, and in a plan of decode rows through the GEMV (a
/// batch state of few sequences) a count fixed by the longest sequence the state serves
/// (`n_ctx`: one up to 1024 positions, one more per 1024 after that), which spreads a few
/// rows' keys over more workgroups. At most 16 chunks.
pub(in super::super) fn batch_attn_splits(inp: &super::super::plans::PlanInputs) -> Splits {
    let n_ctx = inp.paged_ctx.max(1);
    let keys = match inp.tuning.batch_attn_split_keys {
        Some(0) => None,
        Some(k) => Some(k),
        None => (!inp.batch_decode_gemv).then_some(MANY_ROWS_SPLIT_KEYS),
    };
    match keys {
        Some(keys) => Splits::PerToken { keys, max: n_ctx.div_ceil(keys).clamp(1, 16) },
        None => Splits::Fixed(n_ctx.div_ceil(1024).clamp(1, 16)),
    }
}

/// The attention op `i` over cache layer `layer`, with a sliding `window` (`None`: global).
pub(super) fn attention(cx: &PlanCx, plan: &mut Plan, i: usize, layer: usize, window: Option<usize>) -> Result<(), EngineError> {
    let (ctx, inp, c) = (cx.ctx, cx.inp, cx.cfg());
    let opts = AttnOptions { scale: c.attn_scale, softcap: c.attn_softcap, window };
    let (q, out) = (cx.slots.bind(Slot::Qkv), cx.slots.bind(Slot::Attn));
    if let Mode::Batch { max_tok } = cx.mode {
        // Every row at its own position through its sequence's blocks; its split count from its
        // own length, so that a row's numbers never depend on the rest of the step.
        let (cache, batch) = inp.paged()?;
        let ql = QueryLayout { n_tok: max_tok, n_q: c.n_heads, q_off: 0, tok_stride: c.qkv_dim() };
        let splits = batch_attn_splits(inp);
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

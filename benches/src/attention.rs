//! Attention workloads: flash-decoding GB/s of KV read at long contexts (as a fraction of the
//! streaming-read roofline measured in the same run) and causal prefill TFLOP/s. The plans are
//! built once (kernels, bind groups, partial buffers) and recorded `reps` times into one submit.

use boostr::attention::{AttnOptions, DecodeKernel, DecodePlan, PrefillAttnCoop, PrefillPlan, QueryLayout};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::ops_common::OpPlan;
use boostr::quant::QuantGemm;
use numr::gpu::StepValues;
use numr::{DType, Device, GpuContext, Result, Tensor};

use crate::{Measurement, time_recorded};

fn cache(ctx: &GpuContext, n_kv: usize, hd: usize, capacity: usize, dtype: KvDtype) -> Result<KvCache> {
    KvCache::new(ctx, KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity, dtype, max_segment_bytes: None })
        .map_err(|e| numr::NumrError::Internal { context: "building the KV cache".into(), message: e.to_string() })
}

fn ops_err(e: boostr::ops_common::OpsError) -> numr::NumrError {
    numr::NumrError::Internal { context: "planning attention".into(), message: e.to_string() }
}

/// Decode attention of one token over `ctx_len` cached positions; bytes = K and V read.
/// `two_pass`: the subgroup kernel plus the separate combine dispatch instead of the fused merge.
#[allow(clippy::too_many_arguments)]
pub fn decode(ctx: &GpuContext, n_q: usize, n_kv: usize, hd: usize, ctx_len: usize, dtype: KvDtype, reps: usize, two_pass: bool) -> Result<Measurement> {
    let c = cache(ctx, n_kv, hd, ctx_len, dtype)?;
    let q = Tensor::zeros(&[n_q * hd], DType::F32, &Device::Gpu(ctx.clone()))?;
    let kind = DecodeKernel::best(&boostr::ops_common::env_of(ctx));
    let qb = q.gpu_binding(4)?.0;
    let opts = AttnOptions::new(hd);
    let b = DecodePlan::builder(ctx, &qb, 0, n_q, &c, 0, &opts).kernel(kind);
    let plan = if two_pass { b.two_pass() } else { b }.build().map_err(ops_err)?;
    let step = DecodePlan::step(ctx_len).map_err(ops_err)?;
    let s = time_recorded(ctx, reps, 5, |rec, _| {
        plan.record(rec, &step).map_err(ops_err)?;
        Ok(())
    })?;
    let bytes = 2.0 * (ctx_len * n_kv * dtype.row_words(hd) * 4) as f64;
    Ok(Measurement {
        label: format!("decode attn {n_q}q/{n_kv}kv hd{hd} {dtype:?} ctx {ctx_len}{}", if two_pass { " two-pass" } else { "" }),
        seconds: s,
        bytes,
        flops: 0.0,
    })
}

/// Fused decode with a chosen tuning (heads per workgroup, keys per step, target workgroups).
#[allow(clippy::too_many_arguments)]
pub fn decode_tuned(
    ctx: &GpuContext,
    n_q: usize,
    n_kv: usize,
    hd: usize,
    ctx_len: usize,
    heads: u32,
    keys: u32,
    target: usize,
    reps: usize,
) -> Result<Measurement> {
    let c = cache(ctx, n_kv, hd, ctx_len, KvDtype::F16)?;
    let q = Tensor::zeros(&[n_q * hd], DType::F32, &Device::Gpu(ctx.clone()))?;
    let qb = q.gpu_binding(4)?.0;
    let plan = DecodePlan::builder(ctx, &qb, 0, n_q, &c, 0, &AttnOptions::new(hd)).tuning(heads, keys, target).build().map_err(ops_err)?;
    let step = DecodePlan::step(ctx_len).map_err(ops_err)?;
    let s = time_recorded(ctx, reps, 5, |rec, _| {
        plan.record(rec, &step).map_err(ops_err)?;
        Ok(())
    })?;
    let bytes = 2.0 * (ctx_len * n_kv * KvDtype::F16.row_words(hd) * 4) as f64;
    Ok(Measurement { label: format!("decode attn {n_q}q/{n_kv}kv hd{hd} F16 ctx {ctx_len} fused h{heads}/k{keys}/wg{target}"), seconds: s, bytes, flops: 0.0 })
}

/// Causal prefill of `n_tok` tokens on an empty cache with `kernel` (the plan's default when
/// `None`); flops = 4 · hd · n_q · n(n+1)/2.
pub fn prefill(ctx: &GpuContext, n_q: usize, n_kv: usize, hd: usize, n_tok: usize, reps: usize, kernel: Option<DecodeKernel>) -> Result<Measurement> {
    prefill_variant(ctx, n_q, n_kv, hd, n_tok, reps, kernel, None)
}

/// [`prefill`] with a given coopmat variant.
#[allow(clippy::too_many_arguments)]
pub fn prefill_variant(
    ctx: &GpuContext,
    n_q: usize,
    n_kv: usize,
    hd: usize,
    n_tok: usize,
    reps: usize,
    kernel: Option<DecodeKernel>,
    coop: Option<PrefillAttnCoop>,
) -> Result<Measurement> {
    let c = cache(ctx, n_kv, hd, n_tok, KvDtype::F16)?;
    let q = Tensor::zeros(&[n_tok * n_q * hd], DType::F32, &Device::Gpu(ctx.clone()))?;
    let ql = QueryLayout { n_tok, n_q, q_off: 0, tok_stride: n_q * hd };
    let qb = q.gpu_binding(4)?.0;
    let b = PrefillPlan::builder(ctx, &qb, &ql, &c, 0, &AttnOptions::new(hd));
    let plan = match (kernel, coop) {
        (_, Some(v)) => b.coop_variant(v),
        (Some(k), None) => b.kernel(k),
        (None, None) => b,
    }
    .build()
    .map_err(ops_err)?;
    let step = StepValues::chunk(0, u32::try_from(n_tok).map_err(|_| ops_err(boostr::ops_common::OpsError::BadArgs { op: "bench", reason: "n_tok".into() }))?);
    let s = time_recorded(ctx, reps, 3, |rec, _| {
        plan.record(rec, &step).map_err(ops_err)?;
        Ok(())
    })?;
    let flops = 4.0 * (hd * n_q) as f64 * (n_tok * (n_tok + 1) / 2) as f64;
    let what = match coop {
        Some(v) => format!("Coop h{} k{}", v.heads, v.bk),
        None => format!("{:?}", plan.kernel()),
    };
    Ok(Measurement { label: format!("prefill attn {n_q}q/{n_kv}kv hd{hd} {n_tok} tok {what}"), seconds: s, bytes: 0.0, flops })
}

/// The attention table: the roofline first, then decode at 4K and 32K (f16 and q8_0 caches) and
/// prefill at 2K tokens (Llama-3-8B shape: 32 query heads, 8 KV heads, head_dim 128).
pub fn attention_table(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let (roof_bytes, reps) = if quick { (64u64 << 20, 3) } else { (1u64 << 30, 20) };
    let mut v = vec![crate::stream_read(ctx, roof_bytes, reps)?];
    let ctxs: &[usize] = if quick { &[1024] } else { &[4096, 32768] };
    for &len in ctxs {
        for dtype in [KvDtype::F16, KvDtype::Q8_0] {
            v.push(decode(ctx, 32, 8, 128, len, dtype, if quick { 3 } else { 200 }, false)?);
        }
        v.push(decode(ctx, 32, 8, 128, len, KvDtype::F16, if quick { 3 } else { 200 }, true)?);
    }
    if !quick {
        for (heads, keys, target) in [(2, 2, 512), (2, 4, 528), (2, 4, 396), (2, 4, 1056), (4, 4, 264)] {
            v.push(decode_tuned(ctx, 32, 8, 128, 32768, heads, keys, target, 200)?);
        }
        // Short contexts: the plan's default (the short-context variant up to
        // `DECODE_SHORT_KV` positions) against each variant forced, to place the threshold.
        let (sh, sk, st) = boostr::attention::DECODE_SHORT_TUNING;
        for len in [128, 512, 1024, 2048, 4096] {
            v.push(decode(ctx, 32, 8, 128, len, KvDtype::F16, 200, false)?);
            v.push(decode_tuned(ctx, 32, 8, 128, len, sh, sk, st, 200)?);
            v.push(decode_tuned(ctx, 32, 8, 128, len, 2, boostr::attention::DECODE_KEYS_PER_STEP, boostr::attention::DECODE_TARGET_WGS, 200)?);
        }
    }
    // Prefill: the default kernel (coopmat where the adapter has it) and the subgroup one.
    for n_tok in if quick { vec![128] } else { vec![512, 2048] } {
        for (n_q, n_kv, hd) in [(32, 8, 128), (32, 8, 64)] {
            v.push(prefill(ctx, n_q, n_kv, hd, n_tok, if quick { 1 } else { 5 }, None)?);
            if DecodeKernel::best(&boostr::ops_common::env_of(ctx)) == DecodeKernel::Subgroup {
                v.push(prefill(ctx, n_q, n_kv, hd, n_tok, if quick { 1 } else { 5 }, Some(DecodeKernel::Subgroup))?);
            }
            // The coopmat variants, where they run.
            let max_shared = ctx.capabilities().limits.max_compute_workgroup_storage_size;
            let have = QuantGemm::coopmat_available(ctx);
            for (heads, bk) in [(4, 32), (2, 32), (1, 32), (2, 64), (1, 64), (4, 64)] {
                let c = PrefillAttnCoop { head_dim: hd as u32, heads, bk };
                if have && c.supported(&boostr::ops_common::env_of(ctx), true, max_shared) {
                    v.push(prefill_variant(ctx, n_q, n_kv, hd, n_tok, if quick { 1 } else { 5 }, None, Some(c))?);
                }
            }
        }
    }
    Ok(v)
}

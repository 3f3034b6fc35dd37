//! Paged attention workloads: a batched decode step (B sequences, one query token each, every
//! sequence at the same context length) over the paged cache, at block lengths 16 and 32, beside
//! the contiguous cache's tuned decode for one sequence; then a batched step's prompt chunk through
//! the paged kernel beside the session's prefill attention. Bytes = the K and V rows read; the table
//! prints them as a fraction of the streaming-read roofline of the same run.

use boostr::attention::{AttnOptions, QueryLayout};
use boostr::kv_cache::KvDtype;
use boostr::ops_common::{OpPlan, OpsError};
use boostr::paged::{BatchSeq, BlockAllocator, BlockTable, PagedAttnPlan, PagedBatch, PagedKvCache, PagedKvConfig, Splits};
use numr::{DType, Device, GpuContext, Result, Tensor};

use crate::{Measurement, time_recorded};

fn ops_err(e: OpsError) -> numr::NumrError {
    numr::NumrError::Internal { context: "planning paged attention".into(), message: e.to_string() }
}

/// One batched decode step of `b` sequences at `ctx_len` positions each (llama-8b's attention
/// shape when `n_q = 32, n_kv = 8, hd = 128`), `splits` chunks per sequence.
#[allow(clippy::too_many_arguments)]
pub fn paged_decode(
    ctx: &GpuContext,
    n_q: usize,
    n_kv: usize,
    hd: usize,
    b: usize,
    ctx_len: usize,
    block_len: usize,
    splits: Splits,
    reps: usize,
) -> Result<Measurement> {
    let per_seq = ctx_len.div_ceil(block_len);
    let cfg = PagedKvConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, block_len, n_blocks: b * per_seq, dtype: KvDtype::F16, max_buffer_bytes: None };
    let kv = PagedKvCache::new(ctx, cfg).map_err(ops_err)?;
    let mut alloc = BlockAllocator::new(cfg.n_blocks);
    let mut tables = vec![BlockTable::new(); b];
    for t in &mut tables {
        t.grow(&mut alloc, block_len, ctx_len).map_err(ops_err)?;
    }
    let batch = PagedBatch::new(ctx, b, b * per_seq, block_len).map_err(ops_err)?;
    let seqs: Vec<BatchSeq> = tables.iter().map(|t| BatchSeq { table: t, pos: ctx_len - 1, n_tok: 1 }).collect();
    let step = batch.set(ctx, &seqs).map_err(ops_err)?;
    let q = Tensor::zeros(&[b * n_q * hd], DType::F32, &Device::Gpu(ctx.clone()))?;
    let qb = q.gpu_binding(4)?.0;
    let ql = QueryLayout { n_tok: b, n_q, q_off: 0, tok_stride: n_q * hd };
    let plan = PagedAttnPlan::new(ctx, &qb, &ql, &kv, 0, &batch, &AttnOptions::new(hd), splits, None).map_err(ops_err)?;
    let s = time_recorded(ctx, reps, 5, |rec, _| plan.record(rec, &step).map_err(ops_err))?;
    let bytes = 2.0 * (b * ctx_len * n_kv * KvDtype::F16.row_words(hd) * 4) as f64;
    Ok(Measurement {
        label: format!(
            "paged decode {n_q}q/{n_kv}kv hd{hd} B={b} ctx {ctx_len} block {block_len} {}",
            match splits {
                Splits::Fixed(n) => format!("splits {n}"),
                Splits::Auto { max } => format!("splits auto (<= {max})"),
                Splits::PerToken { keys, max } => format!("a split per {keys} keys (<= {max})"),
            }
        ),
        seconds: s,
        bytes,
        flops: 0.0,
    })
}

/// One prefill chunk of `n_tok` tokens of one sequence after `depth` cached positions, through
/// the paged kernel a batched step's prompt rows take (each token its own workgroups, `splits`
/// key chunks each); flops = 4 · hd · n_q · Σ (pos + 1) over the chunk's positions, as
/// [`crate::attention::prefill`] counts them, so the two tables' TFLOP/s compare.
#[allow(clippy::too_many_arguments)]
pub fn paged_prefill(
    ctx: &GpuContext,
    n_q: usize,
    n_kv: usize,
    hd: usize,
    n_tok: usize,
    depth: usize,
    block_len: usize,
    splits: usize,
    reps: usize,
) -> Result<Measurement> {
    let len = depth + n_tok;
    let cfg = PagedKvConfig {
        n_layers: 1,
        n_kv_heads: n_kv,
        head_dim: hd,
        block_len,
        n_blocks: len.div_ceil(block_len),
        dtype: KvDtype::F16,
        max_buffer_bytes: None,
    };
    let kv = PagedKvCache::new(ctx, cfg).map_err(ops_err)?;
    let mut alloc = BlockAllocator::new(cfg.n_blocks);
    let mut table = BlockTable::new();
    table.grow(&mut alloc, block_len, len).map_err(ops_err)?;
    let batch = PagedBatch::new(ctx, n_tok, cfg.n_blocks, block_len).map_err(ops_err)?;
    let step = batch.set(ctx, &[BatchSeq { table: &table, pos: depth, n_tok }]).map_err(ops_err)?;
    let q = Tensor::zeros(&[n_tok * n_q * hd], DType::F32, &Device::Gpu(ctx.clone()))?;
    let qb = q.gpu_binding(4)?.0;
    let ql = QueryLayout { n_tok, n_q, q_off: 0, tok_stride: n_q * hd };
    let plan = PagedAttnPlan::new(ctx, &qb, &ql, &kv, 0, &batch, &AttnOptions::new(hd), Splits::Fixed(splits), None).map_err(ops_err)?;
    let s = time_recorded(ctx, reps, 3, |rec, _| plan.record(rec, &step).map_err(ops_err))?;
    let keys: usize = (depth..len).map(|p| p + 1).sum();
    Ok(Measurement {
        label: format!("paged prefill {n_q}q/{n_kv}kv hd{hd} {n_tok} tok at depth {depth} block {block_len} splits {splits}"),
        seconds: s,
        bytes: 0.0,
        flops: 4.0 * (hd * n_q) as f64 * keys as f64,
    })
}

/// The paged table: the roofline, then for B = 1, 8, 64 at decreasing contexts, block lengths 16
/// and 32 with a few split counts, and the contiguous decode of one sequence for scale.
pub fn paged_table(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let (roof_bytes, reps) = if quick { (64u64 << 20, 3) } else { (1u64 << 30, 50) };
    let mut v = vec![crate::stream_read(ctx, roof_bytes, if quick { 3 } else { 20 })?];
    let cases: &[(usize, usize)] = if quick { &[(1, 256), (4, 128)] } else { &[(1, 4096), (1, 32768), (8, 4096), (64, 1024), (64, 4096)] };
    for &(b, len) in cases {
        if b == 1 {
            v.push(crate::attention::decode(ctx, 32, 8, 128, len, KvDtype::F16, reps, false)?);
        }
        for block_len in [16, 32] {
            let splits: &[usize] = if quick {
                &[1, 4]
            } else if b == 1 {
                &[16, 64, 256]
            } else if b == 8 {
                &[4, 16, 64]
            } else {
                &[1, 4]
            };
            for &s in splits {
                v.push(paged_decode(ctx, 32, 8, 128, b, len, block_len, Splits::Fixed(s), reps)?);
            }
            if block_len == 16 {
                v.push(paged_decode(ctx, 32, 8, 128, b, len, block_len, Splits::Auto { max: 256 }, reps)?);
            }
        }
    }
    // A batched step's prompt chunk (512 tokens, at the start of a prompt and after 1536
    // cached positions) through the paged kernel, beside the session's prefill attention of a
    // whole prompt of 512 (coopmat where the adapter has it).
    let (n_tok, depths, preps): (usize, &[usize], usize) = if quick { (64, &[0, 64], 1) } else { (512, &[0, 1536], 5) };
    v.push(crate::attention::prefill(ctx, 32, 8, 128, n_tok, preps, None)?);
    for &depth in depths {
        for splits in [1, 4] {
            v.push(paged_prefill(ctx, 32, 8, 128, n_tok, depth, 16, splits, preps)?);
        }
    }
    Ok(v)
}

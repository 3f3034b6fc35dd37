//! A batched attention block on the paged cache, as an engine records it: QK-norm + RoPE at each
//! token's own position (`RopePositions::Buffer` over the batch's positions), the K/V write
//! through the block tables, and attention, in one recorder and one submit per step.
//!
//! Two steps over three sequences: prefill chunks of different lengths, then one decode row for
//! each of two of them beside a new sequence's prefill chunk. Each step's attention output and the
//! cached rows are checked against the CPU references run per sequence (`QkvRope::reference`
//! then `paged_attention_ref`), at head sizes 16, 64 (the subgroup kernel where the adapter has
//! subgroups) and 80. Recording a step creates no buffer and no
//! bind group, and the dispatch count does not depend on how many tokens or sequences it carries.

use boostr::attention::{AttnOptions, QueryLayout};
use boostr::kv_cache::KvDtype;
use boostr::ops_common::{OpPlan, pseudo_random as rnd};
use boostr::paged::{
    BatchSeq, BlockAllocator, BlockTable, PagedAttnPlan, PagedBatch, PagedKvCache, PagedKvConfig, PagedKvWritePlan, PagedRowsLayout, Splits,
    paged_attention_ref,
};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopePositions, RopeStyle};
use numr::gpu::GpuContext;
use numr::testing::test_gpu;

#[path = "plans_util.rs"]
mod util;
use util::*;

const MAX_TOK: usize = 32;

fn block(ctx: &GpuContext, hd: usize) {
    let (n_q, n_kv, bl) = (4, 2, 16);
    let what = format!("hd {hd}");
    let cfg = QkvRope { style: RopeStyle::Neox, rope: true, qk_norm: true, norm_offset: false, kv_write: None };
    let rp = rope_params(hd, hd, RopeStyle::Neox);
    let l = QkvLayout::packed(MAX_TOK, n_q, n_kv, hd);
    let width = l.tok_stride;
    let (qw, kw) = (rnd(hd, 4, 1.0), rnd(hd, 5, 1.0));
    let (qwt, kwt) = (up(ctx, &qw), up(ctx, &kw));
    let xt = up(ctx, &vec![0.0; MAX_TOK * width]);
    let xb = bind(&xt);
    let kv_cfg = PagedKvConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, block_len: bl, n_blocks: 16, dtype: KvDtype::F16, max_buffer_bytes: None };
    let kv = PagedKvCache::new(ctx, kv_cfg).unwrap();
    let batch = PagedBatch::new(ctx, MAX_TOK, 64, bl).unwrap();
    let pos_b = batch.positions_binding();
    let inp = QkvRopeInputs {
        x: &xb,
        layout: l,
        rope: &rp,
        positions: &RopePositions::Buffer(pos_b),
        qw: Some(&bind(&qwt)),
        kw: Some(&bind(&kwt)),
        eps: 1e-6,
        cache: None,
    };
    let rope = QkvRopePlan::new(ctx, &cfg, &inp).unwrap();
    let rows = PagedRowsLayout { x_off: 0, tok_stride: width, k_off: l.k_off, v_off: l.v_off };
    let write = PagedKvWritePlan::new(ctx, &xb, &rows, &kv, 0, &batch).unwrap();
    let opts = AttnOptions::new(hd);
    let ql = QueryLayout { n_tok: MAX_TOK, n_q, q_off: 0, tok_stride: width };
    let attn = PagedAttnPlan::new(ctx, &xb, &ql, &kv, 0, &batch, &opts, Splits::Auto { max: 4 }, None).unwrap();

    let mut alloc = BlockAllocator::new(16);
    let mut tables = [BlockTable::new(), BlockTable::new(), BlockTable::new()];
    // The CPU side: every sequence's rotated K and V rows so far, `[pos][n_kv][hd]`.
    let mut cached: [(Vec<f32>, Vec<f32>); 3] = Default::default();
    // (sequence, first position, tokens) per step.
    let steps: [&[(usize, usize, usize)]; 2] = [&[(0, 0, 17), (1, 0, 5)], &[(1, 5, 1), (2, 0, 9), (0, 17, 1)]];
    let mut counts = Vec::new();
    for (si, step) in steps.iter().enumerate() {
        for &(s, pos, n) in step.iter() {
            tables[s].grow(&mut alloc, bl, pos + n).unwrap();
        }
        let n_tok: usize = step.iter().map(|s| s.2).sum();
        let x0 = rnd(n_tok * width, 10 + si as u64, 1.0);
        ctx.write(xt.gpu_buffer().unwrap(), 0, bytemuck::cast_slice(&x0)).unwrap();
        let bs: Vec<BatchSeq> = step.iter().map(|&(s, pos, n)| BatchSeq { table: &tables[s], pos, n_tok: n }).collect();
        let sv = batch.set(ctx, &bs).unwrap();
        assert_eq!(sv.n_tok as usize, n_tok);
        let before = no_copy_alloc_snapshot(ctx);
        let mut rec = ctx.recorder();
        rope.record(&mut rec, &sv).unwrap();
        write.record(&mut rec, &sv).unwrap();
        attn.record(&mut rec, &sv).unwrap();
        assert_eq!(no_copy_alloc_snapshot(ctx), before, "{what}: recording created a bind group or a buffer");
        counts.push(rec.dispatch_count());
        rec.submit().unwrap();

        // The reference, sequence by sequence.
        let mut x = x0.clone();
        let mut q = Vec::new();
        let mut refs = Vec::new();
        let mut t0 = 0;
        for &(s, pos, n) in step.iter() {
            let mut lx = QkvLayout::packed(n, n_q, n_kv, hd);
            lx.x_off = t0 * width;
            let positions: Vec<u32> = (pos..pos + n).map(|p| p as u32).collect();
            let (ks, vs) = cfg.reference(&mut x, &lx, &rp, &positions, Some(&qw), Some(&kw), 1e-6).unwrap();
            cached[s].0.extend(ks.chunks(hd).flat_map(|r| KvDtype::F16.round_row(r)));
            cached[s].1.extend(vs.chunks(hd).flat_map(|r| KvDtype::F16.round_row(r)));
            for t in t0..t0 + n {
                q.extend_from_slice(&x[t * width..t * width + n_q * hd]);
            }
            refs.push((by_head(&cached[s].0, pos + n, n_kv, hd), by_head(&cached[s].1, pos + n, n_kv, hd), pos, n));
            t0 += n;
        }
        let got = attn.output().unwrap().to_vec::<f32>().unwrap()[..n_tok * n_q * hd].to_vec();
        let r: Vec<(&[f32], &[f32], usize, usize)> = refs.iter().map(|(k, v, p, n)| (&k[..], &v[..], *p, *n)).collect();
        let want = paged_attention_ref(&q, &r, n_q, n_kv, hd, &opts).unwrap();
        close(&got, &want, 1e-4, &format!("{what}: step {si} attention"));
        for &(s, pos, n) in step.iter() {
            let (k, v) = kv.read_sequence(ctx, 0, &tables[s], pos + n).unwrap();
            close(&k, &by_head(&cached[s].0, pos + n, n_kv, hd), 2e-3, &format!("{what}: step {si} K of sequence {s}"));
            close(&v, &by_head(&cached[s].1, pos + n, n_kv, hd), 2e-3, &format!("{what}: step {si} V of sequence {s}"));
        }
    }
    assert_eq!(counts[0], counts[1], "{what}: the dispatches of a step do not depend on its tokens");
}

#[test]
fn a_batched_attention_block_matches_the_per_sequence_references() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    for hd in [16, 64, 80] {
        block(&ctx, hd);
    }
}

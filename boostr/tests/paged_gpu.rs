//! The paged KV cache on a real adapter (lavapipe in CI): the write through block tables and the
//! batched attention, against the CPU reference and against the contiguous cache.
//!
//! - Every head size the issue names (16, 32, 80, 96, 112, 128, 160, 256 as f16; 32, 96, 128,
//!   256 as q8_0), GQA groups from 1 to 24, three sequences in one step mixing decode rows and
//!   prefill chunks, block lengths 16 and 32, positions across block boundaries.
//! - A layer spread over several buffers (a buffer of 3 blocks) with several splits, a sliding
//!   window and soft-capping, on both kernels (the subgroup one at head sizes 64, 128 and 256
//!   where the adapter has subgroups of 8, the portable one always).
//! - A freed-then-reused block: a released sequence's blocks go to a new one, whose output shows
//!   none of the old rows.
//! - The same rows in the contiguous cache give the same attention output (within 1e-4: both read
//!   the same f16 rows; the kernels sum in different orders).
//!
//! What is checked against what: the stored rows read back equal the CPU rounding of the rows
//! written (f16 exactly; q8_0 within one quantization step), and the attention output is within
//! 1e-4 relative of the f64 reference ([`paged_attention_ref`]) over the rows as stored.

use boostr::attention::DecodeKernel;
use boostr::attention::{self, AttnOptions, QueryLayout};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype, KvWritePlan};
use boostr::ops_common::{OpPlan, env_of, pseudo_random as rnd};
use boostr::paged::{
    BatchSeq, BlockAllocator, BlockTable, PagedAttnPlan, PagedBatch, PagedKvCache, PagedKvConfig, PagedKvWritePlan, PagedRowsLayout, Splits, auto_splits,
    paged_attention_ref,
};
use boostr::rope::QkvLayout;
use numr::gpu::{GpuContext, StepValues};
use numr::testing::test_gpu;

#[path = "plans_util.rs"]
mod util;
use util::*;

/// One attention case: the cache's shape, the sequences (tokens already cached, tokens in the
/// step), the splits and the options.
struct Case {
    hd: usize,
    n_q: usize,
    n_kv: usize,
    dtype: KvDtype,
    block_len: usize,
    /// Blocks per buffer (None: one buffer).
    buf_blocks: Option<usize>,
    /// `(cached, new)` per sequence: the step attends `new` tokens at positions `cached ..`.
    seqs: Vec<(usize, usize)>,
    splits: usize,
    opts: AttnOptions,
}

impl Case {
    fn new(hd: usize, n_q: usize, n_kv: usize, dtype: KvDtype) -> Case {
        Case { hd, n_q, n_kv, dtype, block_len: 16, buf_blocks: None, seqs: vec![(0, 5), (40, 1), (15, 18)], splits: 1, opts: AttnOptions::new(hd) }
    }

    fn what(&self) -> String {
        format!(
            "hd {} {}q/{}kv {} blocks of {} ({:?} per buffer) seqs {:?} splits {} {:?}",
            self.hd, self.n_q, self.n_kv, self.dtype, self.block_len, self.buf_blocks, self.seqs, self.splits, self.opts
        )
    }
}

fn cache(ctx: &GpuContext, c: &Case, n_blocks: usize) -> PagedKvCache {
    let mut cfg = PagedKvConfig { n_layers: 1, n_kv_heads: c.n_kv, head_dim: c.hd, block_len: c.block_len, n_blocks, dtype: c.dtype, max_buffer_bytes: None };
    cfg.max_buffer_bytes = c.buf_blocks.map(|b| b as u64 * cfg.block_bytes());
    PagedKvCache::new(ctx, cfg).unwrap()
}

/// K/V rows for `n` tokens, `[token][k heads | v heads]`.
fn rows(n: usize, n_kv: usize, hd: usize, seed: u64) -> (Vec<f32>, PagedRowsLayout) {
    (rnd(n * 2 * n_kv * hd, seed, 1.0), PagedRowsLayout { x_off: 0, tok_stride: 2 * n_kv * hd, k_off: 0, v_off: n_kv * hd })
}

/// Writes `rows` of every sequence's positions `0 .. cached + new` (one step per sequence, then
/// one step of all), returning each sequence's table.
fn fill(ctx: &GpuContext, c: &Case, kv: &PagedKvCache, alloc: &mut BlockAllocator, seed: u64) -> Vec<(BlockTable, Vec<f32>)> {
    let mut out = Vec::new();
    for (i, &(cached, new)) in c.seqs.iter().enumerate() {
        let n = cached + new;
        let mut t = BlockTable::new();
        t.grow(alloc, c.block_len, n).unwrap();
        let (x, l) = rows(n, c.n_kv, c.hd, seed + i as u64);
        let xt = up(ctx, &x);
        let batch = PagedBatch::new(ctx, n, 64, c.block_len).unwrap();
        let w = PagedKvWritePlan::new(ctx, &bind(&xt), &l, kv, 0, &batch).unwrap();
        let step = batch.set(ctx, &[BatchSeq { table: &t, pos: 0, n_tok: n }]).unwrap();
        assert_eq!((step.n_tok, step.kv_max()), (n as u32, n as u32));
        w.run(ctx, &step).unwrap();
        out.push((t, x));
    }
    out
}

/// Checks the stored rows against the rounding of the rows written, then one batched attention
/// step against the reference. Returns the GPU output.
fn attend(ctx: &GpuContext, c: &Case, kv: &PagedKvCache, seqs: &[(BlockTable, Vec<f32>)]) -> Vec<f32> {
    let what = c.what();
    let hd = c.hd;
    let mut stored = Vec::new();
    for (i, (t, x)) in seqs.iter().enumerate() {
        let n = c.seqs[i].0 + c.seqs[i].1;
        let (k, v) = kv.read_sequence(ctx, 0, t, n).unwrap();
        // The rows written, each rounded as the cache stores it, `[kv_head][pos][hd]`.
        let part = |first: usize| -> Vec<f32> {
            let r: Vec<f32> = x.chunks(2 * c.n_kv * hd).flat_map(|t| t[first..first + c.n_kv * hd].chunks(hd).flat_map(|h| c.dtype.round_row(h))).collect();
            by_head(&r, n, c.n_kv, hd)
        };
        let (kx, vx) = (part(0), part(c.n_kv * hd));
        stored_close(&k, &kx, c.dtype, &format!("{what}: stored K of sequence {i}"));
        stored_close(&v, &vx, c.dtype, &format!("{what}: stored V of sequence {i}"));
        stored.push((k, v));
    }
    let n_tok: usize = c.seqs.iter().map(|s| s.1).sum();
    let q = rnd(n_tok * c.n_q * hd, 7, 2.0);
    let qt = up(ctx, &q);
    let batch = PagedBatch::new(ctx, n_tok + 3, 64, c.block_len).unwrap();
    let ql = QueryLayout { n_tok, n_q: c.n_q, q_off: 0, tok_stride: c.n_q * hd };
    // A plan for more tokens than the step has: rows past the step are not touched.
    let qbig = up(ctx, &[q.clone(), vec![0.0; 3 * c.n_q * hd]].concat());
    let bs: Vec<BatchSeq> = seqs.iter().zip(&c.seqs).map(|((t, _), &(cached, new))| BatchSeq { table: t, pos: cached, n_tok: new }).collect();
    let step = batch.set(ctx, &bs).unwrap();
    assert_eq!(step.n_tok as usize, n_tok);
    let refs: Vec<(&[f32], &[f32], usize, usize)> = stored.iter().zip(&c.seqs).map(|((k, v), &(cached, new))| (&k[..], &v[..], cached, new)).collect();
    let want = paged_attention_ref(&q, &refs, c.n_q, c.n_kv, hd, &c.opts).unwrap();
    // Both kernels where the subgroup one takes the shape (head sizes 64, 128, 256, groups up
    // to 16, subgroups of at least 8), else the portable one.
    let shape_sg = attention::contiguous_supported(hd, c.n_q / c.n_kv);
    let sg = shape_sg && DecodeKernel::best(&env_of(ctx)) == DecodeKernel::Subgroup;
    if shape_sg && !sg {
        numr::testing::skip_path(ctx, "the paged subgroup attention kernel", "no subgroups of at least 8 invocations");
    }
    let mut got = Vec::new();
    for kernel in [DecodeKernel::Tiled, DecodeKernel::Subgroup].into_iter().filter(|k| sg || *k == DecodeKernel::Tiled) {
        // The fixed split count, the count picked per step (at most 8), and each token's own
        // count (one chunk per 24 keys, at most 4).
        for splits in [Splits::Fixed(c.splits), Splits::Auto { max: 8 }, Splits::PerToken { keys: 24, max: 4 }] {
            let plan = PagedAttnPlan::with_kernel(ctx, &bind(&qbig), &ql, kv, 0, &batch, &c.opts, splits, None, Some(kernel)).unwrap();
            plan.run(ctx, &step).unwrap();
            got = plan.output().unwrap().to_vec::<f32>().unwrap()[..n_tok * c.n_q * hd].to_vec();
            close(&got, &want, 1e-4, &format!("{what}: attention ({kernel:?}, {splits:?})"));
        }
    }
    drop(qt);
    got
}

fn run_case(ctx: &GpuContext, c: &Case) -> Vec<f32> {
    let kv = cache(ctx, c, 24);
    let mut alloc = BlockAllocator::new(24);
    let seqs = fill(ctx, c, &kv, &mut alloc, 11);
    attend(ctx, c, &kv, &seqs)
}

#[test]
fn every_head_size_and_group_matches_the_reference() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    for hd in [16, 32, 64, 80, 96, 112, 128, 160, 256] {
        run_case(&ctx, &Case::new(hd, 4, 2, KvDtype::F16));
    }
    for hd in [32, 96, 128, 256] {
        run_case(&ctx, &Case::new(hd, 4, 2, KvDtype::Q8_0));
    }
    // GQA groups 1, 3, 8, 16 and 24 (more than one workgroup's heads), MQA.
    for (n_q, n_kv) in [(2, 2), (6, 2), (8, 1), (16, 1), (48, 2)] {
        run_case(&ctx, &Case::new(64, n_q, n_kv, KvDtype::F16));
    }
}

#[test]
fn blocks_of_32_several_buffers_splits_window_and_softcap() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    let mut c = Case::new(80, 4, 2, KvDtype::F16);
    c.block_len = 32;
    c.seqs = vec![(31, 2), (64, 1), (0, 33)];
    run_case(&ctx, &c);
    for (buf_blocks, splits) in [(Some(3), 1), (Some(3), 4), (None, 5)] {
        let mut c = Case::new(96, 6, 2, KvDtype::F16);
        c.buf_blocks = buf_blocks;
        c.splits = splits;
        c.seqs = vec![(100, 1), (7, 9), (47, 2)];
        run_case(&ctx, &c);
        c.dtype = KvDtype::Q8_0;
        run_case(&ctx, &c);
    }
    // The same at head sizes the subgroup kernel takes (both kernels run).
    for (hd, dtype) in [(64, KvDtype::F16), (128, KvDtype::Q8_0)] {
        let mut c = Case::new(hd, 8, 2, dtype);
        c.buf_blocks = Some(3);
        c.splits = 4;
        c.seqs = vec![(100, 1), (7, 9), (47, 2)];
        run_case(&ctx, &c);
    }
    for hd in [32, 64] {
        let mut c = Case::new(hd, 4, 1, KvDtype::F16);
        c.buf_blocks = Some(2);
        c.splits = 3;
        c.seqs = vec![(90, 1), (20, 12)];
        c.opts.window = Some(19);
        c.opts.softcap = Some(1.5);
        run_case(&ctx, &c);
    }
}

#[test]
fn a_freed_block_reused_by_another_sequence_shows_none_of_the_old_rows() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    let mut c = Case::new(64, 4, 2, KvDtype::F16);
    c.seqs = vec![(40, 1)];
    let kv = cache(&ctx, &c, 4);
    let mut alloc = BlockAllocator::new(4);
    let mut old = fill(&ctx, &c, &kv, &mut alloc, 1);
    let old_blocks = old[0].0.blocks().to_vec();
    old[0].0.release(&mut alloc).unwrap();
    // A shorter sequence on the same blocks: its last block still holds the old sequence's rows
    // past its length, which attention must not see.
    c.seqs = vec![(20, 1)];
    let new = fill(&ctx, &c, &kv, &mut alloc, 2);
    assert_eq!(new[0].0.blocks(), &old_blocks[..2], "the freed blocks are reused");
    attend(&ctx, &c, &kv, &new);
}

#[test]
fn the_paged_and_the_contiguous_cache_give_the_same_output() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    let (hd, n_q, n_kv, n) = (64, 8, 2, 70);
    let mut c = Case::new(hd, n_q, n_kv, KvDtype::F16);
    c.seqs = vec![(n - 1, 1)];
    let kv = cache(&ctx, &c, 8);
    let mut alloc = BlockAllocator::new(8);
    // Blocks out of order: the sequence's table is not 0, 1, 2, ...
    let mut hole = BlockTable::new();
    hole.grow(&mut alloc, 16, 33).unwrap();
    let seqs = fill(&ctx, &c, &kv, &mut alloc, 5);
    hole.release(&mut alloc).unwrap();
    assert_ne!(seqs[0].0.blocks()[0], 0);
    let paged = attend(&ctx, &c, &kv, &seqs);

    let cfg = KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity: 128, dtype: KvDtype::F16, max_segment_bytes: None };
    let flat = KvCache::new(&ctx, cfg).unwrap();
    let xt = up(&ctx, &seqs[0].1);
    let l = QkvLayout { n_tok: n, n_q: 0, n_kv, head_dim: hd, tok_stride: 2 * n_kv * hd, x_off: 0, q_off: 0, k_off: 0, v_off: n_kv * hd };
    KvWritePlan::new(&ctx, &bind(&xt), &l, &flat, 0).unwrap().run(&ctx, &StepValues::chunk(0, n as u32)).unwrap();
    let q = rnd(n_q * hd, 7, 2.0);
    let qt = up(&ctx, &q);
    let contiguous = attention::decode(&ctx, &bind(&qt), 0, n_q, &flat, 0, n, &c.opts).unwrap().to_vec::<f32>().unwrap();
    close(&paged, &contiguous, 1e-4, "paged against contiguous");
}

/// [`Splits::PerToken`]: a token's split count follows its own length only, so its output is
/// the same bits whatever else its step holds (each sequence alone in a step of its own), and a
/// token of `k` chunks gets the bits [`Splits::Fixed`]`(k)` gives it (the merge adds the other
/// chunks' empty partials as exact zeros). Both kernels where the adapter runs them.
#[test]
fn a_token_split_by_its_own_length_gets_the_same_bits_in_any_step() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    let mut c = Case::new(128, 8, 2, KvDtype::F16);
    // Tokens of 1 to 101 keys: 1, 2, 3 and 4 chunks of 32 keys.
    c.seqs = vec![(100, 1), (7, 9), (47, 2), (0, 40), (70, 1)];
    let kv = cache(&ctx, &c, 24);
    let mut alloc = BlockAllocator::new(24);
    let seqs = fill(&ctx, &c, &kv, &mut alloc, 3);
    let (hd, n_q) = (c.hd, c.n_q);
    let n_tok: usize = c.seqs.iter().map(|s| s.1).sum();
    let q = rnd(n_tok * n_q * hd, 9, 2.0);
    let qt = up(&ctx, &q);
    let ql = QueryLayout { n_tok, n_q, q_off: 0, tok_stride: n_q * hd };
    let batch = PagedBatch::new(&ctx, n_tok, 64, c.block_len).unwrap();
    let (keys, max) = (32, 4);
    let sg = DecodeKernel::best(&env_of(&ctx)) == DecodeKernel::Subgroup;
    if !sg {
        numr::testing::skip_path(&ctx, "the paged subgroup attention kernel", "no subgroups of at least 8 invocations");
    }
    for kernel in [DecodeKernel::Tiled, DecodeKernel::Subgroup].into_iter().filter(|k| sg || *k == DecodeKernel::Tiled) {
        // `q`: the step's tokens' queries, padded to the plan's tokens.
        let run = |splits: Splits, bs: &[BatchSeq], q: &[f32]| -> Vec<f32> {
            let mut padded = q.to_vec();
            padded.resize(n_tok * n_q * hd, 0.0);
            let qt = up(&ctx, &padded);
            let plan = PagedAttnPlan::with_kernel(&ctx, &bind(&qt), &ql, &kv, 0, &batch, &c.opts, splits, None, Some(kernel)).unwrap();
            let step = batch.set(&ctx, bs).unwrap();
            plan.run(&ctx, &step).unwrap();
            let n: usize = bs.iter().map(|b| b.n_tok).sum();
            plan.output().unwrap().to_vec::<f32>().unwrap()[..n * n_q * hd].to_vec()
        };
        let all: Vec<BatchSeq> = seqs.iter().zip(&c.seqs).map(|((t, _), &(cached, new))| BatchSeq { table: t, pos: cached, n_tok: new }).collect();
        let per_token = Splits::PerToken { keys, max };
        let got = run(per_token, &all, &q);
        let row = n_q * hd;
        // Each sequence alone: the same bits.
        let mut first = 0;
        for (i, b) in all.iter().enumerate() {
            let mine = &q[first * row..(first + b.n_tok) * row];
            let alone = run(per_token, std::slice::from_ref(b), mine);
            assert!(alone.iter().zip(&got[first * row..]).all(|(a, g)| a.to_bits() == g.to_bits()), "{kernel:?}: sequence {i} alone differs");
            first += b.n_tok;
        }
        // A token of k >= 2 chunks: the bits of Fixed(k).
        for k in 2..=max {
            let fixed = run(Splits::Fixed(k), &all, &q);
            let mut t = 0;
            for b in &all {
                for pos in b.pos..b.pos + b.n_tok {
                    if (pos + 1).div_ceil(keys).min(max) == k {
                        let r = t * row..(t + 1) * row;
                        assert!(got[r.clone()].iter().zip(&fixed[r]).all(|(a, f)| a.to_bits() == f.to_bits()), "{kernel:?}: token at {pos} against Fixed({k})");
                    }
                    t += 1;
                }
            }
        }
    }
    drop(qt);
    // No keys per chunk is a typed error.
    assert!(PagedAttnPlan::new(&ctx, &bind(&up(&ctx, &q)), &ql, &kv, 0, &batch, &c.opts, Splits::PerToken { keys: 0, max: 2 }, None).is_err());
}

#[test]
fn bad_steps_and_shapes_are_typed_errors() {
    let Some(ctx) = test_gpu() else { return };
    let c = Case::new(64, 4, 2, KvDtype::F16);
    let kv = cache(&ctx, &c, 2);
    let mut alloc = BlockAllocator::new(2);
    let mut t = BlockTable::new();
    t.grow(&mut alloc, 16, 20).unwrap();
    let batch = PagedBatch::new(&ctx, 4, 8, 16).unwrap();
    // Positions the table does not hold, too many tokens, no tokens.
    assert!(batch.set(&ctx, &[BatchSeq { table: &t, pos: 30, n_tok: 3 }]).is_err());
    assert!(batch.set(&ctx, &[BatchSeq { table: &t, pos: 0, n_tok: 5 }]).is_err());
    assert!(batch.set(&ctx, &[]).is_err());
    // A head size the kernels do not take; 5 query heads over 2 KV heads.
    let bad = PagedKvConfig { n_layers: 1, n_kv_heads: 2, head_dim: 20, block_len: 16, n_blocks: 2, dtype: KvDtype::F16, max_buffer_bytes: None };
    assert!(PagedKvCache::new(&ctx, bad).is_err());
    assert!(PagedKvCache::new(&ctx, PagedKvConfig { head_dim: 80, dtype: KvDtype::Q8_0, ..bad }).is_err());
    let qt = up(&ctx, &vec![0.0; 5 * 64 * 4]);
    let ql = QueryLayout { n_tok: 4, n_q: 5, q_off: 0, tok_stride: 5 * 64 };
    assert!(PagedAttnPlan::new(&ctx, &bind(&qt), &ql, &kv, 0, &batch, &c.opts, Splits::Fixed(1), None).is_err());
    // A layer the cache lacks; a step over the plan's tokens.
    let ql = QueryLayout { n_tok: 4, n_q: 4, q_off: 0, tok_stride: 4 * 64 };
    assert!(PagedAttnPlan::new(&ctx, &bind(&qt), &ql, &kv, 1, &batch, &c.opts, Splits::Fixed(1), None).is_err());
    let plan = PagedAttnPlan::new(&ctx, &bind(&qt), &ql, &kv, 0, &batch, &c.opts, Splits::Fixed(1), None).unwrap();
    assert!(plan.run(&ctx, &StepValues::chunk(0, 5)).is_err());
}

#[test]
fn auto_splits_follow_the_measured_best() {
    // Llama-3-8B's shape: 8 KV heads x 2 head blocks of the subgroup kernel = 16 rows per token.
    assert_eq!(auto_splits(1, 4096, 16, 64), 16);
    assert_eq!(auto_splits(8, 4096, 16, 64), 4);
    assert_eq!(auto_splits(64, 1024, 16, 64), 1);
    assert_eq!(auto_splits(1, 100, 16, 64), 1, "short contexts are one split");
    assert_eq!(auto_splits(1, 1 << 20, 16, 8), 8, "never past the plan's most");
}

/// The paged kernel over a contiguous cache (each segment a block, the identity table): decode and
/// a prefill chunk on a non-empty cache, at head sizes the contiguous kernels do not take, on a
/// cache split into segments, against the reference; at head size 64 against `DecodePlan`.
#[test]
fn over_a_contiguous_cache_any_head_size() {
    let Some(ctx) = test_gpu() else { return };
    let _s = serial();
    for (hd, n_q, n_kv, seg, splits) in [(16, 4, 2, None, 1), (16, 4, 2, Some(7), 3), (80, 6, 2, None, 4), (40, 24, 1, Some(20), 1), (64, 8, 2, None, 2)] {
        let what = format!("contiguous hd {hd} {n_q}q/{n_kv}kv seg {seg:?} splits {splits}");
        let cap = 48;
        let cache = new_cache(&ctx, n_kv, hd, cap, KvDtype::F16, seg);
        let (x, l) = kv_rows(cap, n_kv, hd, 3);
        let xt = up(&ctx, &x);
        KvWritePlan::new(&ctx, &bind(&xt), &l, &cache, 0).unwrap().run(&ctx, &StepValues::chunk(0, cap as u32)).unwrap();
        let (kc, vc) = cache.read_layer(&ctx, 0, cap).unwrap();
        let max_tok = 9;
        let q = rnd(max_tok * n_q * hd, 8, 2.0);
        let qt = up(&ctx, &q);
        let ql = QueryLayout { n_tok: max_tok, n_q, q_off: 0, tok_stride: n_q * hd };
        let opts = AttnOptions::new(hd);
        let plan = PagedAttnPlan::over_contiguous(&ctx, &bind(&qt), &ql, &cache, 0, &opts, Splits::Fixed(splits), None).unwrap();
        for (p0, n) in [(0usize, 9usize), (30, 1), (39, 9), (47, 1)] {
            plan.run(&ctx, &StepValues::chunk(p0 as u32, n as u32)).unwrap();
            let got = plan.output().unwrap().to_vec::<f32>().unwrap()[..n * n_q * hd].to_vec();
            let kv = p0 + n;
            let want = boostr::attention::attention_ref(
                &q[..n * n_q * hd],
                &prefix(&kc, n_kv, cap, kv, hd),
                &prefix(&vc, n_kv, cap, kv, hd),
                n,
                n_q,
                n_kv,
                hd,
                kv,
                p0,
                &opts,
            )
            .unwrap();
            close(&got, &want, 1e-4, &format!("{what}: {n} tokens at {p0}"));
            if hd == 64 && n == 1 {
                let flat = attention::decode(&ctx, &bind(&qt), 0, n_q, &cache, 0, kv, &opts).unwrap().to_vec::<f32>().unwrap();
                close(&got, &flat, 1e-4, &format!("{what}: against DecodePlan at {p0}"));
            }
        }
        assert!(matches!(plan.run(&ctx, &StepValues::chunk(45, 4)), Err(boostr::ops_common::OpsError::ContextOverflow { .. })), "{what}");
    }
}

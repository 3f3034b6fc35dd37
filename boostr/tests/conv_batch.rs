//! The short conv of a batched step ([`ShortConvBatchPlan`]): several sequences, each with its own
//! ring, decode rows and prefill chunks mixed in one dispatch, chunks longer than the ring, a slot
//! reused from position 0 over a dirty ring, and a rollback the ring allows. Every step's outputs
//! and the rings equal the one-sequence CPU reference run per sequence (f32 table of
//! `numr::dtype::rtol`). Bad runs are typed errors.

use std::sync::Arc;

use boostr::conv::{ConvSeq, ConvSeqs, ShortConvBatch, ShortConvBatchIo, ShortConvBatchPlan};
use boostr::ops_common::{GpuView, OpPlan, OpsError, pseudo_random as rnd};
use numr::gpu::{GpuBuffer, GpuContext, StepValues};
use numr::testing::{check_close, test_gpu};

fn read_f32(ctx: &GpuContext, b: &Arc<GpuBuffer>, words: usize) -> Vec<f32> {
    bytemuck::cast_slice(&ctx.read_bytes(b, 0, words as u64 * 4).unwrap()).to_vec()
}

fn close(got: &[f32], want: &[f32], what: &str) {
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    check_close(&f(got), &f(want), numr::DType::F32).unwrap_or_else(|e| panic!("{what}: {e}"));
}

fn seq(slot: usize, pos: usize, n_tok: usize) -> ConvSeq {
    ConvSeq { slot, pos, n_tok }
}

#[test]
fn batched_short_conv_equals_each_sequence_alone() {
    let Some(ctx) = test_gpu() else { return };
    let (ch, slots, max_tok) = (77, 4, 12);
    let steps: [&[ConvSeq]; 5] = [
        // Two new sequences.
        &[seq(2, 0, 5), seq(0, 0, 1)],
        // A decode row, a chunk longer than the ring, a third sequence.
        &[seq(2, 5, 1), seq(0, 1, 8), seq(3, 0, 2)],
        // Decode rows and a chunk; a fourth sequence in the last slot.
        &[seq(0, 9, 1), seq(3, 2, 4), seq(2, 6, 1), seq(1, 0, 3)],
        // Slot 0 again from position 0 (a new sequence over a dirty ring); slot 2 rolls back.
        &[seq(0, 0, 2), seq(2, 5, 2), seq(1, 3, 1)],
        // One token alone.
        &[seq(3, 6, 1)],
    ];
    for conv in ShortConvBatch::all() {
        let k = conv.kernel as usize;
        let ring = k + 2;
        let w = rnd(ch * k, 3, 1.0);
        let (wb, bcx) = (ctx.upload(bytemuck::cast_slice(&w)).unwrap(), ctx.upload(&vec![0u8; max_tok * 3 * ch * 4]).unwrap());
        let (state, out) = (ctx.upload(&vec![0u8; slots * ring * ch * 4]).unwrap(), ctx.upload(&vec![0u8; max_tok * ch * 4]).unwrap());
        let seqs = ConvSeqs::new(&ctx, max_tok, slots).unwrap();
        let io = ShortConvBatchIo { bcx: GpuView::whole(&bcx), w: GpuView::whole(&wb), state: GpuView::whole(&state), out: GpuView::whole(&out) };
        let plan = ShortConvBatchPlan::new(&ctx, &conv, &io, &seqs, ch, ring).unwrap();
        let mut rings = vec![0.0f32; slots * ring * ch];
        for (i, step) in steps.iter().enumerate() {
            let n: usize = step.iter().map(|s| s.n_tok).sum();
            let x = rnd(n * 3 * ch, 100 + (10 * i + k) as u64, 1.0);
            ctx.write(&bcx, 0, bytemuck::cast_slice(&x)).unwrap();
            let n_tok = seqs.set(&ctx, step).unwrap();
            assert_eq!(n_tok as usize, n);
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &StepValues::batch(n_tok, 0)).unwrap();
            assert_eq!(rec.dispatch_count(), 1, "one dispatch for every sequence");
            rec.submit().unwrap();
            let want = conv.reference(&x, &w, &mut rings, ring, step, ch).unwrap();
            close(&read_f32(&ctx, &out, n * ch), &want, &format!("{conv:?} step {i} outputs"));
            close(&read_f32(&ctx, &state, slots * ring * ch), &rings, &format!("{conv:?} rings after step {i}"));
        }
    }
}

#[test]
fn batched_short_conv_rejects_bad_runs() {
    let Some(ctx) = test_gpu() else { return };
    let seqs = ConvSeqs::new(&ctx, 8, 2).unwrap();
    let bad = |r: Result<u32, OpsError>, what: &str| {
        let e = r.expect_err(what);
        assert!(matches!(e, OpsError::BadArgs { .. }), "{what}: {e}");
    };
    bad(seqs.set(&ctx, &[seq(2, 0, 1)]), "a slot past the rings");
    bad(seqs.set(&ctx, &[seq(0, 0, 1), seq(0, 1, 1)]), "one slot twice");
    bad(seqs.set(&ctx, &[seq(1, 0, 0)]), "a run of no tokens");
    bad(seqs.set(&ctx, &[seq(0, 0, 5), seq(1, 0, 4)]), "more tokens than the buffer");
    bad(seqs.set(&ctx, &[]), "no runs");
    assert!(ConvSeqs::new(&ctx, 0, 2).is_err() && ConvSeqs::new(&ctx, 8, 0).is_err());
    let conv = ShortConvBatch { kernel: 3 };
    let b = ctx.upload(&[0u8; 4096]).unwrap();
    let v = GpuView::whole(&b);
    let io = ShortConvBatchIo { bcx: v.clone(), w: v.clone(), state: v.clone(), out: v };
    assert!(ShortConvBatchPlan::new(&ctx, &conv, &io, &seqs, 4, 1).is_err(), "a ring shorter than kernel - 1");
    assert!(ShortConvBatchPlan::new(&ctx, &conv, &io, &seqs, 64, 4).is_err(), "buffers too small for the step");
    assert!(ShortConvBatchPlan::new(&ctx, &ShortConvBatch { kernel: 1 }, &io, &seqs, 4, 4).is_err(), "one tap");
    let plan = ShortConvBatchPlan::new(&ctx, &conv, &io, &seqs, 4, 4).unwrap();
    assert!(plan.check(&StepValues::batch(9, 0)).is_err(), "a step over the plan's tokens");
}

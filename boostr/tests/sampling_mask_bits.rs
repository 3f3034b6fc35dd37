//! [`MaskBitsPlan`] on the GPU against [`mask_bits_ref`]: allowed-id bitmasks applied to chosen
//! logits rows in place (a structured-output constraint's mask reaching the sampler with no
//! logits read back), then argmax and top-k over the rows choose among the allowed ids only.

use boostr::ops_common::{GpuView, OpPlan, pseudo_random as rnd};
use boostr::sampling::{ArgmaxPlan, MaskBitsPlan, TopKPlan, mask_bits_ref};
use numr::gpu::StepValues;
use numr::testing::test_gpu;

/// A mask allowing the ids for which `keep` holds.
fn bits(n: usize, keep: impl Fn(usize) -> bool) -> Vec<u32> {
    let mut b = vec![0u32; n.div_ceil(32)];
    for id in (0..n).filter(|&i| keep(i)) {
        b[id / 32] |= 1 << (id % 32);
    }
    b
}

#[test]
fn masks_reach_their_rows_and_the_sampler_keeps_to_them() {
    let Some(ctx) = test_gpu() else { return };
    // A vocabulary that is not a multiple of 32 or of the workgroup's 64 words.
    let (n, max_rows, max_masks) = (4133, 5, 3);
    let logits: Vec<f32> = rnd(n * max_rows, 91, 6.0);
    let lb = ctx.upload(bytemuck::cast_slice(&logits)).unwrap();
    // Row 3: only every seventh id from 700 on; row 0: everything but the row's own best id;
    // row 4: a single id in the last, partial word.
    let best0 = (0..n).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap();
    let masks = [bits(n, |i| i >= 700 && i.is_multiple_of(7)), bits(n, |i| i != best0), bits(n, |i| i == n - 2)];
    let rows = [3u32, 0, 4];
    let flat: Vec<u32> = masks.concat();
    let (bb, rb) = (ctx.upload(bytemuck::cast_slice(&flat)).unwrap(), ctx.upload(bytemuck::cast_slice(&rows)).unwrap());
    let lv = GpuView::whole(&lb);
    let plan = MaskBitsPlan::new(&ctx, &lv, n, max_rows, &GpuView::whole(&bb), &GpuView::whole(&rb), max_masks).unwrap();
    let argmax = ArgmaxPlan::rows(&ctx, &lv, n, max_rows, None).unwrap();
    let topk = TopKPlan::rows(&ctx, &lv, n, 16, max_rows).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, 3)).unwrap();
    let all = StepValues::chunk(0, max_rows as u32);
    argmax.record(&mut rec, &all).unwrap();
    topk.record(&mut rec, &all).unwrap();
    rec.submit().unwrap();
    let mut want = logits.clone();
    for (m, &r) in masks.iter().zip(&rows) {
        mask_bits_ref(&mut want[r as usize * n..(r as usize + 1) * n], m);
    }
    let got: Vec<f32> = bytemuck::cast_slice(&ctx.read_bytes(&lb, 0, 4 * (n * max_rows) as u64).unwrap()).to_vec();
    assert_eq!(got, want, "masked rows");
    // Rows 1 and 2 had no mask: unchanged.
    assert_eq!(got[n..3 * n], logits[n..3 * n]);
    let ids: Vec<u32> = bytemuck::cast_slice(&ctx.read_bytes(argmax.ids().buffer(), argmax.ids().byte_offset(), 4 * max_rows as u64).unwrap()).to_vec();
    for r in 0..max_rows {
        let row = &want[r * n..(r + 1) * n];
        let best = (0..n).max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a))).unwrap() as u32;
        assert_eq!(ids[r], best, "row {r}'s argmax");
    }
    assert!(ids[3] >= 700 && ids[3].is_multiple_of(7) && ids[0] != best0 as u32 && ids[4] == n as u32 - 2, "{ids:?}");
    // Top-k of the single-id row: the id, then masked ones at -f32::MAX only.
    let (ti, tv) = (topk.ids(), topk.values());
    let tids: Vec<u32> = bytemuck::cast_slice(&ctx.read_bytes(ti.buffer(), ti.byte_offset(), 4 * 16 * max_rows as u64).unwrap()).to_vec();
    let tvals: Vec<f32> = bytemuck::cast_slice(&ctx.read_bytes(tv.buffer(), tv.byte_offset(), 4 * 16 * max_rows as u64).unwrap()).to_vec();
    assert_eq!(tids[4 * 16], n as u32 - 2);
    assert!(tvals[4 * 16 + 1..5 * 16].iter().all(|&v| v == -f32::MAX), "{:?}", &tvals[4 * 16..5 * 16]);
    // A step without masks records nothing; more masks than the plan holds is a typed error.
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, 0)).unwrap();
    assert_eq!(rec.dispatch_count(), 0);
    assert!(plan.record(&mut rec, &StepValues::chunk(0, 4)).is_err());
    // Views too small for the plan's most rows or masks are typed errors.
    assert!(MaskBitsPlan::new(&ctx, &lv, n, max_rows + 1, &GpuView::whole(&bb), &GpuView::whole(&rb), max_masks).is_err());
    assert!(MaskBitsPlan::new(&ctx, &lv, n, max_rows, &GpuView::whole(&bb), &GpuView::whole(&rb), max_masks + 1).is_err());
}

//! Plans for RoPE / QK-norm + RoPE + KV write and KV cache writes, recorded into explicit
//! recorders: each against its CPU reference and the eager (stream) path. One plan recorded at
//! positions 5, 6 and 7 in one recorder gives each step's result, and recording creates no
//! buffer and no bind group; positions from a GPU buffer; a projection's two partial sums added
//! by the kernel; KV-only writes to f16 and q8_0 caches, segmented.
//!
//! Tolerance: 1e-4 relative (RoPE angles up to 40 rad), 2e-3 / 2e-2 for K/V rows stored as f16 /
//! q8_0 against unrounded ones.

#[path = "plans_util.rs"]
mod util;

use boostr::kv_cache::{KvDtype, KvWritePlan};
use boostr::ops_common::{OpPlan, OpsError, pseudo_random as rnd};
use boostr::quant::{GemvOutput, SplitSumPlan};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use numr::gpu::{Binding, BufferKind, GpuContext, StepValues};
use util::*;

/// One QK-norm + RoPE + KV write plan (positions from the step) recorded at positions 5, 6 and 7
/// in one recorder over a segmented cache: each step's activations and cached rows against the
/// reference, and the eager path.
fn rope_plan_steps(ctx: &GpuContext) {
    let _serial = serial();
    let (hd, n_q, n_kv) = (64, 2, 1);
    let cfg = QkvRope { style: RopeStyle::Neox, rope: true, qk_norm: true, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let rp = rope_params(hd, 48, RopeStyle::Neox);
    let cache = new_cache(ctx, n_kv, hd, 8, KvDtype::F16, Some(3));
    let mut l = QkvLayout::packed(1, n_q, n_kv, hd);
    l.x_off = 5;
    let len = l.x_off + l.tok_stride;
    let x0 = rnd(len, 3, 1.5);
    let (src, xt) = (up(ctx, &x0), up(ctx, &x0));
    let (qw, kw) = (rnd(hd, 4, 1.0), rnd(hd, 5, 1.0));
    let (qwt, kwt) = (up(ctx, &qw), up(ctx, &kw));
    let inp = QkvRopeInputs {
        x: &bind(&xt),
        layout: l,
        rope: &rp,
        positions: &RopePositions::Step,
        qw: Some(&bind(&qwt)),
        kw: Some(&bind(&kwt)),
        eps: 1e-6,
        cache: Some((&cache, 0)),
    };
    let plan = QkvRopePlan::new(ctx, &cfg, &inp).unwrap();
    let dst = ctx.alloc((3 * len * 4) as u64, BufferKind::Storage).unwrap();
    let (sb, xb) = (src.gpu_buffer().unwrap().clone(), xt.gpu_buffer().unwrap().clone());
    let before = no_copy_alloc_snapshot(ctx);
    let mut rec = ctx.recorder();
    for (i, pos) in [5u32, 6, 7].into_iter().enumerate() {
        rec.copy(&sb, 0, &xb, 0, (len * 4) as u64).unwrap();
        plan.record(&mut rec, &StepValues::decode(pos)).unwrap();
        rec.copy(&xb, 0, &dst, (i * len * 4) as u64, (len * 4) as u64).unwrap();
    }
    assert_eq!(no_copy_alloc_snapshot(ctx), before, "recording created a bind group or a buffer");
    rec.submit().unwrap();
    let (kc, vc) = cache.read_layer(ctx, 0, 8).unwrap();
    for (i, pos) in [5u32, 6, 7].into_iter().enumerate() {
        let mut want = x0.clone();
        let (ks, vs) = cfg.reference(&mut want, &l, &rp, &[pos], Some(&qw), Some(&kw), 1e-6).unwrap();
        close(&read_f32(ctx, &dst, (i * len * 4) as u64, len), &want, 1e-4, &format!("x at position {pos}"));
        close(&kc[pos as usize * hd..][..hd], &ks, 2e-3, &format!("K at slot {pos}"));
        close(&vc[pos as usize * hd..][..hd], &vs, 2e-3, &format!("V at slot {pos}"));
        if pos == 7 {
            let xe = up(ctx, &x0);
            let no_cache = cfg.run(ctx, &bind(&xe), &l, &rp, &[7], Some(&bind(&qwt)), Some(&bind(&kwt)), 1e-6, None);
            assert!(matches!(no_cache, Err(OpsError::BadArgs { .. })), "a KV-write variant without a cache");
            let nokv = QkvRope { kv_write: None, ..cfg };
            nokv.run(ctx, &bind(&xe), &l, &rp, &[7], Some(&bind(&qwt)), Some(&bind(&kwt)), 1e-6, None).unwrap();
            close(&xe.to_vec::<f32>().unwrap(), &want, 1e-4, "eager x at position 7");
        }
    }
    // Slots 0..5 were never written.
    assert!(kc[..5 * hd].iter().chain(&vc[..5 * hd]).all(|&v| v == 0.0));
    // Rotation only (no norm weights, no cache), explicit recorder, against the reference.
    let plain = QkvRope { qk_norm: false, kv_write: None, ..cfg };
    let xp = up(ctx, &x0);
    let inp = QkvRopeInputs { x: &bind(&xp), layout: l, rope: &rp, positions: &RopePositions::Step, qw: None, kw: None, eps: 0.0, cache: None };
    let plan = QkvRopePlan::new(ctx, &plain, &inp).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::decode(6)).unwrap();
    rec.submit().unwrap();
    let mut want = x0.clone();
    plain.reference(&mut want, &l, &rp, &[6], None, None, 0.0).unwrap();
    close(&xp.to_vec::<f32>().unwrap(), &want, 1e-4, "rotation only at position 6");
}

/// Positions read from a GPU buffer at `step.token + t`, a chunk of 3 tokens over a segmented
/// q8_0 cache at slots 2..5, against the reference and the eager `QkvRope::run`.
fn rope_plan_positions_from_buffer(ctx: &GpuContext) {
    let _serial = serial();
    let (hd, n_q, n_kv, n) = (128, 3, 1, 3);
    let cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::Q8_0) };
    let rp = rope_params(hd, 128, RopeStyle::Normal);
    let l = QkvLayout::packed(4, n_q, n_kv, hd);
    let x0 = rnd(4 * l.tok_stride, 11, 1.0);
    let xt = up(ctx, &x0);
    let all_pos = [9u32, 3, 40, 17, 0, 2];
    let pos_buf = ctx.upload(bytemuck::cast_slice(&all_pos)).unwrap();
    let positions = RopePositions::Buffer(Binding::whole(&pos_buf));
    let cache = new_cache(ctx, n_kv, hd, 8, KvDtype::Q8_0, Some(3));
    let inp = QkvRopeInputs { x: &bind(&xt), layout: l, rope: &rp, positions: &positions, qw: None, kw: None, eps: 0.0, cache: Some((&cache, 0)) };
    let plan = QkvRopePlan::new(ctx, &cfg, &inp).unwrap();
    let step = step_u32(2, n).with_token(1);
    assert_eq!(plan.plan().dispatch_count(&step), 2, "slots 2..5 touch segments 0..3 and 3..6");
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &step).unwrap();
    rec.submit().unwrap();
    let lw = QkvLayout { n_tok: n, ..l };
    let mut want = x0.clone();
    let (ks, vs) = cfg.reference(&mut want, &lw, &rp, &all_pos[1..4], None, None, 0.0).unwrap();
    close(&xt.to_vec::<f32>().unwrap(), &want, 1e-4, "x");
    let (kc, vc) = cache.read_layer(ctx, 0, 5).unwrap();
    close(&kc[2 * hd..], &ks, 2e-2, "K");
    close(&vc[2 * hd..], &vs, 2e-2, "V");
    // The eager path writes the same rows at the same slots.
    let mut eager_cache = new_cache(ctx, n_kv, hd, 8, KvDtype::Q8_0, Some(3));
    eager_cache.commit(2).unwrap();
    let xe = up(ctx, &x0);
    cfg.run(ctx, &bind(&xe), &lw, &rp, &all_pos[1..4], None, None, 0.0, Some((&eager_cache, 0))).unwrap();
    close(&xe.to_vec::<f32>().unwrap(), &xt.to_vec::<f32>().unwrap(), 1e-6, "eager x");
    let (ke, ve) = eager_cache.read_layer(ctx, 0, 5).unwrap();
    assert_eq!((ke, ve), (kc, vc), "eager cache rows");
    // Steps the plan was not built for.
    assert!(matches!(plan.record(&mut ctx.recorder(), &step_u32(0, 5)), Err(OpsError::BadArgs { .. })), "more tokens than the layout");
    assert!(matches!(plan.record(&mut ctx.recorder(), &step_u32(6, 3)), Err(OpsError::ContextOverflow { needed: 9, capacity: 8 })));
    assert!(matches!(plan.record(&mut ctx.recorder(), &step_u32(0, 3).with_token(4)), Err(OpsError::BadArgs { .. })), "positions past the buffer");
}

/// A projection split over K leaves two partial sums `part_off` apart
/// ([`QkvRopePlan::with_partial_sum`]): the rotated Q/K rows written back and the cached K/V are
/// those of their sum, for a chunk of 3 tokens at slots 2..5; variants that write nothing back,
/// and an `x` too short for the second partial, are typed errors.
fn rope_plan_sums_split_partials(ctx: &GpuContext) {
    let _serial = serial();
    let (hd, n_q, n_kv, n) = (64, 4, 2, 3);
    let cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let rp = rope_params(hd, 64, RopeStyle::Normal);
    let l = QkvLayout::packed(n, n_q, n_kv, hd);
    let part = n * l.tok_stride;
    let x = rnd(2 * part, 31, 1.0);
    let xt = up(ctx, &x);
    let cache = new_cache(ctx, n_kv, hd, 8, KvDtype::F16, None);
    let inp = QkvRopeInputs { x: &bind(&xt), layout: l, rope: &rp, positions: &RopePositions::Step, qw: None, kw: None, eps: 0.0, cache: Some((&cache, 0)) };
    let freqs = ctx.upload(bytemuck::cast_slice(&rp.inv_freqs())).unwrap();
    let plan = QkvRopePlan::with_partial_sum(ctx, &cfg, &inp, &Binding::whole(&freqs), part).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &step_u32(2, n)).unwrap();
    rec.submit().unwrap();
    let mut want: Vec<f32> = (0..part).map(|i| x[i] + x[part + i]).collect();
    let (ks, vs) = cfg.reference(&mut want, &l, &rp, &[2, 3, 4], None, None, 0.0).unwrap();
    let got = xt.to_vec::<f32>().unwrap();
    // Q and K rows of each token (V rows stay the first partial's: they only go to the cache).
    for t in 0..n {
        let qk = t * l.tok_stride..t * l.tok_stride + (n_q + n_kv) * hd;
        close(&got[qk.clone()], &want[qk], 1e-4, &format!("Q/K of token {t}"));
    }
    // The cache is `[kv head][slot][hd]`, the reference `[token][kv head][hd]`.
    let (kc, vc) = cache.read_layer(ctx, 0, 5).unwrap();
    let slots = |c: &[f32]| -> Vec<f32> {
        (0..n).flat_map(|t| (0..n_kv).flat_map(move |h| (0..hd).map(move |d| (h, t, d)))).map(|(h, t, d)| c[(h * 5 + 2 + t) * hd + d]).collect()
    };
    close(&slots(&kc), &ks, 2e-3, "K");
    close(&slots(&vc), &vs, 2e-3, "V");
    let kv_only = QkvRope { rope: false, ..cfg };
    assert!(QkvRopePlan::with_partial_sum(ctx, &kv_only, &inp, &Binding::whole(&freqs), part).is_err(), "a variant that writes nothing back");
    let short = up(ctx, &x[..part + 10]);
    let inp = QkvRopeInputs { x: &bind(&short), ..inp };
    assert!(QkvRopePlan::with_partial_sum(ctx, &cfg, &inp, &Binding::whole(&freqs), part).is_err(), "x without room for the second partial");
}

/// A batched projection split over K into 4 partial sums ([`QkvRopePlan::with_partials`], no
/// KV write, the positions from a buffer): every head row written back, V's included, is the
/// bits of the split sum's ((p0 + p1) + p2) + p3 ([`SplitSumPlan`]) followed by the plain
/// plan, with and without the QK norm; a step of 3 of the 5 tokens leaves the others alone;
/// 1 or 9 partials, a variant that writes nothing back and an `x` too short for the last
/// partial are typed errors.
fn rope_plan_sums_many_partials_as_split_sum_does(ctx: &GpuContext) {
    let _serial = serial();
    let (hd, n_q, n_kv, n, parts) = (64, 4, 2, 5, 4u32);
    let rp = rope_params(hd, 64, RopeStyle::Normal);
    let l = QkvLayout::packed(n, n_q, n_kv, hd);
    let part = n * l.tok_stride;
    // Partials of mixed magnitudes, so that the order of the adds shows in the bits.
    let x: Vec<f32> = rnd(parts as usize * part, 47, 1.0).iter().enumerate().map(|(i, v)| v * [1.0, 3e-4, 2e3, 0.1][i / part]).collect();
    let freqs = ctx.upload(bytemuck::cast_slice(&rp.inv_freqs())).unwrap();
    let pos = ctx.upload(bytemuck::cast_slice(&[9u32, 3, 17, 4, 250])).unwrap();
    let positions = RopePositions::Buffer(Binding::whole(&pos));
    let (qw, kw) = (up(ctx, &rnd(hd, 5, 1.0)), up(ctx, &rnd(hd, 6, 1.0)));
    for qk_norm in [false, true] {
        let cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm, norm_offset: false, kv_write: None };
        let (qwb, kwb) = (bind(&qw), bind(&kw));
        let norm = qk_norm.then_some((&qwb, &kwb));
        for n_tok in [n, 3] {
            let xa = up(ctx, &x);
            let ba = bind(&xa);
            let fused = QkvRopePlan::with_partials(ctx, &cfg, &no_cache_inputs(&ba, l, &rp, &positions, norm), &Binding::whole(&freqs), part, parts).unwrap();
            let mut rec = ctx.recorder();
            fused.record(&mut rec, &step_u32(0, n_tok)).unwrap();
            rec.submit().unwrap();
            let got = xa.to_vec::<f32>().unwrap();
            let xb = up(ctx, &x);
            let summed = ctx.alloc(4 * part as u64, BufferKind::Storage).unwrap();
            let sum = SplitSumPlan::new(ctx, &bind(&xb), &GemvOutput::Single(Binding::whole(&summed)), n, l.tok_stride, parts).unwrap();
            let bs = Binding::whole(&summed);
            let plain = QkvRopePlan::with_freqs(ctx, &cfg, &no_cache_inputs(&bs, l, &rp, &positions, norm), &Binding::whole(&freqs)).unwrap();
            let mut rec = ctx.recorder();
            sum.record(&mut rec, &step_u32(0, n_tok)).unwrap();
            plain.record(&mut rec, &step_u32(0, n_tok)).unwrap();
            rec.submit().unwrap();
            let want: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&summed, 0, 4 * part as u64).unwrap());
            let what = format!("QK norm {qk_norm}, a step of {n_tok} tokens");
            let ran = n_tok * l.tok_stride;
            let differs = got[..ran].iter().zip(&want[..ran]).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(differs, None, "{what}: a head value differs from the split sum's then the plain plan's");
            assert_eq!(got[ran..], x[ran..], "{what}: the tokens past the step and the other partials are left alone");
        }
        let xa = up(ctx, &x);
        let ba = bind(&xa);
        for bad_parts in [1, 9] {
            assert!(
                QkvRopePlan::with_partials(ctx, &cfg, &no_cache_inputs(&ba, l, &rp, &positions, norm), &Binding::whole(&freqs), part, bad_parts).is_err(),
                "{bad_parts} partials"
            );
        }
        let kv_only = QkvRope { rope: false, qk_norm: false, ..cfg };
        let plain_inputs = QkvRopeInputs { qw: None, kw: None, ..no_cache_inputs(&ba, l, &rp, &positions, norm) };
        assert!(QkvRopePlan::with_partials(ctx, &kv_only, &plain_inputs, &Binding::whole(&freqs), part, parts).is_err(), "a variant that writes nothing back");
        let short = up(ctx, &x[..(parts as usize - 1) * part + 10]);
        let bshort = bind(&short);
        assert!(
            QkvRopePlan::with_partials(ctx, &cfg, &no_cache_inputs(&bshort, l, &rp, &positions, norm), &Binding::whole(&freqs), part, parts).is_err(),
            "x without room for the last partial"
        );
    }
}

/// The inputs of a plan without a KV write, with the QK norm's weights where given.
fn no_cache_inputs<'a>(
    x: &'a Binding,
    layout: QkvLayout,
    rope: &'a RopeParams,
    positions: &'a RopePositions,
    norm: Option<(&'a Binding, &'a Binding)>,
) -> QkvRopeInputs<'a> {
    QkvRopeInputs { x, layout, rope, positions, qw: norm.map(|n| n.0), kw: norm.map(|n| n.1), eps: 1e-6, cache: None }
}

/// KV-only writes, f16 and q8_0, two chunks in one recorder on a segmented cache, against the
/// CPU model of the cache and the eager fused write with rotation off.
fn kv_write_plan(ctx: &GpuContext) {
    let _serial = serial();
    for dtype in [KvDtype::F16, KvDtype::Q8_0] {
        let (hd, n_kv) = (64, 2);
        let cache = new_cache(ctx, n_kv, hd, 10, dtype, Some(4));
        let (x, mut l) = kv_rows(5, n_kv, hd, 21);
        // Padding between tokens and ignored Q heads in the layout.
        l.tok_stride += 3;
        l.n_q = 7;
        let x = [x.clone(), vec![0.0; 5 * 3]].concat();
        let xt = up(ctx, &x);
        let plan = KvWritePlan::new(ctx, &bind(&xt), &l, &cache, 0).unwrap();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &step_u32(0, 5)).unwrap();
        plan.record(&mut rec, &step_u32(5, 3)).unwrap();
        rec.submit().unwrap();
        let lr = QkvLayout { n_q: 0, ..l };
        let rope = RopeParams { head_dim: hd, rot_dim: 0, base: 1.0, scaling: RopeScaling::None, style: RopeStyle::Neox };
        let cfg = QkvRope { style: RopeStyle::Neox, rope: false, qk_norm: false, norm_offset: false, kv_write: Some(dtype) };
        let (ks, vs) = cfg.reference(&mut x.clone(), &lr, &rope, &[0; 5], None, None, 0.0).unwrap();
        let (k, v) = cache.read_layer(ctx, 0, 8).unwrap();
        let (ks, vs) = (by_head(&ks, 5, n_kv, hd), by_head(&vs, 5, n_kv, hd));
        for h in 0..n_kv {
            // Slots 0..5 and 5..8 hold tokens 0..5 and 0..3.
            let row = |a: &[f32], s: usize| a[(h * 8 + s) * hd..][..hd].to_vec();
            for s in 0..8 {
                let t = if s < 5 { s } else { s - 5 };
                assert_eq!(row(&k, s), ks[(h * 5 + t) * hd..][..hd].to_vec(), "{dtype:?} K head {h} slot {s}");
                assert_eq!(row(&v, s), vs[(h * 5 + t) * hd..][..hd].to_vec(), "{dtype:?} V head {h} slot {s}");
            }
        }
        let eager = new_cache(ctx, n_kv, hd, 10, dtype, Some(4));
        cfg.run(ctx, &bind(&xt), &QkvLayout { n_tok: 5, ..lr }, &rope, &[0; 5], None, None, 0.0, Some((&eager, 0))).unwrap();
        assert_eq!(eager.read_layer(ctx, 0, 5).unwrap().0, prefix(&k, n_kv, 8, 5, hd), "{dtype:?} eager");
    }
}

numr::test_gpu_profiles!(
    rope_plan_steps,
    rope_plan_positions_from_buffer,
    rope_plan_sums_split_partials,
    rope_plan_sums_many_partials_as_split_sum_does,
    kv_write_plan
);

//! Plans for decode and prefill attention, recorded into explicit recorders: each against its
//! CPU reference and the eager (stream) path (the RoPE and KV-write plans: `plans_rope.rs`).
//!
//! - One plan recorded several times in one recorder with different step values (decode at
//!   kv_len 1, 100, 1000 and back to 100, so stale partials of a larger step would show) gives
//!   each step's result; the output is copied to a distinct buffer after each recording.
//!   Recording creates no buffer and no bind group.
//! - Both decode kernels (subgroup where the adapter has it, tiled), the fused merge (where the
//!   adapter has `@coherent` storage) and the forced two-pass merge, f16 and q8_0 caches,
//!   segmented caches, GQA, sliding window and soft-capping; prefill at p0 > 0 on a non-empty
//!   cache with both kernels.
//! - Typed errors for invalid kernel variants, bad layers, inconsistent CPU-reference inputs and
//!   steps a plan was not built for.
//!
//! Tolerance: 1e-4 relative (exp and long sums in another order than the f64 references, RoPE
//! angles up to 40 rad), 2e-3 / 2e-2 for K/V rows stored as f16 / q8_0 against unrounded ones.

use boostr::attention::{
    self, AttnCombine, AttnOptions, DecodeAttn, DecodeAttnSg, DecodeKernel, DecodePlan, PrefillAttn, PrefillPlan, QueryLayout, attention_ref,
};
use boostr::kv_cache::{KvDtype, KvWritePlan};
use boostr::ops_common::OpPlan;
use boostr::ops_common::{OpsError, env_of, pseudo_random as rnd};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use numr::gpu::{BufferKind, GpuContext, KernelEnv, ParamMode, StepValues};
use numr::testing::{test_gpu, test_gpu_private};

#[path = "plans_util.rs"]
mod util;
use util::*;

struct DecodeCase {
    hd: usize,
    n_q: usize,
    n_kv: usize,
    dtype: KvDtype,
    /// Positions per cache segment (None: unsegmented).
    seg: Option<usize>,
    kind: DecodeKernel,
    two_pass: bool,
    opts: AttnOptions,
}

/// One decode plan, recorded for kv_len 1, 100, 1000 and 100 into ONE explicit recorder after
/// the cache fill (a [`KvWritePlan`] in the same recorder, on a cache whose clears sit in the
/// implicit stream): every step against the reference, and the eager path at kv_len 100.
fn decode_steps(ctx: &GpuContext, c: &DecodeCase) {
    let cap = 1000;
    let what = format!("decode {:?} two_pass {} hd {} {}q/{}kv {:?} seg {:?}", c.kind, c.two_pass, c.hd, c.n_q, c.n_kv, c.dtype, c.seg);
    let cache = new_cache(ctx, c.n_kv, c.hd, cap, c.dtype, c.seg);
    let (x, l) = kv_rows(cap, c.n_kv, c.hd, c.hd as u64 + c.n_q as u64);
    let xt = up(ctx, &x);
    let writer = KvWritePlan::new(ctx, &bind(&xt), &l, &cache, 0).unwrap();
    let q = rnd(c.n_q * c.hd, 99, 2.0);
    let qt = up(ctx, &q);
    let qb = bind(&qt);
    let b = DecodePlan::builder(ctx, &qb, 0, c.n_q, &cache, 0, &c.opts).kernel(c.kind);
    let plan = if c.two_pass { b.two_pass() } else { b }.build().unwrap();
    let fused = c.kind == DecodeKernel::Subgroup && !c.two_pass && c.seg.is_none() && attention::fused_merge_supported(ctx);
    assert_eq!(plan.is_fused(), fused, "{what}");
    for kv in 1..=cap {
        assert!(plan.splits_at(kv) <= plan.max_splits(), "{what}: {} splits at {kv}, sized for {}", plan.splits_at(kv), plan.max_splits());
    }
    let steps = [1usize, 100, 1000, 100];
    let n_out = c.n_q * c.hd;
    let dst = ctx.alloc((steps.len() * n_out * 4) as u64, BufferKind::Storage).unwrap();
    let before = no_copy_alloc_snapshot(ctx);
    let mut rec = ctx.recorder();
    writer.record(&mut rec, &step_u32(0, cap)).unwrap();
    for (i, &kv) in steps.iter().enumerate() {
        let step = DecodePlan::step(kv).unwrap();
        let segs_touched = cache.segments(0).unwrap().iter().filter(|s| s.start < kv).count();
        assert_eq!(plan.dispatch_count(&step), if fused { 1 } else { segs_touched + 1 }, "{what} at {kv}");
        plan.record(&mut rec, &step).unwrap();
        let (ob, off) = plan.output_binding();
        rec.copy(&ob.buffer, ob.offset + off as u64 * 4, &dst, (i * n_out * 4) as u64, (n_out * 4) as u64).unwrap();
    }
    assert_eq!(no_copy_alloc_snapshot(ctx), before, "{what}: recording created a bind group or a buffer");
    rec.submit().unwrap();
    let (k, v) = cache.read_layer(ctx, 0, cap).unwrap();
    // The write stored what the CPU model of the cache stores.
    let (kr, vr) = QkvRope { style: RopeStyle::Neox, rope: false, qk_norm: false, norm_offset: false, kv_write: Some(c.dtype) }
        .reference(
            &mut x.clone(),
            &l,
            &RopeParams { head_dim: c.hd, rot_dim: 0, base: 1.0, scaling: RopeScaling::None, style: RopeStyle::Neox },
            &vec![0; cap],
            None,
            None,
            0.0,
        )
        .unwrap();
    stored_close(&k, &by_head(&kr, cap, c.n_kv, c.hd), c.dtype, &format!("{what}: stored K"));
    stored_close(&v, &by_head(&vr, cap, c.n_kv, c.hd), c.dtype, &format!("{what}: stored V"));
    let want_at = |kv: usize| {
        attention_ref(&q, &prefix(&k, c.n_kv, cap, kv, c.hd), &prefix(&v, c.n_kv, cap, kv, c.hd), 1, c.n_q, c.n_kv, c.hd, kv, kv - 1, &c.opts).unwrap()
    };
    for (i, &kv) in steps.iter().enumerate() {
        let got = read_f32(ctx, &dst, (i * n_out * 4) as u64, n_out);
        close(&got, &want_at(kv), 1e-4, &format!("{what}: step {i} (kv_len {kv})"));
    }
    let eager = attention::decode(ctx, &qb, 0, c.n_q, &cache, 0, 100, &c.opts).unwrap().to_vec::<f32>().unwrap();
    close(&eager, &want_at(100), 1e-4, &format!("{what}: eager"));
}

fn sg_available(ctx: &GpuContext) -> bool {
    DecodeKernel::best(&env_of(ctx)) == DecodeKernel::Subgroup
}

/// The subgroup kernel: fused merge (unsegmented, coherent adapters), forced two-pass, and a
/// segmented cache (two-pass always); f16 and q8_0; GQA, window, softcap.
#[test]
fn decode_plan_subgroup_steps() {
    let Some(ctx) = test_gpu_private() else { return };
    if !sg_available(&ctx) {
        numr::testing::skip_path(&ctx, "the subgroup decode attention kernel", "no subgroups of 8");
        return;
    }
    let capped = AttnOptions { scale: 0.1, softcap: Some(20.0), window: Some(333) };
    let sg = DecodeKernel::Subgroup;
    for c in [
        DecodeCase { hd: 64, n_q: 8, n_kv: 2, dtype: KvDtype::F16, seg: None, kind: sg, two_pass: false, opts: AttnOptions::new(64) },
        DecodeCase { hd: 128, n_q: 4, n_kv: 1, dtype: KvDtype::Q8_0, seg: None, kind: sg, two_pass: true, opts: capped },
        DecodeCase { hd: 64, n_q: 3, n_kv: 1, dtype: KvDtype::Q8_0, seg: Some(300), kind: sg, two_pass: false, opts: AttnOptions::new(64) },
    ] {
        decode_steps(&ctx, &c);
    }
}

/// The portable tiled kernel: unsegmented and segmented, f16 and q8_0, GQA, window, softcap.
#[test]
fn decode_plan_tiled_steps() {
    let Some(ctx) = test_gpu_private() else { return };
    let windowed = AttnOptions { scale: 1.0 / 8.0, softcap: None, window: Some(77) };
    let capped = AttnOptions { scale: 1.0 / 16.0, softcap: Some(5.0), window: None };
    let t = DecodeKernel::Tiled;
    for c in [
        DecodeCase { hd: 64, n_q: 8, n_kv: 2, dtype: KvDtype::F16, seg: Some(300), kind: t, two_pass: false, opts: windowed },
        DecodeCase { hd: 256, n_q: 2, n_kv: 1, dtype: KvDtype::Q8_0, seg: None, kind: t, two_pass: false, opts: capped },
    ] {
        decode_steps(&ctx, &c);
    }
}

/// Bug 1: a cache and an output made through the implicit stream (their clears recorded there),
/// then the KV write and the two-pass and tiled decode plans in an explicit recorder: the
/// clears run first, so the results are the attention, not zeros.
fn explicit_recorder_two_pass_and_tiled_decode(ctx: &GpuContext) {
    let _serial = serial();
    let (hd, n_q, n_kv, n) = (64, 4, 2, 37);
    let cache = new_cache(ctx, n_kv, hd, 40, KvDtype::F16, None);
    let (x, l) = kv_rows(n, n_kv, hd, 5);
    let xt = up(ctx, &x);
    let writer = KvWritePlan::new(ctx, &bind(&xt), &l, &cache, 0).unwrap();
    let q = rnd(n_q * hd, 6, 2.0);
    let qt = up(ctx, &q);
    let opts = AttnOptions::new(hd);
    let mut plans = vec![DecodePlan::builder(ctx, &bind(&qt), 0, n_q, &cache, 0, &opts).kernel(DecodeKernel::Tiled).build().unwrap()];
    if sg_available(ctx) {
        let p = DecodePlan::builder(ctx, &bind(&qt), 0, n_q, &cache, 0, &opts).kernel(DecodeKernel::Subgroup).two_pass().build().unwrap();
        assert!(!p.is_fused());
        assert_eq!(p.dispatch_count(&DecodePlan::step(n).unwrap()), 2);
        plans.push(p);
    } else {
        numr::testing::skip_path(ctx, "the subgroup decode kernel's two-pass plan", "no subgroups of 8");
    }
    let mut rec = ctx.recorder();
    writer.record(&mut rec, &step_u32(0, n)).unwrap();
    for p in &plans {
        p.record(&mut rec, &DecodePlan::step(n).unwrap()).unwrap();
    }
    rec.submit().unwrap();
    let (k, v) = cache.read_layer(ctx, 0, n).unwrap();
    let want = attention_ref(&q, &k, &v, 1, n_q, n_kv, hd, n, n - 1, &opts).unwrap();
    for p in &plans {
        close(&p.out().unwrap().to_vec::<f32>().unwrap(), &want, 1e-4, &format!("{:?}", p.kernel()));
    }
}

/// The fused WGSL declares the cross-workgroup bindings `@coherent`; other variants do not; the
/// fused variant is refused without coherent storage.
#[test]
fn fused_merge_is_coherent() {
    let env = KernelEnv { param_mode: ParamMode::Immediates, f16: true, subgroups: true, subgroup_min_size: 8, coherent: true };
    let base = DecodeAttnSg::new(128, 4, KvDtype::F16, false).unwrap();
    let fused = DecodeAttnSg { fused: true, ..base }.source(&env).unwrap();
    for (i, name) in [(3, "o_part"), (4, "ml"), (6, "out")] {
        let decl = format!("@coherent @group(0) @binding({i}) var<storage, read_write> {name}");
        assert!(fused.wgsl.contains(&decl), "missing `{decl}`");
    }
    assert!(fused.wgsl.contains("storageBarrier()"));
    assert!(fused.wgsl.contains("subgroup_id") && !fused.wgsl.contains("lidx / sg_size"), "slots from the subgroup builtins only");
    assert!(!base.source(&env).unwrap().wgsl.contains("@coherent"));
    let plain = KernelEnv { coherent: false, ..env };
    assert!(matches!(DecodeAttnSg { fused: true, ..base }.source(&plain), Err(OpsError::Unsupported { .. })));
}

/// Prefill plan recorded for three chunks (p0 = 0, 17, 57: on a non-empty cache) into one
/// recorder, both kernels, unsegmented and segmented caches, f16 and q8_0; against the reference
/// and the eager path.
fn prefill_plan_steps(ctx: &GpuContext) {
    let _serial = serial();
    let mut kinds = vec![DecodeKernel::Tiled];
    if sg_available(ctx) {
        kinds.push(DecodeKernel::Subgroup);
    } else {
        numr::testing::skip_path(ctx, "the subgroup kernel's prefill plan", "no subgroups of 8");
    }
    let cases = [
        (64, 4, 2, KvDtype::F16, None, AttnOptions::new(64)),
        (128, 6, 2, KvDtype::Q8_0, Some(30), AttnOptions { scale: 0.08, softcap: Some(30.0), window: Some(11) }),
    ];
    // The unsegmented f16 case runs the coopmat kernel too where the adapter has cooperative
    // matrices (80 positions: the last key tile reaches past the cache's end).
    let (cap, max_tok) = (80, 40);
    for &(hd, n_q, n_kv, dtype, seg, opts) in &cases {
        let cache = new_cache(ctx, n_kv, hd, cap, dtype, seg);
        let coop = PrefillPlan::coop_config(ctx, &cache, 0, n_q, &opts).is_some();
        let mut kinds = kinds.clone();
        if coop {
            kinds.push(DecodeKernel::Coop);
        } else if dtype == KvDtype::F16 && seg.is_none() {
            numr::testing::skip_path(ctx, "the cooperative-matrix prefill plan (unsegmented f16 case)", "no cooperative matrices");
        }
        // The coopmat kernel rounds Q and P to f16 (module docs of `prefill_coop`).
        let tol = |k: DecodeKernel| if k == DecodeKernel::Coop { 4e-3 } else { 1e-4 };
        let (x, l) = kv_rows(cap, n_kv, hd, 7 + hd as u64);
        let xt = up(ctx, &x);
        let writer = KvWritePlan::new(ctx, &bind(&xt), &l, &cache, 0).unwrap();
        writer.run(ctx, &step_u32(0, cap)).unwrap();
        let (k, v) = cache.read_layer(ctx, 0, cap).unwrap();
        let q = rnd(max_tok * n_q * hd, 8, 2.0);
        let qt = up(ctx, &q);
        let ql = QueryLayout { n_tok: max_tok, n_q, q_off: 0, tok_stride: n_q * hd };
        let steps = [(0usize, 17usize), (17, 40), (57, 23)];
        for &kind in &kinds {
            let what = format!("prefill {kind:?} hd {hd} {dtype:?} seg {seg:?}");
            let plan = PrefillPlan::builder(ctx, &bind(&qt), &ql, &cache, 0, &opts).kernel(kind).build().unwrap();
            let dst = ctx.alloc((steps.len() * max_tok * n_q * hd * 4) as u64, BufferKind::Storage).unwrap();
            let before = no_copy_alloc_snapshot(ctx);
            let mut rec = ctx.recorder();
            for (i, &(p0, n)) in steps.iter().enumerate() {
                plan.record(&mut rec, &step_u32(p0, n)).unwrap();
                let (ob, off) = plan.output_binding();
                let bytes = (n * n_q * hd * 4) as u64;
                rec.copy(&ob.buffer, ob.offset + off as u64 * 4, &dst, (i * max_tok * n_q * hd * 4) as u64, bytes).unwrap();
            }
            assert_eq!(no_copy_alloc_snapshot(ctx), before, "{what}: recording created a bind group or a buffer");
            rec.submit().unwrap();
            for (i, &(p0, n)) in steps.iter().enumerate() {
                let kv = p0 + n;
                let want =
                    attention_ref(&q[..n * n_q * hd], &prefix(&k, n_kv, cap, kv, hd), &prefix(&v, n_kv, cap, kv, hd), n, n_q, n_kv, hd, kv, p0, &opts).unwrap();
                let got = read_f32(ctx, &dst, (i * max_tok * n_q * hd * 4) as u64, n * n_q * hd);
                close(&got, &want, tol(kind), &format!("{what}: chunk {i} (p0 {p0}, {n} tokens)"));
                if i == 2 {
                    let eq = QueryLayout { n_tok: n, ..ql };
                    let eager = attention::prefill(ctx, &bind(&qt), &eq, &cache, 0, p0, &opts).unwrap().to_vec::<f32>().unwrap();
                    let default = if coop { DecodeKernel::Coop } else { *kinds.last().unwrap_or(&kind) };
                    close(&eager, &want, tol(default), &format!("{what}: eager"));
                }
            }
        }
    }
}

/// Invalid variants are typed errors before a kernel can be built from them.
#[test]
fn invalid_kernel_variants_are_typed_errors() {
    let env = KernelEnv { param_mode: ParamMode::Immediates, f16: true, subgroups: true, subgroup_min_size: 8, coherent: true };
    let ok = DecodeAttnSg::new(128, 4, KvDtype::F16, false).unwrap();
    assert!(ok.source(&env).is_ok());
    let unsupported = |r: Result<numr::gpu::KernelSource, OpsError>| matches!(r, Err(OpsError::Unsupported { .. }));
    for bad in [
        DecodeAttnSg { keys: 0, ..ok },
        DecodeAttnSg { keys: 5, ..ok },
        DecodeAttnSg { heads: 3, ..ok },
        DecodeAttnSg { heads: 0, ..ok },
        DecodeAttnSg { group: 0, ..ok },
        DecodeAttnSg { group: 17, heads: 1, ..ok },
        DecodeAttnSg { head_dim: 96, ..ok },
        DecodeAttnSg { normalised: true, fused: true, ..ok },
    ] {
        assert!(unsupported(bad.source(&env)), "{bad:?}");
    }
    assert!(DecodeAttnSg::new(100, 4, KvDtype::F16, false).is_err());
    assert!(DecodeAttnSg::new(64, 0, KvDtype::F16, false).is_err());
    let no_sg = KernelEnv { subgroups: false, subgroup_min_size: 1, ..env };
    assert!(unsupported(ok.source(&no_sg)));
    assert!(unsupported(DecodeAttn { head_dim: 100, group: 1, dtype: KvDtype::F16, softcap: false }.source(&env)));
    assert!(unsupported(DecodeAttn { head_dim: 64, group: 0, dtype: KvDtype::F16, softcap: false }.source(&env)));
    assert!(unsupported(PrefillAttn { head_dim: 32, dtype: KvDtype::F16, softcap: false, partial: false }.source(&env)));
    assert!(unsupported(AttnCombine { head_dim: 512 }.source(&env)));
}

/// The CPU references refuse inconsistent inputs with a typed error instead of panicking.
#[test]
fn references_refuse_inconsistent_inputs() {
    let opts = AttnOptions::new(64);
    let (q, k) = (vec![0.0; 2 * 64], vec![0.0; 3 * 64]);
    let bad_args = |r: Result<Vec<f32>, OpsError>| matches!(r, Err(OpsError::BadArgs { .. }));
    assert!(attention_ref(&q, &k, &k, 1, 2, 1, 64, 3, 2, &opts).is_ok());
    assert!(bad_args(attention_ref(&q, &k, &k, 1, 2, 1, 64, 4, 3, &opts)), "k shorter than kv_len");
    assert!(bad_args(attention_ref(&q[1..], &k, &k, 1, 2, 1, 64, 3, 2, &opts)), "q short");
    assert!(bad_args(attention_ref(&q, &k, &k[1..], 1, 2, 1, 64, 3, 2, &opts)), "v short");
    assert!(bad_args(attention_ref(&q, &k, &k, 1, 2, 0, 64, 3, 2, &opts)), "no KV heads");
    assert!(bad_args(attention_ref(&q, &k, &k, 1, 2, 1, 64, 3, 3, &opts)), "query past kv_len");
    let l = QkvLayout::packed(2, 1, 1, 64);
    let rp = rope_params(64, 64, RopeStyle::Neox);
    let cfg = QkvRope { style: RopeStyle::Neox, rope: true, qk_norm: true, norm_offset: false, kv_write: None };
    let w = vec![1.0; 64];
    let mut x = vec![0.5; 2 * l.tok_stride];
    assert!(cfg.reference(&mut x.clone(), &l, &rp, &[0, 1], Some(&w), Some(&w), 0.0).is_ok());
    assert!(matches!(cfg.reference(&mut x[1..].to_vec(), &l, &rp, &[0, 1], Some(&w), Some(&w), 0.0), Err(OpsError::BadArgs { .. })));
    assert!(matches!(cfg.reference(&mut x, &l, &rp, &[0], Some(&w), Some(&w), 0.0), Err(OpsError::BadArgs { .. })));
    assert!(matches!(cfg.reference(&mut x, &l, &rp, &[0, 1], None, Some(&w), 0.0), Err(OpsError::BadArgs { .. })));
    assert!(matches!(cfg.reference(&mut x, &l, &rp, &[0, 1], Some(&w[..3]), Some(&w), 0.0), Err(OpsError::BadArgs { .. })));
    assert!(matches!(rp.rotate(&mut [0.0; 10], 3, &rp.inv_freqs()), Err(OpsError::BadArgs { .. })));
}

/// Bad layers, bindings and steps: typed errors at build or record time.
#[test]
fn plans_refuse_bad_inputs() {
    let _serial = serial();
    let Some(ctx) = test_gpu() else { return };
    let (hd, n_q, n_kv) = (64, 4, 2);
    let cache = new_cache(&ctx, n_kv, hd, 16, KvDtype::F16, None);
    assert!(matches!(cache.segments(1), Err(OpsError::BadArgs { .. })));
    assert!(matches!(cache.read_layer(&ctx, 1, 4), Err(OpsError::BadArgs { .. })));
    let q = up(&ctx, &vec![0.0; n_q * hd]);
    let qb = bind(&q);
    let opts = AttnOptions::new(hd);
    let bad_args = |r: &Result<DecodePlan, OpsError>| matches!(r, Err(OpsError::BadArgs { .. }));
    assert!(bad_args(&DecodePlan::new(&ctx, &qb, 0, n_q, &cache, 1, &opts)), "layer");
    assert!(bad_args(&DecodePlan::new(&ctx, &qb, 1, n_q, &cache, 0, &opts)), "q binding too small");
    let small = up(&ctx, &vec![0.0; n_q * hd - 1]);
    assert!(bad_args(&DecodePlan::builder(&ctx, &qb, 0, n_q, &cache, 0, &opts).output(&bind(&small), 0).build()), "output too small");
    assert!(matches!(DecodePlan::new(&ctx, &qb, 0, 3, &cache, 0, &opts), Err(OpsError::Unsupported { .. })), "n_q not a multiple of n_kv");
    if sg_available(&ctx) {
        let tuned = DecodePlan::builder(&ctx, &qb, 0, n_q, &cache, 0, &opts).tuning(1, 0, 512).build();
        assert!(matches!(tuned, Err(OpsError::Unsupported { .. })), "keys 0");
        let tuned = DecodePlan::builder(&ctx, &qb, 0, n_q, &cache, 0, &opts).tuning(1, 2, 0).build();
        assert!(bad_args(&tuned), "target 0");
    } else {
        numr::testing::skip_path(&ctx, "the subgroup decode plan's tuning checks", "no subgroups of 8");
    }
    let plan = DecodePlan::new(&ctx, &qb, 0, n_q, &cache, 0, &opts).unwrap();
    let mut rec = ctx.recorder();
    assert!(matches!(plan.record(&mut rec, &step_u32(3, 2)), Err(OpsError::BadArgs { .. })), "two tokens");
    assert!(matches!(plan.record(&mut rec, &StepValues::decode(16)), Err(OpsError::ContextOverflow { needed: 17, capacity: 16 })));
    assert!(DecodePlan::step(0).is_err());
    assert_eq!(rec.dispatch_count(), 0);
    let ql = QueryLayout { n_tok: 1, n_q, q_off: 0, tok_stride: n_q * hd };
    let pre = PrefillPlan::new(&ctx, &qb, &ql, &cache, 0, &opts).unwrap();
    assert!(matches!(pre.record(&mut rec, &step_u32(0, 2)), Err(OpsError::BadArgs { .. })), "more tokens than the layout");
    assert!(matches!(pre.record(&mut rec, &step_u32(0, 0)), Err(OpsError::BadArgs { .. })), "no tokens");
    assert!(matches!(pre.record(&mut rec, &step_u32(16, 1)), Err(OpsError::ContextOverflow { .. })));
    let ql2 = QueryLayout { n_tok: 2, ..ql };
    assert!(matches!(PrefillPlan::new(&ctx, &qb, &ql2, &cache, 0, &opts), Err(OpsError::BadArgs { .. })), "q binding too small for 2 tokens");
    // QK-norm variant without weights, x too short.
    let rp = rope_params(hd, hd, RopeStyle::Neox);
    let l = QkvLayout::packed(2, n_q, n_kv, hd);
    let norm = QkvRope { style: RopeStyle::Neox, rope: true, qk_norm: true, norm_offset: false, kv_write: None };
    let x = up(&ctx, &vec![0.0; 2 * l.tok_stride]);
    let inp = QkvRopeInputs { x: &bind(&x), layout: l, rope: &rp, positions: &RopePositions::Step, qw: None, kw: None, eps: 0.0, cache: None };
    assert!(matches!(QkvRopePlan::new(&ctx, &norm, &inp), Err(OpsError::BadArgs { .. })));
    let plain = QkvRope { qk_norm: false, ..norm };
    assert!(QkvRopePlan::new(&ctx, &plain, &inp).is_ok());
    let xs = up(&ctx, &vec![0.0; l.tok_stride + (n_q + n_kv) * hd - 1]);
    assert!(matches!(QkvRopePlan::new(&ctx, &plain, &QkvRopeInputs { x: &bind(&xs), ..inp }), Err(OpsError::BadArgs { .. })));
    let kvl = QkvLayout::packed(2, 0, n_kv, hd);
    assert!(matches!(KvWritePlan::new(&ctx, &bind(&x), &kvl, &cache, 3), Err(OpsError::BadArgs { .. })), "layer");
    let other = QkvLayout::packed(2, 0, 1, hd);
    assert!(matches!(KvWritePlan::new(&ctx, &bind(&x), &other, &cache, 0), Err(OpsError::BadArgs { .. })), "KV heads");
}

numr::test_gpu_profiles!(explicit_recorder_two_pass_and_tiled_decode, prefill_plan_steps);

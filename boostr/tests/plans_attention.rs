//! Plans for RoPE / QK-norm + RoPE + KV write, KV cache writes, decode and prefill attention,
//! recorded into explicit recorders: each against its CPU reference and the eager (stream) path.
//!
//! - One plan recorded several times in one recorder with different step values (RoPE at
//!   positions 5, 6, 7; decode at kv_len 1, 100, 1000 and back to 100, so stale partials of a
//!   larger step would show) gives each step's result; the output is copied to a distinct buffer
//!   after each recording. Recording creates no buffer and no bind group.
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
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype, KvWritePlan};
use boostr::ops_common::OpPlan;
use boostr::ops_common::{OpsError, env_of, pseudo_random as rnd};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, ParamMode, StepValues};
use numr::testing::{check_close_rtol, test_gpu, test_gpu_private};
use numr::{Device, Tensor};
use std::sync::Arc;

fn up(ctx: &GpuContext, v: &[f32]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], &Device::Gpu(ctx.clone())).unwrap()
}

fn bind(t: &Tensor) -> Binding {
    t.gpu_binding(4).unwrap().0
}

fn close(got: &[f32], want: &[f32], tol: f64, what: &str) {
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    if let Err(e) = check_close_rtol(&f(got), &f(want), tol) {
        panic!("{what}: {e}");
    }
}

/// Stored cache rows against the CPU model of the cache. f16 rows match exactly. A q8_0 code
/// is `round(x / d)`, and Vulkan's division need not be correctly rounded (2.5 ULP), so a value
/// within a few ULP of a tie may round the other way on a GPU (it does on the H200): q8_0 rows
/// match exactly except at most one element in a thousand, each off by exactly one step of its
/// block.
fn stored_close(got: &[f32], want: &[f32], dtype: KvDtype, what: &str) {
    if dtype == KvDtype::F16 {
        return close(got, want, 1e-6, what);
    }
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut ties = 0;
    for (b, (g, w)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
        let step = w.iter().fold(0.0f32, |m, &x| m.max(x.abs())) / 127.0;
        for (i, (&g, &w)) in g.iter().zip(w).enumerate() {
            let diff = (g - w).abs();
            if diff <= 1e-6 * step.max(1e-30) * 127.0 {
                continue;
            }
            assert!((diff - step).abs() <= 1e-3 * step, "{what}: element {}: got {g} want {w} (step {step})", 32 * b + i);
            ties += 1;
        }
    }
    assert!(ties * 1000 <= got.len(), "{what}: {ties} of {} values a step off", got.len());
}

fn read_f32(ctx: &GpuContext, buf: &Arc<GpuBuffer>, off: u64, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(buf, off, (n * 4) as u64).unwrap())
}

/// A cache of one layer whose segments hold `seg` positions (None: one segment).
fn new_cache(ctx: &GpuContext, n_kv: usize, hd: usize, capacity: usize, dtype: KvDtype, seg: Option<usize>) -> KvCache {
    let pos_bytes = (n_kv * dtype.row_words(hd) * 4) as u64;
    let cfg = KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity, dtype, max_segment_bytes: seg.map(|s| s as u64 * pos_bytes) };
    let c = KvCache::new(ctx, cfg).unwrap();
    assert_eq!(c.segments(0).unwrap().len(), seg.map_or(1, |s| capacity.div_ceil(s)));
    c
}

/// `n` tokens of K then V heads, `[t][k heads | v heads]`, and their layout.
fn kv_rows(n: usize, n_kv: usize, hd: usize, seed: u64) -> (Vec<f32>, QkvLayout) {
    let l = QkvLayout { n_tok: n, n_q: 0, n_kv, head_dim: hd, tok_stride: 2 * n_kv * hd, x_off: 0, q_off: 0, k_off: 0, v_off: n_kv * hd };
    (rnd(n * l.tok_stride, seed, 1.0), l)
}

/// `[n_kv][len][hd]` -> the first `kv` positions of each head.
fn prefix(a: &[f32], n_kv: usize, len: usize, kv: usize, hd: usize) -> Vec<f32> {
    (0..n_kv).flat_map(|h| a[h * len * hd..][..kv * hd].to_vec()).collect()
}

/// `[t][n_kv][hd]` -> `[n_kv][t][hd]`.
fn by_head(a: &[f32], n: usize, n_kv: usize, hd: usize) -> Vec<f32> {
    let mut o = vec![0.0; a.len()];
    for t in 0..n {
        for h in 0..n_kv {
            o[(h * n + t) * hd..][..hd].copy_from_slice(&a[(t * n_kv + h) * hd..][..hd]);
        }
    }
    o
}

fn step_u32(pos: usize, n: usize) -> StepValues {
    StepValues::chunk(pos as u32, n as u32)
}

fn no_copy_alloc_snapshot(ctx: &GpuContext) -> (u64, u64) {
    (ctx.bind_groups_created(), ctx.pool_stats().created)
}

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
        eprintln!("adapter lacks subgroups of 8: the subgroup decode kernel is not run");
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
#[test]
fn explicit_recorder_two_pass_and_tiled_decode() {
    let Some(ctx) = test_gpu() else { return };
    let (hd, n_q, n_kv, n) = (64, 4, 2, 37);
    let cache = new_cache(&ctx, n_kv, hd, 40, KvDtype::F16, None);
    let (x, l) = kv_rows(n, n_kv, hd, 5);
    let xt = up(&ctx, &x);
    let writer = KvWritePlan::new(&ctx, &bind(&xt), &l, &cache, 0).unwrap();
    let q = rnd(n_q * hd, 6, 2.0);
    let qt = up(&ctx, &q);
    let opts = AttnOptions::new(hd);
    let mut plans = vec![DecodePlan::builder(&ctx, &bind(&qt), 0, n_q, &cache, 0, &opts).kernel(DecodeKernel::Tiled).build().unwrap()];
    if sg_available(&ctx) {
        let p = DecodePlan::builder(&ctx, &bind(&qt), 0, n_q, &cache, 0, &opts).kernel(DecodeKernel::Subgroup).two_pass().build().unwrap();
        assert!(!p.is_fused());
        assert_eq!(p.dispatch_count(&DecodePlan::step(n).unwrap()), 2);
        plans.push(p);
    }
    let mut rec = ctx.recorder();
    writer.record(&mut rec, &step_u32(0, n)).unwrap();
    for p in &plans {
        p.record(&mut rec, &DecodePlan::step(n).unwrap()).unwrap();
    }
    rec.submit().unwrap();
    let (k, v) = cache.read_layer(&ctx, 0, n).unwrap();
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
#[test]
fn prefill_plan_steps() {
    let Some(ctx) = test_gpu() else { return };
    let mut kinds = vec![DecodeKernel::Tiled];
    if sg_available(&ctx) {
        kinds.push(DecodeKernel::Subgroup);
    }
    let cases = [
        (64, 4, 2, KvDtype::F16, None, AttnOptions::new(64)),
        (128, 6, 2, KvDtype::Q8_0, Some(30), AttnOptions { scale: 0.08, softcap: Some(30.0), window: Some(11) }),
    ];
    // The unsegmented f16 case runs the coopmat kernel too where the adapter has cooperative
    // matrices (80 positions: the last key tile reaches past the cache's end).
    let (cap, max_tok) = (80, 40);
    for &(hd, n_q, n_kv, dtype, seg, opts) in &cases {
        let cache = new_cache(&ctx, n_kv, hd, cap, dtype, seg);
        let coop = PrefillPlan::coop_config(&ctx, &cache, 0, n_q, &opts).is_some();
        let mut kinds = kinds.clone();
        if coop {
            kinds.push(DecodeKernel::Coop);
        }
        // The coopmat kernel rounds Q and P to f16 (module docs of `prefill_coop`).
        let tol = |k: DecodeKernel| if k == DecodeKernel::Coop { 4e-3 } else { 1e-4 };
        let (x, l) = kv_rows(cap, n_kv, hd, 7 + hd as u64);
        let xt = up(&ctx, &x);
        let writer = KvWritePlan::new(&ctx, &bind(&xt), &l, &cache, 0).unwrap();
        writer.run(&ctx, &step_u32(0, cap)).unwrap();
        let (k, v) = cache.read_layer(&ctx, 0, cap).unwrap();
        let q = rnd(max_tok * n_q * hd, 8, 2.0);
        let qt = up(&ctx, &q);
        let ql = QueryLayout { n_tok: max_tok, n_q, q_off: 0, tok_stride: n_q * hd };
        let steps = [(0usize, 17usize), (17, 40), (57, 23)];
        for &kind in &kinds {
            let what = format!("prefill {kind:?} hd {hd} {dtype:?} seg {seg:?}");
            let plan = PrefillPlan::builder(&ctx, &bind(&qt), &ql, &cache, 0, &opts).kernel(kind).build().unwrap();
            let dst = ctx.alloc((steps.len() * max_tok * n_q * hd * 4) as u64, BufferKind::Storage).unwrap();
            let before = no_copy_alloc_snapshot(&ctx);
            let mut rec = ctx.recorder();
            for (i, &(p0, n)) in steps.iter().enumerate() {
                plan.record(&mut rec, &step_u32(p0, n)).unwrap();
                let (ob, off) = plan.output_binding();
                let bytes = (n * n_q * hd * 4) as u64;
                rec.copy(&ob.buffer, ob.offset + off as u64 * 4, &dst, (i * max_tok * n_q * hd * 4) as u64, bytes).unwrap();
            }
            assert_eq!(no_copy_alloc_snapshot(&ctx), before, "{what}: recording created a bind group or a buffer");
            rec.submit().unwrap();
            for (i, &(p0, n)) in steps.iter().enumerate() {
                let kv = p0 + n;
                let want =
                    attention_ref(&q[..n * n_q * hd], &prefix(&k, n_kv, cap, kv, hd), &prefix(&v, n_kv, cap, kv, hd), n, n_q, n_kv, hd, kv, p0, &opts).unwrap();
                let got = read_f32(&ctx, &dst, (i * max_tok * n_q * hd * 4) as u64, n * n_q * hd);
                close(&got, &want, tol(kind), &format!("{what}: chunk {i} (p0 {p0}, {n} tokens)"));
                if i == 2 {
                    let eq = QueryLayout { n_tok: n, ..ql };
                    let eager = attention::prefill(&ctx, &bind(&qt), &eq, &cache, 0, p0, &opts).unwrap().to_vec::<f32>().unwrap();
                    let default = if coop { DecodeKernel::Coop } else { *kinds.last().unwrap_or(&kind) };
                    close(&eager, &want, tol(default), &format!("{what}: eager"));
                }
            }
        }
    }
}

fn rope_params(hd: usize, rot: usize, style: RopeStyle) -> RopeParams {
    RopeParams { head_dim: hd, rot_dim: rot, base: 10000.0, scaling: RopeScaling::Linear { factor: 2.0 }, style }
}

/// One QK-norm + RoPE + KV write plan (positions from the step) recorded at positions 5, 6 and 7
/// in one recorder over a segmented cache: each step's activations and cached rows against the
/// reference, and the eager path.
#[test]
fn rope_plan_steps() {
    let Some(ctx) = test_gpu() else { return };
    let (hd, n_q, n_kv) = (64, 2, 1);
    let cfg = QkvRope { style: RopeStyle::Neox, rope: true, qk_norm: true, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let rp = rope_params(hd, 48, RopeStyle::Neox);
    let cache = new_cache(&ctx, n_kv, hd, 8, KvDtype::F16, Some(3));
    let mut l = QkvLayout::packed(1, n_q, n_kv, hd);
    l.x_off = 5;
    let len = l.x_off + l.tok_stride;
    let x0 = rnd(len, 3, 1.5);
    let (src, xt) = (up(&ctx, &x0), up(&ctx, &x0));
    let (qw, kw) = (rnd(hd, 4, 1.0), rnd(hd, 5, 1.0));
    let (qwt, kwt) = (up(&ctx, &qw), up(&ctx, &kw));
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
    let plan = QkvRopePlan::new(&ctx, &cfg, &inp).unwrap();
    let dst = ctx.alloc((3 * len * 4) as u64, BufferKind::Storage).unwrap();
    let (sb, xb) = (src.gpu_buffer().unwrap().clone(), xt.gpu_buffer().unwrap().clone());
    let before = no_copy_alloc_snapshot(&ctx);
    let mut rec = ctx.recorder();
    for (i, pos) in [5u32, 6, 7].into_iter().enumerate() {
        rec.copy(&sb, 0, &xb, 0, (len * 4) as u64).unwrap();
        plan.record(&mut rec, &StepValues::decode(pos)).unwrap();
        rec.copy(&xb, 0, &dst, (i * len * 4) as u64, (len * 4) as u64).unwrap();
    }
    assert_eq!(no_copy_alloc_snapshot(&ctx), before, "recording created a bind group or a buffer");
    rec.submit().unwrap();
    let (kc, vc) = cache.read_layer(&ctx, 0, 8).unwrap();
    for (i, pos) in [5u32, 6, 7].into_iter().enumerate() {
        let mut want = x0.clone();
        let (ks, vs) = cfg.reference(&mut want, &l, &rp, &[pos], Some(&qw), Some(&kw), 1e-6).unwrap();
        close(&read_f32(&ctx, &dst, (i * len * 4) as u64, len), &want, 1e-4, &format!("x at position {pos}"));
        close(&kc[pos as usize * hd..][..hd], &ks, 2e-3, &format!("K at slot {pos}"));
        close(&vc[pos as usize * hd..][..hd], &vs, 2e-3, &format!("V at slot {pos}"));
        if pos == 7 {
            let xe = up(&ctx, &x0);
            let no_cache = cfg.run(&ctx, &bind(&xe), &l, &rp, &[7], Some(&bind(&qwt)), Some(&bind(&kwt)), 1e-6, None);
            assert!(matches!(no_cache, Err(OpsError::BadArgs { .. })), "a KV-write variant without a cache");
            let nokv = QkvRope { kv_write: None, ..cfg };
            nokv.run(&ctx, &bind(&xe), &l, &rp, &[7], Some(&bind(&qwt)), Some(&bind(&kwt)), 1e-6, None).unwrap();
            close(&xe.to_vec::<f32>().unwrap(), &want, 1e-4, "eager x at position 7");
        }
    }
    // Slots 0..5 were never written.
    assert!(kc[..5 * hd].iter().chain(&vc[..5 * hd]).all(|&v| v == 0.0));
    // Rotation only (no norm weights, no cache), explicit recorder, against the reference.
    let plain = QkvRope { qk_norm: false, kv_write: None, ..cfg };
    let xp = up(&ctx, &x0);
    let inp = QkvRopeInputs { x: &bind(&xp), layout: l, rope: &rp, positions: &RopePositions::Step, qw: None, kw: None, eps: 0.0, cache: None };
    let plan = QkvRopePlan::new(&ctx, &plain, &inp).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::decode(6)).unwrap();
    rec.submit().unwrap();
    let mut want = x0.clone();
    plain.reference(&mut want, &l, &rp, &[6], None, None, 0.0).unwrap();
    close(&xp.to_vec::<f32>().unwrap(), &want, 1e-4, "rotation only at position 6");
}

/// Positions read from a GPU buffer at `step.token + t`, a chunk of 3 tokens over a segmented
/// q8_0 cache at slots 2..5, against the reference and the eager `QkvRope::run`.
#[test]
fn rope_plan_positions_from_buffer() {
    let Some(ctx) = test_gpu() else { return };
    let (hd, n_q, n_kv, n) = (128, 3, 1, 3);
    let cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::Q8_0) };
    let rp = rope_params(hd, 128, RopeStyle::Normal);
    let l = QkvLayout::packed(4, n_q, n_kv, hd);
    let x0 = rnd(4 * l.tok_stride, 11, 1.0);
    let xt = up(&ctx, &x0);
    let all_pos = [9u32, 3, 40, 17, 0, 2];
    let pos_buf = ctx.upload(bytemuck::cast_slice(&all_pos)).unwrap();
    let positions = RopePositions::Buffer(Binding::whole(&pos_buf));
    let cache = new_cache(&ctx, n_kv, hd, 8, KvDtype::Q8_0, Some(3));
    let inp = QkvRopeInputs { x: &bind(&xt), layout: l, rope: &rp, positions: &positions, qw: None, kw: None, eps: 0.0, cache: Some((&cache, 0)) };
    let plan = QkvRopePlan::new(&ctx, &cfg, &inp).unwrap();
    let step = step_u32(2, n).with_token(1);
    assert_eq!(plan.plan().dispatch_count(&step), 2, "slots 2..5 touch segments 0..3 and 3..6");
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &step).unwrap();
    rec.submit().unwrap();
    let lw = QkvLayout { n_tok: n, ..l };
    let mut want = x0.clone();
    let (ks, vs) = cfg.reference(&mut want, &lw, &rp, &all_pos[1..4], None, None, 0.0).unwrap();
    close(&xt.to_vec::<f32>().unwrap(), &want, 1e-4, "x");
    let (kc, vc) = cache.read_layer(&ctx, 0, 5).unwrap();
    close(&kc[2 * hd..], &ks, 2e-2, "K");
    close(&vc[2 * hd..], &vs, 2e-2, "V");
    // The eager path writes the same rows at the same slots.
    let mut eager_cache = new_cache(&ctx, n_kv, hd, 8, KvDtype::Q8_0, Some(3));
    eager_cache.commit(2).unwrap();
    let xe = up(&ctx, &x0);
    cfg.run(&ctx, &bind(&xe), &lw, &rp, &all_pos[1..4], None, None, 0.0, Some((&eager_cache, 0))).unwrap();
    close(&xe.to_vec::<f32>().unwrap(), &xt.to_vec::<f32>().unwrap(), 1e-6, "eager x");
    let (ke, ve) = eager_cache.read_layer(&ctx, 0, 5).unwrap();
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
#[test]
fn rope_plan_sums_split_partials() {
    let Some(ctx) = test_gpu() else { return };
    let (hd, n_q, n_kv, n) = (64, 4, 2, 3);
    let cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let rp = rope_params(hd, 64, RopeStyle::Normal);
    let l = QkvLayout::packed(n, n_q, n_kv, hd);
    let part = n * l.tok_stride;
    let x = rnd(2 * part, 31, 1.0);
    let xt = up(&ctx, &x);
    let cache = new_cache(&ctx, n_kv, hd, 8, KvDtype::F16, None);
    let inp = QkvRopeInputs { x: &bind(&xt), layout: l, rope: &rp, positions: &RopePositions::Step, qw: None, kw: None, eps: 0.0, cache: Some((&cache, 0)) };
    let freqs = ctx.upload(bytemuck::cast_slice(&rp.inv_freqs())).unwrap();
    let plan = QkvRopePlan::with_partial_sum(&ctx, &cfg, &inp, &Binding::whole(&freqs), part).unwrap();
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
    let (kc, vc) = cache.read_layer(&ctx, 0, 5).unwrap();
    let slots = |c: &[f32]| -> Vec<f32> {
        (0..n).flat_map(|t| (0..n_kv).flat_map(move |h| (0..hd).map(move |d| (h, t, d)))).map(|(h, t, d)| c[(h * 5 + 2 + t) * hd + d]).collect()
    };
    close(&slots(&kc), &ks, 2e-3, "K");
    close(&slots(&vc), &vs, 2e-3, "V");
    let kv_only = QkvRope { rope: false, ..cfg };
    assert!(QkvRopePlan::with_partial_sum(&ctx, &kv_only, &inp, &Binding::whole(&freqs), part).is_err(), "a variant that writes nothing back");
    let short = up(&ctx, &x[..part + 10]);
    let inp = QkvRopeInputs { x: &bind(&short), ..inp };
    assert!(QkvRopePlan::with_partial_sum(&ctx, &cfg, &inp, &Binding::whole(&freqs), part).is_err(), "x without room for the second partial");
}

/// KV-only writes, f16 and q8_0, two chunks in one recorder on a segmented cache, against the
/// CPU model of the cache and the eager fused write with rotation off.
#[test]
fn kv_write_plan() {
    let Some(ctx) = test_gpu() else { return };
    for dtype in [KvDtype::F16, KvDtype::Q8_0] {
        let (hd, n_kv) = (64, 2);
        let cache = new_cache(&ctx, n_kv, hd, 10, dtype, Some(4));
        let (x, mut l) = kv_rows(5, n_kv, hd, 21);
        // Padding between tokens and ignored Q heads in the layout.
        l.tok_stride += 3;
        l.n_q = 7;
        let x = [x.clone(), vec![0.0; 5 * 3]].concat();
        let xt = up(&ctx, &x);
        let plan = KvWritePlan::new(&ctx, &bind(&xt), &l, &cache, 0).unwrap();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &step_u32(0, 5)).unwrap();
        plan.record(&mut rec, &step_u32(5, 3)).unwrap();
        rec.submit().unwrap();
        let lr = QkvLayout { n_q: 0, ..l };
        let rope = RopeParams { head_dim: hd, rot_dim: 0, base: 1.0, scaling: RopeScaling::None, style: RopeStyle::Neox };
        let cfg = QkvRope { style: RopeStyle::Neox, rope: false, qk_norm: false, norm_offset: false, kv_write: Some(dtype) };
        let (ks, vs) = cfg.reference(&mut x.clone(), &lr, &rope, &[0; 5], None, None, 0.0).unwrap();
        let (k, v) = cache.read_layer(&ctx, 0, 8).unwrap();
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
        let eager = new_cache(&ctx, n_kv, hd, 10, dtype, Some(4));
        cfg.run(&ctx, &bind(&xt), &QkvLayout { n_tok: 5, ..lr }, &rope, &[0; 5], None, None, 0.0, Some((&eager, 0))).unwrap();
        assert_eq!(eager.read_layer(&ctx, 0, 5).unwrap().0, prefix(&k, n_kv, 8, 5, hd), "{dtype:?} eager");
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

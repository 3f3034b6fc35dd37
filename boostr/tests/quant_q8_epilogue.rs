//! GEMV epilogues (`Q8Epilogue`): an integer-dot GEMV that quantizes its own output for the next
//! projection, and the consumer that applies the deferred RMSNorm (`rms_scale`).
//!
//! What is checked, on every subgroup mode and row layout:
//! - the epilogue's int8 activations are **bit-identical** to the standalone quantizer's on the
//!   same GEMV output (`DeferredRmsQuantizeQ8` for the norm, `GluQuantizeQ8` for the GLU): the
//!   same f32 operations in the same order, so any difference is a synchronisation bug (a block
//!   quantized before all its rows were stored);
//! - the chain is repeated, so the arrival counters must have been reset by the last arrival;
//! - the residual and the consumer's output against the CPU: the residual at 1e-5 on the GPU's own
//!   int8 activations; the deferred norm's codes within half a step of the CPU's RMSNorm; the
//!   consumer at 1e-4 of `matmul_ref` on those dequantized activations (f32 rounding), and at
//!   6e-2 of the exact norm's product (the int8 rounding alone, a sanity bound);
//! - the plan's typed errors for what an epilogue cannot do.

#[path = "formats_util.rs"]
mod util;

use boostr::act::ActKind;
use boostr::formats::{GgmlType, PackedWeights, matmul_ref};
use boostr::quant::{GemvOutput, Q8Activations, Q8Epilogue, Q8GemvPlan, QuantError, QuantGemvQ8, QuantMatrix, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, check_q8, random_ggml, rmsnorm_cpu};

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn read_f32(ctx: &GpuContext, b: &std::sync::Arc<numr::gpu::GpuBuffer>, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(b, 0, 4 * n as u64).unwrap())
}

/// The int8 codes and scale words of `xa` (`k` activations).
fn read_q8(ctx: &GpuContext, xa: &Q8Activations) -> (Vec<i8>, Vec<f32>) {
    let nb = xa.k() / 32;
    let q = ctx.read_bytes(xa.xq(), 0, (nb * 32) as u64).unwrap().into_iter().map(|b| b as i8).collect();
    (q, bytemuck::pod_collect_to_vec(&ctx.read_bytes(xa.xs(), 0, (nb * 16) as u64).unwrap()))
}

/// The layouts each epilogue runs with: the default, two rows per workgroup, rows per subgroup
/// (four rows over a 128-wide workgroup), the workgroup-memory reduction, and three row groups
/// per workgroup.
fn layouts(base: QuantGemvQ8) -> Vec<(&'static str, QuantGemvQ8)> {
    vec![
        ("default", base),
        ("r2", QuantGemvQ8 { rows_per_workgroup: 2, unchecked: true, ..base }),
        // The engine's gate/up and LM head on tall matrices (cera's tuning, Q8_TALL_ROWS).
        ("r4", QuantGemvQ8 { rows_per_workgroup: 4, unchecked: true, ..base }),
        ("sgrows", QuantGemvQ8 { subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base }),
        ("no-subgroups", QuantGemvQ8 { subgroups: false, rows_per_workgroup: 2, threads: 64, ..base }),
        ("row-groups", QuantGemvQ8 { row_groups: 3, rows_per_workgroup: 2, ..base }),
    ]
}

#[test]
fn epilogue_variants_validate_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation().into_iter().filter(|e| e.coherent) {
        for gemma in [false, true] {
            let src = boostr::quant::DeferredRmsQuantizeQ8 { gemma }.source(&env);
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
        }
        for cfg in QuantGemvQ8::all_for(&env).into_iter().filter(|c| c.epilogue.is_some() || c.rms_scale) {
            let src = cfg.source(&env);
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
    }
    assert!(n > 50, "{n} variants");
}

/// The residual half of a layer: `h += W_o a` with the next RMSNorm's quantization in the
/// epilogue, then a consumer GEMV applying `1 / rms`; three times over an evolving residual.
#[test]
fn norm_epilogue_and_rms_consumer_match_the_standalone_quantizer_and_cpu() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    assert!(Q8GemvPlan::epilogue_supported(&ctx, Q8Epilogue::Quantize { norm: true, gemma: false }), "the test adapter runs epilogues");
    let mut rng = Rng(71);
    let (k_in, dim, n_out, eps) = (256, 256, 96, 1e-5f32);
    for (ty, gemma) in [(GgmlType::Q4_0, false), (GgmlType::Q8_0, true), (GgmlType::Q4_K, false)] {
        let wo = random_ggml(&mut rng, ty, dim, k_in);
        let wc = random_ggml(&mut rng, ty, n_out, dim);
        let (mo, mc) = (QuantMatrix::upload(&ctx, "w_o", &wo).unwrap(), QuantMatrix::upload(&ctx, "w_c", &wc).unwrap());
        let kind = WeightKind::of(wo.format());
        let nw: Vec<f32> = (0..dim).map(|_| rng.f32_in(0.5, 1.5)).collect();
        let nwb = ctx.upload(bytemuck::cast_slice(&nw)).unwrap();
        let base = QuantGemvQ8::new(kind, &env, 1);
        let arrivals = Q8Epilogue::Quantize { norm: true, gemma };
        let local = Q8Epilogue::QuantizeLocal { norm: true, gemma };
        // Every arrival layout, and workgroups that own whole blocks (32 rows or more).
        let mut cases: Vec<(&str, QuantGemvQ8, Q8Epilogue)> = layouts(base).into_iter().map(|(l, c)| (l, c, arrivals)).collect();
        cases.extend([
            ("local r32 t32", QuantGemvQ8 { rows_per_workgroup: 32, threads: 32, ..base }, local),
            ("local r32 t64 no-subgroups", QuantGemvQ8 { rows_per_workgroup: 32, threads: 64, subgroups: false, ..base }, local),
            ("local r32 sgrows1 t1024", QuantGemvQ8 { rows_per_workgroup: 32, threads: 1024, subgroup_rows: 1, unchecked: true, ..base }, local),
            ("local r64 sgrows2 t512", QuantGemvQ8 { rows_per_workgroup: 64, threads: 512, subgroup_rows: 2, ..base }, local),
            ("local r32 sgrows2 t64 row-groups", QuantGemvQ8 { rows_per_workgroup: 32, threads: 64, subgroup_rows: 2, row_groups: 3, ..base }, local),
        ]);
        for (label, cfg, ep) in cases {
            let mut h: Vec<f32> = (0..dim).map(|_| rng.f32_in(-2.0, 2.0)).collect();
            let ab = ctx.alloc(4 * k_in as u64, BufferKind::Storage).unwrap();
            let hb = ctx.upload(bytemuck::cast_slice(&h)).unwrap();
            let y = ctx.alloc(4 * n_out as u64, BufferKind::Storage).unwrap();
            let xa = Q8Activations::new(&ctx, &Binding::whole(&ab), 1, k_in).unwrap();
            let target = Q8Activations::written_by_producer(&ctx, dim, Some(eps)).unwrap();
            let producer = QuantGemvQ8 { accumulate: true, epilogue: ep, ..cfg };
            let pp =
                Q8GemvPlan::with_epilogue(&ctx, &producer, &mo, &xa, &GemvOutput::Single(Binding::whole(&hb)), &target, Some(&Binding::whole(&nwb))).unwrap();
            // (The local producers' wide workgroups are not consumer shapes.)
            let consumer = QuantGemvQ8 { rms_scale: true, ..if ep.is_local() { base } else { cfg } };
            let cp = Q8GemvPlan::new(&ctx, &consumer, &mc, &target, &GemvOutput::Single(Binding::whole(&y))).unwrap();
            // The standalone quantizer of the same residual, for the bit-exact comparison.
            let standalone = Q8Activations::with_deferred_rms_norm(&ctx, &Binding::whole(&hb), &Binding::whole(&nwb), 1, dim, eps, gemma).unwrap();
            let step = StepValues::decode(0);
            for round in 0..3 {
                // Fresh activations each round; the residual keeps what the last round added.
                let a: Vec<f32> = (0..k_in).map(|_| rng.f32_in(-1.0, 1.0)).collect();
                ctx.write(&ab, 0, bytemuck::cast_slice(&a)).unwrap();
                let mut rec = ctx.recorder();
                xa.record(&mut rec, &step).unwrap();
                pp.record(&mut rec, &step).unwrap();
                cp.record(&mut rec, &step).unwrap();
                assert_eq!(rec.dispatch_count(), 3);
                rec.submit().unwrap();
                let what = format!("{ty:?} {label} {ep:?} round {round}");
                let (aq, as_) = read_q8(&ctx, &xa);
                let deq_a = check_q8(&a, &aq, &as_, 0.0);
                // The residual: h + W_o a (on the GPU's own int8 a).
                let h_new: Vec<f32> = matmul_ref(&wo, &deq_a, 1).unwrap().iter().zip(&h).map(|(d, h)| h + d).collect();
                let got_h = read_f32(&ctx, &hb, dim);
                check_close_rtol(&f64s(&got_h), &f64s(&h_new), 1e-5).unwrap_or_else(|e| panic!("{what}: residual: {e}"));
                let (eq, es) = read_q8(&ctx, &target);
                standalone.run(&ctx, &step).unwrap();
                let (sq, ss) = read_q8(&ctx, &standalone);
                assert_eq!(eq, sq, "{what}: epilogue codes differ from the standalone quantizer's");
                assert_eq!(es, ss, "{what}: epilogue scales differ from the standalone quantizer's");
                // The deferred norm: codes times d / rms are the CPU's RMSNorm of the residual
                // within half a step (1 / rms from the blocks' sums of squares, as the consumer
                // computes it).
                let ssum: f64 = es.chunks(4).map(|s| s[3] as f64).sum();
                let inv = (1.0 / (ssum / dim as f64 + eps as f64).sqrt()) as f32;
                let scaled: Vec<f32> = es.chunks(4).flat_map(|s| [s[0] * inv, s[1] * inv, s[2] * inv, 0.0]).collect();
                let normed = rmsnorm_cpu(&got_h, &nw, 1, eps, gemma);
                let deq = check_q8(&normed, &eq, &scaled, 1e-5);
                // The consumer on those activations (f32 tolerance), and, as a sanity bound, on the
                // exact norm (the int8 rounding of 256 activations moves a sum by a few percent).
                let got = f64s(&read_f32(&ctx, &y, n_out));
                check_close_rtol(&got, &f64s(&matmul_ref(&wc, &deq, 1).unwrap()), 1e-4).unwrap_or_else(|e| panic!("{what}: consumer: {e}"));
                check_close_rtol(&got, &f64s(&matmul_ref(&wc, &normed, 1).unwrap()), 6e-2).unwrap_or_else(|e| panic!("{what}: consumer (f32 x): {e}"));
                h = got_h;
            }
        }
    }
}

/// The FFN half: `[gate | up] = W_gu x` with `act(gate) * up` quantized in the epilogue, then
/// the down projection reading it; codes equal `GluQuantizeQ8` on the same `[gate | up]`.
#[test]
fn glu_epilogue_matches_the_standalone_quantizer_and_cpu() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(72);
    for (ty, act) in [(GgmlType::Q4_0, ActKind::Silu), (GgmlType::Q6_K, ActKind::GeluTanh)] {
        let kind = WeightKind::Ggml(ty);
        for (label, cfg) in layouts(QuantGemvQ8::new(kind, &env, 1)) {
            glu_case(&ctx, &mut rng, ty, label, QuantGemvQ8 { epilogue: Q8Epilogue::Glu { act }, ..cfg }, cfg);
        }
    }
}

/// The same with workgroups that own whole blocks (`Q8Epilogue::GluLocal`): every layout that
/// holds 64 rows or more per workgroup, with and without subgroups, row groups, the deferred
/// RMSNorm of the input.
#[test]
fn workgroup_local_glu_epilogue_matches_the_standalone_quantizer_and_cpu() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    assert!(Q8GemvPlan::epilogue_supported(&ctx, Q8Epilogue::GluLocal { act: ActKind::Silu }));
    let mut rng = Rng(74);
    for (ty, act) in [(GgmlType::Q4_0, ActKind::Silu), (GgmlType::Q6_K, ActKind::GeluTanh)] {
        let base = QuantGemvQ8::new(WeightKind::Ggml(ty), &env, 1);
        let epilogue = Q8Epilogue::GluLocal { act };
        let layouts = [
            ("r64 t64", QuantGemvQ8 { rows_per_workgroup: 64, threads: 64, ..base }),
            ("r64 t128 no-subgroups", QuantGemvQ8 { rows_per_workgroup: 64, threads: 128, subgroups: false, ..base }),
            ("r64 sgrows1 t128", QuantGemvQ8 { rows_per_workgroup: 64, threads: 128, subgroup_rows: 1, unchecked: true, ..base }),
            ("r128 sgrows2 t256", QuantGemvQ8 { rows_per_workgroup: 128, threads: 256, subgroup_rows: 2, ..base }),
            ("r64 sgrows4 t64 row-groups", QuantGemvQ8 { rows_per_workgroup: 64, threads: 64, subgroup_rows: 4, row_groups: 3, ..base }),
        ];
        for (label, cfg) in layouts {
            glu_case(&ctx, &mut rng, ty, label, QuantGemvQ8 { epilogue, ..cfg }, base);
        }
    }
}

/// One GLU producer (`producer`, whose epilogue is a GLU) and the down projection (`consumer`)
/// three times over fresh inputs: the epilogue's codes and scales against `GluQuantizeQ8` on
/// the producer's own `[gate | up]`, the GLU and the down projection against the CPU.
fn glu_case(ctx: &GpuContext, rng: &mut Rng, ty: GgmlType, label: &str, producer: QuantGemvQ8, consumer: QuantGemvQ8) {
    let (k_in, f, n_out) = (256, 256, 64);
    let act = match producer.epilogue {
        Q8Epilogue::Glu { act } | Q8Epilogue::GluLocal { act } => act,
        e => panic!("{e:?} is not a GLU"),
    };
    let wgu = random_ggml(rng, ty, 2 * f, k_in);
    let wd = random_ggml(rng, ty, n_out, f);
    let (mgu, md) = (QuantMatrix::upload(ctx, "w_gu", &wgu).unwrap(), QuantMatrix::upload(ctx, "w_d", &wd).unwrap());
    let gu = ctx.alloc(4 * 2 * f as u64, BufferKind::Storage).unwrap();
    let y = ctx.alloc(4 * n_out as u64, BufferKind::Storage).unwrap();
    let xb = ctx.alloc(4 * k_in as u64, BufferKind::Storage).unwrap();
    let nw = ctx.upload(bytemuck::cast_slice(&vec![1.0f32; k_in])).unwrap();
    let xa = if producer.rms_scale {
        Q8Activations::with_deferred_rms_norm(ctx, &Binding::whole(&xb), &Binding::whole(&nw), 1, k_in, 1e-5, false).unwrap()
    } else {
        Q8Activations::new(ctx, &Binding::whole(&xb), 1, k_in).unwrap()
    };
    let target = Q8Activations::written_by_producer(ctx, f, None).unwrap();
    let pp = Q8GemvPlan::with_epilogue(ctx, &producer, &mgu, &xa, &GemvOutput::Single(Binding::whole(&gu)), &target, None).unwrap();
    let dp = Q8GemvPlan::new(ctx, &consumer, &md, &target, &GemvOutput::Single(Binding::whole(&y))).unwrap();
    let standalone = Q8Activations::with_glu(ctx, &Binding::whole(&gu), act, 1, f).unwrap();
    let step = StepValues::decode(0);
    for round in 0..3 {
        let x: Vec<f32> = (0..k_in).map(|_| rng.f32_in(-1.0, 1.0)).collect();
        ctx.write(&xb, 0, bytemuck::cast_slice(&x)).unwrap();
        let mut rec = ctx.recorder();
        xa.record(&mut rec, &step).unwrap();
        pp.record(&mut rec, &step).unwrap();
        dp.record(&mut rec, &step).unwrap();
        rec.submit().unwrap();
        let what = format!("{ty:?} {act:?} {label} round {round}");
        let (eq, es) = read_q8(ctx, &target);
        standalone.run(ctx, &step).unwrap();
        let (sq, ss) = read_q8(ctx, &standalone);
        assert_eq!(eq, sq, "{what}: epilogue codes differ from GluQuantizeQ8's");
        assert_eq!(es, ss, "{what}: epilogue scales differ from GluQuantizeQ8's");
        // [gate | up] against the CPU (on the GPU's own int8 input), the GLU, and the down
        // projection on the GPU's own int8 GLU.
        let g: Vec<f32> = read_f32(ctx, &gu, 2 * f);
        let (xq, xs) = read_q8(ctx, &xa);
        let mut xin = check_q8_raw(&xq, &xs);
        if producer.rms_scale {
            let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let inv = 1.0 / (ss / k_in as f64 + 1e-5).sqrt();
            xin.iter_mut().for_each(|v| *v = (*v as f64 * inv) as f32);
        }
        let want_gu = f64s(&matmul_ref(&wgu, &xin, 1).unwrap());
        check_close_rtol(&f64s(&g), &want_gu, 1e-4).unwrap_or_else(|e| panic!("{what}: gate/up: {e}"));
        let glu: Vec<f32> = (0..f).map(|i| (act.apply(g[i] as f64) * g[f + i] as f64) as f32).collect();
        let deq = check_q8(&glu, &eq, &es, 1e-5);
        let want = f64s(&matmul_ref(&wd, &deq, 1).unwrap());
        check_close_rtol(&f64s(&read_f32(ctx, &y, n_out)), &want, 1e-5).unwrap_or_else(|e| panic!("{what}: down: {e}"));
    }
}

/// The values int8 activations stand for (`code * d` per block of 32).
fn check_q8_raw(q: &[i8], s: &[f32]) -> Vec<f32> {
    q.iter().enumerate().map(|(i, &c)| c as f32 * s[(i / 32) * 4]).collect()
}

fn packed(rng: &mut Rng, rows: usize, cols: usize) -> PackedWeights {
    random_ggml(rng, GgmlType::Q4_0, rows, cols)
}

/// What an epilogue cannot do is a typed error, as is a consumer that disagrees with its
/// activations about the deferred norm.
#[test]
fn epilogue_misuse_is_a_typed_error() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(73);
    let w = QuantMatrix::upload(&ctx, "w", &packed(&mut rng, 64, 64)).unwrap();
    let x = ctx.alloc(4 * 64 * 2, BufferKind::Storage).unwrap();
    let y = ctx.alloc(4 * 64 * 2, BufferKind::Storage).unwrap();
    let nw = ctx.alloc(4 * 64, BufferKind::Storage).unwrap();
    let xa = Q8Activations::new(&ctx, &Binding::whole(&x), 2, 64).unwrap();
    let deferred = Q8Activations::written_by_producer(&ctx, 64, Some(1e-5)).unwrap();
    let plain = Q8Activations::written_by_producer(&ctx, 64, None).unwrap();
    let out = GemvOutput::Single(Binding::whole(&y));
    let base = QuantGemvQ8::new(WeightKind::of(w.format), &env, 1);
    let ep = QuantGemvQ8 { epilogue: Q8Epilogue::Quantize { norm: true, gemma: false }, ..base };
    let config = |r: Result<Q8GemvPlan, QuantError>, what: &str| match r {
        Err(QuantError::Config { .. } | QuantError::Shape { .. }) => {}
        other => panic!("{what}: {other:?}"),
    };
    // An epilogue config through `new`, and a target with a config that has none.
    config(Q8GemvPlan::new(&ctx, &ep, &w, &xa, &out), "epilogue without a target");
    config(Q8GemvPlan::with_epilogue(&ctx, &base, &w, &xa, &out, &deferred, Some(&Binding::whole(&nw))), "target without an epilogue");
    // Two activation rows; rows per workgroup not dividing 32; a norm into non-deferred scratch.
    config(Q8GemvPlan::with_epilogue(&ctx, &QuantGemvQ8 { activation_rows: 2, ..ep }, &w, &xa, &out, &deferred, Some(&Binding::whole(&nw))), "two rows");
    config(
        Q8GemvPlan::with_epilogue(&ctx, &QuantGemvQ8 { rows_per_workgroup: 3, ..ep }, &w, &xa, &out, &deferred, Some(&Binding::whole(&nw))),
        "3 rows per workgroup",
    );
    config(Q8GemvPlan::with_epilogue(&ctx, &ep, &w, &xa, &out, &plain, Some(&Binding::whole(&nw))), "norm into final activations");
    // Fewer invocations than quantize a block together.
    let narrow = QuantGemvQ8 { threads: Q8Epilogue::QUANT_LANES / 2, subgroups: false, rows_per_workgroup: 1, ..ep };
    match Q8GemvPlan::with_epilogue(&ctx, &narrow, &w, &xa, &out, &deferred, Some(&Binding::whole(&nw))) {
        Err(QuantError::Config { reason, .. }) => assert!(reason.contains("invocations"), "{reason}"),
        other => panic!("4 invocations: {other:?}"),
    }
    config(Q8GemvPlan::with_epilogue(&ctx, &ep, &w, &xa, &out, &deferred, None), "norm without its weight");
    // The GLU needs a target of half the rows.
    let glu = QuantGemvQ8 { epilogue: Q8Epilogue::Glu { act: ActKind::Silu }, ..base };
    config(Q8GemvPlan::with_epilogue(&ctx, &glu, &w, &xa, &out, &plain, None), "GLU into a full-width target");
    // Workgroup-local GLU blocks: rows per workgroup a multiple of 64 that divides the rows.
    let half = Q8Activations::written_by_producer(&ctx, 32, None).unwrap();
    let local = QuantGemvQ8 { epilogue: Q8Epilogue::GluLocal { act: ActKind::Silu }, threads: 64, ..base };
    assert!(Q8GemvPlan::with_epilogue(&ctx, &QuantGemvQ8 { rows_per_workgroup: 64, ..local }, &w, &plain_row(&ctx, &x), &out, &half, None).is_ok());
    for r in [32, 128] {
        match Q8GemvPlan::with_epilogue(&ctx, &QuantGemvQ8 { rows_per_workgroup: r, threads: 128, ..local }, &w, &plain_row(&ctx, &x), &out, &half, None) {
            Err(QuantError::Config { reason, .. }) => assert!(reason.contains("multiple of 64"), "{reason}"),
            other => panic!("local GLU with {r} rows per workgroup over 64 rows: {other:?}"),
        }
    }
    // A consumer must apply 1 / rms exactly when its activations defer it.
    config(Q8GemvPlan::new(&ctx, &base, &w, &deferred, &out), "deferred activations without rms_scale");
    config(Q8GemvPlan::new(&ctx, &QuantGemvQ8 { rms_scale: true, ..base }, &w, &plain, &out), "rms_scale on final activations");
    // The workgroup reduction of a consumer holds its rows' sums and the sum of squares: a
    // workgroup of exactly as many invocations as rows has none left for the latter (it read
    // an unset 1 / rms, 0, before the plan counted it).
    let full = QuantGemvQ8 { rms_scale: true, rows_per_workgroup: 32, threads: 32, subgroups: false, ..base };
    match Q8GemvPlan::new(&ctx, &full, &w, &deferred, &out) {
        Err(QuantError::Config { reason, .. }) => assert!(reason.contains("33 sums"), "{reason}"),
        other => panic!("32 rows over 32 invocations with rms_scale: {other:?}"),
    }
    assert!(Q8GemvPlan::new(&ctx, &QuantGemvQ8 { threads: 64, ..full }, &w, &deferred, &out).is_ok());
}

/// One activation row of `x`, quantized (the misuse test's other activations hold two).
fn plain_row(ctx: &GpuContext, x: &std::sync::Arc<numr::gpu::GpuBuffer>) -> Q8Activations {
    Q8Activations::new(ctx, &Binding::whole(x), 1, 64).unwrap()
}

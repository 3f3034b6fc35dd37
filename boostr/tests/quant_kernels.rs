//! GPU quantized GEMV / GEMM / fused kernels against the CPU reference (`formats::matmul_ref`),
//! plus naga validation of every generated variant.
//!
//! Tolerances (relative to max(|want|, rms(want)), see `numr::testing::check_close_rtol`):
//! - f32 math: 1e-4. The GPU sums in f32 in a different order than the f64 reference, and the
//!   affine decode (`a * dot(q, x) + b * sum(x)`) reassociates the products; over K = 512..2048
//!   the f32 rounding stays well under 1e-4 of the output scale.
//! - f16 math and the cooperative-matrix GEMM (f16 inputs, f32 accumulation): 1e-2, the
//!   workspace's f16 tolerance (inputs rounded to 11 significant bits).

#[path = "formats_util.rs"]
mod util;

use std::sync::Arc;

use boostr::formats::{AwqTensors, GgmlType, GptqTensors, GptqZeroOffset, PackedWeights, matmul_ref};
use boostr::quant::upload::concat_rows;
use boostr::quant::{GemmPlan, GemvIo, GemvOutput, GemvPlan, Prologue, QuantError, QuantGemm, QuantGemv, QuantMatrix, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, validate_wgsl};
use util::{Rng, random_ggml, rmsnorm_cpu, small_f16};

const RTOL_F32: f64 = 1e-4;
const RTOL_F16: f64 = 1e-2;

/// A random AWQ (`gptq = false`) or GPTQ weight of `n` outputs and `k` inputs.
fn random_int4(rng: &mut Rng, gptq: bool, n: usize, k: usize, group: usize) -> PackedWeights {
    let qweight = rng.bytes(k * n / 2);
    let qzeros = rng.bytes(k / group * n / 2);
    let scales: Vec<u8> = (0..k / group * n).flat_map(|_| small_f16(rng, 0.002, 0.02)).collect();
    if gptq {
        GptqTensors {
            qweight: &qweight,
            qzeros: &qzeros,
            scales: &scales,
            g_idx: None,
            in_features: k,
            out_features: n,
            group_size: group,
            zero_offset: GptqZeroOffset::V1PlusOne,
        }
        .repack()
        .unwrap()
    } else {
        AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: k, out_features: n, group_size: group }.repack().unwrap()
    }
}

/// Every format with a weight of `rows x cols` (int4 with several group sizes).
fn all_weights(rng: &mut Rng, rows: usize, cols: usize) -> Vec<(String, PackedWeights)> {
    let mut v: Vec<(String, PackedWeights)> = GgmlType::SUPPORTED.iter().map(|&t| (t.name().to_string(), random_ggml(rng, t, rows, cols))).collect();
    for (gptq, g) in [(false, 32), (false, 64), (false, 128), (true, 128)] {
        // int4 needs N % 8 == 0: round up (the GEMV test then uses 3 rows per workgroup).
        v.push((format!("{}-g{g}", if gptq { "GPTQ" } else { "AWQ" }), random_int4(rng, gptq, rows.div_ceil(8) * 8, cols, g)));
    }
    v
}

fn upload_f32(ctx: &GpuContext, v: &[f32]) -> Arc<GpuBuffer> {
    ctx.upload(bytemuck::cast_slice(v)).unwrap()
}

fn read_f32(ctx: &GpuContext, b: &Arc<GpuBuffer>, n: usize) -> Vec<f64> {
    let bytes = ctx.read_bytes(b, 0, 4 * n as u64).unwrap();
    bytemuck::cast_slice::<u8, f32>(&bytes).iter().map(|&v| v as f64).collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn gemv_gpu(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, x: &[f32], m: usize) -> Vec<f64> {
    let xb = upload_f32(ctx, x);
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage).unwrap();
    let io = GemvIo::new(Binding::whole(&xb), Binding::whole(&y));
    let plan = GemvPlan::new(ctx, cfg, w, &io).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::decode(0)).unwrap();
    rec.submit().unwrap();
    read_f32(ctx, &y, m * w.rows)
}

fn random_x(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(-1.0, 1.0)).collect()
}

#[test]
fn every_variant_validates_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        for cfg in QuantGemv::all_for(&env) {
            let src = cfg.source(&env);
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
        for cfg in QuantGemm::all_for(&env) {
            let src = cfg.source(&env).unwrap();
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
    }
    assert!(n > 500, "{n} variants");
}

fn gemv_matches_reference_for_every_format(ctx: &GpuContext) {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(7);
    // 37 rows: not a multiple of the rows per workgroup; K = 512: two K-quant super-blocks.
    let (rows, cols) = (37, 512);
    for (name, p) in all_weights(&mut rng, rows, cols) {
        let w = QuantMatrix::upload(ctx, &name, &p).unwrap();
        let kind = WeightKind::of(p.format());
        let mut cases = vec![(1, false), (3, false), (8, false)];
        if env.f16 && kind != WeightKind::Ggml(GgmlType::F32) && kind != WeightKind::Ggml(GgmlType::F16) && kind != WeightKind::Ggml(GgmlType::BF16) {
            cases.push((2, true));
        }
        for (m, f16_math) in cases {
            let x = random_x(&mut rng, m * cols);
            let want = f64s(&matmul_ref(&p, &x, m).unwrap());
            let mut cfg = QuantGemv { f16_math, unchecked: m == 3, ..QuantGemv::new(kind, &env, m as u32) };
            if kind == WeightKind::Int4 {
                cfg.rows_per_workgroup = 3;
            }
            let got = gemv_gpu(ctx, &cfg, &w, &x, m);
            let tol = if f16_math { RTOL_F16 } else { RTOL_F32 };
            check_close_rtol(&got, &want, tol).unwrap_or_else(|e| panic!("{name} m={m} f16={f16_math}: {e}"));
        }
    }
}

fn gemv_every_activation_count_and_both_reductions(ctx: &GpuContext) {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(8);
    let (rows, cols) = (45, 1024);
    let p = random_ggml(&mut rng, GgmlType::Q4_K, rows, cols);
    let w = QuantMatrix::upload(ctx, "q4k", &p).unwrap();
    for m in 1..=8usize {
        let x = random_x(&mut rng, m * cols);
        let want = f64s(&matmul_ref(&p, &x, m).unwrap());
        for subgroups in [false, env.subgroups] {
            let cfg = QuantGemv {
                subgroups,
                rows_per_workgroup: 1 + (m as u32 % 4),
                threads: 64,
                ..QuantGemv::new(WeightKind::Ggml(GgmlType::Q4_K), &env, m as u32)
            };
            let got = gemv_gpu(ctx, &cfg, &w, &x, m);
            check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("m={m} subgroups={subgroups}: {e}"));
        }
    }
}

fn fused_rmsnorm_gemv_matches_unfused(ctx: &GpuContext) {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(9);
    let (rows, cols) = (21, 1024);
    for ty in [GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::F16] {
        let p = random_ggml(&mut rng, ty, rows, cols);
        let w = QuantMatrix::upload(ctx, "w", &p).unwrap();
        // stage_k 4096 holds the row; stage_k 0 and 512 take the two-phase on-the-fly path.
        for (m, gemma, stage_k) in [(1usize, false, 4096u32), (2, true, 0), (3, false, 512)] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.f32_in(-3.0, 3.0)).collect();
            let nw: Vec<f32> = (0..cols).map(|_| rng.f32_in(0.5, 1.5)).collect();
            let eps = 1e-5;
            let want = f64s(&matmul_ref(&p, &rmsnorm_cpu(&x, &nw, m, eps, gemma), m).unwrap());
            let cfg = QuantGemv { prologue: Prologue::RmsNorm { gemma, stage_k }, ..QuantGemv::new(WeightKind::of(p.format()), &env, m as u32) };
            let (xb, nb) = (upload_f32(ctx, &x), upload_f32(ctx, &nw));
            let y = ctx.alloc(4 * (m * rows) as u64, BufferKind::Storage).unwrap();
            let io = GemvIo::new(Binding::whole(&xb), Binding::whole(&y)).with_rms_norm(Binding::whole(&nb), eps);
            let plan = GemvPlan::new(ctx, &cfg, &w, &io).unwrap();
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &StepValues::decode(0)).unwrap();
            rec.submit().unwrap();
            let got = read_f32(ctx, &y, m * rows);
            check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} m={m} gemma={gemma} stage={stage_k}: {e}"));
        }
    }
}

fn fused_glu_and_residual_gemv_match_unfused(ctx: &GpuContext) {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(11);
    let (rows, cols) = (21, 1024);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::F16] {
        let p = random_ggml(&mut rng, ty, rows, cols);
        let w = QuantMatrix::upload(ctx, "w", &p).unwrap();
        for act in [boostr::act::ActKind::Silu, boostr::act::ActKind::GeluTanh] {
            let gate_up: Vec<f32> = (0..2 * cols).map(|_| rng.f32_in(-3.0, 3.0)).collect();
            let glu: Vec<f32> = (0..cols).map(|i| (act.apply(gate_up[i] as f64) * gate_up[cols + i] as f64) as f32).collect();
            let y0: Vec<f32> = (0..rows).map(|_| rng.f32_in(-1.0, 1.0)).collect();
            let prod = matmul_ref(&p, &glu, 1).unwrap();
            let want: Vec<f64> = prod.iter().zip(&y0).map(|(a, b)| *a as f64 + *b as f64).collect();
            for unchecked in [false, true] {
                let cfg = QuantGemv { prologue: Prologue::Glu { act }, accumulate: true, unchecked, ..QuantGemv::new(WeightKind::of(p.format()), &env, 1) };
                let (xb, y) = (upload_f32(ctx, &gate_up), upload_f32(ctx, &y0));
                let plan = GemvPlan::new(ctx, &cfg, &w, &GemvIo::new(Binding::whole(&xb), Binding::whole(&y))).unwrap();
                let mut rec = ctx.recorder();
                plan.record(&mut rec, &StepValues::decode(0)).unwrap();
                rec.submit().unwrap();
                check_close_rtol(&read_f32(ctx, &y, rows), &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} {act:?}: {e}"));
            }
            // The packed [gate | up] row must hold 2 K activations.
            let short = upload_f32(ctx, &gate_up[..cols]);
            let y = upload_f32(ctx, &y0);
            let cfg = QuantGemv { prologue: Prologue::Glu { act }, ..QuantGemv::new(WeightKind::of(p.format()), &env, 1) };
            assert!(GemvPlan::new(ctx, &cfg, &w, &GemvIo::new(Binding::whole(&short), Binding::whole(&y))).is_err());
        }
        // The residual add alone.
        let x = random_x(&mut rng, cols);
        let y0: Vec<f32> = (0..rows).map(|_| rng.f32_in(-1.0, 1.0)).collect();
        let want: Vec<f64> = matmul_ref(&p, &x, 1).unwrap().iter().zip(&y0).map(|(a, b)| *a as f64 + *b as f64).collect();
        let cfg = QuantGemv { accumulate: true, ..QuantGemv::new(WeightKind::of(p.format()), &env, 1) };
        let (xb, y) = (upload_f32(ctx, &x), upload_f32(ctx, &y0));
        let plan = GemvPlan::new(ctx, &cfg, &w, &GemvIo::new(Binding::whole(&xb), Binding::whole(&y))).unwrap();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::decode(0)).unwrap();
        rec.submit().unwrap();
        check_close_rtol(&read_f32(ctx, &y, rows), &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} accumulate: {e}"));
    }
}

fn fused_qkv_matches_separate_projections(ctx: &GpuContext) {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(10);
    let cols = 512;
    let (nq, nk, nv) = (40, 16, 16);
    for kind in ["AWQ", "Q4_K", "Q8_0"] {
        let make = |rng: &mut Rng, n: usize| match kind {
            "AWQ" => random_int4(rng, false, n, cols, 128),
            "Q4_K" => random_ggml(rng, GgmlType::Q4_K, n, cols),
            _ => random_ggml(rng, GgmlType::Q8_0, n, cols),
        };
        let (q, k, v) = (make(&mut rng, nq), make(&mut rng, nk), make(&mut rng, nv));
        let qkv = concat_rows(&[&q, &k, &v]).unwrap();
        let w = QuantMatrix::upload(ctx, "qkv", &qkv).unwrap();
        for m in [1usize, 4] {
            let x = random_x(&mut rng, m * cols);
            let cfg = QuantGemv { split_qkv: true, ..QuantGemv::new(WeightKind::of(qkv.format()), &env, m as u32) };
            assert!(cfg.source(&env).bindings.len() <= 8);
            let xb = upload_f32(ctx, &x);
            let ys: Vec<_> = [nq, nk, nv].iter().map(|&n| ctx.alloc(4 * (m * n) as u64, BufferKind::Storage).unwrap()).collect();
            let output = GemvOutput::Qkv { q: Binding::whole(&ys[0]), k: Binding::whole(&ys[1]), v: Binding::whole(&ys[2]), rows: [nq, nk, nv] };
            let io = GemvIo { x: Binding::whole(&xb), norm_weight: None, eps: 0.0, output };
            let plan = GemvPlan::new(ctx, &cfg, &w, &io).unwrap();
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &StepValues::decode(0)).unwrap();
            assert_eq!(rec.dispatch_count(), 1);
            rec.submit().unwrap();
            for (i, (pw, n)) in [(&q, nq), (&k, nk), (&v, nv)].into_iter().enumerate() {
                let want = f64s(&matmul_ref(pw, &x, m).unwrap());
                // The unfused composition on the GPU: a separate GEMV of this projection.
                let sep = gemv_gpu(ctx, &QuantGemv::new(WeightKind::of(pw.format()), &env, m as u32), &QuantMatrix::upload(ctx, "sep", pw).unwrap(), &x, m);
                let got = read_f32(ctx, &ys[i], m * n);
                check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("{kind} m={m} output {i}: {e}"));
                check_close_rtol(&got, &sep, RTOL_F32).unwrap_or_else(|e| panic!("{kind} m={m} output {i} vs separate: {e}"));
            }
        }
    }
}

fn tensor_over_the_binding_limit_is_split_by_rows(ctx: &GpuContext) {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(11);
    let (rows, cols) = (50, 512);
    for ty in [GgmlType::Q4_0, GgmlType::Q6_K] {
        let p = random_ggml(&mut rng, ty, rows, cols);
        // A 4 KiB "binding limit": several parts.
        let w = QuantMatrix::upload_with_limit(ctx, "token_embd.weight", &p, 4096).unwrap();
        assert!(w.parts.len() > 3, "{} parts", w.parts.len());
        assert!(w.parts.iter().all(|part| part.sections.words as u64 * 4 <= 4096));
        assert_eq!(w.parts.iter().map(|part| part.rows).sum::<usize>(), rows);
        let kind = WeightKind::of(p.format());
        for m in [1usize, 5] {
            let x = random_x(&mut rng, m * cols);
            let want = f64s(&matmul_ref(&p, &x, m).unwrap());
            let got = gemv_gpu(ctx, &QuantGemv::new(kind, &env, m as u32), &w, &x, m);
            check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} gemv m={m}: {e}"));
        }
        let m = 70;
        let x = random_x(&mut rng, m * cols);
        let want = f64s(&matmul_ref(&p, &x, m).unwrap());
        let got = gemm_gpu(ctx, &QuantGemm { kind, coopmat: false, unchecked: false, x_f16: false }, &w, &x, m);
        check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} gemm: {e}"));
    }
    // One row that cannot fit is a typed error naming the tensor.
    let p = random_ggml(&mut rng, GgmlType::Q8_0, 2, 4096);
    match QuantMatrix::upload_with_limit(ctx, "output.weight", &p, 1024) {
        Err(QuantError::RowTooLarge { name, .. }) => assert_eq!(name, "output.weight"),
        other => panic!("expected RowTooLarge, got {other:?}"),
    }
}

fn gemm_gpu(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, x: &[f32], m: usize) -> Vec<f64> {
    let xb = upload_f32(ctx, x);
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage).unwrap();
    let plan = GemmPlan::new(ctx, cfg, w, &Binding::whole(&xb), &Binding::whole(&y), m).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
    rec.submit().unwrap();
    read_f32(ctx, &y, m * w.rows)
}

fn gemm_matches_reference_for_every_format(ctx: &GpuContext) {
    let coop = QuantGemm::coopmat_available(ctx);
    let mut rng = Rng(12);
    // M = 70 and N = 100: neither is a multiple of the 64x64 tile.
    let (rows, cols, m) = (100, 512, 70);
    for (name, p) in all_weights(&mut rng, rows, cols) {
        let w = QuantMatrix::upload(ctx, &name, &p).unwrap();
        let kind = WeightKind::of(p.format());
        let x = random_x(&mut rng, m * cols);
        let want = f64s(&matmul_ref(&p, &x, m).unwrap());
        for coopmat in [false, true] {
            if coopmat && !coop {
                continue;
            }
            let got = gemm_gpu(ctx, &QuantGemm { kind, coopmat, unchecked: coopmat, x_f16: false }, &w, &x, m);
            let tol = if coopmat { RTOL_F16 } else { RTOL_F32 };
            check_close_rtol(&got, &want, tol).unwrap_or_else(|e| panic!("{name} coopmat={coopmat}: {e}"));
        }
    }
    if !coop {
        numr::testing::skip_path(ctx, "the cooperative-matrix GEMM beside the tiled one", "no cooperative matrices");
    }
}

numr::test_gpu_profiles!(
    gemv_matches_reference_for_every_format,
    gemv_every_activation_count_and_both_reductions,
    fused_rmsnorm_gemv_matches_unfused,
    fused_glu_and_residual_gemv_match_unfused,
    fused_qkv_matches_separate_projections,
    tensor_over_the_binding_limit_is_split_by_rows,
    gemm_matches_reference_for_every_format
);

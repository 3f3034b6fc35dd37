//! The fused kernels of the integer-dot path: RMSNorm + int8 quantization in one dispatch
//! (`RmsNormQuantizeQ8`), and the Q/K/V projection in one integer-dot GEMV with three outputs
//! (`QuantGemvQ8 { split_qkv }`), each against the unfused composition and the CPU.
//!
//! Tolerances: the fused norm's quantization is checked block by block against the CPU's
//! normalised values (the GPU's f32 normalisation may differ by a few ulps, so 1e-5 of the
//! block's max is allowed on top of `d / 2`); the GEMV on top against `matmul_ref` of the CPU's
//! normalised activations at 2e-2 (the int8 rounding, as in `quant_gemv_q8.rs`); the fused QKV
//! against separate integer-dot GEMVs on the same int8 activations at 1e-5. The GLU quantizer
//! (`GluQuantizeQ8`) is checked like the fused norm, and the accumulating GEMV on top against
//! `y0 + matmul_ref` of the GPU's own dequantized activations at 1e-5.

#[path = "formats_util.rs"]
mod util;

use boostr::act::ActKind;
use boostr::formats::{GgmlType, matmul_ref};
use boostr::quant::upload::concat_rows;
use boostr::quant::{GemvOutput, GluQuantizeQ8, Q8Activations, Q8GemvPlan, QuantGemvQ8, QuantMatrix, RmsNormQuantizeQ8, WeightKind};
use numr::gpu::{Binding, BufferKind, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, check_q8, random_ggml, rmsnorm_cpu};

/// Records the quantizer and the GEMV (two dispatches, one submit) for `m` rows of `k`, and
/// returns the int8 activations (`q`, `xs` words) the GEMV read.
fn quantize_then_gemv(ctx: &numr::gpu::GpuContext, xa: &Q8Activations, plan: &Q8GemvPlan, m: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut rec = ctx.recorder();
    let step = StepValues::chunk(0, m as u32);
    xa.record(&mut rec, &step).unwrap();
    plan.record(&mut rec, &step).unwrap();
    assert_eq!(rec.dispatch_count(), 2);
    rec.submit().unwrap();
    let nb = m * k / 32;
    let q = ctx.read_bytes(xa.xq(), 0, (nb * 32) as u64).unwrap().into_iter().map(|b| b as i8).collect();
    (q, bytemuck::pod_collect_to_vec(&ctx.read_bytes(xa.xs(), 0, (nb * 16) as u64).unwrap()))
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn fused_q8_variants_validate_with_naga() {
    for env in KernelEnv::all_for_validation() {
        for gemma in [false, true] {
            let src = RmsNormQuantizeQ8 { gemma }.source(&env);
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
        }
        for act in [ActKind::Silu, ActKind::GeluTanh] {
            let src = GluQuantizeQ8 { act }.source(&env);
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
        }
    }
}

/// The down projection of a decode step on the integer-dot path: GLU + quantize in one
/// dispatch, then the GEMV adding into the residual stream, for one and two activation rows
/// and both subgroup modes.
#[test]
fn glu_quantize_and_accumulating_gemv_match_cpu() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(47);
    let (rows, k) = (37usize, 1024usize);
    for (ty, act, m) in [(GgmlType::Q4_0, ActKind::Silu, 1usize), (GgmlType::Q6_K, ActKind::GeluTanh, 2), (GgmlType::Q4_1, ActKind::Silu, 2)] {
        let gate_up: Vec<f32> = (0..m * 2 * k).map(|_| rng.f32_in(-3.0, 3.0)).collect();
        let glu: Vec<f32> =
            (0..m * k).map(|i| (i / k, i % k)).map(|(r, j)| (act.apply(gate_up[r * 2 * k + j] as f64) * gate_up[r * 2 * k + k + j] as f64) as f32).collect();
        let p = random_ggml(&mut rng, ty, rows, k);
        let w = QuantMatrix::upload(&ctx, "down", &p).unwrap();
        let gub = ctx.upload(bytemuck::cast_slice(&gate_up)).unwrap();
        let xa = Q8Activations::with_glu(&ctx, &Binding::whole(&gub), act, m, k).unwrap();
        let base = QuantGemvQ8 { accumulate: true, ..QuantGemvQ8::new(WeightKind::Ggml(ty), &env, m as u32) };
        for cfg in [base, QuantGemvQ8 { subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base }] {
            let y0: Vec<f32> = (0..m * rows).map(|_| rng.f32_in(-1.0, 1.0)).collect();
            let y = ctx.upload(bytemuck::cast_slice(&y0)).unwrap();
            let plan = Q8GemvPlan::new(&ctx, &cfg, &w, &xa, &GemvOutput::Single(Binding::whole(&y))).unwrap();
            let (q, s) = quantize_then_gemv(&ctx, &xa, &plan, m, k);
            let deq = check_q8(&glu, &q, &s, 1e-5);
            let got: Vec<f64> =
                bytemuck::pod_collect_to_vec::<u8, f32>(&ctx.read_bytes(&y, 0, (4 * m * rows) as u64).unwrap()).into_iter().map(|v| v as f64).collect();
            let want: Vec<f64> = matmul_ref(&p, &deq, m).unwrap().iter().zip(&y0).map(|(a, b)| *a as f64 + *b as f64).collect();
            check_close_rtol(&got, &want, 1e-5).unwrap_or_else(|e| panic!("{} {act:?} m={m} {cfg:?}: {e}", ty.name()));
        }
        // The packed rows must hold 2 K values each; accumulate with split_qkv is a typed error.
        let short = ctx.upload(bytemuck::cast_slice(&gate_up[..m * k])).unwrap();
        assert!(Q8Activations::with_glu(&ctx, &Binding::whole(&short), act, m, k).is_err());
        let y = Binding::whole(&ctx.alloc((4 * m * rows) as u64, BufferKind::Storage).unwrap());
        let bad = QuantGemvQ8 { split_qkv: true, ..base };
        assert!(Q8GemvPlan::new_qkv(&ctx, &bad, &w, &xa, [&y, &y, &y], [rows - 2, 1, 1]).is_err());
    }
}

/// RMSNorm + quantize in one dispatch, then the integer-dot GEMV: K = 544 (17 blocks, not a
/// multiple of the 256 invocations' stride) and 2048, one and three activation rows, both norm
/// forms.
#[test]
fn rmsnorm_quantize_matches_norm_then_quantize() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(41);
    for (k, m, gemma) in [(544usize, 1usize, false), (2048, 3, true), (2048, 1, false)] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.f32_in(-2.0, 2.0)).collect();
        let nw: Vec<f32> = (0..k).map(|_| rng.f32_in(0.5, 1.5)).collect();
        let (xb, nwb) = (ctx.upload(bytemuck::cast_slice(&x)).unwrap(), ctx.upload(bytemuck::cast_slice(&nw)).unwrap());
        let p = random_ggml(&mut rng, if k % 256 == 0 { GgmlType::Q4_K } else { GgmlType::Q4_0 }, 24, k);
        let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
        let xa = Q8Activations::with_rms_norm(&ctx, &Binding::whole(&xb), &Binding::whole(&nwb), m, k, 1e-5, gemma).unwrap();
        let y = ctx.alloc((4 * m * 24) as u64, BufferKind::Storage).unwrap();
        let plan = Q8GemvPlan::new(&ctx, &QuantGemvQ8::new(w.kind(), &env, m as u32), &w, &xa, &GemvOutput::Single(Binding::whole(&y))).unwrap();
        let (q, s) = quantize_then_gemv(&ctx, &xa, &plan, m, k);
        let normed = rmsnorm_cpu(&x, &nw, m, 1e-5, gemma);
        check_q8(&normed, &q, &s, 1e-5);
        let got: Vec<f64> =
            bytemuck::pod_collect_to_vec::<u8, f32>(&ctx.read_bytes(&y, 0, (4 * m * 24) as u64).unwrap()).into_iter().map(|v| v as f64).collect();
        let want = f64s(&matmul_ref(&p, &normed, m).unwrap());
        check_close_rtol(&got, &want, 2e-2).unwrap_or_else(|e| panic!("k={k} m={m} gemma={gemma}: {e}"));
    }
}

/// AWQ int4 weights (`rows` a multiple of 8) with groups of `g`.
fn random_awq(rng: &mut Rng, rows: usize, cols: usize, g: usize) -> boostr::formats::PackedWeights {
    let (qweight, qzeros) = (rng.bytes(cols * rows / 2), rng.bytes(cols / g * rows / 2));
    let scales: Vec<u8> = (0..cols / g * rows).flat_map(|_| util::small_f16(rng, 0.002, 0.02)).collect();
    boostr::formats::AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: cols, out_features: rows, group_size: g }.repack().unwrap()
}

/// Q/K/V in one integer-dot dispatch (three outputs, at most 8 storage bindings) against three
/// separate integer-dot GEMVs on the same int8 activations, for two legacy formats, a K-quant
/// and int4 with groups of 32, 64 and 128, in both reduction modes.
#[test]
fn fused_qkv_q8_matches_separate_gemvs() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(43);
    let cols = 512;
    let (nq, nk, nv) = (40, 16, 16);
    for ty in ["Q4_0", "Q6_K", "Q8_0", "int4-g32", "int4-g64", "int4-g128"] {
        let make = |rng: &mut Rng, n: usize| match ty {
            "Q4_0" => random_ggml(rng, GgmlType::Q4_0, n, cols),
            "Q6_K" => random_ggml(rng, GgmlType::Q6_K, n, cols),
            "Q8_0" => random_ggml(rng, GgmlType::Q8_0, n, cols),
            g => random_awq(rng, n, cols, g.trim_start_matches("int4-g").parse().unwrap()),
        };
        let (q, k, v) = (make(&mut rng, nq), make(&mut rng, nk), make(&mut rng, nv));
        let w = QuantMatrix::upload(&ctx, "qkv", &concat_rows(&[&q, &k, &v]).unwrap()).unwrap();
        let kind = WeightKind::of(q.format());
        for m in [1usize, 3] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.f32_in(-1.0, 1.0)).collect();
            let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
            let xa = Q8Activations::new(&ctx, &Binding::whole(&xb), m, cols).unwrap();
            let step = StepValues::chunk(0, m as u32);
            let base = QuantGemvQ8::new(kind, &env, m as u32);
            for cfg in [QuantGemvQ8 { split_qkv: true, ..base }, QuantGemvQ8 { split_qkv: true, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, ..base }]
            {
                assert!(cfg.source(&env).bindings.len() <= 8);
                let ys: Vec<_> = [nq, nk, nv].iter().map(|&n| ctx.alloc((4 * m * n) as u64, BufferKind::Storage).unwrap()).collect();
                let yb: Vec<Binding> = ys.iter().map(Binding::whole).collect();
                let plan = Q8GemvPlan::new_qkv(&ctx, &cfg, &w, &xa, [&yb[0], &yb[1], &yb[2]], [nq, nk, nv]).unwrap();
                let mut rec = ctx.recorder();
                xa.record(&mut rec, &step).unwrap();
                plan.record(&mut rec, &step).unwrap();
                assert_eq!(rec.dispatch_count(), 2);
                rec.submit().unwrap();
                for (i, (pw, n)) in [(&q, nq), (&k, nk), (&v, nv)].into_iter().enumerate() {
                    let sw = QuantMatrix::upload(&ctx, "sep", pw).unwrap();
                    let sy = ctx.alloc((4 * m * n) as u64, BufferKind::Storage).unwrap();
                    let sep = Q8GemvPlan::new(&ctx, &base, &sw, &xa, &GemvOutput::Single(Binding::whole(&sy))).unwrap();
                    let mut rec = ctx.recorder();
                    sep.record(&mut rec, &step).unwrap();
                    rec.submit().unwrap();
                    let read = |b| -> Vec<f64> {
                        bytemuck::pod_collect_to_vec::<u8, f32>(&ctx.read_bytes(b, 0, (4 * m * n) as u64).unwrap()).into_iter().map(|v| v as f64).collect()
                    };
                    check_close_rtol(&read(&ys[i]), &read(&sy), 1e-5).unwrap_or_else(|e| panic!("{ty} m={m} {cfg:?} output {i}: {e}"));
                    let want = f64s(&matmul_ref(pw, &x, m).unwrap());
                    check_close_rtol(&read(&ys[i]), &want, 2e-2).unwrap_or_else(|e| panic!("{ty} m={m} output {i} vs CPU: {e}"));
                }
            }
        }
        // Mismatched row counts and a missing flag are typed errors.
        let xb = ctx.upload(bytemuck::cast_slice(&vec![0f32; cols])).unwrap();
        let xa = Q8Activations::new(&ctx, &Binding::whole(&xb), 1, cols).unwrap();
        let y = Binding::whole(&ctx.alloc(4 * 72, BufferKind::Storage).unwrap());
        let cfg = QuantGemvQ8::new(kind, &env, 1);
        assert!(Q8GemvPlan::new_qkv(&ctx, &cfg, &w, &xa, [&y, &y, &y], [nq, nk, nv]).is_err());
        assert!(Q8GemvPlan::new_qkv(&ctx, &QuantGemvQ8 { split_qkv: true, ..cfg }, &w, &xa, [&y, &y, &y], [nq, nk, 1]).is_err());
        assert!(Q8GemvPlan::new(&ctx, &QuantGemvQ8 { split_qkv: true, ..cfg }, &w, &xa, &GemvOutput::Single(y.clone())).is_err());
    }
}

//! The integer-dot GEMV (`boostr::quant::gemv_q8`) against the CPU reference, plus naga
//! validation of every generated variant.
//!
//! Tolerances (relative to max(|want|, rms(want)), see `numr::testing::check_close_rtol`):
//! - against `matmul_ref` on the GPU's own int8 activations (read back and dequantized): 1e-4,
//!   the f32 GEMV tolerance (integer products are exact; f32 rounding of the scales and sums).
//! - against `matmul_ref` on the original f32 activations: 2e-2. Rounding the activations to
//!   int8 per 32 moves each by at most max|x| / 254; over K terms the relative error of the sum
//!   is a few 1e-3 (llama.cpp's Q8_1 scheme has the same error).

#[path = "formats_util.rs"]
mod util;

use std::sync::Arc;

use boostr::formats::{AwqTensors, GgmlType, PackedWeights, matmul_ref};
use boostr::quant::GemvOutput;
use boostr::quant::{Q8Activations, Q8GemvPlan, QuantGemvQ8, QuantMatrix, QuantizeQ8, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, check_q8, random_ggml, small_f16};

/// Every quantized format (int4 as AWQ with groups of 32 and 128) at `rows x cols`.
fn quant_weights(rng: &mut Rng, rows: usize, cols: usize) -> Vec<(String, PackedWeights)> {
    let mut v = Vec::new();
    for &ty in GgmlType::SUPPORTED.iter().filter(|&&t| QuantGemvQ8::supports(WeightKind::Ggml(t))) {
        v.push((ty.name().to_string(), random_ggml(rng, ty, rows, cols)));
    }
    for g in [32, 128] {
        let n = rows.div_ceil(8) * 8;
        let (qweight, qzeros) = (rng.bytes(cols * n / 2), rng.bytes(cols / g * n / 2));
        let scales: Vec<u8> = (0..cols / g * n).flat_map(|_| small_f16(rng, 0.002, 0.02)).collect();
        let p = AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: cols, out_features: n, group_size: g }.repack().unwrap();
        v.push((format!("AWQ-g{g}"), p));
    }
    v
}

fn read(ctx: &GpuContext, b: &Arc<GpuBuffer>, bytes: usize) -> Vec<u8> {
    ctx.read_bytes(b, 0, bytes as u64).unwrap()
}

/// Runs quantize + GEMV; returns (y, the GPU's dequantized activations).
fn run(ctx: &GpuContext, cfg: &QuantGemvQ8, w: &QuantMatrix, x: &[f32], m: usize) -> (Vec<f64>, Vec<f32>) {
    let xb = ctx.upload(bytemuck::cast_slice(x)).unwrap();
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage).unwrap();
    let xa = Q8Activations::new(ctx, &Binding::whole(&xb), m, w.cols).unwrap();
    let plan = Q8GemvPlan::new(ctx, cfg, w, &xa, &GemvOutput::Single(Binding::whole(&y))).unwrap();
    let mut rec = ctx.recorder();
    let step = StepValues::chunk(0, m as u32);
    xa.record(&mut rec, &step).unwrap();
    plan.record(&mut rec, &step).unwrap();
    rec.submit().unwrap();
    let nb = m * w.cols / 32;
    let q: Vec<i8> = read(ctx, xa.xq(), nb * 32).into_iter().map(|b| b as i8).collect();
    let s: Vec<f32> = bytemuck::pod_collect_to_vec(&read(ctx, xa.xs(), nb * 16));
    // The quantization is faithful: d = max|x| / 127, |x - d q| <= d / 2, and the half sums match.
    let deq = check_q8(x, &q, &s, 0.0);
    let got: Vec<f64> = bytemuck::pod_collect_to_vec::<u8, f32>(&read(ctx, &y, 4 * m * w.rows)).into_iter().map(|v| v as f64).collect();
    (got, deq)
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn every_q8_variant_validates_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        let src = QuantizeQ8.source(&env);
        validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
        for cfg in QuantGemvQ8::all_for(&env) {
            let src = cfg.source(&env);
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
    }
    assert!(n > 100, "{n} variants");
}

#[test]
fn q8_gemv_matches_reference_for_every_quantized_format() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(11);
    // 37 rows (40 for int4): not a multiple of the rows per workgroup; K = 512: two super-blocks,
    // and with 64 invocations x unroll 2 some steps run past the row end.
    let (rows, cols) = (37, 512);
    for (name, p) in quant_weights(&mut rng, rows, cols) {
        let w = QuantMatrix::upload(&ctx, &name, &p).unwrap();
        let kind = WeightKind::of(p.format());
        // Every format with the defaults; the other variants on the formats with specialised
        // decoders' neighbours (legacy, Q8_0, K-quants, int4) to keep lavapipe time short.
        let all_variants = ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "AWQ-g32"].contains(&name.as_str());
        let cases: &[(usize, u32)] =
            if all_variants { &[(1, 0), (1, 1), (1, 2), (1, 3), (1, 5), (1, 7), (1, 8), (3, 0), (3, 4), (3, 6), (3, 7), (8, 0)] } else { &[(1, 0), (8, 0)] };
        for &(m, variant) in cases {
            let base = QuantGemvQ8::new(kind, &env, m as u32);
            let cfg = match variant {
                0 => base,
                1 => QuantGemvQ8 { unroll: 4, contiguous: true, rows_per_workgroup: 4, threads: 32, unchecked: true, ..base },
                2 => QuantGemvQ8 { subgroups: false, rows_per_workgroup: 3, unroll: 3, ..base },
                // Rows per subgroup: 8 rows over 8 subgroups (on 32-wide subgroups; lavapipe's
                // 8-wide ones take a row each too), and pairs of rows with contiguous chunks.
                3 => QuantGemvQ8 { subgroup_rows: 1, rows_per_workgroup: 8, threads: 256, unroll: 2, ..base },
                4 => QuantGemvQ8 { subgroup_rows: 2, rows_per_workgroup: 6, threads: 64, unroll: 2, contiguous: true, ..base },
                // Prefetching the next step's chunks: with the defaults, and with rows per
                // subgroup, two rows per workgroup and an uneven number of steps.
                5 => QuantGemvQ8 { prefetch: true, ..base },
                // Row groups taken at the grid's stride: 19 groups of two rows over 7 workgroups
                // (the last one short), and with rows per subgroup.
                7 => QuantGemvQ8 { row_groups: 3, rows_per_workgroup: 2, ..base },
                8 => QuantGemvQ8 { row_groups: 2, subgroup_rows: 1, rows_per_workgroup: 4, threads: 128, unchecked: true, ..base },
                _ => QuantGemvQ8 { prefetch: true, subgroup_rows: 1, rows_per_workgroup: 2, threads: 64, unroll: 3, ..base },
            };
            // The row-group variants draw from their own generator (the others' inputs stay those
            // the tolerances were set on).
            let mut own = Rng(1000 + variant as u64);
            let r = if variant >= 7 { &mut own } else { &mut rng };
            let x: Vec<f32> = (0..m * cols).map(|_| r.f32_in(-1.0, 1.0)).collect();
            let (got, deq) = run(&ctx, &cfg, &w, &x, m);
            let want_q = f64s(&matmul_ref(&p, &deq, m).unwrap());
            check_close_rtol(&got, &want_q, 1e-4).unwrap_or_else(|e| panic!("{name} m={m} variant {variant} (int8 x): {e}"));
            let want = f64s(&matmul_ref(&p, &x, m).unwrap());
            check_close_rtol(&got, &want, 2e-2).unwrap_or_else(|e| panic!("{name} m={m} variant {variant} (f32 x): {e}"));
        }
    }
}

/// The per-matrix default pairs rows only for many short rows, and never changes the m > 2 shape.
#[test]
fn per_matrix_defaults() {
    let env = KernelEnv::all_for_validation()[0];
    let kind = WeightKind::Ggml(GgmlType::Q4_0);
    assert_eq!(QuantGemvQ8::for_matrix(kind, &env, 1, 4096, 14336), QuantGemvQ8::new(kind, &env, 1));
    assert_eq!(QuantGemvQ8::for_matrix(kind, &env, 1, 14336, 4096).rows_per_workgroup, 2);
    assert_eq!(QuantGemvQ8::for_matrix(kind, &env, 8, 14336, 4096), QuantGemvQ8::new(kind, &env, 8));
}

//! The residual add and norm over a split GEMM's partial sums ([`NormPlan::with_partials`],
//! [`GemmPlan::with_split_k_partials`]): the kernels validate with naga; on any adapter the
//! fused norm gives the bits of the sum ([`SplitSumPlan`]) followed by the plain residual norm,
//! both for partials given directly and for a split GEMM's (the tiled variant, and the coopmat
//! one where the adapter has it); a step of fewer rows leaves the rest alone; wrong uses are
//! typed errors.

#[path = "formats_util.rs"]
mod util;

use std::sync::Arc;

use boostr::formats::GgmlType;
use boostr::norm::{Norm, NormIo, NormKind, NormPlan};
use boostr::ops_common::{GpuView, OpPlan};
use boostr::quant::{GemmPlan, GemvOutput, QuantError, QuantGemm, QuantMatrix, SplitSumPlan, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, StepValues};
use numr::testing::{test_gpu, validate_wgsl};
use util::{Rng, random_ggml};

fn read_f32(ctx: &GpuContext, b: &Arc<GpuBuffer>, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(b, 0, 4 * n as u64).unwrap())
}

fn view(b: &Arc<GpuBuffer>) -> GpuView {
    GpuView::new(Binding::whole(b), 0)
}

#[test]
fn partial_norms_validate_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        for cfg in Norm::all().into_iter().filter(|c| c.residual) {
            for vec4 in [false, true] {
                let src = cfg.source_partials(&env, vec4);
                validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
                assert!(src.name.contains("_parts"), "{}", src.name);
                n += 1;
            }
        }
    }
    assert!(n >= 8);
}

/// What one step leaves: the residual stream and the norm's output.
struct After {
    residual: Vec<f32>,
    out: Vec<f32>,
}

/// Runs `first` (if any) and `norm` for a step of `rows_now` rows over a fresh residual
/// stream `res0` and an output full of a marker.
fn run(ctx: &GpuContext, first: Option<&numr::gpu::Plan>, norm: &NormPlan, bufs: (&Arc<GpuBuffer>, &Arc<GpuBuffer>), res0: &[f32], rows_now: usize) -> After {
    let (res, out) = bufs;
    ctx.write(res, 0, bytemuck::cast_slice(res0)).unwrap();
    ctx.write(out, 0, bytemuck::cast_slice(&vec![-9.5f32; res0.len()])).unwrap();
    let step = StepValues::chunk(0, rows_now as u32);
    let mut rec = ctx.recorder();
    if let Some(p) = first {
        p.record(&mut rec, &step).unwrap();
    }
    norm.record(&mut rec, &step).unwrap();
    rec.submit().unwrap();
    After { residual: read_f32(ctx, res, res0.len()), out: read_f32(ctx, out, res0.len()) }
}

fn assert_same_bits(a: &After, b: &After, what: &str) {
    for (name, x, y) in [("residual", &a.residual, &b.residual), ("output", &a.out, &b.out)] {
        let differs = x.iter().zip(y).position(|(p, q)| p.to_bits() != q.to_bits());
        assert_eq!(differs, None, "{what}: the {name} differs ({:?})", differs.map(|i| (x[i], y[i])));
    }
}

/// Partials of 7 x 96 in 1, 2, 3 and 8 parts (values of mixed magnitudes, so the order of
/// the adds shows in the bits), RMSNorm and LayerNorm: the fused norm gives the sum then the
/// norm bit for bit, at steps of 7 and 4 rows (rows 4..7 untouched in the latter).
#[test]
fn the_norm_of_partials_is_the_sum_then_the_norm() {
    let Some(ctx) = test_gpu() else { return };
    let (m, n) = (7usize, 96usize);
    let mut rng = Rng(17);
    let res0: Vec<f32> = (0..m * n).map(|_| rng.f32_in(-2.0, 2.0)).collect();
    let w: Vec<f32> = (0..n).map(|_| rng.f32_in(0.5, 1.5)).collect();
    let wb = ctx.upload(bytemuck::cast_slice(&w)).unwrap();
    let (res, out, delta) = (
        ctx.alloc(4 * (m * n) as u64, BufferKind::Storage).unwrap(),
        ctx.alloc(4 * (m * n) as u64, BufferKind::Storage).unwrap(),
        ctx.alloc(4 * (m * n) as u64, BufferKind::Storage).unwrap(),
    );
    for kind in [NormKind::Rms, NormKind::Layer] {
        let cfg = Norm { kind, residual: true, ..Norm::rms() };
        for parts in [1u32, 2, 3, 8] {
            let p: Vec<f32> = (0..parts as usize * m * n).map(|i| rng.f32_in(-1.0, 1.0) * [1.0, 3e-4, 2e3, 0.1][i % 4]).collect();
            let pb = ctx.upload(bytemuck::cast_slice(&p)).unwrap();
            let io = |x: GpuView| NormIo { x, w: view(&wb), b: None, residual: Some(view(&res)), out: Some(view(&out)) };
            let fused = NormPlan::with_partials(&ctx, &cfg, &io(view(&pb)), n, m, 1e-5, parts).unwrap();
            let sum = SplitSumPlan::new(&ctx, &Binding::whole(&pb), &GemvOutput::Single(Binding::whole(&delta)), m, n, parts).unwrap();
            let plain = NormPlan::new(&ctx, &cfg, &io(view(&delta)), n, m, 1e-5).unwrap();
            for rows_now in [7usize, 4] {
                let what = format!("{kind:?}, {parts} parts, a step of {rows_now} rows");
                let got = run(&ctx, None, &fused, (&res, &out), &res0, rows_now);
                let want = run(&ctx, Some(sum.plan()), &plain, (&res, &out), &res0, rows_now);
                assert_same_bits(&got, &want, &what);
                // Rows past the step keep the stream and the marker.
                assert_eq!(got.residual[rows_now * n..], res0[rows_now * n..], "{what}");
                assert!(got.out[rows_now * n..].iter().all(|&v| v == -9.5), "{what}");
                // The rows the step ran are the CPU reference's, within f32 rounding.
                let mut sum_cpu = vec![0f32; m * n];
                for (i, s) in sum_cpu.iter_mut().enumerate() {
                    *s = (1..parts as usize).fold(p[i], |a, z| a + p[z * m * n + i]);
                }
                let mut r = res0.clone();
                let want_out = cfg.reference(&sum_cpu, &w, None, Some(&mut r), n, 1e-5).unwrap();
                for i in 0..rows_now * n {
                    assert_eq!(got.residual[i].to_bits(), r[i].to_bits(), "{what}: residual {i}");
                    assert!((got.out[i] - want_out[i]).abs() <= 1e-4 * (1.0 + want_out[i].abs()), "{what}: output {i}: {} against {}", got.out[i], want_out[i]);
                }
            }
        }
    }
    // Typed errors: no residual, 0 or 9 parts, partials too short for their count.
    let pb = ctx.alloc(4 * (2 * m * n) as u64, BufferKind::Storage).unwrap();
    let io = NormIo { x: view(&pb), w: view(&wb), b: None, residual: Some(view(&res)), out: Some(view(&out)) };
    let plain_io = NormIo { residual: None, ..io.clone() };
    assert!(NormPlan::with_partials(&ctx, &Norm::rms(), &plain_io, n, m, 1e-5, 2).is_err());
    let cfg = Norm { residual: true, ..Norm::rms() };
    for parts in [0, 9, 3] {
        assert!(NormPlan::with_partials(&ctx, &cfg, &io, n, m, 1e-5, parts).is_err(), "{parts} parts");
    }
}

/// A split GEMM's partials (Q4_0 and Q4_K, 3 splits, 150 x 1280 -> 256; the tiled variant, and
/// the coopmat one where the adapter has it) into the fused norm: the bits of the summed GEMM
/// ([`GemmPlan::with_split_k_sum`]) followed by the plain norm, at steps of 150, 40 and 1 rows.
#[test]
fn a_split_gemm_into_the_norm_gives_the_summed_gemms_bits() {
    let Some(ctx) = test_gpu() else { return };
    let (rows, cols, max_m, splits) = (256usize, 1280usize, 150usize, 3u32);
    let mut rng = Rng(23);
    let x: Vec<f32> = (0..max_m * cols).map(|_| rng.f32_in(-1.0, 1.0)).collect();
    let res0: Vec<f32> = (0..max_m * rows).map(|_| rng.f32_in(-2.0, 2.0)).collect();
    let w: Vec<f32> = (0..rows).map(|_| rng.f32_in(0.5, 1.5)).collect();
    let (xb, wb) = (ctx.upload(bytemuck::cast_slice(&x)).unwrap(), ctx.upload(bytemuck::cast_slice(&w)).unwrap());
    let alloc = |elems: usize| ctx.alloc(4 * elems as u64, BufferKind::Storage).unwrap();
    let (parts, delta, res, out) = (alloc(splits as usize * max_m * rows), alloc(max_m * rows), alloc(max_m * rows), alloc(max_m * rows));
    let cfg = Norm { residual: true, ..Norm::rms() };
    let io = |x: &Arc<GpuBuffer>| NormIo { x: view(x), w: view(&wb), b: None, residual: Some(view(&res)), out: Some(view(&out)) };
    let coop = QuantGemm::coopmat_available(&ctx);
    for coopmat in [false, true] {
        if coopmat && !coop {
            numr::testing::skip_path(&ctx, "the coopmat split-K GEMM into the norm of its partials", "no cooperative matrices; the tiled variant was checked");
            continue;
        }
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
            let q = random_ggml(&mut rng, ty, rows, cols);
            let wq = QuantMatrix::upload(&ctx, "w", &q).unwrap();
            let gcfg = QuantGemm { kind: WeightKind::Ggml(ty), coopmat, unchecked: true, x_f16: false };
            let (bx, bp) = (Binding::whole(&xb), Binding::whole(&parts));
            for s in [0, 1, 9] {
                assert!(matches!(GemmPlan::with_split_k_partials(&ctx, &gcfg, &wq, &bx, &bp, max_m, s), Err(QuantError::Config { .. })), "{s} splits");
            }
            let split = GemmPlan::with_split_k_partials(&ctx, &gcfg, &wq, &bx, &bp, max_m, splits).unwrap();
            let fused = NormPlan::with_partials(&ctx, &cfg, &io(&parts), rows, max_m, 1e-5, splits).unwrap();
            let summed = GemmPlan::with_split_k_sum(&ctx, &gcfg, &wq, &bx, &bp, &GemvOutput::Single(Binding::whole(&delta)), max_m, splits).unwrap();
            let plain = NormPlan::new(&ctx, &cfg, &io(&delta), rows, max_m, 1e-5).unwrap();
            for rows_now in [150usize, 40, 1] {
                let what = format!("{ty:?}, coopmat {coopmat}, a step of {rows_now} rows");
                let got = run(&ctx, Some(split.plan()), &fused, (&res, &out), &res0, rows_now);
                let want = run(&ctx, Some(summed.plan()), &plain, (&res, &out), &res0, rows_now);
                assert_same_bits(&got, &want, &what);
                assert_eq!(got.residual[rows_now * rows..], res0[rows_now * rows..], "{what}");
                assert_ne!(got.residual[..rows_now * rows], res0[..rows_now * rows], "{what}: the step added nothing");
            }
        }
    }
}

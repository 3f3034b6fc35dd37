//! The GEMM split over K and summed ([`GemmPlan::with_split_k_sum`], [`SplitSumPlan`]): the
//! sum kernel validates with naga; it adds partials in order on any adapter; on cooperative
//! matrices, the summed GEMM matches the CPU reference in every row band, and a row's result is
//! the same bits whatever the step's size (the property a batched engine relies on); the split
//! counts follow the grid. Wrong uses are typed errors.

#[path = "formats_util.rs"]
mod util;

use boostr::formats::{GgmlType, matmul_ref};
use boostr::quant::split_sum::split_sum_source;
use boostr::quant::{GemmPlan, GemvOutput, QuantError, QuantGemm, QuantMatrix, SplitSumPlan, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, random_ggml};

fn read_f32(ctx: &GpuContext, b: &std::sync::Arc<numr::gpu::GpuBuffer>, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(b, 0, 4 * n as u64).unwrap())
}

#[test]
fn split_sum_validates_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        let src = split_sum_source(&env);
        validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
        n += 1;
    }
    assert!(n > 0);
}

/// Doubling while the 32-row band's grid is under 512 blocks, up to 4 splits of at least 1024
/// inputs: Llama-3-8B's O, Q/K/V and down projections take 4, gate/up none, Llama-3.2-1B's
/// Q/K/V 2 (2048 inputs), SmolLM2's none (576 inputs).
#[test]
fn row_band_splits_follow_the_grid() {
    let cases =
        [((4096, 4096), 4), ((6144, 4096), 4), ((4096, 14336), 4), ((28672, 4096), 1), ((3072, 2048), 2), ((2048, 8192), 4), ((576, 576), 1), ((64, 1024), 1)];
    for ((rows, cols), want) in cases {
        assert_eq!(GemmPlan::row_band_splits(rows, cols), want, "{rows} x {cols}");
    }
}

/// Three partials of 5 x 6 summed into columns 2..8 of rows 10 wide: the steps' rows get
/// `(p0 + p1) + p2` exactly, every other element keeps its value; a step of 3 rows leaves rows
/// 3 and 4 alone. Wrong shapes are typed errors.
#[test]
fn split_sum_adds_the_partials_in_order() {
    let Some(ctx) = test_gpu() else { return };
    let (m, n, splits, stride, offset) = (5usize, 6usize, 3u32, 10usize, 2usize);
    let mut rng = Rng(3);
    let parts: Vec<f32> = (0..splits as usize * m * n).map(|i| rng.f32_in(-1.0, 1.0) * [1.0, 1e-4, 3e3][i % 3]).collect();
    let pb = ctx.upload(bytemuck::cast_slice(&parts)).unwrap();
    for rows_now in [5usize, 3] {
        let y = ctx.upload(bytemuck::cast_slice(&vec![7.5f32; m * stride])).unwrap();
        let out = GemvOutput::Columns { y: Binding::whole(&y), stride, offset };
        let plan = SplitSumPlan::new(&ctx, &Binding::whole(&pb), &out, m, n, splits).unwrap();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::chunk(0, rows_now as u32)).unwrap();
        rec.submit().unwrap();
        let got = read_f32(&ctx, &y, m * stride);
        for r in 0..m {
            for c in 0..stride {
                let want = if r < rows_now && (offset..offset + n).contains(&c) {
                    let i = r * n + c - offset;
                    (parts[i] + parts[m * n + i]) + parts[2 * m * n + i]
                } else {
                    7.5
                };
                assert_eq!(got[r * stride + c].to_bits(), want.to_bits(), "row {r} column {c}, a step of {rows_now}");
            }
        }
    }
    let y = ctx.alloc(4 * (m * n) as u64, BufferKind::Storage).unwrap();
    let single = GemvOutput::Single(Binding::whole(&y));
    let short = Binding { buffer: pb.clone(), offset: 0, size: 4 * (2 * m * n) as u64 };
    assert!(matches!(SplitSumPlan::new(&ctx, &short, &single, m, n, 3), Err(QuantError::BufferTooSmall { .. })));
    for s in [0, 9] {
        assert!(matches!(SplitSumPlan::new(&ctx, &Binding::whole(&pb), &single, m, n, s), Err(QuantError::Shape { .. })), "{s} splits");
    }
    let v = Binding::whole(&y);
    let qkv = GemvOutput::Qkv { q: v.clone(), k: v.clone(), v, rows: [2, 2, 2] };
    assert!(SplitSumPlan::new(&ctx, &Binding::whole(&pb), &qkv, m, n, 3).is_err());
}

/// A plan for 150 rows over a matrix of 200 x 1280 (40 chunks: 3 splits of 16, 16 and 8),
/// Q4_0 and Q4_K, into a plain output and into columns of a wider row, on the tiled variant
/// and (where the adapter has them) on cooperative matrices. Steps of 150, 70, 40, 20, 5 and 1
/// rows run every coopmat band (default, 64, 16 rows): each matches the CPU reference, and its
/// rows are the same bits as the 150-row step's; columns outside the output keep their values.
/// One split runs no sum; 0 or 9 splits are typed errors.
#[test]
fn split_k_sums_are_the_same_bits_in_every_band() {
    let Some(ctx) = test_gpu() else { return };
    let (rows, cols, max_m) = (200usize, 1280usize, 150usize);
    let mut rng = Rng(41);
    let x: Vec<f32> = (0..max_m * cols).map(|_| rng.f32_in(-1.0, 1.0)).collect();
    let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
    let parts = ctx.alloc(4 * (3 * max_m * rows) as u64, BufferKind::Storage).unwrap();
    let bx = Binding::whole(&xb);
    let bp = Binding::whole(&parts);
    let coop = QuantGemm::coopmat_available(&ctx);
    for coopmat in [false, true] {
        if coopmat && !coop {
            numr::testing::skip_path(&ctx, "the coopmat split-K GEMM summed in every row band", "no cooperative matrices; the tiled variant was checked");
            continue;
        }
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
            let p = random_ggml(&mut rng, ty, rows, cols);
            let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
            let cfg = QuantGemm { kind: WeightKind::Ggml(ty), coopmat, unchecked: true, x_f16: false };
            let want_all: Vec<f64> = matmul_ref(&p, &x, max_m).unwrap().iter().map(|&v| v as f64).collect();
            let y = ctx.alloc(4 * (max_m * rows) as u64, BufferKind::Storage).unwrap();
            for s in [0, 9] {
                let out = GemvOutput::Single(Binding::whole(&y));
                assert!(matches!(GemmPlan::with_split_k_sum(&ctx, &cfg, &w, &bx, &bp, &out, max_m, s), Err(QuantError::Config { .. })), "{s} splits");
            }
            for (splits, stride, offset) in [(3, rows, 0), (3, rows + 24, 16), (1, rows, 0)] {
                let y = ctx.alloc(4 * (max_m * stride) as u64, BufferKind::Storage).unwrap();
                let out = if stride == rows { GemvOutput::Single(Binding::whole(&y)) } else { GemvOutput::Columns { y: Binding::whole(&y), stride, offset } };
                let plan = GemmPlan::with_split_k_sum(&ctx, &cfg, &w, &bx, &bp, &out, max_m, splits).unwrap();
                let mut first: Vec<f32> = Vec::new();
                for rows_now in [150usize, 70, 40, 20, 5, 1] {
                    ctx.write(&y, 0, bytemuck::cast_slice(&vec![-3.25f32; max_m * stride])).unwrap();
                    let mut rec = ctx.recorder();
                    plan.record(&mut rec, &StepValues::chunk(0, rows_now as u32)).unwrap();
                    rec.submit().unwrap();
                    let all = read_f32(&ctx, &y, max_m * stride);
                    let what = format!("{ty:?}, coopmat {coopmat}, {splits} splits, stride {stride}, a step of {rows_now} rows");
                    let mut got = Vec::with_capacity(rows_now * rows);
                    for (i, v) in all.iter().enumerate() {
                        let (r, c) = (i / stride, i % stride);
                        if r < rows_now && (offset..offset + rows).contains(&c) {
                            got.push(*v);
                        } else {
                            assert_eq!(*v, -3.25, "{what}: row {r} column {c} is outside the step's outputs");
                        }
                    }
                    let g64: Vec<f64> = got.iter().map(|&v| v as f64).collect();
                    check_close_rtol(&g64, &want_all[..rows_now * rows], if coopmat { 1e-2 } else { 1e-3 }).unwrap_or_else(|e| panic!("{what}: {e}"));
                    if first.is_empty() {
                        first = got;
                    } else {
                        let differs = got.iter().zip(&first).position(|(a, b)| a.to_bits() != b.to_bits());
                        assert_eq!(differs, None, "{what}: an output differs from the 150-row step's");
                    }
                }
            }
        }
    }
}

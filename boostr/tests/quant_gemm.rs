//! The cooperative-matrix GEMM ([`boostr::quant::gemm::CoopTiles`] block shapes) against the CPU
//! reference, naga validation of every candidate shape, and an ignored speed probe
//! (`cargo test --release -p boostr --test quant_gemm -- --ignored --nocapture gemm_speed`)
//! that prints TFLOP/s (2·M·N·K / GPU time per dispatch) at M = 512, N = K = 4096.
//!
//! Tolerance: 1e-2 relative to max(|want|, rms(want)), the workspace's f16 tolerance (inputs
//! rounded to f16, products accumulated in f32).

#[path = "formats_util.rs"]
mod util;

use std::sync::Arc;

use boostr::formats::{AwqTensors, GgmlType, PackedWeights, matmul_ref};
use boostr::quant::gemm::CoopTiles;
use boostr::quant::{GemmPlan, QuantGemm, QuantMatrix, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, random_ggml, small_f16};

const RTOL_F16: f64 = 1e-2;

/// A random weight with modest scales (so f16 staging stays in range).
fn random_weight(rng: &mut Rng, kind: WeightKind, rows: usize, cols: usize) -> PackedWeights {
    let n = rows * cols;
    let ty = match kind {
        WeightKind::Int4 => {
            let g = 128;
            let qweight = rng.bytes(n / 2);
            let qzeros = rng.bytes(cols / g * rows / 2);
            let scales: Vec<u8> = (0..cols / g * rows).flat_map(|_| small_f16(rng, 0.002, 0.02)).collect();
            return AwqTensors { qweight: &qweight, qzeros: &qzeros, scales: &scales, in_features: cols, out_features: rows, group_size: g }.repack().unwrap();
        }
        WeightKind::Ggml(t) => t,
    };
    random_ggml(rng, ty, rows, cols)
}

fn run_gemm(ctx: &GpuContext, cfg: &QuantGemm, tiles: CoopTiles, w: &QuantMatrix, x: &Arc<GpuBuffer>, m: usize) -> Vec<f64> {
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage).unwrap();
    let plan = GemmPlan::with_tiles(ctx, cfg, tiles, w, &Binding::whole(x), &Binding::whole(&y), m).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
    rec.submit().unwrap();
    let bytes = ctx.read_bytes(&y, 0, 4 * (m * w.rows) as u64).unwrap();
    bytemuck::cast_slice::<u8, f32>(&bytes).iter().map(|&v| v as f64).collect()
}

fn random_x(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(-1.0, 1.0)).collect()
}

#[test]
fn coopmat_tile_shapes_validate_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        if !(env.f16 && env.subgroups) {
            continue;
        }
        for kind in WeightKind::all() {
            for t in CoopTiles::candidates().into_iter().chain(CoopTiles::ROW_BANDS.map(|(_, t)| t)) {
                assert!(t.valid(48 << 10), "{t:?}");
                for x_f16 in [false, true] {
                    let src = boostr::quant::gemm::coop_source(kind, &t, x_f16, &env).unwrap();
                    validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{} {t:?} f16 input {x_f16}: {e}\n{}", kind.name(), src.wgsl));
                    n += 1;
                }
            }
        }
    }
    assert!(n > 0);
}

/// Every candidate shape and format, with M and N partly outside whole blocks (both epilogue
/// paths) and K a non-multiple of the K step for the legacy formats.
#[test]
fn coopmat_gemm_matches_reference_for_every_shape() {
    let Some(ctx) = test_gpu() else { return };
    if !QuantGemm::coopmat_available(&ctx) {
        numr::testing::skip_path(&ctx, "the cooperative-matrix GEMM for every shape and format", "no cooperative matrices");
        return;
    }
    let mut rng = Rng(21);
    let (rows, m) = (200, 150);
    let mut failures = Vec::new();
    for kind in WeightKind::all() {
        let kq = matches!(kind, WeightKind::Ggml(t) if t.block_size() == 256) || kind == WeightKind::Int4;
        let cols = if kq { 768 } else { 544 };
        let p = random_weight(&mut rng, kind, rows, cols);
        let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
        let x = random_x(&mut rng, m * cols);
        let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
        let want: Vec<f64> = matmul_ref(&p, &x, m).unwrap().iter().map(|&v| v as f64).collect();
        for unchecked in [false, true] {
            for t in CoopTiles::candidates() {
                let got = run_gemm(&ctx, &QuantGemm { kind, coopmat: true, unchecked, x_f16: false }, t, &w, &xb, m);
                if let Err(e) = check_close_rtol(&got, &want, RTOL_F16) {
                    failures.push(format!("{} {t:?} unchecked={unchecked}: {e}", kind.name()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// [`CoopTiles::bands`]: the row bands cover `1..=max_m` in order without gaps, stop at
/// `max_m`, and leave a shape the adapter cannot hold to the next band (the default shape last,
/// which the plan checks).
#[test]
fn row_bands_cover_every_row_count() {
    let big = 48 << 10;
    let his = |v: &[(CoopTiles, u32, u32)]| v.iter().map(|b| (b.1, b.2)).collect::<Vec<_>>();
    assert_eq!(his(&CoopTiles::bands(8, big)), [(0, 16)]);
    assert_eq!(his(&CoopTiles::bands(32, big)), [(0, 16), (16, 32)]);
    assert_eq!(his(&CoopTiles::bands(512, big)), [(0, 16), (16, 32), (32, 64), (64, u32::MAX)]);
    assert_eq!(CoopTiles::bands(512, big)[3].0, CoopTiles::DEFAULT);
    // Too little workgroup memory for the 16-row shape (13.8 KiB): its rows go to the next one.
    let small = CoopTiles::ROW_BANDS[0].1.shared_bytes() as u32 - 1;
    let v = CoopTiles::bands(512, small);
    assert!(v[..v.len() - 1].iter().all(|b| b.0.valid(small)), "{v:?}");
    assert_eq!(v.last().map(|b| (b.0, b.2)), Some((CoopTiles::DEFAULT, u32::MAX)));
    assert_eq!(v[0].1, 0);
    assert!(v.windows(2).all(|w| w[0].2 == w[1].1), "{v:?}");
}

/// A plan of [`GemmPlan::new`] picks its block shape by the step's rows; each row's result is
/// the same whatever band its step fell in (bit for bit), and matches the reference, for
/// steps on both sides of every band edge. Q4_0, Q4_K and Q6_K.
#[test]
fn a_rows_result_does_not_depend_on_the_steps_row_band() {
    let Some(ctx) = test_gpu() else { return };
    let coop = QuantGemm::coopmat_available(&ctx);
    let mut rng = Rng(23);
    let (rows, max_m) = (200, 150);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let kind = WeightKind::Ggml(ty);
        let cols = 768;
        let p = random_weight(&mut rng, kind, rows, cols);
        let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
        let x = random_x(&mut rng, max_m * cols);
        let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
        let want: Vec<f64> = matmul_ref(&p, &x, max_m).unwrap().iter().map(|&v| v as f64).collect();
        let cfg = QuantGemm { kind, coopmat: coop, unchecked: true, x_f16: false };
        let y = ctx.alloc(4 * (max_m * rows) as u64, BufferKind::Storage).unwrap();
        let plan = GemmPlan::new(&ctx, &cfg, &w, &Binding::whole(&xb), &Binding::whole(&y), max_m).unwrap();
        let run = |m: usize| -> Vec<f32> {
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
            rec.submit().unwrap();
            bytemuck::pod_collect_to_vec(&ctx.read_bytes(&y, 0, 4 * (m * rows) as u64).unwrap())
        };
        let all = run(max_m);
        let all64: Vec<f64> = all.iter().map(|&v| v as f64).collect();
        check_close_rtol(&all64, &want, RTOL_F16).unwrap_or_else(|e| panic!("{} {max_m} rows: {e}", ty.name()));
        for m in [1, 7, 16, 17, 32, 33, 64, 65] {
            let got = run(m);
            let same = got.iter().zip(&all).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
            assert_eq!(same, m * rows, "{} coopmat={coop}: a step of {m} rows differs from one of {max_m} in {} values", ty.name(), m * rows - same);
        }
    }
    if !coop {
        numr::testing::skip_path(&ctx, "the cooperative-matrix GEMM's row bands", "no cooperative matrices; the tiled GEMM was checked");
    }
}

/// The K split ([`GemmPlan::with_split_k`]): each partial `z` lands `z * m * N` further on and
/// the partials add up to the reference, for 2, 3 and 8 splits (8 of K = 544: some splits
/// empty), checked and unchecked, and for a step of fewer rows than the plan's; and with each
/// row band's block shape ([`GemmPlan::with_tiles_split_k`]) at its rows; the tiled variant
/// in 3 splits. Wrong uses are typed errors (a short output, 0 or 9 splits).
#[test]
fn split_k_partials_add_up_to_the_reference() {
    let Some(ctx) = test_gpu() else { return };
    let mut rng = Rng(22);
    let (rows, m, cols) = (200, 150, 544);
    let p = random_weight(&mut rng, WeightKind::Ggml(GgmlType::Q4_0), rows, cols);
    let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
    let x = random_x(&mut rng, m * cols);
    let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
    let tiled = QuantGemm { kind: WeightKind::Ggml(GgmlType::Q4_0), coopmat: false, unchecked: false, x_f16: false };
    // The tiled variant splits too (one chunk a K step).
    let y = ctx.alloc(4 * (3 * m * rows) as u64, BufferKind::Storage).unwrap();
    ctx.write(&y, 0, &vec![0u8; 4 * 3 * m * rows]).unwrap();
    let plan = GemmPlan::with_split_k(&ctx, &tiled, &w, &Binding::whole(&xb), &Binding::whole(&y), m, 3).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, 40)).unwrap();
    rec.submit().unwrap();
    let all: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&y, 0, 4 * (3 * m * rows) as u64).unwrap());
    let got: Vec<f64> = (0..40 * rows).map(|i| (0..3).map(|z| all[z * m * rows + i] as f64).sum()).collect();
    let want: Vec<f64> = matmul_ref(&p, &x[..40 * cols], 40).unwrap().iter().map(|&v| v as f64).collect();
    check_close_rtol(&got, &want, 1e-3).unwrap_or_else(|e| panic!("tiled, 3 splits: {e}"));
    if !QuantGemm::coopmat_available(&ctx) {
        numr::testing::skip_path(
            &ctx,
            "the cooperative-matrix GEMM's split-K and short outputs",
            "no cooperative matrices; the tiled split and the typed errors were checked",
        );
        return;
    }
    let short = ctx.alloc(4 * (m * rows) as u64, BufferKind::Storage).unwrap();
    for (splits, out) in [(2, &short), (0, &y), (9, &y)] {
        let coop = QuantGemm { coopmat: true, ..tiled };
        assert!(GemmPlan::with_split_k(&ctx, &coop, &w, &Binding::whole(&xb), &Binding::whole(out), m, splits).is_err(), "{splits} splits");
    }
    let band = |i: usize| Some(CoopTiles::ROW_BANDS[i].1);
    let cases = [
        (None, 2, false, m),
        (None, 3, true, m),
        (None, 8, false, m),
        (None, 2, true, 70),
        (band(0), 4, true, 16),
        (band(1), 3, false, 32),
        (band(2), 2, true, 64),
    ];
    for (tiles, splits, unchecked, rows_now) in cases {
        let cfg = QuantGemm { coopmat: true, unchecked, ..tiled };
        let y = ctx.alloc(4 * (splits * m * rows) as u64, BufferKind::Storage).unwrap();
        ctx.write(&y, 0, &vec![0u8; 4 * splits * m * rows]).unwrap();
        let (bx, by) = (Binding::whole(&xb), Binding::whole(&y));
        let plan = match tiles {
            None => GemmPlan::with_split_k(&ctx, &cfg, &w, &bx, &by, m, splits as u32),
            Some(t) => GemmPlan::with_tiles_split_k(&ctx, &cfg, t, &w, &bx, &by, m, splits as u32),
        }
        .unwrap();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::chunk(0, rows_now as u32)).unwrap();
        rec.submit().unwrap();
        let all: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&y, 0, 4 * (splits * m * rows) as u64).unwrap());
        let got: Vec<f64> = (0..rows_now * rows).map(|i| (0..splits).map(|z| all[z * m * rows + i] as f64).sum()).collect();
        let want: Vec<f64> = matmul_ref(&p, &x[..rows_now * cols], rows_now).unwrap().iter().map(|&v| v as f64).collect();
        check_close_rtol(&got, &want, RTOL_F16).unwrap_or_else(|e| panic!("{tiles:?}: {splits} splits, {rows_now} rows: {e}"));
    }
}

/// Speed probe for the H200: TFLOP/s per format and block shape at M = 512, N = K = 4096,
/// each checked against the CPU on the first 8 activation rows.
#[test]
#[ignore]
fn gemm_speed() {
    let Some(ctx) = test_gpu() else { return };
    let coop = QuantGemm::coopmat_available(&ctx);
    let (m, n, k) = (512usize, 4096usize, 4096usize);
    let only: Option<String> = std::env::var("GEMM_TILES").ok();
    let mut rng = Rng(5);
    let x = random_x(&mut rng, m * k);
    let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
    let y = ctx.alloc(4 * (m * n) as u64, BufferKind::Storage).unwrap();
    // Raise the GPU clocks first (without this the first format measured several times slower).
    {
        let kind = WeightKind::Ggml(GgmlType::Q8_0);
        let w = QuantMatrix::upload(&ctx, "warm", &random_weight(&mut rng, kind, n, k)).unwrap();
        let plan = GemmPlan::new(&ctx, &QuantGemm::new(kind, &ctx), &w, &Binding::whole(&xb), &Binding::whole(&y), m).unwrap();
        let t0 = std::time::Instant::now();
        while t0.elapsed().as_secs_f64() < 1.0 {
            let mut rec = ctx.recorder();
            for _ in 0..50 {
                plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
            }
            rec.submit().unwrap();
            ctx.sync().unwrap();
        }
    }
    let kinds = [GgmlType::Q4_0, GgmlType::F16, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K];
    for ty in kinds {
        let kind = WeightKind::Ggml(ty);
        let p = random_weight(&mut rng, kind, n, k);
        let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
        let check_m = 8;
        let want: Vec<f64> = matmul_ref(&p, &x[..check_m * k], check_m).unwrap().iter().map(|&v| v as f64).collect();
        let mut variants: Vec<(QuantGemm, CoopTiles)> = vec![(QuantGemm { kind, coopmat: false, unchecked: true, x_f16: false }, CoopTiles::DEFAULT)];
        if coop {
            for t in CoopTiles::candidates() {
                if only.as_ref().is_none_or(|o| o.contains(&format!("{}x{}x{}", t.bm, t.bn, t.bk))) {
                    variants.push((QuantGemm { kind, coopmat: true, unchecked: true, x_f16: false }, t));
                }
            }
        }
        for (cfg, t) in variants {
            let plan = GemmPlan::with_tiles(&ctx, &cfg, t, &w, &Binding::whole(&xb), &Binding::whole(&y), m).unwrap();
            // Warm-up and correctness.
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
            rec.submit().unwrap();
            let bytes = ctx.read_bytes(&y, 0, 4 * (check_m * n) as u64).unwrap();
            let got: Vec<f64> = bytemuck::cast_slice::<u8, f32>(&bytes).iter().map(|&v| v as f64).collect();
            let ok = check_close_rtol(&got, &want, RTOL_F16);
            let mut rec = ctx.recorder();
            for _ in 0..20 {
                plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
            }
            let prof = rec.submit_profiled().unwrap();
            let mut ns: Vec<f64> = prof.entries.iter().map(|e| e.1).collect();
            ns.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let med = ns[ns.len() / 2];
            let tflops = 2.0 * (m * n * k) as f64 / med / 1e3;
            let label = if cfg.coopmat { format!("coop {}x{}x{} sg {}x{}", t.bm, t.bn, t.bk, t.sg_m, t.sg_n) } else { "tiled".into() };
            println!(
                "GEMM {:5} {m}x{k}x{n} {label:28} {:8.1} us {tflops:6.1} TFLOP/s  {}",
                ty.name(),
                med / 1e3,
                if ok.is_ok() { "ok".to_string() } else { format!("WRONG {ok:?}") }
            );
        }
    }
}

//! GEMMs that read f16 activations ([`QuantGemm::x_f16`]) and [`HalfRowsPlan`], which writes
//! them:
//! - the rounding equals the `half` crate's round to nearest, bit for bit, and touches only the
//!   step's rows;
//! - the tiled GEMM on f16 input matches the CPU reference over the rounded activations (f32
//!   tolerance);
//! - the coopmat GEMM on f16 input gives the same bits as on the f32 input it was rounded from,
//!   in every row band (cooperative matrices: GPU only);
//! - bad shapes, short buffers and a plan for more rows than a step allows are typed errors;
//! - every kernel validates with naga.

#[path = "formats_util.rs"]
mod util;

use boostr::formats::{GgmlType, matmul_ref};
use boostr::quant::half_rows::half_rows_source;
use boostr::quant::{GemmPlan, HalfRowsPlan, QuantError, QuantGemm, QuantMatrix, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, random_ggml};

/// The workspace's f32 tolerance for a GEMM (relative to max(|want|, rms(want))).
const RTOL_F32: f64 = 1e-4;

fn read_f32(ctx: &GpuContext, b: &std::sync::Arc<numr::gpu::GpuBuffer>, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(b, 0, 4 * n as u64).unwrap())
}

/// Values over several binades, so the rounding is exercised at different exponents.
fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|i| rng.f32_in(-1.0, 1.0) * [1.0, 0.01, 37.0, 1000.0][i % 4]).collect()
}

#[test]
fn half_rows_and_f16_input_gemms_validate_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        if !env.f16 {
            assert!(half_rows_source(&env).is_err());
            continue;
        }
        let src = half_rows_source(&env).unwrap();
        validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
        for cfg in QuantGemm::all_for(&env).into_iter().filter(|c| c.x_f16) {
            let src = cfg.source(&env).unwrap();
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
    }
    assert!(n > 0);
}

/// A plan for 150 rows run with steps of 150 and of 37 rows: the step's rows equal
/// `half::f16::from_f32` bit for bit, the rows past the step keep what they held.
#[test]
fn half_rows_round_to_nearest_within_the_step() {
    let Some(ctx) = test_gpu() else { return };
    if !ctx.capabilities().shader_f16 {
        let x = ctx.alloc(4 * 64, BufferKind::Storage).unwrap();
        assert!(matches!(HalfRowsPlan::new(&ctx, &Binding::whole(&x), &Binding::whole(&x), 4, 16), Err(QuantError::Unsupported { .. })));
        numr::testing::skip_path(&ctx, "f16 rows", "the adapter has no shader-f16; the typed error was checked");
        return;
    }
    let mut rng = Rng(31);
    let (max_m, k) = (150, 72);
    let x = activations(&mut rng, max_m * k);
    let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
    let yb = ctx.alloc(2 * (max_m * k) as u64, BufferKind::Storage).unwrap();
    let plan = HalfRowsPlan::new(&ctx, &Binding::whole(&xb), &Binding::whole(&yb), max_m, k).unwrap();
    let want: Vec<u16> = x.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
    let fill = vec![0xabcd_u16; max_m * k];
    for m in [max_m, 37, 1] {
        ctx.write(&yb, 0, bytemuck::cast_slice(&fill)).unwrap();
        let mut rec = ctx.recorder();
        plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
        rec.submit().unwrap();
        let got: Vec<u16> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&yb, 0, 2 * (max_m * k) as u64).unwrap());
        let wrong = (0..m * k).filter(|&i| got[i] != want[i]).count();
        assert_eq!(wrong, 0, "a step of {m} rows: {wrong} values rounded otherwise than to nearest");
        assert!(got[m * k..].iter().all(|&v| v == 0xabcd), "a step of {m} rows wrote past its rows");
    }
    // Typed errors: a step too large, K not a multiple of 4, short buffers.
    let mut rec = ctx.recorder();
    assert!(matches!(plan.record(&mut rec, &StepValues::chunk(0, max_m as u32 + 1)), Err(QuantError::StepTooLarge { .. })));
    assert!(matches!(HalfRowsPlan::new(&ctx, &Binding::whole(&xb), &Binding::whole(&yb), 10, 6), Err(QuantError::Shape { .. })));
    assert!(matches!(HalfRowsPlan::new(&ctx, &Binding::whole(&xb), &Binding::whole(&yb), max_m + 1, k), Err(QuantError::BufferTooSmall { buffer: "x", .. })));
    let short = ctx.alloc(2 * (max_m * k) as u64 - 8, BufferKind::Storage).unwrap();
    assert!(matches!(HalfRowsPlan::new(&ctx, &Binding::whole(&xb), &Binding::whole(&short), max_m, k), Err(QuantError::BufferTooSmall { buffer: "y", .. })));
}

/// The GEMM on f16 activations written by [`HalfRowsPlan`]: the tiled variant against the CPU
/// reference over the rounded activations; the coopmat variant (where the adapter has it)
/// against itself on the f32 activations, bit for bit, for steps in every row band. Q4_0, Q4_K
/// and Q6_K; an f16 input sized for f32 rows' count but not their bytes is accepted, one short
/// of it is a typed error.
#[test]
fn f16_input_gemm_equals_the_rounded_f32_one() {
    let Some(ctx) = test_gpu() else { return };
    if !ctx.capabilities().shader_f16 {
        numr::testing::skip_path(&ctx, "GEMMs on f16 activations", "the adapter has no shader-f16");
        return;
    }
    let coop = QuantGemm::coopmat_available(&ctx);
    let mut rng = Rng(32);
    let (rows, cols, max_m) = (200, 768, 150);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let kind = WeightKind::Ggml(ty);
        let p = random_ggml(&mut rng, ty, rows, cols);
        let w = QuantMatrix::upload(&ctx, "w", &p).unwrap();
        let x: Vec<f32> = activations(&mut rng, max_m * cols).iter().map(|v| v * 0.01).collect();
        let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
        let xh = ctx.alloc(2 * (max_m * cols) as u64, BufferKind::Storage).unwrap();
        let half = HalfRowsPlan::new(&ctx, &Binding::whole(&xb), &Binding::whole(&xh), max_m, cols).unwrap();
        let mut rec = ctx.recorder();
        half.record(&mut rec, &StepValues::chunk(0, max_m as u32)).unwrap();
        rec.submit().unwrap();
        let (y32, y16) =
            (ctx.alloc(4 * (max_m * rows) as u64, BufferKind::Storage).unwrap(), ctx.alloc(4 * (max_m * rows) as u64, BufferKind::Storage).unwrap());
        let plan =
            |cfg: &QuantGemm, x: &std::sync::Arc<numr::gpu::GpuBuffer>, y| GemmPlan::new(&ctx, cfg, &w, &Binding::whole(x), &Binding::whole(y), max_m).unwrap();
        let run = |plan: &GemmPlan, m: usize| {
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &StepValues::chunk(0, m as u32)).unwrap();
            rec.submit().unwrap();
        };
        // The tiled variant: f16 input widened to f32, against the reference over the rounded rows.
        let tiled = QuantGemm { kind, coopmat: false, unchecked: true, x_f16: true };
        run(&plan(&tiled, &xh, &y16), max_m);
        let rounded: Vec<f32> = x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let want: Vec<f64> = matmul_ref(&p, &rounded, max_m).unwrap().iter().map(|&v| v as f64).collect();
        let got: Vec<f64> = read_f32(&ctx, &y16, max_m * rows).iter().map(|&v| v as f64).collect();
        check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("{} tiled on f16 input: {e}", ty.name()));
        // A short f16 input is a typed error naming it.
        let short = ctx.alloc(2 * (max_m * cols) as u64 - 8, BufferKind::Storage).unwrap();
        let short_plan = GemmPlan::new(&ctx, &tiled, &w, &Binding::whole(&short), &Binding::whole(&y16), max_m);
        assert!(matches!(short_plan, Err(QuantError::BufferTooSmall { buffer: "x", .. })), "{short_plan:?}");
        if !coop {
            continue;
        }
        let (f32_plan, f16_plan) = (
            plan(&QuantGemm { kind, coopmat: true, unchecked: true, x_f16: false }, &xb, &y32),
            plan(&QuantGemm { kind, coopmat: true, unchecked: true, x_f16: true }, &xh, &y16),
        );
        for m in [1, 16, 17, 32, 33, 64, 65, max_m] {
            run(&f32_plan, m);
            run(&f16_plan, m);
            let (a, b) = (read_f32(&ctx, &y32, m * rows), read_f32(&ctx, &y16, m * rows));
            let differ = a.iter().zip(&b).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(differ, 0, "{} coopmat, a step of {m} rows: f16 input differs from f32 input in {differ} values", ty.name());
        }
    }
    if !coop {
        numr::testing::skip_path(&ctx, "the cooperative-matrix GEMM on f16 activations", "no cooperative matrices; the tiled GEMM was checked");
    }
}

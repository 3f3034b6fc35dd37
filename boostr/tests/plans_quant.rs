//! The quantized plans (`GemvPlan`, `Q8GemvPlan`, `GemmPlan`, `Q8Activations`) recorded into
//! explicit recorders against the CPU references, and through the eager stream path; one GEMM
//! plan recorded for several token counts in one recorder; unchecked plans against checked
//! ones; typed errors for every undersized binding and bad configuration.
//!
//! Tolerances are those of the other quant tests (relative to max(|want|, rms(want))): f32 math
//! 1e-4; the integer-dot path 1e-4 against the reference on the GPU's own int8 activations and
//! 2e-2 against the unquantized activations. The eager path and the unchecked plans run the same
//! kernel code over the same data, so they must agree with the explicit recording exactly.
//!
//! The tests of this file share one GPU context and take a lock, so that the pool and bind-group
//! counters read by one test are not moved by another running beside it.

#[path = "formats_util.rs"]
mod util;

use std::sync::{Arc, Mutex, MutexGuard};

use boostr::act::ActKind;
use boostr::formats::{GgmlType, PackedWeights, matmul_ref};
use boostr::quant::gemm::{CoopTiles, coop_source};
use boostr::quant::upload::concat_rows;
use boostr::quant::{
    GemmPlan, GemvIo, GemvOutput, GemvPlan, Prologue, Q8Activations, Q8GemvPlan, QuantError, QuantGemm, QuantGemv, QuantGemvQ8, QuantMatrix, WeightKind,
};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu};
use util::{Rng, check_q8, random_ggml, rmsnorm_cpu};

const RTOL_F32: f64 = 1e-4;
const RTOL_Q8: f64 = 2e-2;
/// Legacy formats with and without an offset, Q8_0 (no offset), and a K-quant.
const KINDS: [GgmlType; 4] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K];
/// 37 rows (not a multiple of any rows-per-workgroup), K = 512 (two K-quant super-blocks).
const ROWS: usize = 37;
const COLS: usize = 512;

static LOCK: Mutex<()> = Mutex::new(());

/// A recording of one plan, built by a test.
type RecordFn = Box<dyn Fn(&mut numr::gpu::Recorder)>;

fn gpu() -> Option<(MutexGuard<'static, ()>, GpuContext)> {
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    test_gpu().map(|ctx| (guard, ctx))
}

fn upload(ctx: &GpuContext, v: &[f32]) -> Arc<GpuBuffer> {
    ctx.upload(bytemuck::cast_slice(v)).unwrap()
}

fn alloc(ctx: &GpuContext, floats: usize) -> Arc<GpuBuffer> {
    ctx.alloc(4 * floats as u64, BufferKind::Storage).unwrap()
}

fn whole(b: &Arc<GpuBuffer>) -> Binding {
    Binding::whole(b)
}

fn read(ctx: &GpuContext, b: &Arc<GpuBuffer>, floats: usize) -> Vec<f64> {
    bytemuck::pod_collect_to_vec::<u8, f32>(&ctx.read_bytes(b, 0, 4 * floats as u64).unwrap()).into_iter().map(|v| v as f64).collect()
}

fn zero(ctx: &GpuContext, b: &Arc<GpuBuffer>, floats: usize) {
    ctx.write(b, 0, &vec![0u8; 4 * floats]).unwrap();
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn random_x(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32_in(-1.0, 1.0)).collect()
}

fn weight(ctx: &GpuContext, rng: &mut Rng, ty: GgmlType, rows: usize) -> (PackedWeights, QuantMatrix) {
    let p = random_ggml(rng, ty, rows, COLS);
    let w = QuantMatrix::upload(ctx, ty.name(), &p).unwrap();
    (p, w)
}

/// Records `f` into an explicit recorder and submits it.
fn explicit(ctx: &GpuContext, f: impl FnOnce(&mut numr::gpu::Recorder)) {
    let mut rec = ctx.recorder();
    f(&mut rec);
    rec.submit().unwrap();
}

/// The f32-math GEMV, its fused RMSNorm prologue and its fused Q/K/V epilogue.
#[test]
fn gemv_plans_match_reference() {
    let Some((_g, ctx)) = gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    eprintln!("kernel environment: {env:?}");
    let mut rng = Rng(101);
    let step = StepValues::decode(7);
    for ty in KINDS {
        let kind = WeightKind::Ggml(ty);
        let (p, w) = weight(&ctx, &mut rng, ty, ROWS);
        for m in [1usize, 3] {
            let x = random_x(&mut rng, m * COLS);
            let (xb, y) = (upload(&ctx, &x), alloc(&ctx, m * ROWS));
            let plan = GemvPlan::new(&ctx, &QuantGemv::new(kind, &env, m as u32), &w, &GemvIo::new(whole(&xb), whole(&y))).unwrap();
            explicit(&ctx, |rec| plan.record(rec, &step).unwrap());
            let got = read(&ctx, &y, m * ROWS);
            check_close_rtol(&got, &f64s(&matmul_ref(&p, &x, m).unwrap()), RTOL_F32).unwrap_or_else(|e| panic!("{ty} m={m}: {e}"));
            zero(&ctx, &y, m * ROWS);
            plan.run(&ctx, &step).unwrap();
            assert_eq!(read(&ctx, &y, m * ROWS), got, "{ty} m={m}: eager path");
        }
        // Fused RMSNorm: staged in workgroup memory (m = 1), normalised while loading (m = 2).
        for (m, gemma, stage_k) in [(1usize, false, 4096u32), (2, true, 0)] {
            let x: Vec<f32> = (0..m * COLS).map(|_| rng.f32_in(-3.0, 3.0)).collect();
            let nw: Vec<f32> = (0..COLS).map(|_| rng.f32_in(0.5, 1.5)).collect();
            let (xb, nb, y) = (upload(&ctx, &x), upload(&ctx, &nw), alloc(&ctx, m * ROWS));
            let cfg = QuantGemv { prologue: Prologue::RmsNorm { gemma, stage_k }, ..QuantGemv::new(kind, &env, m as u32) };
            let plan = GemvPlan::new(&ctx, &cfg, &w, &GemvIo::new(whole(&xb), whole(&y)).with_rms_norm(whole(&nb), 1e-5)).unwrap();
            explicit(&ctx, |rec| plan.record(rec, &step).unwrap());
            let got = read(&ctx, &y, m * ROWS);
            let want = f64s(&matmul_ref(&p, &rmsnorm_cpu(&x, &nw, m, 1e-5, gemma), m).unwrap());
            check_close_rtol(&got, &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} rmsnorm m={m} gemma={gemma}: {e}"));
            zero(&ctx, &y, m * ROWS);
            plan.run(&ctx, &step).unwrap();
            assert_eq!(read(&ctx, &y, m * ROWS), got, "{ty} rmsnorm m={m}: eager path");
        }
        // Fused Q/K/V: one dispatch, three outputs.
        let rows = [24usize, 8, 8];
        let parts: Vec<PackedWeights> = rows.iter().map(|&n| random_ggml(&mut rng, ty, n, COLS)).collect();
        let qkv = QuantMatrix::upload(&ctx, "qkv", &concat_rows(&[&parts[0], &parts[1], &parts[2]]).unwrap()).unwrap();
        for m in [1usize, 2] {
            let x = random_x(&mut rng, m * COLS);
            let xb = upload(&ctx, &x);
            let ys: Vec<_> = rows.iter().map(|&n| alloc(&ctx, m * n)).collect();
            let output = GemvOutput::Qkv { q: whole(&ys[0]), k: whole(&ys[1]), v: whole(&ys[2]), rows };
            let cfg = QuantGemv { split_qkv: true, ..QuantGemv::new(kind, &env, m as u32) };
            let plan = GemvPlan::new(&ctx, &cfg, &qkv, &GemvIo { x: whole(&xb), norm_weight: None, eps: 0.0, output }).unwrap();
            assert_eq!(plan.plan().dispatch_count(&step), 1);
            explicit(&ctx, |rec| plan.record(rec, &step).unwrap());
            for i in 0..3 {
                let want = f64s(&matmul_ref(&parts[i], &x, m).unwrap());
                check_close_rtol(&read(&ctx, &ys[i], m * rows[i]), &want, RTOL_F32).unwrap_or_else(|e| panic!("{ty} qkv m={m} output {i}: {e}"));
            }
        }
    }
}

/// The integer-dot GEMV on int8 activations, quantized as they are and with the fused
/// RMSNorm + quantize.
#[test]
fn q8_gemv_plans_match_reference() {
    let Some((_g, ctx)) = gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(102);
    for ty in KINDS {
        let kind = WeightKind::Ggml(ty);
        let (p, w) = weight(&ctx, &mut rng, ty, ROWS);
        for (m, norm) in [(1usize, None), (3, None), (1, Some(false)), (2, Some(true))] {
            let step = StepValues::chunk(5, m as u32);
            let x: Vec<f32> = (0..m * COLS).map(|_| rng.f32_in(-2.0, 2.0)).collect();
            let nw: Vec<f32> = (0..COLS).map(|_| rng.f32_in(0.5, 1.5)).collect();
            let (xb, nb, y) = (upload(&ctx, &x), upload(&ctx, &nw), alloc(&ctx, m * ROWS));
            let xa = match norm {
                None => Q8Activations::new(&ctx, &whole(&xb), m, COLS).unwrap(),
                Some(gemma) => Q8Activations::with_rms_norm(&ctx, &whole(&xb), &whole(&nb), m, COLS, 1e-5, gemma).unwrap(),
            };
            let plan = Q8GemvPlan::new(&ctx, &QuantGemvQ8::new(kind, &env, m as u32), &w, &xa, &GemvOutput::Single(whole(&y))).unwrap();
            explicit(&ctx, |rec| {
                xa.record(rec, &step).unwrap();
                plan.record(rec, &step).unwrap();
                assert_eq!(rec.dispatch_count(), 2);
            });
            let nblk = m * COLS / 32;
            let q: Vec<i8> = ctx.read_bytes(xa.xq(), 0, (nblk * 32) as u64).unwrap().into_iter().map(|b| b as i8).collect();
            let s: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(xa.xs(), 0, (nblk * 16) as u64).unwrap());
            let input = match norm {
                None => x.clone(),
                Some(gemma) => rmsnorm_cpu(&x, &nw, m, 1e-5, gemma),
            };
            let deq = check_q8(&input, &q, &s, if norm.is_some() { 1e-5 } else { 0.0 });
            let got = read(&ctx, &y, m * ROWS);
            let what = format!("{ty} m={m} norm={norm:?}");
            check_close_rtol(&got, &f64s(&matmul_ref(&p, &deq, m).unwrap()), RTOL_F32).unwrap_or_else(|e| panic!("{what} (int8 x): {e}"));
            check_close_rtol(&got, &f64s(&matmul_ref(&p, &input, m).unwrap()), RTOL_Q8).unwrap_or_else(|e| panic!("{what} (f32 x): {e}"));
            zero(&ctx, &y, m * ROWS);
            xa.run(&ctx, &step).unwrap();
            plan.run(&ctx, &step).unwrap();
            assert_eq!(read(&ctx, &y, m * ROWS), got, "{what}: eager path");
        }
    }
}

/// The tiled GEMM (and the cooperative-matrix one where the adapter has it).
#[test]
fn gemm_plans_match_reference() {
    let Some((_g, ctx)) = gpu() else { return };
    if !QuantGemm::coopmat_available(&ctx) {
        numr::testing::skip_path(&ctx, "the cooperative-matrix GEMM plans", "no cooperative matrices");
    }
    let mut rng = Rng(103);
    let m = 9;
    let step = StepValues::chunk(0, m as u32);
    for ty in KINDS {
        let kind = WeightKind::Ggml(ty);
        let (p, w) = weight(&ctx, &mut rng, ty, ROWS);
        let x = random_x(&mut rng, m * COLS);
        let want = f64s(&matmul_ref(&p, &x, m).unwrap());
        let (xb, y) = (upload(&ctx, &x), alloc(&ctx, m * ROWS));
        for coopmat in [false, true] {
            if coopmat && !QuantGemm::coopmat_available(&ctx) {
                continue;
            }
            let plan = GemmPlan::new(&ctx, &QuantGemm { kind, coopmat, unchecked: false, x_f16: false }, &w, &whole(&xb), &whole(&y), m).unwrap();
            explicit(&ctx, |rec| plan.record(rec, &step).unwrap());
            let got = read(&ctx, &y, m * ROWS);
            check_close_rtol(&got, &want, if coopmat { 1e-2 } else { RTOL_F32 }).unwrap_or_else(|e| panic!("{ty} coopmat={coopmat}: {e}"));
            zero(&ctx, &y, m * ROWS);
            plan.run(&ctx, &step).unwrap();
            assert_eq!(read(&ctx, &y, m * ROWS), got, "{ty} coopmat={coopmat}: eager path");
        }
    }
}

/// A batched step's projection: the GEMM beside the decode-row GEMV (`GemvPlan::decode_rows`,
/// groups of 4 rows in one dispatch). For steps of decode rows only, prompt rows only, and both
/// (the GEMV's rows first), every row matches the reference, with the f32 GEMV and with the
/// integer-dot one; a decode row gives the same bits
/// whichever rows share its step and whatever group it falls in; a step of decode rows only
/// records no GEMM dispatch.
#[test]
fn decode_row_gemv_beside_the_gemm() {
    let Some((_g, ctx)) = gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(107);
    let max_m = 16;
    for ty in KINDS {
        let kind = WeightKind::Ggml(ty);
        let (p, w) = weight(&ctx, &mut rng, ty, ROWS);
        let x = random_x(&mut rng, max_m * COLS);
        let want = f64s(&matmul_ref(&p, &x, max_m).unwrap());
        let (xb, y) = (upload(&ctx, &x), alloc(&ctx, max_m * ROWS));
        let gemm = GemmPlan::beside_decode_rows(&ctx, &QuantGemm::new(kind, &ctx), &w, &whole(&xb), &GemvOutput::Single(whole(&y)), max_m).unwrap();
        let cfg = QuantGemv { step_rows: true, ..QuantGemv::new(kind, &env, 4) };
        let gemv = GemvPlan::decode_rows(&ctx, &cfg, &w, &GemvIo::new(whole(&xb), whole(&y)), max_m).unwrap();
        // The integer-dot GEMV over the step's rows quantized (tolerance of the int8 rounding).
        let xa = Q8Activations::new(&ctx, &whole(&xb), max_m, COLS).unwrap();
        let q8 = QuantGemvQ8 { step_rows: true, ..QuantGemvQ8::new(kind, &env, 4) };
        let q8 = Q8GemvPlan::decode_rows(&ctx, &q8, &w, &xa, &GemvOutput::Single(whole(&y))).unwrap();
        // Activations of fewer rows than the group (a batch of one or two sequences): the
        // group's rows clamp to the step's.
        let xa2 = Q8Activations::new(&ctx, &whole(&xb), 2, COLS).unwrap();
        let y2 = alloc(&ctx, 2 * ROWS);
        let q8_2 = QuantGemvQ8 { step_rows: true, ..QuantGemvQ8::new(kind, &env, 4) };
        let q8_2 = Q8GemvPlan::decode_rows(&ctx, &q8_2, &w, &xa2, &GemvOutput::Single(whole(&y2))).unwrap();
        let step2 = StepValues::chunk(0, 2).with_decode_rows(2);
        explicit(&ctx, |rec| {
            xa2.plan().record(rec, &step2).unwrap();
            q8_2.record(rec, &step2).unwrap();
        });
        check_close_rtol(&read(&ctx, &y2, 2 * ROWS), &want[..2 * ROWS], 1.5e-2).unwrap_or_else(|e| panic!("{ty}: two rows in a group of four: {e}"));
        for int8 in [false, true] {
            let mut first_row: Option<Vec<f64>> = None;
            for (n_tok, decode) in [(1usize, 1usize), (5, 5), (13, 13), (9, 0), (12, 3), (16, 7)] {
                let step = StepValues::chunk(0, n_tok as u32).with_decode_rows(decode as u32);
                assert_eq!(gemm.plan().dispatch_count(&step), usize::from(decode < n_tok) * w.parts.len(), "{ty}: GEMM skipped iff every row is a decode row");
                zero(&ctx, &y, max_m * ROWS);
                explicit(&ctx, |rec| {
                    gemm.plan().record(rec, &step).unwrap();
                    if int8 {
                        xa.plan().record(rec, &step).unwrap();
                        q8.record(rec, &step).unwrap();
                    } else {
                        gemv.record(rec, &step).unwrap();
                    }
                });
                let got = read(&ctx, &y, max_m * ROWS);
                let (p_rows, d_rows) = (n_tok * ROWS, decode * ROWS);
                check_close_rtol(&got[d_rows..p_rows], &want[d_rows..p_rows], 1e-2)
                    .unwrap_or_else(|e| panic!("{ty} int8 {int8}: {n_tok} rows, {decode} decode: {e}"));
                assert!(got[p_rows..].iter().all(|&v| v == 0.0), "{ty}: rows past the step stay untouched");
                if decode > 0 {
                    // The decode rows against the reference on what the GEMV read: x, or the
                    // GPU's own int8 activations.
                    let x_read = if int8 {
                        let nblk = decode * COLS / 32;
                        let q: Vec<i8> = ctx.read_bytes(xa.xq(), 0, (nblk * 32) as u64).unwrap().into_iter().map(|b| b as i8).collect();
                        let sc: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(xa.xs(), 0, (nblk * 16) as u64).unwrap());
                        check_q8(&x[..decode * COLS], &q, &sc, 0.0)
                    } else {
                        x[..decode * COLS].to_vec()
                    };
                    let want_dec = f64s(&matmul_ref(&p, &x_read, decode).unwrap());
                    check_close_rtol(&got[..d_rows], &want_dec, RTOL_F32).unwrap_or_else(|e| panic!("{ty} int8 {int8}: decode rows of {n_tok}: {e}"));
                    match &first_row {
                        Some(r) => assert_eq!(&got[..ROWS], &r[..], "{ty} int8 {int8}: decode row 0 in a step of {n_tok} rows, {decode} decode"),
                        None => first_row = Some(got[..ROWS].to_vec()),
                    }
                }
            }
        }
    }
}

/// One GEMM plan (built for 20 rows) and one quantizer (built for 4 rows) recorded for several
/// token counts in one recorder: each step computes its rows only, and recording creates no
/// buffer and no bind group.
#[test]
fn plans_follow_the_step_without_allocating() {
    let Some((_g, ctx)) = gpu() else { return };
    let mut rng = Rng(104);
    let (max_m, sentinel) = (20usize, 7.0f32);
    let (p, w) = weight(&ctx, &mut rng, GgmlType::Q4_K, ROWS);
    let x = random_x(&mut rng, max_m * COLS);
    let xb = upload(&ctx, &x);
    let y = upload(&ctx, &vec![sentinel; max_m * ROWS]);
    let plan = GemmPlan::new(&ctx, &QuantGemm { kind: w.kind(), coopmat: false, unchecked: false, x_f16: false }, &w, &whole(&xb), &whole(&y), max_m).unwrap();
    assert_eq!(plan.max_m(), max_m);
    let steps = [1u32, 5, 17];
    let copies: Vec<_> = steps.iter().map(|_| alloc(&ctx, max_m * ROWS)).collect();
    // The quantizer: rows 0..n_tok of 4, each step's xs copied out.
    let (q_rows, q_steps) = (4usize, [1u32, 3]);
    let xa = Q8Activations::new(&ctx, &whole(&xb), q_rows, COLS).unwrap();
    let xs_blocks = q_rows * COLS / 32;
    ctx.write(xa.xs(), 0, bytemuck::cast_slice(&vec![sentinel; 4 * xs_blocks])).unwrap();
    let xs_copies: Vec<_> = q_steps.iter().map(|_| alloc(&ctx, 4 * xs_blocks)).collect();
    ctx.flush().unwrap();
    let (groups, buffers) = (ctx.bind_groups_created(), ctx.pool_stats().created);
    let mut rec = ctx.recorder();
    for (i, &n) in steps.iter().enumerate() {
        plan.record(&mut rec, &StepValues::chunk(100 + i as u32, n)).unwrap();
        rec.copy(&y, 0, &copies[i], 0, (4 * max_m * ROWS) as u64).unwrap();
    }
    for (i, &n) in q_steps.iter().enumerate() {
        xa.record(&mut rec, &StepValues::chunk(3, n)).unwrap();
        rec.copy(xa.xs(), 0, &xs_copies[i], 0, (16 * xs_blocks) as u64).unwrap();
    }
    // A step of no tokens records nothing.
    let before = rec.dispatch_count();
    plan.record(&mut rec, &StepValues::chunk(0, 0)).unwrap();
    xa.record(&mut rec, &StepValues::chunk(0, 0)).unwrap();
    assert_eq!(rec.dispatch_count(), before);
    assert_eq!((ctx.bind_groups_created(), ctx.pool_stats().created), (groups, buffers), "recording created bind groups or buffers");
    rec.submit().unwrap();
    for (i, &n) in steps.iter().enumerate() {
        let n = n as usize;
        let got = read(&ctx, &copies[i], max_m * ROWS);
        let want = f64s(&matmul_ref(&p, &x[..n * COLS], n).unwrap());
        check_close_rtol(&got[..n * ROWS], &want, RTOL_F32).unwrap_or_else(|e| panic!("step of {n} tokens: {e}"));
        assert!(got[n * ROWS..].iter().all(|&v| v == sentinel as f64), "step of {n} tokens wrote rows past it");
    }
    for (i, &n) in q_steps.iter().enumerate() {
        let s = read(&ctx, &xs_copies[i], 4 * xs_blocks);
        let done = n as usize * COLS / 32;
        for b in 0..xs_blocks {
            let d = s[4 * b];
            let am = x[b * 32..b * 32 + 32].iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            if b < done {
                assert!((d - am / 127.0).abs() <= 1e-6 * am, "quantizer step of {n}: block {b} d {d} vs {}", am / 127.0);
            } else {
                assert_eq!(d, sentinel as f64, "quantizer step of {n} wrote block {b}");
            }
        }
    }
    // More tokens than the plans were built for: a typed error, nothing recorded.
    let mut rec = ctx.recorder();
    assert!(matches!(plan.record(&mut rec, &StepValues::chunk(0, 21)), Err(QuantError::StepTooLarge { n_tok: 21, max: 20, .. })));
    assert!(matches!(xa.record(&mut rec, &StepValues::chunk(0, 5)), Err(QuantError::StepTooLarge { n_tok: 5, max: 4, .. })));
    assert!(matches!(plan.run(&ctx, &StepValues::chunk(0, 21)), Err(QuantError::StepTooLarge { .. })));
    assert_eq!(rec.dispatch_count(), 0);
}

/// Plans built from `unchecked` configs compile a second module (without naga's bounds checks)
/// and give the checked plan's result.
#[test]
fn unchecked_plans_match_checked() {
    let Some((_g, ctx)) = gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(105);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
        let kind = WeightKind::Ggml(ty);
        let (_, w) = weight(&ctx, &mut rng, ty, ROWS);
        let m = 2;
        let x = random_x(&mut rng, 9 * COLS);
        let nw: Vec<f32> = (0..COLS).map(|_| rng.f32_in(0.5, 1.5)).collect();
        let (xb, nb) = (upload(&ctx, &x), upload(&ctx, &nw));
        // Runs `build(unchecked)` for both settings and returns the two outputs.
        let both = |n: usize, build: &dyn Fn(bool, &Arc<GpuBuffer>) -> RecordFn| -> [Vec<f64>; 2] {
            [false, true].map(|unchecked| {
                let y = alloc(&ctx, n);
                let kernels = ctx.cached_kernels();
                let rec_fn = build(unchecked, &y);
                if unchecked {
                    assert_eq!(ctx.cached_kernels(), kernels + 1, "{ty}: the unchecked plan compiled no module of its own");
                }
                explicit(&ctx, |rec| rec_fn(rec));
                read(&ctx, &y, n)
            })
        };
        let step = StepValues::chunk(0, m as u32);
        let gemv = both(m * ROWS, &|unchecked, y| {
            let cfg = QuantGemv { unchecked, prologue: Prologue::RmsNorm { gemma: false, stage_k: 4096 }, ..QuantGemv::new(kind, &env, m as u32) };
            let plan = GemvPlan::new(&ctx, &cfg, &w, &GemvIo::new(whole(&xb), whole(y)).with_rms_norm(whole(&nb), 1e-5)).unwrap();
            Box::new(move |rec| plan.record(rec, &step).unwrap())
        });
        assert_eq!(gemv[0], gemv[1], "{ty}: GEMV");
        let xa = Q8Activations::new(&ctx, &whole(&xb), m, COLS).unwrap();
        explicit(&ctx, |rec| xa.record(rec, &step).unwrap());
        for sg_rows in [0, 1] {
            let q8 = both(m * ROWS, &|unchecked, y| {
                let cfg = QuantGemvQ8 { unchecked, subgroup_rows: sg_rows, rows_per_workgroup: 2, threads: 64, ..QuantGemvQ8::new(kind, &env, m as u32) };
                let plan = Q8GemvPlan::new(&ctx, &cfg, &w, &xa, &GemvOutput::Single(whole(y))).unwrap();
                Box::new(move |rec| plan.record(rec, &step).unwrap())
            });
            assert_eq!(q8[0], q8[1], "{ty}: integer-dot GEMV, subgroup rows {sg_rows}");
        }
        let gemm = both(9 * ROWS, &|unchecked, y| {
            let plan = GemmPlan::new(&ctx, &QuantGemm { kind, coopmat: false, unchecked, x_f16: false }, &w, &whole(&xb), &whole(y), 9).unwrap();
            Box::new(move |rec| plan.record(rec, &StepValues::chunk(0, 9)).unwrap())
        });
        assert_eq!(gemm[0], gemm[1], "{ty}: GEMM");
    }
}

fn short(e: std::result::Result<impl std::fmt::Debug, QuantError>, buffer: &str) {
    match e {
        Err(QuantError::BufferTooSmall { buffer: b, needed, actual, .. }) if b == buffer && actual < needed => {}
        other => panic!("expected BufferTooSmall for {buffer}, got {other:?}"),
    }
}

/// Every undersized binding, bad configuration and inconsistent matrix is a typed error when
/// the plan is built (never a panic, never a kernel that reads or writes out of bounds).
#[test]
fn bad_inputs_are_typed_errors() {
    let Some((_g, ctx)) = gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(106);
    let kind = WeightKind::Ggml(GgmlType::Q4_0);
    let (_, w) = weight(&ctx, &mut rng, GgmlType::Q4_0, ROWS);
    let m = 2;
    let b = |floats: usize| whole(&alloc(&ctx, floats));
    let (x, y, nw) = (b(m * COLS), b(m * ROWS), b(COLS));
    let cfg = QuantGemv::new(kind, &env, m as u32);
    // GEMV: activations, output, norm weight, each Q/K/V output.
    short(GemvPlan::new(&ctx, &cfg, &w, &GemvIo::new(b(m * COLS - 4), y.clone())), "x");
    short(GemvPlan::new(&ctx, &cfg, &w, &GemvIo::new(x.clone(), b(m * ROWS - 1))), "y");
    let rms = QuantGemv { prologue: Prologue::RmsNorm { gemma: false, stage_k: 0 }, ..cfg };
    short(GemvPlan::new(&ctx, &rms, &w, &GemvIo::new(x.clone(), y.clone()).with_rms_norm(b(COLS - 4), 1e-5)), "norm weight");
    assert!(matches!(GemvPlan::new(&ctx, &rms, &w, &GemvIo::new(x.clone(), y.clone())), Err(QuantError::Shape { .. })));
    assert!(matches!(GemvPlan::new(&ctx, &cfg, &w, &GemvIo::new(x.clone(), y.clone()).with_rms_norm(nw.clone(), 1e-5)), Err(QuantError::Shape { .. })));
    let rows = [21, 8, 8];
    let qkv_cfg = QuantGemv { split_qkv: true, ..cfg };
    let qkv =
        |q: Binding, k: Binding, v: Binding, rows: [usize; 3]| GemvIo { x: x.clone(), norm_weight: None, eps: 0.0, output: GemvOutput::Qkv { q, k, v, rows } };
    short(GemvPlan::new(&ctx, &qkv_cfg, &w, &qkv(b(m * 21 - 1), b(m * 8), b(m * 8), rows)), "q output");
    short(GemvPlan::new(&ctx, &qkv_cfg, &w, &qkv(b(m * 21), b(m * 8 - 1), b(m * 8), rows)), "k output");
    short(GemvPlan::new(&ctx, &qkv_cfg, &w, &qkv(b(m * 21), b(m * 8), b(m * 8 - 1), rows)), "v output");
    assert!(matches!(GemvPlan::new(&ctx, &qkv_cfg, &w, &qkv(b(m * 21), b(m * 8), b(m * 8), [21, 8, 7])), Err(QuantError::Shape { .. })));
    assert!(matches!(GemvPlan::new(&ctx, &qkv_cfg, &w, &GemvIo::new(x.clone(), y.clone())), Err(QuantError::Shape { .. })));
    // GEMV configurations the kernel cannot run correctly.
    for bad in [QuantGemv { threads: 96, ..cfg }, QuantGemv { threads: 4, rows_per_workgroup: 4, ..cfg }, QuantGemv { rows_per_workgroup: 0, ..cfg }] {
        assert!(matches!(GemvPlan::new(&ctx, &bad, &w, &GemvIo::new(x.clone(), y.clone())), Err(QuantError::Config { .. })), "{bad:?}");
    }
    assert!(matches!(GemvPlan::new(&ctx, &QuantGemv { activation_rows: 9, ..cfg }, &w, &GemvIo::new(x.clone(), y.clone())), Err(QuantError::Shape { .. })));
    // A matrix whose parts no longer match their buffers.
    let mut bad_w = w.clone();
    bad_w.parts[0].rows += 1;
    bad_w.rows += 1;
    assert!(matches!(GemvPlan::new(&ctx, &cfg, &bad_w, &GemvIo::new(x.clone(), b(m * (ROWS + 1)))), Err(QuantError::Unsupported { .. })));
    let mut bad_w = w.clone();
    bad_w.parts[0].row0 = 1;
    assert!(matches!(
        GemmPlan::new(&ctx, &QuantGemm { kind, coopmat: false, unchecked: true, x_f16: false }, &bad_w, &x, &y, m),
        Err(QuantError::Unsupported { .. })
    ));
    // Int8 activations: their input and norm weight; the GEMV on them: its output, and
    // activations of too few rows or another K.
    short(Q8Activations::new(&ctx, &b(m * COLS - 4), m, COLS), "x");
    short(Q8Activations::with_rms_norm(&ctx, &x, &b(COLS - 4), m, COLS, 1e-5, false), "norm weight");
    assert!(matches!(Q8Activations::new(&ctx, &x, m, COLS - 16), Err(QuantError::Shape { .. })));
    assert!(matches!(Q8Activations::new(&ctx, &x, 0, COLS), Err(QuantError::Shape { .. })));
    let xa = Q8Activations::new(&ctx, &x, m, COLS).unwrap();
    let q8 = QuantGemvQ8::new(kind, &env, m as u32);
    short(Q8GemvPlan::new(&ctx, &q8, &w, &xa, &GemvOutput::Single(b(m * ROWS - 1))), "y");
    let xa1 = Q8Activations::new(&ctx, &x, 1, COLS).unwrap();
    assert!(matches!(Q8GemvPlan::new(&ctx, &q8, &w, &xa1, &GemvOutput::Single(y.clone())), Err(QuantError::Shape { .. })));
    let xa_k = Q8Activations::new(&ctx, &x, 1, 2 * COLS).unwrap();
    assert!(matches!(Q8GemvPlan::new(&ctx, &q8, &w, &xa_k, &GemvOutput::Single(y.clone())), Err(QuantError::Shape { .. })));
    assert!(matches!(Q8GemvPlan::new(&ctx, &QuantGemvQ8 { unroll: 0, ..q8 }, &w, &xa, &GemvOutput::Single(y.clone())), Err(QuantError::Config { .. })));
    let q8qkv = QuantGemvQ8 { split_qkv: true, ..q8 };
    short(Q8GemvPlan::new_qkv(&ctx, &q8qkv, &w, &xa, [&b(m * 21), &b(m * 8 - 1), &b(m * 8)], rows), "k output");
    // GEMM: activations and output for the plan's maximum rows.
    let gemm = QuantGemm { kind, coopmat: false, unchecked: true, x_f16: false };
    short(GemmPlan::new(&ctx, &gemm, &w, &b(9 * COLS - 4), &b(9 * ROWS), 9), "x");
    short(GemmPlan::new(&ctx, &gemm, &w, &b(9 * COLS), &b(9 * ROWS - 1), 9), "y");
    assert!(matches!(GemmPlan::new(&ctx, &gemm, &w, &x, &y, 0), Err(QuantError::Shape { .. })));
    // The cooperative-matrix generator: malformed tiles (and absurd ones) are typed errors.
    let coop_env = KernelEnv { f16: true, subgroups: true, subgroup_min_size: 32, ..env };
    assert!(coop_source(kind, &CoopTiles::DEFAULT, false, &coop_env).is_ok());
    let d = CoopTiles::DEFAULT;
    for t in [
        CoopTiles { bk: 48, ..d },
        CoopTiles { sg_m: 0, ..d },
        CoopTiles { bm: 100, ..d },
        CoopTiles { pad: 3, ..d },
        CoopTiles { sg_m: u32::MAX, sg_n: u32::MAX, ..d },
        CoopTiles { bm: u32::MAX - 15, bn: u32::MAX - 15, bk: 1 << 31, pad: 1 << 31, ..d },
        CoopTiles { bm: 4096, bn: 4096, bk: 4096, sg_m: 1, sg_n: 1, ..d },
    ] {
        assert!(matches!(coop_source(kind, &t, false, &coop_env), Err(QuantError::Config { .. })), "{t:?}");
    }
    assert!(matches!(coop_source(kind, &d, false, &KernelEnv { subgroups: false, ..coop_env }), Err(QuantError::Config { .. })));
    assert!(matches!(
        QuantGemm { kind, coopmat: true, unchecked: false, x_f16: false }.source(&KernelEnv { f16: false, ..coop_env }),
        Err(QuantError::Config { .. })
    ));
}

/// The CPU reference refuses inconsistent lengths, overflowing ones included, with a typed
/// error.
#[test]
fn cpu_reference_rejects_inconsistent_lengths() {
    let p = random_ggml(&mut Rng(107), GgmlType::Q4_0, 2, 32);
    assert!(matches!(matmul_ref(&p, &[0.0; 31], 1), Err(boostr::formats::FormatError::Length { .. })));
    assert!(matches!(matmul_ref(&p, &[0.0; 32], usize::MAX), Err(boostr::formats::FormatError::Length { .. })));
    assert!(matches!(matmul_ref(&p, &[0.0; 32], 1 << 60), Err(boostr::formats::FormatError::Length { .. })));
}

/// The decode-row GEMV with a prologue (a speculative verification step's fused projections):
/// the RMSNorm of each of the step's rows (reduced group by group) and the GLU of `[gate | up]`
/// rows adding into the output, at steps of 1, 5 and 11 rows in groups of 4, against the
/// references; rows past the step stay untouched.
#[test]
fn decode_row_gemv_takes_the_norm_and_the_glu() {
    let Some((_g, ctx)) = gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(211);
    let (max_m, eps) = (11, 1e-5);
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
        let kind = WeightKind::Ggml(ty);
        let (p, w) = weight(&ctx, &mut rng, ty, ROWS);
        let x = random_x(&mut rng, max_m * COLS);
        let nw: Vec<f32> = (0..COLS).map(|_| rng.f32_in(0.5, 1.5)).collect();
        let gu = random_x(&mut rng, max_m * 2 * COLS);
        let y0 = random_x(&mut rng, max_m * ROWS);
        let (xb, nwb, gub, y) = (upload(&ctx, &x), upload(&ctx, &nw), upload(&ctx, &gu), alloc(&ctx, max_m * ROWS));
        let norm_cfg = QuantGemv { step_rows: true, prologue: Prologue::RmsNorm { gemma: false, stage_k: 4096 }, ..QuantGemv::new(kind, &env, 4) };
        let norm = GemvPlan::decode_rows(&ctx, &norm_cfg, &w, &GemvIo::new(whole(&xb), whole(&y)).with_rms_norm(whole(&nwb), eps), max_m).unwrap();
        let glu_cfg = QuantGemv { step_rows: true, accumulate: true, prologue: Prologue::Glu { act: ActKind::Silu }, ..QuantGemv::new(kind, &env, 4) };
        let glu = GemvPlan::decode_rows(&ctx, &glu_cfg, &w, &GemvIo::new(whole(&gub), whole(&y)), max_m).unwrap();
        let normed = rmsnorm_cpu(&x, &nw, max_m, eps, false);
        let want_norm = f64s(&matmul_ref(&p, &normed, max_m).unwrap());
        let h: Vec<f32> = (0..max_m * COLS)
            .map(|i| {
                let (r, c) = (i / COLS, i % COLS);
                let (g, u) = (gu[r * 2 * COLS + c], gu[r * 2 * COLS + COLS + c]);
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        let want_glu: Vec<f64> = matmul_ref(&p, &h, max_m).unwrap().iter().zip(&y0).map(|(&a, &b)| (a + b) as f64).collect();
        for n in [1usize, 5, 11] {
            let step = StepValues::chunk(0, n as u32).with_decode_rows(n as u32);
            let rows = n * ROWS;
            zero(&ctx, &y, max_m * ROWS);
            explicit(&ctx, |rec| norm.record(rec, &step).unwrap());
            let got = read(&ctx, &y, max_m * ROWS);
            check_close_rtol(&got[..rows], &want_norm[..rows], RTOL_F32).unwrap_or_else(|e| panic!("{ty}: the norm over {n} rows: {e}"));
            assert!(got[rows..].iter().all(|&v| v == 0.0), "{ty}: rows past the step");
            ctx.write(&y, 0, bytemuck::cast_slice(&y0)).unwrap();
            explicit(&ctx, |rec| glu.record(rec, &step).unwrap());
            let got = read(&ctx, &y, max_m * ROWS);
            check_close_rtol(&got[..rows], &want_glu[..rows], RTOL_F32).unwrap_or_else(|e| panic!("{ty}: the GLU over {n} rows: {e}"));
            assert_eq!(got[rows..], f64s(&y0[rows..])[..], "{ty}: rows past the step");
        }
    }
}

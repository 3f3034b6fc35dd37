//! The Q/K/V GEMV's RoPE + KV-cache epilogue (`rope_kv`, both GEMV paths) against the CPU
//! reference of the separate rope kernel (`QkvRope::reference`) applied to the same GEMV's
//! unrotated output, and against the GPU's own unfused composition (the plain GEMV, then
//! `QkvRopePlan`).
//!
//! Checked, for full and partial rotary dimensions, head_dim 64 and 128, both reduction layouts
//! of the integer-dot GEMV and the f32 GEMV with its RMSNorm prologue:
//! - the packed row (Q and K rotated at the step's position, V as computed) at 1e-5 of the CPU;
//! - the cache rows of K and V at the step's slot, as f16, within one f16 rounding of the CPU's
//!   values, and equal to what the unfused path stores; every other slot stays zero;
//! - two steps of one plan at different positions (the position is a per-step word);
//! - the typed errors for what the epilogue cannot do.

#[path = "formats_util.rs"]
mod util;

use boostr::formats::GgmlType;
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use boostr::ops_common::OpPlan;
use boostr::quant::{GemvIo, GemvOutput, GemvPlan, Prologue, Q8Activations, Q8GemvPlan, QuantError, QuantGemv, QuantGemvQ8, QuantMatrix, RopeKv};
use boostr::rope::{QkvLayout, QkvRope, QkvRopeInputs, QkvRopePlan, RopeParams, RopePositions, RopeScaling, RopeStyle};
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};
use util::{Rng, random_ggml};

const CAPACITY: usize = 48;

fn read_f32(ctx: &GpuContext, b: &Binding, n: usize) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(&ctx.read_bytes(&b.buffer, b.offset, 4 * n as u64).unwrap())
}

/// The f16 values of a cache buffer: `[kv_head][slot][head_dim]`.
fn read_f16(ctx: &GpuContext, b: &std::sync::Arc<numr::gpu::GpuBuffer>, n: usize) -> Vec<f32> {
    let bytes = ctx.read_bytes(b, 0, 2 * n as u64).unwrap();
    bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
}

fn cache(ctx: &GpuContext, n_kv: usize, hd: usize, dtype: KvDtype) -> KvCache {
    KvCache::new(ctx, KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity: CAPACITY, dtype, max_segment_bytes: None }).unwrap()
}

/// One shape: heads, head_dim, rotated dims.
#[derive(Clone, Copy, Debug)]
struct Shape {
    n_q: usize,
    n_kv: usize,
    hd: usize,
    rot: usize,
}

impl Shape {
    fn rows(&self) -> usize {
        (self.n_q + 2 * self.n_kv) * self.hd
    }
    fn rope(&self) -> RopeParams {
        RopeParams { head_dim: self.hd, rot_dim: self.rot, base: 10_000.0, scaling: RopeScaling::None, style: RopeStyle::Normal }
    }
    fn layout(&self) -> QkvLayout {
        QkvLayout::packed(1, self.n_q, self.n_kv, self.hd)
    }
}

/// Which GEMV builds the projection.
enum Gemv<'a> {
    F32(QuantGemv, &'a GemvIo),
    Q8(QuantGemvQ8, &'a Q8Activations),
}

/// Builds the plain GEMV (`rope = None`) or the fused one into `y`.
fn plan(ctx: &GpuContext, g: &Gemv, w: &QuantMatrix, y: &Binding, rope: Option<&RopeKv>) -> Result<numr::gpu::Plan, QuantError> {
    Ok(match (g, rope) {
        (Gemv::F32(cfg, io), None) => GemvPlan::new(ctx, cfg, w, &GemvIo { output: GemvOutput::Single(y.clone()), ..(*io).clone() })?.plan().clone(),
        (Gemv::F32(cfg, io), Some(rk)) => {
            let cfg = QuantGemv { rope_kv: true, ..*cfg };
            GemvPlan::with_rope_kv(ctx, &cfg, w, &GemvIo { output: GemvOutput::Single(y.clone()), ..(*io).clone() }, rk)?.plan().clone()
        }
        (Gemv::Q8(cfg, xa), None) => Q8GemvPlan::new(ctx, cfg, w, xa, &GemvOutput::Single(y.clone()))?.plan().clone(),
        (Gemv::Q8(cfg, xa), Some(rk)) => Q8GemvPlan::with_rope_kv(ctx, &QuantGemvQ8 { rope_kv: true, ..*cfg }, w, xa, y, rk)?.plan().clone(),
    })
}

/// Runs the fused and the unfused path for steps at `positions` and checks them against the
/// CPU and each other.
fn check_shape(ctx: &GpuContext, s: Shape, g: &Gemv, w: &QuantMatrix, pre: &numr::gpu::Plan, label: &str) {
    let rows = s.rows();
    let rope = s.rope();
    let freqs = ctx.upload(bytemuck::cast_slice(&rope.inv_freqs())).unwrap();
    let alloc = || Binding::whole(&ctx.alloc(4 * rows as u64, BufferKind::Storage).unwrap());
    let (y_fused, y_plain, y_unfused) = (alloc(), alloc(), alloc());
    let (c_fused, c_unfused) = (cache(ctx, s.n_kv, s.hd, KvDtype::F16), cache(ctx, s.n_kv, s.hd, KvDtype::F16));
    let rk = RopeKv { n_q: s.n_q, n_kv: s.n_kv, head_dim: s.hd, rot_dim: s.rot, freqs: &Binding::whole(&freqs), cache: &c_fused, layer: 0 };
    let fused = plan(ctx, g, w, &y_fused, Some(&rk)).unwrap();
    let plain = plan(ctx, g, w, &y_plain, None).unwrap();
    let unfused_gemv = plan(ctx, g, w, &y_unfused, None).unwrap();
    let inputs = QkvRopeInputs {
        x: &y_unfused,
        layout: s.layout(),
        rope: &rope,
        positions: &RopePositions::Step,
        qw: None,
        kw: None,
        eps: 0.0,
        cache: Some((&c_unfused, 0)),
    };
    let cfg = QkvRope { style: RopeStyle::Normal, rope: true, qk_norm: false, norm_offset: false, kv_write: Some(KvDtype::F16) };
    let rope_plan = QkvRopePlan::new(ctx, &cfg, &inputs).unwrap();
    let positions = [5u32, 37];
    let per_slot = s.n_kv * CAPACITY * s.hd;
    for &pos in &positions {
        let step = StepValues::decode(pos);
        let mut rec = ctx.recorder();
        pre.record(&mut rec, &step).unwrap();
        fused.record(&mut rec, &step).unwrap();
        plain.record(&mut rec, &step).unwrap();
        unfused_gemv.record(&mut rec, &step).unwrap();
        rope_plan.record(&mut rec, &step).unwrap();
        rec.submit().unwrap();
        // The CPU: the rope kernel's reference on the plain GEMV's output.
        let mut want = read_f32(ctx, &y_plain, rows);
        let (k_rows, v_rows) = cfg.reference(&mut want, &s.layout(), &rope, &[pos], None, None, 0.0).unwrap();
        let got = read_f32(ctx, &y_fused, rows);
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        check_close_rtol(&f(&got), &f(&want), 1e-5).unwrap_or_else(|e| panic!("{label} {s:?} pos {pos}: packed row: {e}"));
        check_close_rtol(&f(&read_f32(ctx, &y_unfused, rows)), &f(&want), 1e-5).unwrap_or_else(|e| panic!("{label} {s:?} pos {pos}: unfused row: {e}"));
        let seg = &c_fused.segments(0).unwrap()[0];
        let useg = &c_unfused.segments(0).unwrap()[0];
        for (name, buf, ubuf, rows_want) in [("k", &seg.k, &useg.k, &k_rows), ("v", &seg.v, &useg.v, &v_rows)] {
            let (got, unf) = (read_f16(ctx, buf, per_slot), read_f16(ctx, ubuf, per_slot));
            for h in 0..s.n_kv {
                for d in 0..s.hd {
                    let i = (h * CAPACITY + pos as usize) * s.hd + d;
                    let want = rows_want[h * s.hd + d];
                    let tol = want.abs() * 2f32.powi(-10) + 1e-6;
                    assert!((got[i] - want).abs() <= tol, "{label} {s:?} pos {pos}: {name} head {h} dim {d}: {} vs {want}", got[i]);
                    assert!((got[i] - unf[i]).abs() <= tol, "{label} {s:?} pos {pos}: {name} head {h} dim {d}: fused {} vs unfused {}", got[i], unf[i]);
                }
            }
            // Only the steps' slots were written.
            for (i, v) in got.iter().enumerate() {
                let slot = (i / s.hd) % CAPACITY;
                if !positions.contains(&(slot as u32)) {
                    assert_eq!(*v, 0.0, "{label} {s:?}: {name} slot {slot} written");
                }
            }
        }
    }
}

#[test]
fn rope_kv_variants_validate_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation() {
        for src in QuantGemv::all_for(&env).iter().filter(|c| c.rope_kv).map(|c| c.source(&env)) {
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
        for src in QuantGemvQ8::all_for(&env).iter().filter(|c| c.rope_kv).map(|c| c.source(&env)) {
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            assert!(src.bindings.len() <= 8, "{}", src.name);
            n += 1;
        }
    }
    assert!(n > 0);
}

#[test]
fn fused_rope_kv_matches_the_rope_kernel() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(77);
    let shapes = [Shape { n_q: 4, n_kv: 2, hd: 64, rot: 64 }, Shape { n_q: 2, n_kv: 1, hd: 128, rot: 64 }];
    for (si, s) in shapes.into_iter().enumerate() {
        let k = 256;
        let ty = if si == 0 { GgmlType::Q4_0 } else { GgmlType::Q8_0 };
        let p = random_ggml(&mut rng, ty, s.rows(), k);
        let w = QuantMatrix::upload(&ctx, "qkv", &p).unwrap();
        let x: Vec<f32> = (0..k).map(|_| rng.f32_in(-1.0, 1.0)).collect();
        let nw: Vec<f32> = (0..k).map(|_| rng.f32_in(0.5, 1.5)).collect();
        let (xb, nwb) = (Binding::whole(&ctx.upload(bytemuck::cast_slice(&x)).unwrap()), Binding::whole(&ctx.upload(bytemuck::cast_slice(&nw)).unwrap()));
        // The f32 GEMV with its RMSNorm prologue (4 and 8 rows per workgroup).
        let io = GemvIo::new(xb.clone(), xb.clone()).with_rms_norm(nwb.clone(), 1e-5);
        let base = QuantGemv { prologue: Prologue::RmsNorm { gemma: false, stage_k: 0 }, ..QuantGemv::new(w.kind(), &env, 1) };
        for cfg in [base, QuantGemv { rows_per_workgroup: 8, unchecked: true, ..base }] {
            check_shape(&ctx, s, &Gemv::F32(cfg, &io), &w, &numr::gpu::Plan::new(), &format!("f32 r{}", cfg.rows_per_workgroup));
        }
        // The integer-dot GEMV on deferred-norm int8 activations, both reduction layouts.
        let xa = Q8Activations::with_deferred_rms_norm(&ctx, &xb, &nwb, 1, k, 1e-5, false).unwrap();
        let q8 = QuantGemvQ8 { rms_scale: true, rows_per_workgroup: 2, ..QuantGemvQ8::new(w.kind(), &env, 1) };
        let layouts = [q8, QuantGemvQ8 { subgroup_rows: 2, rows_per_workgroup: 8, threads: 128, unchecked: true, ..q8 }];
        for cfg in layouts.into_iter().filter(|c| c.subgroup_rows == 0 || env.subgroups) {
            check_shape(&ctx, s, &Gemv::Q8(cfg, &xa), &w, xa.plan(), &format!("q8 r{} sgrows{}", cfg.rows_per_workgroup, cfg.subgroup_rows));
        }
    }
}

#[test]
fn rope_kv_refuses_what_it_cannot_do() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut rng = Rng(5);
    let s = Shape { n_q: 2, n_kv: 1, hd: 64, rot: 64 };
    let k = 64;
    let w = QuantMatrix::upload(&ctx, "qkv", &random_ggml(&mut rng, GgmlType::Q4_0, s.rows(), k)).unwrap();
    let x = Binding::whole(&ctx.upload(&vec![0u8; 4 * k]).unwrap());
    let y = Binding::whole(&ctx.alloc(4 * s.rows() as u64, BufferKind::Storage).unwrap());
    let freqs = Binding::whole(&ctx.upload(bytemuck::cast_slice(&s.rope().inv_freqs())).unwrap());
    let f16 = cache(&ctx, s.n_kv, s.hd, KvDtype::F16);
    let q8 = cache(&ctx, s.n_kv, s.hd, KvDtype::Q8_0);
    let rk = |c| RopeKv { n_q: s.n_q, n_kv: s.n_kv, head_dim: s.hd, rot_dim: s.rot, freqs: &freqs, cache: c, layer: 0 };
    let xa = Q8Activations::new(&ctx, &x, 1, k).unwrap();
    let cfg = QuantGemvQ8 { rope_kv: true, rows_per_workgroup: 2, ..QuantGemvQ8::new(w.kind(), &env, 1) };
    assert!(Q8GemvPlan::with_rope_kv(&ctx, &cfg, &w, &xa, &y, &rk(&f16)).is_ok());
    // A q8_0 cache, odd rows per workgroup, a shape that is not the matrix's, the flag without
    // the epilogue's inputs.
    assert!(matches!(Q8GemvPlan::with_rope_kv(&ctx, &cfg, &w, &xa, &y, &rk(&q8)), Err(QuantError::Unsupported { .. })));
    let odd = QuantGemvQ8 { rows_per_workgroup: 1, ..cfg };
    assert!(matches!(Q8GemvPlan::with_rope_kv(&ctx, &odd, &w, &xa, &y, &rk(&f16)), Err(QuantError::Config { .. })));
    let wrong = RopeKv { n_q: 3, ..rk(&f16) };
    assert!(matches!(Q8GemvPlan::with_rope_kv(&ctx, &cfg, &w, &xa, &y, &wrong), Err(QuantError::Shape { .. })));
    assert!(matches!(Q8GemvPlan::new(&ctx, &cfg, &w, &xa, &GemvOutput::Single(y.clone())), Err(QuantError::Config { .. })));
    let f = QuantGemv { rope_kv: true, ..QuantGemv::new(w.kind(), &env, 1) };
    let io = GemvIo::new(x.clone(), y.clone());
    assert!(GemvPlan::with_rope_kv(&ctx, &f, &w, &io, &rk(&f16)).is_ok());
    assert!(matches!(GemvPlan::with_rope_kv(&ctx, &QuantGemv { rows_per_workgroup: 3, ..f }, &w, &io, &rk(&f16)), Err(QuantError::Config { .. })));
    assert!(matches!(GemvPlan::new(&ctx, &f, &w, &io), Err(QuantError::Config { .. })));
}

//! Quantized kernel workloads (boostr::quant): GEMV GB/s of weight bytes at Llama-3-8B shapes and
//! GEMM TFLOP/s at M = 512, each reported beside the streaming-read roofline of the same run.

use std::sync::Arc;

use boostr::formats::{AwqTensors, GgmlType, PackedWeights, repack};
use boostr::quant::gemv::GemvIo;
use boostr::quant::{GemmPlan, GemvPlan, QuantGemm, QuantGemv, QuantMatrix, WeightKind};
use numr::gpu::{BufferKind, GpuBuffer, GpuContext, KernelEnv};
use numr::{NumrError, Result};

use crate::{Measurement, stream_read, time_reps};

/// Llama-3-8B GEMV shapes `(N, K)`: attention out (4096x4096), FFN up (14336x4096) and FFN down
/// (4096x14336).
pub const GEMV_SHAPES: [(usize, usize); 3] = [(4096, 4096), (14336, 4096), (4096, 14336)];

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

fn f16_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

fn err(e: impl std::fmt::Display) -> NumrError {
    NumrError::Validation { context: "quant bench".into(), message: e.to_string() }
}

/// A random `rows x cols` weight of `kind` (int4: AWQ with groups of 128) with small scales.
pub fn random_weight(kind: WeightKind, rows: usize, cols: usize, seed: u64) -> Result<PackedWeights> {
    let mut rng = XorShift(seed | 1);
    let small = 0x2000u16.to_le_bytes(); // f16 0.0078
    match kind {
        WeightKind::Int4 => {
            let g = 128;
            let scales: Vec<u8> = (0..cols / g * rows).flat_map(|_| small).collect();
            let (qw, qz) = (rng.bytes(cols * rows / 2), rng.bytes(cols / g * rows / 2));
            AwqTensors { qweight: &qw, qzeros: &qz, scales: &scales, in_features: cols, out_features: rows, group_size: g }.repack().map_err(err)
        }
        WeightKind::Ggml(ty) => {
            let n = rows * cols;
            let mut data = match ty {
                GgmlType::F32 => (0..n).flat_map(|i| ((i % 17) as f32 * 0.01).to_le_bytes()).collect(),
                GgmlType::F16 | GgmlType::BF16 => (0..n).flat_map(|i| ((i % 7) as u16 * 0x100 + 0x2000).to_le_bytes()).collect(),
                _ => rng.bytes(n / ty.block_size() * ty.type_size()),
            };
            if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                for block in data.chunks_exact_mut(ty.type_size()) {
                    for &off in f16_fields(ty) {
                        block[off..off + 2].copy_from_slice(&small);
                    }
                }
            }
            repack(ty, &data, rows, cols).map_err(err)
        }
    }
}

fn upload_x(ctx: &GpuContext, n: usize) -> Result<Arc<GpuBuffer>> {
    let v: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 1000.0).collect();
    ctx.upload(bytemuck::cast_slice(&v))
}

/// One GEMV of `cfg` over a random `n x k` weight with `m` activation rows. Bytes are the packed
/// weight bytes read (the activations are negligible and cached).
pub fn gemv(ctx: &GpuContext, cfg: &QuantGemv, w: &QuantMatrix, packed_bytes: usize, reps: usize) -> Result<Measurement> {
    let m = cfg.activation_rows as usize;
    let x = upload_x(ctx, m * w.cols)?;
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage)?;
    let io = GemvIo { x: &x, norm_weight: None, outputs: &[&y], qkv_rows: [0; 3], eps: 0.0 };
    let plan = GemvPlan::new(ctx, cfg, w, &io).map_err(err)?;
    let s = time_reps(ctx, reps, 5, |r| {
        let mut rec = ctx.recorder();
        for _ in 0..r {
            plan.record(&mut rec).map_err(err)?;
        }
        rec.submit()
    })?;
    Ok(Measurement {
        label: format!(
            "gemv {} {}x{} m{} r{} t{}{}{}",
            w.format.name(),
            w.rows,
            w.cols,
            m,
            cfg.rows_per_workgroup,
            cfg.threads,
            if cfg.f16_math { " f16" } else { "" },
            if cfg.unchecked { " unchecked" } else { "" }
        ),
        seconds: s,
        bytes: packed_bytes as f64,
        flops: 0.0,
    })
}

/// One GEMM (`m x k` activations times the `n x k` weight).
pub fn gemm(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, m: usize, reps: usize) -> Result<Measurement> {
    let x = upload_x(ctx, m * w.cols)?;
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage)?;
    let plan = GemmPlan::new(ctx, cfg, w, &x, &y, m).map_err(err)?;
    let s = time_reps(ctx, reps, 3, |r| {
        let mut rec = ctx.recorder();
        for _ in 0..r {
            plan.record(&mut rec).map_err(err)?;
        }
        rec.submit()
    })?;
    Ok(Measurement {
        label: format!("gemm {} {}x{}x{} {}", w.format.name(), m, w.cols, w.rows, if cfg.coopmat { "coopmat" } else { "tiled" }),
        seconds: s,
        bytes: 0.0,
        flops: 2.0 * (m * w.rows * w.cols) as f64,
    })
}

/// The quant table: the roofline first, then GEMV per format and shape (plus variants of the
/// main formats at the 4096x14336 shape), then GEMM at M = 512.
pub fn quant_table(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let (roof_bytes, reps) = if quick { (64u64 << 20, 3) } else { (1u64 << 30, 50) };
    let mut v = vec![stream_read(ctx, roof_bytes, if quick { 3 } else { 20 })?];
    let shapes: Vec<(usize, usize)> = if quick { vec![(256, 512)] } else { GEMV_SHAPES.to_vec() };
    let main = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K];
    for kind in WeightKind::all() {
        for (si, &(n, k)) in shapes.iter().enumerate() {
            let p = random_weight(kind, n, k, 7)?;
            let bytes = p.total_bytes();
            let w = QuantMatrix::upload(ctx, "w", &p).map_err(err)?;
            let base = QuantGemv { unchecked: true, ..QuantGemv::new(kind, &env, 1) };
            v.push(gemv(ctx, &base, &w, bytes, reps)?);
            let is_main = matches!(kind, WeightKind::Ggml(t) if main.contains(&t));
            if is_main && si == shapes.len() - 1 {
                for (rpw, threads) in [(2, 128), (4, 64), (4, 256), (8, 128), (1, 32)] {
                    v.push(gemv(ctx, &QuantGemv { rows_per_workgroup: rpw, threads, ..base }, &w, bytes, reps)?);
                }
                if env.f16 {
                    v.push(gemv(ctx, &QuantGemv { f16_math: true, ..base }, &w, bytes, reps)?);
                }
                v.push(gemv(ctx, &QuantGemv { unchecked: false, ..base }, &w, bytes, reps)?);
                v.push(gemv(ctx, &QuantGemv::new(kind, &env, 8), &w, bytes, reps)?);
            }
        }
    }
    let (m, n, k) = if quick { (64, 256, 512) } else { (512, 4096, 4096) };
    let coop = QuantGemm::coopmat_available(ctx);
    for kind in WeightKind::all() {
        let p = random_weight(kind, n, k, 9)?;
        let w = QuantMatrix::upload(ctx, "w", &p).map_err(err)?;
        v.push(gemm(ctx, &QuantGemm { kind, coopmat: false, unchecked: true }, &w, m, if quick { 2 } else { 10 })?);
        if coop {
            v.push(gemm(ctx, &QuantGemm { kind, coopmat: true, unchecked: true }, &w, m, if quick { 2 } else { 10 })?);
        }
    }
    Ok(v)
}

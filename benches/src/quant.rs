//! Quantized kernel workloads (boostr::quant): GEMV GB/s of weight bytes at Llama-3-8B shapes and
//! GEMM TFLOP/s at M = 512, each reported beside the streaming-read roofline of the same run.

use boostr::ops_common::OpPlan;
use std::sync::Arc;

use boostr::formats::{AwqTensors, GgmlType, PackedWeights, repack};
use boostr::quant::gemm::CoopTiles;
use boostr::quant::{GemmPlan, GemvIo, GemvOutput, GemvPlan, Q8Activations, Q8GemvPlan, QuantGemm, QuantGemv, QuantGemvQ8, QuantMatrix, WeightKind};
use numr::gpu::{Binding, BufferKind, GpuBuffer, GpuContext, KernelEnv, StepValues};
use numr::{NumrError, Result};

use crate::{Measurement, stream_read, time_recorded};

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

pub(crate) fn err(e: impl std::fmt::Display) -> NumrError {
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

pub(crate) fn upload_x(ctx: &GpuContext, n: usize) -> Result<Arc<GpuBuffer>> {
    let v: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 1000.0).collect();
    ctx.upload(bytemuck::cast_slice(&v))
}

/// Weight copies to rotate through so that a timed run reads at least 192 MiB of distinct
/// weights (more than the H200's 60 MB L2): every GEMV then streams its matrix from memory.
pub fn copies_for(bytes: usize) -> usize {
    (192usize << 20).div_ceil(bytes.max(1)).max(3)
}

/// Uploads `copies` copies of `p` (separate buffers, same contents).
pub fn upload_copies(ctx: &GpuContext, p: &PackedWeights, copies: usize) -> Result<Vec<QuantMatrix>> {
    (0..copies).map(|_| QuantMatrix::upload(ctx, "w", p).map_err(err)).collect()
}

/// Times `record(rep)` (which records repetition `rep`, reading copy `rep % copies`): the wall
/// clock per repetition from submit to completion of `reps` encoded ahead ([`time_recorded`]), and the median GPU
/// timestamp time of the dispatches whose label starts with `gpu_label` (one profiled submit).
pub(crate) fn time_rotating(
    ctx: &GpuContext,
    reps: usize,
    gpu_label: &str,
    mut record: impl FnMut(&mut numr::gpu::Recorder, usize) -> Result<()>,
) -> Result<(f64, f64)> {
    // time_recorded's warm-up trial touches every copy once (first use of fresh buffers is slower).
    let wall = time_recorded(ctx, reps, 7, &mut record)?;
    let mut rec = ctx.recorder();
    for i in 0..reps {
        record(&mut rec, i)?;
    }
    let prof = rec.submit_profiled()?;
    let mut ns: Vec<f64> = prof.entries.iter().filter(|e| e.0.starts_with(gpu_label)).map(|e| e.1).collect();
    ns.sort_by(|a, b| a.total_cmp(b));
    let gpu = ns.get(ns.len() / 2).copied().unwrap_or(f64::NAN) * 1e-9;
    Ok((wall, gpu))
}

fn gemv_label(name: &str, w: &QuantMatrix, m: usize, cfg: String) -> String {
    format!("{name} {} {}x{} m{m} {cfg}", w.format.name(), w.rows, w.cols)
}

/// The f32-math GEMV of `cfg` rotating over `ws` (copies of one weight): a wall-clock row and a
/// GPU-timestamp row. Bytes are the packed weight bytes read (activations are negligible).
pub fn gemv(ctx: &GpuContext, cfg: &QuantGemv, ws: &[QuantMatrix], packed_bytes: usize, reps: usize) -> Result<Vec<Measurement>> {
    let m = cfg.activation_rows as usize;
    let w0 = &ws[0];
    let x = upload_x(ctx, m * w0.cols)?;
    let y = ctx.alloc(4 * (m * w0.rows) as u64, BufferKind::Storage)?;
    let io = GemvIo::new(Binding::whole(&x), Binding::whole(&y));
    let plans = ws.iter().map(|w| GemvPlan::new(ctx, cfg, w, &io).map_err(err)).collect::<Result<Vec<_>>>()?;
    let step = StepValues::chunk(0, m as u32);
    let (wall, gpu) = time_rotating(ctx, reps, "quant_gemv_", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
    let label = gemv_label(
        "gemv",
        w0,
        m,
        format!("r{} t{}{}{}", cfg.rows_per_workgroup, cfg.threads, if cfg.f16_math { " f16" } else { "" }, if cfg.unchecked { " unchecked" } else { "" }),
    );
    Ok(vec![
        Measurement { label: format!("{label} [wall]"), seconds: wall, bytes: packed_bytes as f64, flops: 0.0 },
        Measurement { label: format!("{label} [gpu]"), seconds: gpu, bytes: packed_bytes as f64, flops: 0.0 },
    ])
}

/// The integer-dot GEMV of `cfg` rotating over `ws`: wall clock of the GEMV alone (activations
/// quantized once, as when several projections share them), wall clock of quantize + GEMV per
/// repetition, and the GPU-timestamp times of the GEMV and of the quantize pass.
pub fn gemv_q8(ctx: &GpuContext, cfg: &QuantGemvQ8, ws: &[QuantMatrix], packed_bytes: usize, reps: usize, with_quantize: bool) -> Result<Vec<Measurement>> {
    let m = cfg.activation_rows as usize;
    let w0 = &ws[0];
    let x = upload_x(ctx, m * w0.cols)?;
    let y = ctx.alloc(4 * (m * w0.rows) as u64, BufferKind::Storage)?;
    let xa = Q8Activations::new(ctx, &Binding::whole(&x), m, w0.cols).map_err(err)?;
    let out = GemvOutput::Single(Binding::whole(&y));
    let plans = ws.iter().map(|w| Q8GemvPlan::new(ctx, cfg, w, &xa, &out).map_err(err)).collect::<Result<Vec<_>>>()?;
    let step = StepValues::chunk(0, m as u32);
    let mut rec = ctx.recorder();
    xa.record(&mut rec, &step).map_err(err)?;
    rec.submit()?;
    let (wall, gpu) = time_rotating(ctx, reps, "quant_gemv_q8", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
    let label = gemv_label(
        "gemv-q8",
        w0,
        m,
        format!(
            "r{} t{} u{}{}{}{}{}",
            cfg.rows_per_workgroup,
            cfg.threads,
            cfg.unroll,
            if cfg.contiguous { "c" } else { "" },
            if cfg.prefetch { " prefetch" } else { "" },
            if cfg.subgroup_rows > 0 { format!(" sg-rows{}", cfg.subgroup_rows) } else { String::new() },
            if cfg.unchecked { " unchecked" } else { "" }
        ),
    );
    let b = packed_bytes as f64;
    let mut v = vec![
        Measurement { label: format!("{label} [wall]"), seconds: wall, bytes: b, flops: 0.0 },
        Measurement { label: format!("{label} [gpu]"), seconds: gpu, bytes: b, flops: 0.0 },
    ];
    if with_quantize {
        // The same GEMVs, each writing an output of its own: no hazard between dispatches, so no
        // barrier, and the GPU may overlap one GEMV's tail with the next one's start (as with
        // the independent projections of a layer: Q/K/V, gate/up).
        let free = (0..reps)
            .map(|i| {
                let w = &ws[i % ws.len()];
                let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage)?;
                Q8GemvPlan::new(ctx, cfg, w, &xa, &GemvOutput::Single(Binding::whole(&y))).map_err(err)
            })
            .collect::<Result<Vec<_>>>()?;
        let (wall_free, _) = time_rotating(ctx, reps, "quant_gemv_q8", |rec, i| free[i].record(rec, &step).map_err(err))?;
        v.push(Measurement { label: format!("{label} independent outputs, no barriers [wall]"), seconds: wall_free, bytes: b, flops: 0.0 });
        let (wall2, gpu_q) = time_rotating(ctx, reps, "quantize_q8", |rec, i| {
            xa.record(rec, &step).map_err(err)?;
            plans[i % plans.len()].record(rec, &step).map_err(err)
        })?;
        v.push(Measurement { label: format!("{label} +quantize [wall]"), seconds: wall2, bytes: b, flops: 0.0 });
        v.push(Measurement { label: format!("quantize_q8 m{m} k{} [gpu]", w0.cols), seconds: gpu_q, bytes: (m * w0.cols * 4) as f64, flops: 0.0 });
    }
    Ok(v)
}

/// The attention block's input at Llama-3-8B shapes (K = 4096; Q 4096, K 1024, V 1024 rows) on
/// the integer-dot path, rotating over weight copies: RMSNorm + quantize fused into one dispatch
/// plus one fused Q/K/V GEMV, against the unfused chain (RMSNorm, quantize, three GEMVs), and the
/// fused pair's dispatch alone. Bytes are the Q/K/V weight bytes.
pub fn qkv_block(ctx: &GpuContext, kind: WeightKind, reps: usize, quick: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let (k, rows) = if quick { (512, [64, 32, 32]) } else { (4096, [4096, 1024, 1024]) };
    let parts = rows.iter().enumerate().map(|(i, &n)| random_weight(kind, n, k, 11 + i as u64)).collect::<Result<Vec<_>>>()?;
    let qkv = boostr::quant::upload::concat_rows(&[&parts[0], &parts[1], &parts[2]]).map_err(err)?;
    let bytes = qkv.total_bytes();
    let copies = if quick { 2 } else { copies_for(bytes) };
    let fused_w = upload_copies(ctx, &qkv, copies)?;
    let sep_w: Vec<Vec<QuantMatrix>> = parts.iter().map(|p| upload_copies(ctx, p, copies)).collect::<Result<_>>()?;
    let x = upload_x(ctx, k)?;
    let nw = upload_x(ctx, k)?;
    let normed = ctx.alloc(4 * k as u64, BufferKind::Storage)?;
    let ys: Vec<_> = rows.iter().map(|&n| ctx.alloc(4 * n as u64, BufferKind::Storage)).collect::<Result<_>>()?;
    // Fused: one norm+quantize dispatch, one QKV dispatch.
    let xa_norm = Q8Activations::with_rms_norm(ctx, &Binding::whole(&x), &Binding::whole(&nw), 1, k, 1e-5, false).map_err(err)?;
    let cfg = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::new(kind, &env, 1) };
    let qkv_cfg = QuantGemvQ8 { split_qkv: true, ..cfg };
    let yb: Vec<Binding> = ys.iter().map(Binding::whole).collect();
    let fused =
        fused_w.iter().map(|w| Q8GemvPlan::new_qkv(ctx, &qkv_cfg, w, &xa_norm, [&yb[0], &yb[1], &yb[2]], rows).map_err(err)).collect::<Result<Vec<_>>>()?;
    let step = StepValues::decode(0);
    let t_fused = time_recorded(ctx, reps, 7, |rec, i| {
        xa_norm.record(rec, &step).map_err(err)?;
        fused[i % copies].record(rec, &step).map_err(err)
    })?;
    let t_qkv = time_recorded(ctx, reps, 7, |rec, i| fused[i % copies].record(rec, &step).map_err(err))?;
    // Unfused: the f32 RMSNorm kernel of boostr::norm, a quantize, three GEMVs.
    let norm_io = boostr::norm::NormIo { x: (&x).into(), w: (&nw).into(), b: None, residual: None, out: Some((&normed).into()) };
    let norm = boostr::norm::NormPlan::new(ctx, &boostr::norm::Norm::rms(), &norm_io, k, 1, 1e-5).map_err(err)?;
    let xa = Q8Activations::new(ctx, &Binding::whole(&normed), 1, k).map_err(err)?;
    let sep: Vec<Vec<Q8GemvPlan>> = (0..3)
        .map(|j| {
            let cfg = QuantGemvQ8::for_matrix(kind, &env, 1, rows[j], k);
            sep_w[j].iter().map(|w| Q8GemvPlan::new(ctx, &cfg, w, &xa, &GemvOutput::Single(yb[j].clone())).map_err(err)).collect()
        })
        .collect::<Result<_>>()?;
    let t_sep = time_recorded(ctx, reps, 7, |rec, i| {
        norm.record(rec, &step).map_err(err)?;
        xa.record(rec, &step).map_err(err)?;
        for plans in &sep {
            plans[i % copies].record(rec, &step).map_err(err)?;
        }
        Ok(())
    })?;
    let label = format!("attention input {} K{k} Q/K/V {}+{}+{}", kind.name(), rows[0], rows[1], rows[2]);
    let b = bytes as f64;
    Ok(vec![
        Measurement { label: format!("{label}: norm+quantize, fused QKV (2 dispatches) [wall]"), seconds: t_fused, bytes: b, flops: 0.0 },
        Measurement { label: format!("{label}: fused QKV GEMV alone [wall]"), seconds: t_qkv, bytes: b, flops: 0.0 },
        Measurement { label: format!("{label}: norm, quantize, 3 GEMVs (5 dispatches) [wall]"), seconds: t_sep, bytes: b, flops: 0.0 },
    ])
}

/// Integer-dot GEMV configurations of the sweep: (rows per workgroup, threads, unroll, contiguous).
pub const SWEEP: [(u32, u32, u32, bool); 14] = [
    (1, 32, 2, false),
    (1, 64, 2, false),
    (1, 128, 2, false),
    (2, 32, 2, false),
    (2, 64, 1, false),
    (2, 64, 4, false),
    (2, 64, 2, true),
    (2, 128, 2, false),
    (2, 256, 1, false),
    (4, 32, 2, false),
    (4, 64, 2, false),
    (4, 128, 1, false),
    (4, 64, 4, true),
    (8, 64, 1, false),
];

/// One GEMM (`m x k` activations times the `n x k` weight).
pub fn gemm(ctx: &GpuContext, cfg: &QuantGemm, w: &QuantMatrix, m: usize, reps: usize) -> Result<Measurement> {
    gemm_tiles(ctx, cfg, CoopTiles::DEFAULT, w, m, reps)
}

/// Keeps the GPU busy with `plan`-sized work for about `secs` so that its clocks are up before a
/// compute-bound measurement (from idle, the first GEMMs run several times slower).
pub fn warm_clocks(ctx: &GpuContext, secs: f64) -> Result<()> {
    let w = QuantMatrix::upload(ctx, "warm", &random_weight(WeightKind::Ggml(GgmlType::Q8_0), 4096, 4096, 3)?).map_err(err)?;
    let x = upload_x(ctx, 512 * 4096)?;
    let y = ctx.alloc(4 * 512 * 4096, BufferKind::Storage)?;
    let kind = WeightKind::Ggml(GgmlType::Q8_0);
    let plan = GemmPlan::new(ctx, &QuantGemm::new(kind, ctx), &w, &Binding::whole(&x), &Binding::whole(&y), 512).map_err(err)?;
    let t = std::time::Instant::now();
    while t.elapsed().as_secs_f64() < secs {
        let mut rec = ctx.recorder();
        for _ in 0..20 {
            plan.record(&mut rec, &StepValues::chunk(0, 512)).map_err(err)?;
        }
        rec.submit()?;
        ctx.sync()?;
    }
    Ok(())
}

/// One GEMM with an explicit coopmat block shape.
pub fn gemm_tiles(ctx: &GpuContext, cfg: &QuantGemm, tiles: CoopTiles, w: &QuantMatrix, m: usize, reps: usize) -> Result<Measurement> {
    let x = upload_x(ctx, m * w.cols)?;
    let y = ctx.alloc(4 * (m * w.rows) as u64, BufferKind::Storage)?;
    let plan = GemmPlan::with_tiles(ctx, cfg, tiles, w, &Binding::whole(&x), &Binding::whole(&y), m).map_err(err)?;
    let step = StepValues::chunk(0, m as u32);
    let s = time_recorded(ctx, reps, 7, |rec, _| {
        plan.record(rec, &step).map_err(err)?;
        Ok(())
    })?;
    Ok(Measurement {
        label: format!(
            "gemm {} {}x{}x{} {}{}",
            w.format.name(),
            m,
            w.cols,
            w.rows,
            if cfg.coopmat {
                format!("coopmat {}x{}x{} sg{}x{}{}", tiles.bm, tiles.bn, tiles.bk, tiles.sg_m, tiles.sg_n, if tiles.prefetch { " prefetch" } else { "" })
            } else {
                "tiled".into()
            },
            if cfg.x_f16 { " f16 input" } else { "" }
        ),
        seconds: s,
        bytes: 0.0,
        flops: 2.0 * (m * w.rows * w.cols) as f64,
    })
}

/// The quant table: the roofline first, then GEMV per format and shape, then GEMM at M = 512.
/// Every GEMV rotates over weight copies totalling at least 192 MiB (so the L2 cannot hold
/// them) and is reported twice: `[wall]` (wall clock per GEMV over one submit of many, so it
/// includes the barrier between dispatches) and `[gpu]` (median GPU timestamp per dispatch).
/// `mode`: `""` for everything, `"gemv"` stops after the GEMV rows, `"sweep"` adds a sweep of the
/// integer-dot GEMV's configurations for the main formats (`cargo xtask bench --kernels --only gemv`).
pub fn quant_table(ctx: &GpuContext, quick: bool, mode: &str) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let (roof_bytes, reps) = if quick { (64u64 << 20, 3) } else { (1u64 << 30, 100) };
    let mut v = vec![stream_read(ctx, roof_bytes, if quick { 3 } else { 20 })?];
    let shapes: Vec<(usize, usize)> = if quick { vec![(256, 512)] } else { GEMV_SHAPES.to_vec() };
    let main = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K];
    let is_main = |kind: WeightKind| matches!(kind, WeightKind::Ggml(t) if main.contains(&t));
    let mut kinds: Vec<WeightKind> = main.iter().map(|&t| WeightKind::Ggml(t)).collect();
    kinds.extend(WeightKind::all().into_iter().filter(|&k| !is_main(k)));
    // What any dispatch of one GEMV's bytes gets: the streaming read of Q4_0 4096x14336's bytes,
    // in a dependent chain and without barriers.
    let (sn, sk) = shapes[shapes.len() - 1];
    let q4_bytes = random_weight(WeightKind::Ggml(GgmlType::Q4_0), sn, sk, 7)?.total_bytes() as u64 / 16 * 16;
    for independent in [false, true] {
        v.extend(crate::probe::stream_rotating(ctx, q4_bytes, 4, independent, reps, quick)?);
    }
    for kind in kinds {
        for (si, &(n, k)) in shapes.iter().enumerate() {
            let last = si == shapes.len() - 1;
            let p = random_weight(kind, n, k, 7)?;
            let bytes = p.total_bytes();
            let ws = upload_copies(ctx, &p, if quick { 2 } else { copies_for(bytes) })?;
            if (is_main(kind) && last) || !QuantGemvQ8::supports(kind) {
                v.extend(gemv(ctx, &QuantGemv { unchecked: true, ..QuantGemv::new(kind, &env, 1) }, &ws, bytes, reps)?);
            }
            if QuantGemvQ8::supports(kind) {
                let q8 = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::for_matrix(kind, &env, 1, n, k) };
                v.extend(gemv_q8(ctx, &q8, &ws, bytes, reps, is_main(kind))?);
                if is_main(kind) && mode == "gemv" {
                    v.extend(gemv_q8(ctx, &QuantGemvQ8 { rows_per_workgroup: 2, ..q8 }, &ws, bytes, reps, true)?);
                }
                if is_main(kind) && last {
                    v.extend(gemv(ctx, &QuantGemv { unchecked: true, ..QuantGemv::new(kind, &env, 8) }, &ws, bytes, reps)?);
                    let q8m8 = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::new(kind, &env, 8) };
                    v.extend(gemv_q8(ctx, &q8m8, &ws, bytes, reps, false)?);
                }
                if mode == "sweep" && is_main(kind) && si != 1 {
                    for (r, t, u, c) in SWEEP {
                        let cfg = QuantGemvQ8 { rows_per_workgroup: r, threads: t, unroll: u, contiguous: c, ..q8 };
                        v.extend(gemv_q8(ctx, &cfg, &ws, bytes, reps, false)?);
                    }
                }
            }
            drop(ws);
        }
        if mode == "sweep" && !is_main(kind) {
            break;
        }
    }
    if mode.is_empty() || mode == "gemv" {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
            v.extend(qkv_block(ctx, WeightKind::Ggml(ty), reps, quick)?);
        }
    }
    // GPU timestamps around single dispatches run several microseconds long on the H200 (they
    // serialise the pass), so the table keeps the wall-clock rows; `--only probe` shows both.
    v.retain(|m| !m.label.ends_with("[gpu]"));
    if mode == "gemv" || mode == "sweep" {
        return Ok(v);
    }
    if !quick {
        warm_clocks(ctx, 1.0)?;
    }
    let (m, n, k) = if quick { (64, 256, 512) } else { (512, 4096, 4096) };
    let coop = QuantGemm::coopmat_available(ctx);
    for kind in WeightKind::all() {
        let p = random_weight(kind, n, k, 9)?;
        let w = QuantMatrix::upload(ctx, "w", &p).map_err(err)?;
        v.push(gemm(ctx, &QuantGemm { kind, coopmat: false, unchecked: true, x_f16: false }, &w, m, if quick { 2 } else { 30 })?);
        if coop {
            v.push(gemm(ctx, &QuantGemm { kind, coopmat: true, unchecked: true, x_f16: false }, &w, m, if quick { 2 } else { 30 })?);
        }
    }
    Ok(v)
}

/// The coopmat GEMM over every candidate block shape at M = 512: N = K = 4096 for the main
/// formats (the default shape on f32 and on f16 activations), then Q4_0 at Llama-3-8B's four
/// prefill shapes (every shape on f32, then on f16 activations) (QKV 6144x4096, O 4096x4096, gate/up
/// 28672x4096, down 4096x14336), after warming the clocks (`cargo xtask bench --kernels --only gemm`).
pub fn gemm_sweep(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let (m, n, k) = if quick { (64, 256, 512) } else { (512, 4096, 4096) };
    let mut v = Vec::new();
    if !QuantGemm::coopmat_available(ctx) {
        return Ok(v);
    }
    if !quick {
        warm_clocks(ctx, 1.0)?;
    }
    let max_shared = ctx.capabilities().limits.max_compute_workgroup_storage_size;
    let reps = if quick { 2 } else { 30 };
    let tiles: Vec<CoopTiles> = CoopTiles::candidates();
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let kind = WeightKind::Ggml(ty);
        let w = QuantMatrix::upload(ctx, "w", &random_weight(kind, n, k, 9)?).map_err(err)?;
        for x_f16 in [false, true] {
            v.push(gemm_tiles(ctx, &QuantGemm { kind, coopmat: true, unchecked: true, x_f16 }, CoopTiles::DEFAULT, &w, m, reps)?);
        }
    }
    let shapes: &[(usize, usize)] = if quick { &[(256, 512)] } else { &[(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)] };
    let kind = WeightKind::Ggml(GgmlType::Q4_0);
    for &(n, k) in shapes {
        let w = QuantMatrix::upload(ctx, "w", &random_weight(kind, n, k, 9)?).map_err(err)?;
        for x_f16 in [false, true] {
            for t in tiles.iter().copied().filter(|t| t.valid(max_shared)) {
                v.push(gemm_tiles(ctx, &QuantGemm { kind, coopmat: true, unchecked: true, x_f16 }, t, &w, m, reps)?);
            }
        }
    }
    Ok(v)
}

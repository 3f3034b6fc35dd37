//! The decode step's largest GEMV, Llama-3-8B's gate and up packed into one Q4_0 matrix of
//! 28672x4096, in every workgroup shape worth trying and with what the engine fuses into it (the
//! deferred RMSNorm of its input, the GLU + int8 quantization of its output), each as a dependent
//! chain beside the streaming read of the same bytes (`cargo xtask bench --kernels --only tall`).

use boostr::act::ActKind;
use boostr::formats::GgmlType;
use boostr::quant::{GemvOutput, Q8Activations, Q8Epilogue, Q8GemvPlan, QuantGemvQ8, QuantMatrix, WeightKind};
use numr::Result;
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};

use crate::Measurement;
use crate::quant::{copies_for, err, gemv_q8, random_weight, time_rotating, upload_copies, upload_x};

/// Workgroup shapes of the sweep: (rows, threads, unroll, contiguous, subgroup rows, row
/// groups, prefetch).
const SHAPES: [(u32, u32, u32, bool, u32, u32, bool); 22] = [
    (1, 32, 2, false, 0, 1, false),
    (4, 32, 2, false, 0, 1, false),
    (8, 32, 2, false, 0, 1, false),
    (4, 32, 1, false, 0, 1, false),
    (8, 32, 1, false, 0, 1, false),
    (16, 32, 1, false, 0, 1, false),
    (2, 64, 1, false, 0, 1, false),
    (4, 64, 1, false, 0, 1, false),
    (4, 64, 2, false, 0, 1, false),
    (8, 64, 1, false, 0, 1, false),
    (2, 128, 1, false, 0, 1, false),
    (2, 32, 4, true, 0, 1, false),
    (4, 32, 4, true, 0, 1, false),
    (2, 32, 2, false, 0, 1, true),
    (2, 32, 2, false, 0, 2, false),
    (4, 128, 2, false, 1, 1, false),
    (8, 256, 2, false, 1, 1, false),
    (8, 128, 2, false, 2, 1, false),
    (16, 256, 2, false, 2, 1, false),
    (8, 64, 2, false, 4, 1, false),
    (16, 128, 1, false, 4, 1, false),
    (32, 256, 1, false, 4, 1, false),
];

/// Workgroup shapes tried with the engine's fusions (rows, threads, unroll, subgroup rows): an
/// epilogue's arrival costs each workgroup, so fewer workgroups of more rows may win there.
const FUSED_SHAPES: [(u32, u32, u32, u32); 14] = [
    (4, 32, 2, 0),
    (8, 32, 1, 0),
    (4, 64, 1, 0),
    (8, 64, 1, 0),
    (8, 128, 1, 0),
    (8, 128, 2, 2),
    (16, 256, 2, 2),
    (16, 128, 2, 4),
    (32, 256, 1, 4),
    (32, 512, 2, 2),
    (16, 512, 2, 1),
    (32, 512, 1, 2),
    (32, 1024, 2, 1),
    (8, 256, 2, 1),
];

/// Workgroup shapes tried with the workgroup-local GLU epilogue (`Q8Epilogue::GluLocal`: each
/// workgroup owns whole blocks, so no arrival counter), with the deferred RMSNorm (rows, threads,
/// unroll, subgroup rows).
const LOCAL_SHAPES: [(u32, u32, u32, u32); 12] = [
    (64, 256, 2, 2),
    (64, 512, 1, 1),
    (64, 512, 1, 2),
    (64, 512, 1, 4),
    (64, 512, 2, 4),
    (64, 256, 1, 4),
    (64, 1024, 1, 2),
    (64, 1024, 2, 2),
    (64, 1024, 1, 1),
    (128, 1024, 1, 4),
    (128, 1024, 2, 4),
    (128, 512, 1, 4),
];

/// The sweep (see the module docs).
pub fn tall_sweep(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let (n, k, reps) = if quick { (512, 512, 3) } else { (28672, 4096, 100) };
    let kind = WeightKind::Ggml(GgmlType::Q4_0);
    let p = random_weight(kind, n, k, 7)?;
    let bytes = p.total_bytes();
    let mut v = Vec::new();
    for independent in [false, true] {
        v.extend(crate::probe::stream_rotating(ctx, bytes as u64 / 16 * 16, 4, independent, reps, quick)?);
    }
    let ws = upload_copies(ctx, &p, if quick { 2 } else { copies_for(bytes) })?;
    let base = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::for_matrix(kind, &env, 1, n, k) };
    v.extend(gemv_q8(ctx, &base, &ws, bytes, reps, true)?);
    if Q8GemvPlan::epilogue_supported(ctx, Q8Epilogue::Glu { act: ActKind::Silu }) {
        for (rms, glu) in [(true, false), (false, true), (true, true)] {
            v.push(fused(ctx, &base, &ws, bytes, reps, rms, glu)?);
        }
        for (r, t, u, sg) in FUSED_SHAPES {
            let cfg = QuantGemvQ8 { rows_per_workgroup: r, threads: t, unroll: u, subgroup_rows: sg, ..base };
            v.push(fused(ctx, &cfg, &ws, bytes, reps, true, true)?);
        }
    }
    for (r, t, u, sg) in LOCAL_SHAPES {
        let cfg =
            QuantGemvQ8 { rows_per_workgroup: r, threads: t, unroll: u, subgroup_rows: sg, epilogue: Q8Epilogue::GluLocal { act: ActKind::Silu }, ..base };
        v.push(fused(ctx, &cfg, &ws, bytes, reps, true, true)?);
    }
    for (r, t, u, c, sg, g, pf) in SHAPES {
        let cfg = QuantGemvQ8 { rows_per_workgroup: r, threads: t, unroll: u, contiguous: c, subgroup_rows: sg, row_groups: g, prefetch: pf, ..base };
        let mut rows = gemv_q8(ctx, &cfg, &ws, bytes, reps, false)?;
        if g > 1 {
            rows.iter_mut().for_each(|m| m.label = m.label.replacen(" [", &format!(" g{g} ["), 1));
        }
        v.extend(rows);
    }
    v.retain(|m| !m.label.ends_with("[gpu]"));
    Ok(v)
}

/// The GEMV of `cfg` as the engine runs it, in a dependent chain over `ws`: with `rms` its
/// input defers an RMSNorm (`rms_scale`), with `glu` it quantizes `silu(gate) * up` of its output
/// for the next projection (`Q8Epilogue::Glu`).
fn fused(ctx: &GpuContext, cfg: &QuantGemvQ8, ws: &[QuantMatrix], bytes: usize, reps: usize, rms: bool, glu: bool) -> Result<Measurement> {
    let w0 = &ws[0];
    let x = upload_x(ctx, w0.cols)?;
    let x = Binding::whole(&x);
    let nw = ctx.upload(bytemuck::cast_slice(&vec![1.0f32; w0.cols]))?;
    let xa = if rms {
        Q8Activations::with_deferred_rms_norm(ctx, &x, &Binding::whole(&nw), 1, w0.cols, 1e-5, false).map_err(err)?
    } else {
        Q8Activations::new(ctx, &x, 1, w0.cols).map_err(err)?
    };
    let y = ctx.alloc(4 * w0.rows as u64, BufferKind::Storage)?;
    let out = GemvOutput::Single(Binding::whole(&y));
    let target = Q8Activations::written_by_producer(ctx, w0.rows / 2, None).map_err(err)?;
    // A config that names its GLU epilogue keeps it (the workgroup-local one).
    let epilogue = match (glu, cfg.epilogue) {
        (false, _) => Q8Epilogue::None,
        (true, e) if e.is_glu() => e,
        (true, _) => Q8Epilogue::Glu { act: ActKind::Silu },
    };
    let cfg = QuantGemvQ8 { rms_scale: rms, epilogue, ..*cfg };
    let plans = ws
        .iter()
        .map(|w| if glu { Q8GemvPlan::with_epilogue(ctx, &cfg, w, &xa, &out, &target, None) } else { Q8GemvPlan::new(ctx, &cfg, w, &xa, &out) }.map_err(err))
        .collect::<Result<Vec<_>>>()?;
    let step = StepValues::chunk(0, 1);
    let mut rec = ctx.recorder();
    xa.record(&mut rec, &step).map_err(err)?;
    rec.submit()?;
    let (wall, _) = time_rotating(ctx, reps, "quant_gemv_q8", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
    let label = format!(
        "gemv-q8 Q4_0 {}x{} r{} t{} u{}{}{}{} [wall]",
        w0.rows,
        w0.cols,
        cfg.rows_per_workgroup,
        cfg.threads,
        cfg.unroll,
        if cfg.subgroup_rows > 0 { format!(" sg-rows{}", cfg.subgroup_rows) } else { String::new() },
        if rms { " +deferred rms" } else { "" },
        match epilogue {
            Q8Epilogue::GluLocal { .. } => " +GLU quantize epilogue (workgroup-local blocks)",
            Q8Epilogue::None => "",
            _ => " +GLU quantize epilogue",
        }
    );
    Ok(Measurement { label, seconds: wall, bytes: bytes as f64, flops: 0.0 })
}

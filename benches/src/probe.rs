//! Diagnostics for the GEMV's fixed cost (`cargo xtask bench --kernels --only probe`): what a
//! dispatch the size of one GEMV costs before any GEMV work, so that the GEMV rows can be read
//! against what the GPU gives any kernel of that size.
//!
//! - The streaming read of exactly one GEMV's weight bytes, rotating over copies past the L2
//!   (the small-read roofline), wall clock and GPU timestamps.
//! - An empty grid of the GEMV's shape (4096 workgroups of 32 invocations writing one word).
//! - The integer-dot GEMV rotating over copies and on one L2-resident copy.

use std::sync::Arc;

use numr::Result;
use numr::gpu::{Access, Binding, BoundGroup, BufferKind, GpuBuffer, GpuContext, Kernel, KernelBuilder, KernelEnv, grid_2d};
use numr::kernels::stream::StreamRead;

use crate::quant::{copies_for, gemv_q8, random_weight, time_rotating, upload_copies};
use crate::{Measurement, dispatch_overhead, stream_read};
use boostr::formats::GgmlType;
use boostr::quant::{QuantGemvQ8, WeightKind};

/// Wall seconds per dispatch of `k` over `reps` dispatches in one submit (bind group `i % len`
/// for dispatch `i`), and the median GPU timestamp time.
fn time_dispatches(ctx: &GpuContext, reps: usize, k: &Kernel, groups: &[BoundGroup], params: &[u32], grid: [u32; 3]) -> Result<(f64, f64)> {
    time_rotating(ctx, reps, k.name(), |rec, i| rec.dispatch(k, &groups[i % groups.len()], params, grid))
}

/// A streaming read of `bytes` per dispatch rotating over copies (one vec4 per invocation when
/// `per_thread == 1`, else `per_thread` vec4 in a grid-stride loop).
pub fn stream_rotating(ctx: &GpuContext, bytes: u64, per_thread: u64, independent: bool, reps: usize, quick: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(&StreamRead.source(&env))?;
    let n_vec4 = (bytes / 16) as u32;
    let wgs = (n_vec4 as u64).div_ceil(256 * per_thread) as u32;
    let copies = if quick { 2 } else { copies_for(bytes as usize) };
    let srcs: Vec<Arc<GpuBuffer>> = (0..copies).map(|_| ctx.alloc(bytes, BufferKind::Storage)).collect::<Result<_>>()?;
    let dsts: Vec<Arc<GpuBuffer>> = (0..if independent { reps } else { 1 }).map(|_| ctx.alloc(wgs as u64 * 4, BufferKind::Storage)).collect::<Result<_>>()?;
    let groups: Vec<BoundGroup> =
        (0..reps).map(|i| ctx.bind(&k, &[Binding::whole(&srcs[i % copies]), Binding::whole(&dsts[i % dsts.len()])])).collect::<Result<_>>()?;
    let grid = grid_2d(wgs as u64, 65535).expect("grid");
    let (wall, gpu) = time_dispatches(ctx, reps, &k, &groups, &[n_vec4, wgs * 256], grid)?;
    let label =
        format!("stream read {:.1} MB x{copies} rotating, {per_thread} vec4/invocation{}", bytes as f64 / 1e6, if independent { ", no barriers" } else { "" });
    Ok(vec![
        Measurement { label: format!("{label} [wall]"), seconds: wall, bytes: bytes as f64, flops: 0.0 },
        Measurement { label: format!("{label} [gpu]"), seconds: gpu, bytes: bytes as f64, flops: 0.0 },
    ])
}

/// An empty grid of `wgs` workgroups of `threads` (each workgroup writes one word), into one
/// buffer for all repetitions (a barrier between dispatches) or one per repetition.
fn empty_grid(ctx: &GpuContext, wgs: u32, threads: u32, reps: usize, independent: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let k = ctx.kernel(
        &KernelBuilder::new(format!("empty_grid_t{threads}"), env)
            .workgroup(threads, 1, 1)
            .storage("y", Access::ReadWrite, "array<u32>")
            .params(&["n"])
            .body("    if (lidx == 0u && wg_linear < p.n) { y[wg_linear] = wg_linear; }\n")
            .build(),
    )?;
    let groups: Vec<BoundGroup> = (0..if independent { reps } else { 1 })
        .map(|_| ctx.bind(&k, &[Binding::whole(&ctx.alloc(wgs as u64 * 4, BufferKind::Storage)?)]))
        .collect::<Result<_>>()?;
    let (wall, gpu) = time_dispatches(ctx, reps, &k, &groups, &[wgs], grid_2d(wgs as u64, 65535).expect("grid"))?;
    let label = format!("empty grid {wgs} x {threads} invocations{}", if independent { ", no barriers" } else { "" });
    Ok(vec![
        Measurement { label: format!("{label} [wall]"), seconds: wall, bytes: 0.0, flops: 0.0 },
        Measurement { label: format!("{label} [gpu]"), seconds: gpu, bytes: 0.0, flops: 0.0 },
    ])
}

/// A GEMV-shaped read with no math: workgroup `w` of `threads` reads row `w` (`cpr` vec4 words)
/// in steps of `unroll` vec4 per invocation, `threads` apart; `prefetch` loads the next step's
/// words before folding the current ones. Isolates the access pattern's streaming rate.
#[allow(clippy::too_many_arguments)]
fn row_stream(
    ctx: &GpuContext,
    rows: u32,
    cpr: u32,
    threads: u32,
    unroll: u32,
    prefetch: bool,
    independent: bool,
    reps: usize,
    quick: bool,
) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let mut body = String::from("    let base = wg_linear * p.cpr;\n    var acc = vec4<u32>(0u);\n");
    let load = |dst: &str, kb: &str| -> String {
        (0..unroll).map(|u| format!("        {dst}{u} = src[base + min({kb} + {u}u * {threads}u, p.cpr - 1u)];\n")).collect()
    };
    if prefetch {
        for u in 0..unroll {
            body.push_str(&format!("    var n{u} = vec4<u32>(0u);\n"));
        }
        body.push_str(&load("n", "lidx").replace("        ", "    "));
        body.push_str(&format!("    for (var kb = lidx; kb < p.cpr; kb += {}u) {{\n", threads * unroll));
        for u in 0..unroll {
            body.push_str(&format!("        let c{u} = n{u};\n"));
        }
        body.push_str(&load("n", &format!("(kb + {}u)", threads * unroll)));
        for u in 0..unroll {
            body.push_str(&format!("        acc ^= c{u};\n"));
        }
        body.push_str("    }\n");
    } else {
        body.push_str(&format!("    for (var kb = lidx; kb < p.cpr; kb += {}u) {{\n", threads * unroll));
        for u in 0..unroll {
            body.push_str(&format!("        acc ^= src[base + min(kb + {u}u * {threads}u, p.cpr - 1u)];\n"));
        }
        body.push_str("    }\n");
    }
    body.push_str("    if (acc.x == 0x12345678u) { dst[wg_linear] = acc.y; }\n");
    let src = KernelBuilder::new(format!("row_stream_t{threads}_u{unroll}{}", if prefetch { "_pf" } else { "" }), env)
        .workgroup(threads, 1, 1)
        .storage("src", Access::Read, "array<vec4<u32>>")
        .storage("dst", Access::ReadWrite, "array<u32>")
        .params(&["cpr"])
        .body(&body)
        .build();
    // The bounds invariant below needs exactly `rows` workgroups (a one-dimensional grid) and
    // at least one vec4 per row.
    if rows == 0 || rows > 65535 || cpr == 0 {
        return Err(numr::NumrError::Validation {
            context: "row stream probe".into(),
            message: format!("{rows} rows of {cpr} vec4 (1..=65535 rows, cpr >= 1)"),
        });
    }
    // SAFETY: the grid is `[rows, 1, 1]` (checked above), so `wg_linear < rows`; every `src`
    // index is `wg_linear * cpr + min(.., cpr - 1) < rows * cpr`, and each source buffer below
    // holds `rows * cpr` vec4 words; `dst[wg_linear]` is below the `rows` words of each output.
    let k = ctx.kernel(&unsafe { src.assume_in_bounds() })?;
    let bytes = rows as u64 * cpr as u64 * 16;
    let copies = if quick { 2 } else { copies_for(bytes as usize) };
    let srcs: Vec<Arc<GpuBuffer>> = (0..copies).map(|_| ctx.alloc(bytes, BufferKind::Storage)).collect::<Result<_>>()?;
    // One output for all (a barrier between dispatches), or one per repetition (none).
    let dsts: Vec<Arc<GpuBuffer>> = (0..if independent { reps } else { 1 }).map(|_| ctx.alloc(rows as u64 * 4, BufferKind::Storage)).collect::<Result<_>>()?;
    let groups: Vec<BoundGroup> =
        (0..reps).map(|i| ctx.bind(&k, &[Binding::whole(&srcs[i % copies]), Binding::whole(&dsts[i % dsts.len()])])).collect::<Result<_>>()?;
    let (wall, _) = time_dispatches(ctx, reps, &k, &groups, &[cpr], grid_2d(rows as u64, 65535).expect("grid"))?;
    Ok(vec![Measurement {
        label: format!(
            "row stream {rows} rows x {} B, t{threads} u{unroll}{}{} [wall]",
            cpr * 16,
            if prefetch { " prefetch" } else { "" },
            if independent { ", no barriers" } else { "" }
        ),
        seconds: wall,
        bytes: bytes as f64,
        flops: 0.0,
    }])
}

/// Configurations of the probe sweep: (rows per workgroup, threads, rows per subgroup (0: the
/// workgroup splits K), unroll, contiguous (K-quants: whole super-blocks at unroll 8)).
pub const SG_SWEEP: [(u32, u32, u32, u32, bool); 8] = [
    (2, 32, 0, 2, false),
    (1, 32, 0, 4, false),
    (1, 64, 0, 2, false),
    (1, 64, 0, 1, false),
    (4, 128, 1, 2, false),
    (4, 128, 1, 4, false),
    (2, 64, 1, 4, false),
    (8, 256, 1, 2, false),
];

/// Eight-activation-row configurations of the probe sweep (rows per workgroup, threads, rows
/// per subgroup, unroll).
pub const M8_SWEEP: [(u32, u32, u32, u32); 12] = [
    (2, 64, 0, 1),
    (1, 32, 0, 1),
    (2, 32, 0, 1),
    (4, 32, 0, 1),
    (4, 64, 0, 1),
    (8, 64, 0, 1),
    (2, 128, 0, 1),
    (4, 128, 1, 1),
    (8, 256, 1, 1),
    (8, 128, 2, 1),
    (16, 256, 2, 1),
    (8, 64, 4, 1),
];

/// The probe table (see the module docs).
pub fn probe_table(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let reps = if quick { 3 } else { 60 };
    let mut v = vec![stream_read(ctx, if quick { 64 << 20 } else { 1 << 30 }, if quick { 3 } else { 20 })?];
    let n = if quick { 50 } else { 1000 };
    v.push(dispatch_overhead(ctx, n, true)?);
    v.push(dispatch_overhead(ctx, n, false)?);
    for (wgs, t) in [(1, 64), (4096, 32)] {
        for independent in [false, true] {
            v.extend(empty_grid(ctx, wgs, t, reps, independent)?);
        }
    }
    let (rows, cpr) = if quick { (256, 64) } else { (4096, 14336 / 32) };
    for (t, u, pf) in [(32, 2, false)] {
        for independent in [false, true] {
            v.extend(row_stream(ctx, rows, cpr, t, u, pf, independent, reps, quick)?);
        }
    }
    let env = KernelEnv::from_caps(ctx.capabilities());
    let shapes: &[(usize, usize)] = if quick { &[(256, 512)] } else { &crate::quant::GEMV_SHAPES };
    for &(n, k) in shapes {
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            let kind = WeightKind::Ggml(ty);
            let p = random_weight(kind, n, k, 7)?;
            let bytes = p.total_bytes();
            if ty == GgmlType::Q4_0 {
                for independent in [false, true] {
                    v.extend(stream_rotating(ctx, bytes as u64 / 16 * 16, 4, independent, reps, quick)?);
                }
            }
            let base = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::new(kind, &env, 1) };
            let ws = upload_copies(ctx, &p, if quick { 2 } else { copies_for(bytes) })?;
            v.extend(gemv_q8(ctx, &base, &ws, bytes, reps, true)?);
            if ty == GgmlType::Q4_0 && n == 4096 && k == 14336 {
                v.extend(
                    gemv_q8(ctx, &base, &ws[..1], bytes, reps, false)?.into_iter().map(|m| Measurement { label: format!("{} one copy (L2)", m.label), ..m }),
                );
            }
            for (r, t, sr, u, c) in SG_SWEEP {
                let cfg = QuantGemvQ8 { rows_per_workgroup: r, threads: t, subgroup_rows: sr, unroll: u, contiguous: c, ..base };
                v.extend(gemv_q8(ctx, &cfg, &ws, bytes, reps, true)?);
            }
            if n == 4096 && k == 14336 || quick {
                let m8 = QuantGemvQ8 { unchecked: true, ..QuantGemvQ8::new(kind, &env, 8) };
                for (r, t, sr, u) in M8_SWEEP {
                    let cfg = QuantGemvQ8 { rows_per_workgroup: r, threads: t, subgroup_rows: sr, unroll: u, ..m8 };
                    v.extend(gemv_q8(ctx, &cfg, &ws, bytes, reps, false)?);
                }
            }
        }
    }
    Ok(v)
}

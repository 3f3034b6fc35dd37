//! The projections of a batched decode step of 8 to 64 sequences (`cargo xtask bench --kernels
//! --only rows`): at Llama-3-8B's four projection shapes, Q4_0 and Q4_K, the integer-dot rows GEMV
//! the batcher runs today beside the coopmat GEMM at block shapes made for few rows. Each weight
//! is rotated over copies totalling at least 192 MiB (as the GEMV rows), so no shape is served
//! from the L2. The GB/s column is the weight bytes read once per call.

use boostr::formats::GgmlType;
use boostr::quant::gemm::CoopTiles;
use boostr::quant::{GemmPlan, GemvOutput, Q8Activations, Q8GemvPlan, QuantGemm, QuantGemvQ8, QuantMatrix, WeightKind};
use numr::Result;
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};

use crate::Measurement;
use crate::quant::{copies_for, err, random_weight, time_rotating, upload_copies, upload_x, warm_clocks};

/// Llama-3-8B's projections `(N, K)`: QKV, attention out, gate+up, down.
const SHAPES: [(usize, usize); 4] = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)];

/// Rows GEMV configurations `(weight rows, activation rows a group, threads, unroll)`: the
/// batcher's default first, then more weight rows a workgroup (each activation load serves more
/// of them) and larger groups (each weight decode serves more activation rows).
pub const ROWS_GEMV: &[(u32, u32, u32, u32)] =
    &[(2, 4, 64, 1), (4, 4, 64, 1), (4, 8, 64, 1), (8, 4, 64, 1), (8, 4, 128, 1), (8, 8, 128, 1), (4, 8, 128, 1), (16, 4, 128, 1), (8, 8, 64, 1)];

/// Block shapes for few activation rows: `bm` of 16 to 64, so a step of 8 to 64 rows pads
/// little, and narrow `bn`, so even 4096 outputs make enough workgroups to fill the GPU.
pub fn small_tiles() -> Vec<CoopTiles> {
    let pf = |bm, bn, bk, sg_m, sg_n| CoopTiles { bm, bn, bk, sg_m, sg_n, pad: 8, prefetch: true };
    vec![
        CoopTiles::DEFAULT,
        pf(64, 64, 64, 2, 2),
        pf(64, 128, 64, 2, 4),
        pf(64, 64, 128, 2, 2),
        pf(64, 32, 128, 2, 2),
        pf(32, 32, 128, 1, 2),
        pf(16, 32, 128, 1, 2),
    ]
}

fn row(label: String, seconds: f64, bytes: usize, flops: f64) -> Measurement {
    Measurement { label, seconds, bytes: bytes as f64, flops }
}

/// The sweep: for each format, shape and row count (8, 16, 32, 64), the rows GEMV in each
/// configuration of [`ROWS_GEMV`], then every valid block shape of [`small_tiles`] on f32 and on
/// f16 activations (the GEMM's time only: rounding the rows to f16 is a dispatch of its own),
/// then each row band's block shape that holds the rows ([`CoopTiles::ROW_BANDS`]) split over
/// K into 2, 4 and 8 partial sums. Before the block shapes, the engine's batched GEMM
/// ([`GemmPlan::with_split_k_sum`] at [`GemmPlan::row_band_splits`]' count, the sum included),
/// on the tiled variant where the adapter has no cooperative matrices.
pub fn rows_sweep(ctx: &GpuContext, quick: bool) -> Result<Vec<Measurement>> {
    let env = KernelEnv::from_caps(ctx.capabilities());
    let coop = QuantGemm::coopmat_available(ctx);
    let max_shared = ctx.capabilities().limits.max_compute_workgroup_storage_size;
    let (shapes, ms, reps): (&[(usize, usize)], &[usize], usize) = if quick { (&[(256, 512)], &[8, 16], 2) } else { (&SHAPES, &[8, 16, 32, 64], 20) };
    if !quick {
        warm_clocks(ctx, 1.0)?;
    }
    let mut v = Vec::new();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
        let kind = WeightKind::Ggml(ty);
        for &(n, k) in shapes {
            let p = random_weight(kind, n, k, 11)?;
            let bytes = p.total_bytes();
            let ws = upload_copies(ctx, &p, if quick { 2 } else { copies_for(bytes) })?;
            for &m in ms {
                let x = upload_x(ctx, m * k)?;
                let y = ctx.alloc(4 * (m * n) as u64, BufferKind::Storage)?;
                let out = GemvOutput::Single(Binding::whole(&y));
                let flops = 2.0 * (m * n * k) as f64;
                let name = |what: &str| format!("rows {} {n}x{k} m{m} {what}", ty.name());
                let xa = Q8Activations::new(ctx, &Binding::whole(&x), m, k).map_err(err)?;
                let step = StepValues::batch(m as u32, 1).with_decode_rows(m as u32);
                let mut rec = ctx.recorder();
                xa.record(&mut rec, &step).map_err(err)?;
                rec.submit()?;
                for &(r, g, t, u) in ROWS_GEMV {
                    let cfg = QuantGemvQ8 { unchecked: true, step_rows: true, rows_per_workgroup: r, threads: t, unroll: u, ..QuantGemvQ8::new(kind, &env, g) };
                    let plans = ws.iter().map(|w| Q8GemvPlan::decode_rows(ctx, &cfg, w, &xa, &out).map_err(err)).collect::<Result<Vec<_>>>()?;
                    let (wall, _) = time_rotating(ctx, reps, "quant_gemv_q8", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
                    v.push(row(name(&format!("gemv-q8 r{r} g{g} t{t} u{u}")), wall, bytes, flops));
                }
                let step = StepValues::chunk(0, m as u32);
                // The engine's batched GEMM: split over K as `GemmPlan::row_band_splits` says, in
                // the split bands, its sum of the partials included.
                let splits = GemmPlan::row_band_splits(n, k);
                let parts = ctx.alloc(4 * (splits as usize * m * n) as u64, BufferKind::Storage)?;
                let gcfg = QuantGemm { unchecked: true, ..QuantGemm::new(kind, ctx) };
                let plans = ws
                    .iter()
                    .map(|w: &QuantMatrix| {
                        GemmPlan::with_split_k_sum(ctx, &gcfg, w, &Binding::whole(&x), &Binding::whole(&parts), &out, m, splits).map_err(err)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let (wall, _) = time_rotating(ctx, reps, "quant_gemm", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
                let label = if splits > 1 { format!("batched gemm split-k {splits} + sum") } else { "batched gemm, no split".to_string() };
                v.push(row(name(&label), wall, bytes, flops));
                if !coop {
                    continue;
                }
                for (t, x_f16) in small_tiles().into_iter().filter(|t| t.valid(max_shared)).flat_map(|t| [(t, false), (t, true)]) {
                    let gcfg = QuantGemm { kind, coopmat: true, unchecked: true, x_f16 };
                    let plans = ws
                        .iter()
                        .map(|w: &QuantMatrix| GemmPlan::with_tiles(ctx, &gcfg, t, w, &Binding::whole(&x), &Binding::whole(&y), m).map_err(err))
                        .collect::<Result<Vec<_>>>()?;
                    let (wall, _) = time_rotating(ctx, reps, "quant_gemm", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
                    let label = format!("coop {}x{}x{} sg{}x{}{}", t.bm, t.bn, t.bk, t.sg_m, t.sg_n, if x_f16 { " f16 input" } else { "" });
                    v.push(row(name(&label), wall, bytes, flops));
                }
                // The row bands' blocks split over K: more workgroups where a 4096-wide grid is
                // 128 of them (the GEMM's time only, not the consumer's sum of the partials).
                for (_, t) in CoopTiles::ROW_BANDS.into_iter().filter(|(hi, t)| m <= *hi as usize && t.valid(max_shared)) {
                    for splits in [2u32, 4, 8] {
                        let ys = ctx.alloc(4 * (splits as usize * m * n) as u64, BufferKind::Storage)?;
                        let gcfg = QuantGemm { kind, coopmat: true, unchecked: true, x_f16: false };
                        let plans = ws
                            .iter()
                            .map(|w: &QuantMatrix| {
                                GemmPlan::with_tiles_split_k(ctx, &gcfg, t, w, &Binding::whole(&x), &Binding::whole(&ys), m, splits).map_err(err)
                            })
                            .collect::<Result<Vec<_>>>()?;
                        let (wall, _) = time_rotating(ctx, reps, "quant_gemm", |rec, i| plans[i % plans.len()].record(rec, &step).map_err(err))?;
                        v.push(row(name(&format!("coop {}x{}x{} sg{}x{} split-k {splits}", t.bm, t.bn, t.bk, t.sg_m, t.sg_n)), wall, bytes, flops));
                    }
                }
            }
        }
    }
    Ok(v)
}

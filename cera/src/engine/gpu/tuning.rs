//! The plan builder's tuning: the measured constants (rows per workgroup of the decode GEMVs,
//! when a prefill's Q/K/V GEMM is split over K) and the diagnostic overrides (`CERA_*`) that
//! measured them, so an A/B needs no rebuild.

use boostr::attention::DecodeKernel;
use boostr::quant::{GemmPlan, QuantGemm, QuantGemv, QuantGemvQ8, WeightKind};
use numr::gpu::{GpuContext, KernelEnv};

use super::super::graph::{Op, Slot};
use super::fuse::Allow;
use super::links::Epilogues;
use super::plans::PlanInputs;

/// The decode fusions to make, and whether int8 GEMVs quantize their outputs in their epilogue
/// ([`epilogue_links`]). Diagnostic switches, to measure what each fusion gives:
/// `CERA_DECODE_FUSION` = `none`, or a comma list of `norm`, `residual`, `glu`, `epilogue`,
/// `attn_q8` (default: all);
/// `CERA_NORM_FUSE_MAX_K`: the RMSNorm goes into GEMVs of at most this many input features
/// (default [`NORM_FUSE_MAX_K`]).
pub(super) fn decode_fusions() -> (Allow, Epilogues) {
    let list = std::env::var("CERA_DECODE_FUSION").unwrap_or_else(|_| "norm,residual,glu,epilogue,attn_q8,rope".into());
    let has = |f: &str| list.split(',').any(|x| x.trim() == f);
    let max_k = std::env::var("CERA_NORM_FUSE_MAX_K").ok().and_then(|v| v.parse().ok()).unwrap_or(NORM_FUSE_MAX_K);
    (
        Allow { norm_max_k: if has("norm") { max_k } else { 0 }, residual: has("residual"), glu: has("glu"), rope: has("rope") },
        Epilogues { gemv: has("epilogue"), attention: has("attn_q8") },
    )
}

/// A diagnostic override (`CERA_GEMV_ROWS`, `CERA_GEMV_THREADS`: the f32 decode GEMV's rows per
/// workgroup and invocations; `CERA_Q8_ROWS`, `CERA_Q8_THREADS`, `CERA_Q8_UNROLL`,
/// `CERA_Q8_SG_ROWS`, `CERA_Q8_PREFETCH`, `CERA_Q8_MAX_WGS`: the integer-dot GEMV's;
/// `CERA_Q8_WIDE_*`, `CERA_Q8_TALL_*` and `CERA_Q8_SMALL_*` of `ROWS`, `THREADS`, `UNROLL`: the
/// same for some shapes only, `q8_env`).
pub(super) fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// A diagnostic override of the decode attention's tuning (`CERA_ATTN_TUNING` =
/// `heads,keys,target_wgs`, boostr's `DecodePlanBuilder::tuning`).
pub(super) fn attn_tuning() -> Option<(u32, u32, usize)> {
    let v = std::env::var("CERA_ATTN_TUNING").ok()?;
    let p: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    (p.len() == 3).then(|| (p[0] as u32, p[1] as u32, p[2]))
}

/// A diagnostic override of the decode attention's single-split limit (`CERA_ATTN_SINGLE_KV`:
/// steps over at most this many positions run one split per query head; 0: never).
pub(super) fn attn_single_kv() -> Option<u32> {
    env_u32("CERA_ATTN_SINGLE_KV")
}

/// The prefill attention kernel forced by `CERA_PREFILL_ATTN` = `coop`, `subgroup` or `tiled`
/// (a diagnostic for measuring; default: the best the adapter and the cache allow).
pub(super) fn prefill_attn_kernel() -> Option<DecodeKernel> {
    match std::env::var("CERA_PREFILL_ATTN").ok()?.as_str() {
        "coop" => Some(DecodeKernel::Coop),
        "subgroup" => Some(DecodeKernel::Subgroup),
        "tiled" => Some(DecodeKernel::Tiled),
        _ => None,
    }
}

/// K splits of a prefill's Q/K/V projection where its coopmat GEMM has few blocks
/// ([`QKV_SPLIT_MAX_BLOCKS`]); the RoPE kernel after it adds the two partial sums.
const QKV_SPLIT_K: u32 = 2;

/// A prefill's Q/K/V GEMM of at most this many coopmat blocks is split over K
/// (`CERA_PREFILL_SPLIT_K` = 1 turns the split off, for measuring).
const QKV_SPLIT_MAX_BLOCKS: usize = 256;

/// K splits of the prefill GEMM of linear op `op` (1: none): its output is the Q/K/V slot, a
/// RoPE op that writes Q and K back reads it next (after a bias at most), the GEMM runs on
/// cooperative matrices over one part, and its grid has at most [`QKV_SPLIT_MAX_BLOCKS`] blocks.
pub(super) fn qkv_split_k(ctx: &GpuContext, inp: &PlanInputs, op: usize, max_tok: usize) -> u32 {
    let Some(parts) = inp.weights.linear.get(&op) else { return 1 };
    let coop = parts.len() == 1 && QuantGemm::new(WeightKind::of(parts[0].w.format), ctx).coopmat;
    let on = env_u32("CERA_PREFILL_SPLIT_K").unwrap_or(QKV_SPLIT_K) >= 2;
    split_k_for(&inp.graph.ops, op, max_tok, (coop && on).then(|| GemmPlan::coop_blocks(&parts[0].w, max_tok)))
}

/// The most K splits any Q/K/V projection of a prefill plan of `max_tok` rows takes (1: none):
/// the rows its Q/K/V slot needs per token ([`super::plans::Slots::new`]).
pub(crate) fn prefill_qkv_splits(ctx: &GpuContext, inp: &PlanInputs, max_tok: usize) -> u32 {
    (0..inp.graph.ops.len()).map(|op| qkv_split_k(ctx, inp, op, max_tok)).max().unwrap_or(1)
}

/// [`qkv_split_k`] on the op list alone: `blocks` is the coopmat grid's block count (`None`: no
/// coopmat GEMM, or the split turned off).
fn split_k_for(ops: &[Op], op: usize, max_tok: usize, blocks: Option<usize>) -> u32 {
    // (A plan of one row shares the decode slots' size: no room for a second partial.)
    if max_tok < 2 || !matches!(ops[op], Op::Linear { out: Slot::Qkv, .. }) {
        return 1;
    }
    // The engine's RoPE op always rotates, so it writes Q and K back.
    match (ops[op + 1..].iter().find(|o| !matches!(o, Op::Bias { .. })), blocks) {
        (Some(Op::QkvRope { .. }), Some(b)) if b <= QKV_SPLIT_MAX_BLOCKS => QKV_SPLIT_K,
        _ => 1,
    }
}

/// Input features up to which the RMSNorm runs inside the consuming GEMV.
const NORM_FUSE_MAX_K: usize = usize::MAX;

/// Activations staged in workgroup memory by the RMSNorm prologue up to this many features
/// (`CERA_NORM_STAGE_K`; default 0: normalised while loading, which measured faster on the
/// H200 at every size: staging 4096 features cost llama-8b 20% of its decode speed).
pub(super) fn norm_stage_k() -> u32 {
    env_u32("CERA_NORM_STAGE_K").unwrap_or(0)
}

/// Rows per workgroup of the decode step's integer-dot GEMVs, at least. Two (boostr's default
/// takes one for most shapes) measured 331 -> 340 tok/s on llama-8b and 848 -> 860 on llama-1b
/// (tg128, H200, 2026-12-01); 4 or 8 rows per workgroup with one row per subgroup, unroll 4 and
/// prefetching were all slower.
const Q8_ROWS: u32 = 2;

/// Integer-dot decode GEMVs of more than this many rows (Llama's gate and up packed into one
/// matrix, the LM head) take [`Q8_TALL_ROWS`] rows per workgroup: with the GLU epilogue, whose
/// arrivals and quantization each workgroup pays, four rows measured faster than two (H200,
/// 2026-12-04: Q4_0 28672x4096 with the deferred RMSNorm and the GLU epilogue 26.4 -> 24.5 us in
/// a dependent chain, `cargo xtask bench --kernels --only tall`; llama-8b tg128 451.8 -> 456.9
/// tok/s).
const Q8_TALL: usize = 8192;

/// Rows per workgroup of the integer-dot decode GEMVs over more than [`Q8_TALL`] rows.
const Q8_TALL_ROWS: u32 = 4;

/// The workgroup shape (rows, invocations, unroll, rows per subgroup) of a decode GLU
/// producer whose workgroups own whole blocks (boostr's `Q8Epilogue::GluLocal`: no arrival
/// counter, no `@coherent` storage); `None`: the arrival-counter epilogue (`Q8Epilogue::Glu`).
/// Measured on the H200 (2026-12-04, `cargo xtask bench --kernels --only tall`, Q4_0 28672x4096
/// with the deferred RMSNorm in a dependent chain): 24.3 us with arrivals at four rows per
/// workgroup, 22.1 us at 64 rows over 512 invocations (sixteen subgroups of two rows at a time,
/// unroll 1); tg128 llama-8b 459.8 -> 480.5 tok/s, llama-1b 1,382.6 -> 1,396.5. The other 25
/// local shapes of the sweep were slower (23.1-60.9 us), some slower than the arrivals.
const GLU_LOCAL: Option<(u32, u32, u32, u32)> = Some((64, 512, 1, 2));

/// A workgroup shape: rows, invocations, unroll, rows per subgroup.
pub(super) type Shape = (u32, u32, u32, u32);

/// A diagnostic shape override: unset or unparsable `None`, `off` `Some(None)`, else
/// `rows,threads,unroll,sg_rows`.
fn shape_env(name: &str) -> Option<Option<Shape>> {
    let v = std::env::var(name).ok()?;
    if v.trim() == "off" {
        return Some(None);
    }
    let p: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    if let [r, t, u, sg] = p[..] { Some(Some((r, t, u, sg))) } else { None }
}

/// [`GLU_LOCAL`], or the diagnostic override `CERA_GLU_LOCAL` = `off` or
/// `rows,threads,unroll,sg_rows`.
pub(super) fn glu_local_shape() -> Option<Shape> {
    shape_env("CERA_GLU_LOCAL").unwrap_or(GLU_LOCAL)
}

/// The workgroup shape of a decode GEMV of at most [`NORM_LOCAL_MAX_K`] inputs adding into the
/// residual stream (the O projection; the down projection of an FFN of at most 4096) whose
/// workgroups own whole blocks of the next RMSNorm's
/// int8 input (boostr's `Q8Epilogue::QuantizeLocal`): 32 rows, one per subgroup of a 1024-wide
/// workgroup. Measured on the H200 (2026-12-04, tg128, medians of 3): llama-8b 480.2 -> 483.8
/// tok/s, llama-1b 1,407.7-1,410.3 -> 1,438.6-1,439.0; with 2 rows per subgroup over 512
/// invocations, 4 over 256, unroll 2, or 64 rows, slower (359-463 on llama-8b, O and down
/// together).
const NORM_LOCAL: Option<Shape> = Some((32, 1024, 1, 1));

/// Inputs up to which a residual GEMV takes [`NORM_LOCAL`]. Wider ones (Llama's down, 14336 or
/// 8192 inputs) keep the arrival counters: 480.2 -> 475.1 tok/s on llama-8b with the down
/// projection local too.
const NORM_LOCAL_MAX_K: usize = 4096;

/// The shape for the norm epilogue of a matrix of `cols` inputs ([`NORM_LOCAL`] up to [`NORM_LOCAL_MAX_K`] inputs,
/// else none), or the diagnostic override `CERA_NORM_LOCAL`, or `CERA_NORM_LOCAL_WIDE` (more
/// than 4096 inputs) / `CERA_NORM_LOCAL_SMALL` (the rest), each `off` or
/// `rows,threads,unroll,sg_rows`.
pub(super) fn norm_local_shape(cols: usize) -> Option<Shape> {
    let wide = cols > NORM_LOCAL_MAX_K;
    let class = if wide { "CERA_NORM_LOCAL_WIDE" } else { "CERA_NORM_LOCAL_SMALL" };
    shape_env("CERA_NORM_LOCAL").or_else(|| shape_env(class)).unwrap_or(if wide { None } else { NORM_LOCAL })
}

/// Rows per workgroup of an integer-dot decode GEMV of `height` rows whose boostr default is
/// `base` rows (without the diagnostic overrides).
fn q8_rows(height: usize, base: u32) -> u32 {
    if height > Q8_TALL { Q8_TALL_ROWS.max(base) } else { Q8_ROWS.max(base) }
}

/// Workgroups per integer-dot decode GEMV at most, each taking several row groups where the
/// matrix has more (`CERA_Q8_MAX_WGS`; 0: one row group per workgroup).
const Q8_MAX_WGS: u32 = 0;

/// Decode GEMVs over at least this many input features take 8 rows per workgroup (each
/// activation load shared by twice the rows): +24% decode on llama-8b, neutral on llama-1b,
/// -20% on SmolLM2's 576 (H200, README).
const WIDE_K: usize = 2048;

/// Decode GEMVs below [`WIDE_K`] with fewer input features or fewer rows than this are bound by
/// latency, not bytes: they take two rows per workgroup (twice the workgroups of boostr's
/// default four, each with half the work). H200, tg128, three pairs each: SmolLM2-135M (K 576)
/// 879 -> 977 tok/s, Gemma 3 270M (K 640) 644 -> 681; with two rows everywhere Qwen3-0.6B
/// (K 1024, 4096 and more rows) lost 577 -> 517, so its projections keep four.
const SMALL_GEMV: usize = 1024;

/// Rows per workgroup of the f32 decode GEMV over `w` (with the diagnostic override).
pub(super) fn f32_rows(env: &KernelEnv, w: &boostr::quant::QuantMatrix) -> u32 {
    let small = w.cols < SMALL_GEMV || w.rows < SMALL_GEMV;
    env_u32("CERA_GEMV_ROWS").unwrap_or(if w.cols >= WIDE_K {
        8
    } else if small {
        2
    } else {
        QuantGemv::new(WeightKind::of(w.format), env, 1).rows_per_workgroup
    })
}

/// A diagnostic override of the integer-dot GEMV's `CERA_Q8_{name}` for every matrix, or else
/// `CERA_Q8_WIDE_{name}` for those of more than 4096 input features, `CERA_Q8_TALL_{name}` for
/// those of more than [`Q8_TALL`] rows, or `CERA_Q8_SMALL_{name}` for the rest.
fn q8_env(name: &str, w: &boostr::quant::QuantMatrix) -> Option<u32> {
    let part = |on: bool, prefix: &str| if on { env_u32(&format!("CERA_Q8_{prefix}{name}")) } else { None };
    let (wide, tall) = (w.cols > 4096, w.rows > Q8_TALL);
    part(true, "").or_else(|| part(wide, "WIDE_")).or_else(|| part(tall, "TALL_")).or_else(|| part(!wide && !tall, "SMALL_"))
}

/// The integer-dot GEMV configuration of a decode projection (with the diagnostic overrides).
pub(super) fn q8_config(env: &KernelEnv, w: &boostr::quant::QuantMatrix) -> QuantGemvQ8 {
    let base = QuantGemvQ8::for_matrix(WeightKind::of(w.format), env, 1, w.rows, w.cols);
    let rows = q8_env("ROWS", w).unwrap_or(q8_rows(w.rows, base.rows_per_workgroup));
    // Row groups per workgroup: at most `Q8_MAX_WGS` workgroups per dispatch (0: one group each).
    let max_wgs = env_u32("CERA_Q8_MAX_WGS").unwrap_or(Q8_MAX_WGS) as usize;
    let groups = if max_wgs == 0 { 1 } else { w.rows.div_ceil(rows.max(1) as usize).div_ceil(max_wgs).clamp(1, 64) as u32 };
    QuantGemvQ8 {
        unchecked: true,
        rows_per_workgroup: rows,
        row_groups: groups,
        threads: q8_env("THREADS", w).unwrap_or(base.threads),
        unroll: q8_env("UNROLL", w).unwrap_or(base.unroll),
        subgroup_rows: env_u32("CERA_Q8_SG_ROWS").unwrap_or(base.subgroup_rows),
        prefetch: env_u32("CERA_Q8_PREFETCH").map_or(base.prefetch, |v| v != 0),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::arch::{FileFacts, build};
    use crate::engine::config::Arch;
    use crate::engine::gpu::fuse::tests::config;

    #[test]
    fn tall_int8_gemvs_take_four_rows_per_workgroup() {
        // Llama-3-8B's gate/up (28672 rows) and LM head; Llama-3.2-1B's gate/up (16384).
        for rows in [28672, 16384, 128256] {
            assert_eq!(q8_rows(rows, 2), 4, "{rows}");
        }
        // Q/K/V (6144), O and down (4096): two; boostr's own default wins where larger.
        for rows in [6144, 4096, Q8_TALL] {
            assert_eq!(q8_rows(rows, 1), 2, "{rows}");
            assert_eq!(q8_rows(rows, 2), 2, "{rows}");
        }
        assert_eq!(q8_rows(4096, 8), 8);
        assert_eq!(q8_rows(28672, 8), 8);
    }

    #[test]
    fn workgroup_local_epilogues_take_their_measured_shapes() {
        // Whole blocks per workgroup: 64 rows for the GLU (gate and up of 32 outputs), 32 for a
        // residual GEMV's norm quantization, each within a workgroup of the invocations given.
        let (r, t, _, sg) = GLU_LOCAL.expect("the GLU takes workgroup-local blocks");
        assert!(r.is_multiple_of(64) && t >= r && sg > 0);
        let (r, t, _, sg) = NORM_LOCAL.expect("the O projection takes workgroup-local blocks");
        assert!(r.is_multiple_of(32) && t >= r && sg > 0);
        if std::env::var_os("CERA_NORM_LOCAL").is_none()
            && std::env::var_os("CERA_NORM_LOCAL_SMALL").is_none()
            && std::env::var_os("CERA_NORM_LOCAL_WIDE").is_none()
        {
            // Llama-3-8B's O (4096 inputs) and Llama-3.2-1B's (2048) local; the down
            // projections (14336, 8192 inputs) keep the arrival counters.
            assert_eq!(norm_local_shape(4096), NORM_LOCAL);
            assert_eq!(norm_local_shape(2048), NORM_LOCAL);
            assert_eq!(norm_local_shape(14336), None);
            assert_eq!(norm_local_shape(8192), None);
        }
    }

    #[test]
    fn only_a_small_qkv_grid_before_rope_is_split() {
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
            let g = build(&config(arch, 2), &FileFacts::default());
            let qkv: Vec<usize> = (0..g.ops.len()).filter(|&i| matches!(g.ops[i], Op::Linear { out: Slot::Qkv, .. })).collect();
            assert_eq!(qkv.len(), 2, "{arch:?}");
            for &i in &qkv {
                // Qwen2's bias sits between the projection and the RoPE op.
                assert_eq!(split_k_for(&g.ops, i, 512, Some(192)), QKV_SPLIT_K, "{arch:?} op {i}");
                assert_eq!(split_k_for(&g.ops, i, 512, Some(QKV_SPLIT_MAX_BLOCKS + 1)), 1, "{arch:?}: a grid that fills the GPU");
                assert_eq!(split_k_for(&g.ops, i, 512, None), 1, "{arch:?}: no coopmat GEMM, or turned off");
                assert_eq!(split_k_for(&g.ops, i, 1, Some(1)), 1, "{arch:?}: a plan of one row");
            }
            // No other projection is split.
            for i in (0..g.ops.len()).filter(|i| !qkv.contains(i)) {
                assert_eq!(split_k_for(&g.ops, i, 512, Some(1)), 1, "{arch:?} op {i}: {:?}", g.ops[i]);
            }
        }
    }
}

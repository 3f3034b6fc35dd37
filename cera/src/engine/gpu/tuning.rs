//! The plan builder's tuning applied: [`GpuTuning`]'s fields (the measured constants and their
//! overrides) turned into the configuration of one GEMV, one epilogue, one prefill GEMM.

use boostr::quant::{GemmPlan, QuantGemm, QuantGemv, QuantGemvQ8, QuantMatrix, WeightKind};
use numr::gpu::{GpuContext, KernelEnv};

use super::super::graph::{ModelGraph, Op, Slot};
use super::super::tuning::{GpuTuning, Q8Override, WorkgroupShape};
use super::fuse::Allow;
use super::links::Epilogues;
use super::plans::PlanInputs;
use super::weights::GpuWeights;

/// The decode fusions to make, and whether int8 GEMVs quantize their outputs in their epilogue
/// ([`super::links::epilogue_links`]).
pub(super) fn decode_fusions(t: &GpuTuning) -> (Allow, Epilogues) {
    let f = t.decode_fusions;
    (
        Allow { norm_max_k: if f.norm { t.norm_fuse_max_k } else { 0 }, residual: f.residual, glu: f.glu, rope: f.rope },
        Epilogues { gemv: f.epilogue, attention: f.attn_q8 },
    )
}

/// K splits of a prefill's Q/K/V projection where its coopmat GEMM has few blocks
/// ([`GpuTuning::qkv_split_max_blocks`]); the RoPE kernel after it adds the two partial sums.
const QKV_SPLIT_K: u32 = 2;

/// K splits of the prefill GEMM of linear op `op` (1: none): its output is the Q/K/V slot, a
/// RoPE op that writes Q and K back reads it next (after a bias at most), the GEMM runs on
/// cooperative matrices over one part, and its grid has at most
/// [`GpuTuning::qkv_split_max_blocks`] blocks.
pub(super) fn qkv_split_k(ctx: &GpuContext, inp: &PlanInputs, op: usize, max_tok: usize) -> u32 {
    if inp.prefill_gemv {
        return 1; // no GEMM to split
    }
    let Some(parts) = inp.weights.linear.get(&op) else { return 1 };
    let coop = parts.len() == 1 && QuantGemm::new(WeightKind::of(parts[0].w.format), ctx).coopmat;
    let t = inp.tuning;
    split_k_for(&inp.graph.ops, op, max_tok, (coop && t.prefill_split_k).then(|| GemmPlan::coop_blocks(&parts[0].w, max_tok)), t.qkv_split_max_blocks)
}

/// The most K splits any Q/K/V projection of a prefill plan of `max_tok` rows takes (1: none):
/// the rows its Q/K/V slot needs per token ([`super::plans::Slots::new`]).
pub(crate) fn prefill_qkv_splits(ctx: &GpuContext, inp: &PlanInputs, max_tok: usize) -> u32 {
    (0..inp.graph.ops.len()).map(|op| qkv_split_k(ctx, inp, op, max_tok)).max().unwrap_or(1)
}

/// K splits of the GEMM over `w` in a batched plan of `max_tok` rows that runs every row
/// through the GEMM: [`GpuTuning::batch_split_k`], else (auto) boostr's
/// [`GemmPlan::row_band_splits`] where the coopmat GEMM runs (the tiled one's are unmeasured);
/// 1 where `w` has several parts or the partial sums would not fit one binding.
pub(super) fn batch_split_k(ctx: &GpuContext, t: &GpuTuning, w: &QuantMatrix, max_tok: usize) -> u32 {
    if w.parts.len() != 1 {
        return 1;
    }
    let coop = QuantGemm::new(WeightKind::of(w.format), ctx).coopmat;
    let s = t.batch_split_k.unwrap_or_else(|| if coop { GemmPlan::row_band_splits(w.rows, w.cols) } else { 1 });
    let bytes = (s as u64).saturating_mul(max_tok as u64).saturating_mul(w.rows as u64).saturating_mul(4);
    if bytes > ctx.capabilities().limits.max_storage_buffer_binding_size { 1 } else { s }
}

/// [`batch_split_k`] of linear op `op` in a batched plan of `rows` rows where the split's
/// partial sums may be left to the next op ([`super::fuse::fuse_split_sums`]): the op's one
/// matrix's split, 1 for an op of several matrices or another op.
pub(super) fn batch_op_split_k(ctx: &GpuContext, g: &ModelGraph, weights: &GpuWeights, t: &GpuTuning, op: usize, rows: usize) -> u32 {
    match (g.ops.get(op), weights.linear.get(&op).map(Vec::as_slice)) {
        (Some(Op::Linear { .. }), Some([p])) => batch_split_k(ctx, t, &p.w, rows),
        _ => 1,
    }
}

/// The ops whose GEMMs a batched plan may split ([`batch_split_k`]): the linear ops (the LM
/// head's rows are a plan of their own, of other rows, and its wide matrix never splits).
pub(super) fn batch_split_ops<'a>(inp: &'a PlanInputs) -> impl Iterator<Item = usize> + 'a {
    inp.graph.ops.iter().enumerate().filter(|(_, o)| matches!(o, Op::Linear { .. })).map(|(i, _)| i)
}

/// Elements per row of the partial sums a batched plan's slots of `max_tok` rows need
/// ([`batch_split_k`] at those rows times the matrix's rows, the most over its matrices; 0:
/// none split).
pub(super) fn batch_split_row_elems(ctx: &GpuContext, inp: &PlanInputs, max_tok: usize) -> usize {
    let parts = batch_split_ops(inp).filter_map(|op| inp.weights.linear.get(&op)).flatten();
    parts
        .map(|p| match batch_split_k(ctx, inp.tuning, &p.w, max_tok) {
            1 => 0,
            s => s as usize * p.w.rows,
        })
        .max()
        .unwrap_or(0)
}

/// [`qkv_split_k`] on the op list alone: `blocks` is the coopmat grid's block count (`None`: no
/// coopmat GEMM, or the split turned off), split where at most `max_blocks`.
fn split_k_for(ops: &[Op], op: usize, max_tok: usize, blocks: Option<usize>, max_blocks: usize) -> u32 {
    // (A plan of one row shares the decode slots' size: no room for a second partial.)
    if max_tok < 2 || !matches!(ops.get(op), Some(Op::Linear { out: Slot::Qkv, .. })) {
        return 1;
    }
    // The engine's RoPE op always rotates, so it writes Q and K back.
    match (ops[op + 1..].iter().find(|o| !matches!(o, Op::Bias { .. })), blocks) {
        (Some(Op::QkvRope { .. }), Some(b)) if b <= max_blocks => QKV_SPLIT_K,
        _ => 1,
    }
}

/// The shape for the norm epilogue of a matrix of `cols` inputs:
/// [`GpuTuning::norm_local_small`] up to [`GpuTuning::norm_local_max_k`] inputs, else
/// [`GpuTuning::norm_local_wide`].
pub(super) fn norm_local_shape(t: &GpuTuning, cols: usize) -> Option<WorkgroupShape> {
    if cols > t.norm_local_max_k { t.norm_local_wide } else { t.norm_local_small }
}

/// Rows per workgroup of an integer-dot decode GEMV of `height` rows whose boostr default is
/// `base` rows (without the overrides).
fn q8_rows(t: &GpuTuning, height: usize, base: u32) -> u32 {
    if height > t.q8_tall_above { t.q8_tall_min_rows.max(base) } else { t.q8_min_rows.max(base) }
}

/// Rows per workgroup of the f32 decode GEMV over `w` (with the override).
pub(super) fn f32_rows(t: &GpuTuning, env: &KernelEnv, w: &QuantMatrix) -> u32 {
    let small = w.cols < t.gemv_small || w.rows < t.gemv_small;
    t.gemv_rows.unwrap_or(if w.cols >= t.gemv_eight_rows_min_k {
        8
    } else if small {
        2
    } else {
        QuantGemv::new(WeightKind::of(w.format), env, 1).rows_per_workgroup
    })
}

/// Invocations per workgroup of the f32 decode GEMV (the override, else boostr's `base`).
pub(super) fn f32_threads(t: &GpuTuning, base: u32) -> u32 {
    t.gemv_threads.unwrap_or(base)
}

/// An override of the integer-dot GEMV's field (`pick`) for every matrix ([`GpuTuning::q8`]),
/// or else [`GpuTuning::q8_wide`] for those of more than [`GpuTuning::q8_wide_k`] input
/// features, [`GpuTuning::q8_tall`] for those of more than [`GpuTuning::q8_tall_above`] rows,
/// or [`GpuTuning::q8_small`] for the rest.
fn q8_override(t: &GpuTuning, (rows, cols): (usize, usize), pick: fn(&Q8Override) -> Option<u32>) -> Option<u32> {
    let (wide, tall) = (cols > t.q8_wide_k, rows > t.q8_tall_above);
    let part = |on: bool, o: &Q8Override| if on { pick(o) } else { None };
    part(true, &t.q8).or_else(|| part(wide, &t.q8_wide)).or_else(|| part(tall, &t.q8_tall)).or_else(|| part(!wide && !tall, &t.q8_small))
}

/// The integer-dot GEMV configuration of a decode projection (with the overrides).
pub(super) fn q8_config(t: &GpuTuning, env: &KernelEnv, w: &QuantMatrix) -> QuantGemvQ8 {
    let base = QuantGemvQ8::for_matrix(WeightKind::of(w.format), env, 1, w.rows, w.cols);
    let rows = q8_override(t, (w.rows, w.cols), |o| o.rows).unwrap_or(q8_rows(t, w.rows, base.rows_per_workgroup));
    // Row groups per workgroup: at most `q8_max_wgs` workgroups per dispatch (0: one group each).
    let max_wgs = t.q8_max_wgs as usize;
    let groups = if max_wgs == 0 { 1 } else { w.rows.div_ceil(rows.max(1) as usize).div_ceil(max_wgs).clamp(1, 64) as u32 };
    QuantGemvQ8 {
        unchecked: true,
        rows_per_workgroup: rows,
        row_groups: groups,
        threads: q8_override(t, (w.rows, w.cols), |o| o.threads).unwrap_or(base.threads),
        unroll: q8_override(t, (w.rows, w.cols), |o| o.unroll).unwrap_or(base.unroll),
        subgroup_rows: t.q8_subgroup_rows.unwrap_or(base.subgroup_rows),
        prefetch: t.q8_prefetch.unwrap_or(base.prefetch),
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
        let t = GpuTuning::default();
        // Llama-3-8B's gate/up (28672 rows) and LM head; Llama-3.2-1B's gate/up (16384).
        for rows in [28672, 16384, 128256] {
            assert_eq!(q8_rows(&t, rows, 2), 4, "{rows}");
        }
        // Q/K/V (6144), O and down (4096): two; boostr's own default wins where larger.
        for rows in [6144, 4096, t.q8_tall_above] {
            assert_eq!(q8_rows(&t, rows, 1), 2, "{rows}");
            assert_eq!(q8_rows(&t, rows, 2), 2, "{rows}");
        }
        assert_eq!(q8_rows(&t, 4096, 8), 8);
        assert_eq!(q8_rows(&t, 28672, 8), 8);
    }

    #[test]
    fn workgroup_local_epilogues_take_their_measured_shapes() {
        let t = GpuTuning::default();
        // Whole blocks per workgroup: 64 rows for the GLU (gate and up of 32 outputs), 32 for a
        // residual GEMV's norm quantization, each within a workgroup of the invocations given.
        let s = t.glu_local.expect("the GLU takes workgroup-local blocks");
        assert!(s.rows.is_multiple_of(64) && s.threads >= s.rows && s.subgroup_rows > 0);
        let s = t.norm_local_small.expect("the O projection takes workgroup-local blocks");
        assert!(s.rows.is_multiple_of(32) && s.threads >= s.rows && s.subgroup_rows > 0);
        // Llama-3-8B's O (4096 inputs) and Llama-3.2-1B's (2048) local; the down projections
        // (14336, 8192 inputs) keep the arrival counters.
        assert_eq!(norm_local_shape(&t, 4096), t.norm_local_small);
        assert_eq!(norm_local_shape(&t, 2048), t.norm_local_small);
        assert_eq!(norm_local_shape(&t, 14336), None);
        assert_eq!(norm_local_shape(&t, 8192), None);
    }

    #[test]
    fn the_int8_overrides_reach_their_class_only() {
        let mut t = GpuTuning::default();
        assert_eq!(q8_override(&t, (28672, 14336), |o| o.rows), None, "no override by default");
        for set in ["q8_wide_rows=16", "q8_tall_rows=32", "q8_small_threads=128"] {
            t.set_pair(set).unwrap();
        }
        // Wide: more than 4096 inputs (Llama-3-8B's down, 14336; the class wins over tall);
        // tall: more than 8192 rows; small: neither (Q/K/V, O).
        for ((rows, cols), want) in
            [((4096, 14336), Some(16)), ((28672, 4096), Some(32)), ((28672, 8192), Some(16)), ((6144, 4096), None), ((4096, 4096), None)]
        {
            assert_eq!(q8_override(&t, (rows, cols), |o| o.rows), want, "{rows}x{cols}");
        }
        assert_eq!(q8_override(&t, (6144, 4096), |o| o.threads), Some(128));
        assert_eq!(q8_override(&t, (28672, 4096), |o| o.threads), None);
        // The override of every matrix wins.
        t.set_pair("q8_rows=8").unwrap();
        assert_eq!(q8_override(&t, (4096, 14336), |o| o.rows), Some(8));
    }

    #[test]
    fn only_a_small_qkv_grid_before_rope_is_split() {
        let max = GpuTuning::default().qkv_split_max_blocks;
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
            let g = build(&config(arch, 2), &FileFacts::default());
            let qkv: Vec<usize> = (0..g.ops.len()).filter(|&i| matches!(g.ops[i], Op::Linear { out: Slot::Qkv, .. })).collect();
            assert_eq!(qkv.len(), 2, "{arch:?}");
            for &i in &qkv {
                // Qwen2's bias sits between the projection and the RoPE op.
                assert_eq!(split_k_for(&g.ops, i, 512, Some(192), max), QKV_SPLIT_K, "{arch:?} op {i}");
                assert_eq!(split_k_for(&g.ops, i, 512, Some(max + 1), max), 1, "{arch:?}: a grid that fills the GPU");
                assert_eq!(split_k_for(&g.ops, i, 512, None, max), 1, "{arch:?}: no coopmat GEMM, or turned off");
                assert_eq!(split_k_for(&g.ops, i, 1, Some(1), max), 1, "{arch:?}: a plan of one row");
            }
            // No other projection is split.
            for i in (0..g.ops.len()).filter(|i| !qkv.contains(i)) {
                assert_eq!(split_k_for(&g.ops, i, 512, Some(1), max), 1, "{arch:?} op {i}: {:?}", g.ops[i]);
            }
        }
    }
}

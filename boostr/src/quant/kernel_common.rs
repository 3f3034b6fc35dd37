//! What the quantized kernels share: their parameter words, a part's parameters, the
//! workgroup reduction of the GEMVs, and a grid within the adapter's limits.

use numr::NumrError;
use numr::gpu::{GpuContext, KernelEnv, PlanDispatch, grid_2d};

use super::{QuantError, QuantMatrix, QuantPart, Result};

/// Parameter words shared by the GEMV and GEMM kernels (GEMM adds `m`).
pub(crate) const PARAMS: &[&str] = &["rows", "row0", "n_out", "cpr", "k4", "qs4", "qh", "qh4", "sc", "dof", "mof", "cpg", "eps", "nq", "nk", "nv", "m"];

/// The arguments of `wg_reduce_<v>` in a kernel body.
pub(crate) fn reduce_args(sg: bool) -> &'static str {
    if sg { "lidx, sg_idx, sg_count, sg_id" } else { "lidx" }
}

/// `fn wg_reduce_<v>(a: array<f32, v>, ...) -> f32`: the workgroup sum of element `lidx` of
/// every invocation's array, valid in invocations `lidx < v` (so `v <= wg`). Call from uniform
/// control flow. With subgroups, each subgroup's sums land in slot `sg_idx` (the `subgroup_id`
/// builtin) of a workgroup array with room for `ceil(wg / min subgroup size)` subgroups; slots
/// past it are never written or read, so the array is in bounds whatever the driver reports. The
/// tree reduction needs `wg` a power of two (the plans check it).
pub(crate) fn reduce_fn(v: usize, wg: u32, sg: bool, env: &KernelEnv) -> String {
    if sg {
        let nsg = wg.div_ceil(env.subgroup_min_size.max(4)).max(1) as usize;
        let mut s = format!(
            "var<workgroup> red{v}: array<f32, {}>;\nfn wg_reduce_{v}(a: array<f32, {v}>, lidx: u32, sg_idx: u32, sg_count: u32, sg_id: u32) -> f32 {{\n",
            nsg * v
        );
        for i in 0..v {
            s.push_str(&format!("    let t{i} = subgroupAdd(a[{i}]);\n"));
        }
        s.push_str(&format!("    if (sg_id == 0u && sg_idx < {nsg}u) {{\n"));
        for i in 0..v {
            s.push_str(&format!("        red{v}[sg_idx * {v}u + {i}u] = t{i};\n"));
        }
        s.push_str(&format!(
            "    }}\n    workgroupBarrier();\n    var t = 0.0;\n    if (lidx < {v}u) {{\n        for (var s = 0u; s < min(sg_count, {nsg}u); s++) {{ t += red{v}[s * {v}u + lidx]; }}\n    }}\n    workgroupBarrier();\n    return t;\n}}\n"
        ));
        s
    } else {
        let mut s = format!("var<workgroup> red{v}: array<f32, {}>;\nfn wg_reduce_{v}(a: array<f32, {v}>, lidx: u32) -> f32 {{\n", wg as usize * v);
        for i in 0..v {
            s.push_str(&format!("    red{v}[lidx * {v}u + {i}u] = a[{i}];\n"));
        }
        s.push_str(&format!("    workgroupBarrier();\n    for (var s = {}u; s > 0u; s >>= 1u) {{\n        if (lidx < s) {{\n", wg / 2));
        for i in 0..v {
            s.push_str(&format!("            red{v}[lidx * {v}u + {i}u] += red{v}[(lidx + s) * {v}u + {i}u];\n"));
        }
        s.push_str(&format!(
            "        }}\n        workgroupBarrier();\n    }}\n    var t = 0.0;\n    if (lidx < {v}u) {{ t = red{v}[lidx]; }}\n    workgroupBarrier();\n    return t;\n}}\n"
        ));
        s
    }
}

/// Sets the parameters of one part (`rows`, `row0`, `n_out`, `cpr`, `k4`, the section offsets
/// and `cpg`) by name, each checked to fit 32 bits.
pub(crate) fn set_part(d: PlanDispatch, w: &QuantMatrix, part: &QuantPart) -> Result<PlanDispatch> {
    let s = part.sections;
    let cpg = match w.format {
        crate::formats::PackedFormat::Int4 { group_size, .. } => group_size / 32,
        _ => 1,
    };
    Ok(d.set_usize("rows", part.rows)?
        .set_usize("row0", part.row0)?
        .set_usize("n_out", w.rows)?
        .set_usize("cpr", w.chunks_per_row())?
        .set_usize("k4", w.cols / 4)?
        .set("qs4", s.qs / 4)?
        .set("qh", s.qh)?
        .set("qh4", s.qh / 4)?
        .set("sc", s.sc)?
        .set("dof", s.d)?
        .set("mof", s.m)?
        .set_usize("cpg", cpg)?)
}

/// A grid of `n` workgroups within the adapter's limit.
pub(crate) fn grid_for(ctx: &GpuContext, n: usize) -> Result<[u32; 3]> {
    let limit = ctx.capabilities().limits.max_compute_workgroups_per_dimension;
    grid_2d(n as u64, limit).ok_or(QuantError::Gpu(NumrError::GridTooLarge { workgroups: n as u64, limit }))
}

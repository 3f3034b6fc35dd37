//! Row kernels over the last axis of a contiguous tensor: sum, max and softmax. One workgroup per
//! row; the workgroup reduces through subgroup operations where the adapter has them, else through
//! workgroup memory. Results are f32 (the op layer casts to the requested dtype).

use crate::dtype::DType;
use crate::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::snippets::load_fn;

/// Invocations per workgroup (one workgroup per row).
pub const WG: u32 = 256;

/// What a [`RowReduce`] kernel computes per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowOp {
    /// Sum of the row: one f32 per row.
    Sum,
    /// Maximum of the row: one f32 per row.
    Max,
    /// Numerically stable softmax (max subtracted): a full f32 row.
    Softmax,
}

/// A last-axis row kernel over a contiguous input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowReduce {
    /// The op.
    pub op: RowOp,
    /// Input dtype: F32, F16 or BF16.
    pub dtype: DType,
}

/// Workgroup reduction helpers `wg_sum(v)` and `wg_max(v)` for a 256-invocation workgroup.
/// Must be called from uniform control flow.
pub fn workgroup_reduce_fns(env: &KernelEnv) -> String {
    let mut s = String::from("var<workgroup> red: array<f32, 256>;\n");
    for (name, op, ident) in [("sum", "a + b", "0.0"), ("max", "max(a, b)", "-3.4028235e38")] {
        s.push_str(&format!("fn comb_{name}(a: f32, b: f32) -> f32 {{ return {op}; }}\n"));
        if env.subgroups {
            let sg = if name == "sum" { "subgroupAdd" } else { "subgroupMax" };
            s.push_str(&format!(
                "fn wg_{name}(v: f32, lidx: u32, sg_idx: u32, sg_count: u32, sg_id: u32) -> f32 {{
    let r = {sg}(v);
    if (sg_id == 0u) {{ red[sg_idx] = r; }}
    workgroupBarrier();
    if (lidx == 0u) {{
        var t = red[0];
        for (var i = 1u; i < sg_count; i++) {{ t = comb_{name}(t, red[i]); }}
        red[0] = t;
    }}
    workgroupBarrier();
    let out = red[0];
    workgroupBarrier();
    return out;
}}
"
            ));
        } else {
            s.push_str(&format!(
                "fn wg_{name}(v: f32, lidx: u32) -> f32 {{
    red[lidx] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {{
        if (lidx < s) {{ red[lidx] = comb_{name}(red[lidx], red[lidx + s]); }}
        workgroupBarrier();
    }}
    let out = red[0];
    workgroupBarrier();
    return out;
}}
"
            ));
            let _ = ident;
        }
    }
    s
}

/// The argument list to call `wg_sum`/`wg_max` in a kernel built by [`KernelBuilder`].
pub fn reduce_args(env: &KernelEnv) -> &'static str {
    if env.subgroups { "lidx, sg_idx, sg_count, sg_id" } else { "lidx" }
}

impl RowReduce {
    /// Every op for F32, F16 and BF16.
    pub fn all() -> Vec<RowReduce> {
        let mut v = Vec::new();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for op in [RowOp::Sum, RowOp::Max, RowOp::Softmax] {
                v.push(RowReduce { op, dtype });
            }
        }
        v
    }

    /// The WGSL: binding `x` (read, `array<u32>`) and `out` (`array<f32>`); parameters `rows`,
    /// `n` (row length) and `off` (element offset of row 0).
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let name = format!("row_{:?}_{}", self.op, self.dtype).to_lowercase();
        let mut pre = load_fn("x", self.dtype);
        pre.push_str(&workgroup_reduce_fns(env));
        let args = reduce_args(env);
        let head = "    let row = wg_linear;\n    if (row >= p.rows) { return; }\n    let base = p.off + row * p.n;\n";
        let body = match self.op {
            RowOp::Sum => format!(
                "{head}    var acc = 0.0;\n    for (var i = lidx; i < p.n; i += 256u) {{ acc += ld_x(base + i); }}\n    let r = wg_sum(acc, {args});\n    if (lidx == 0u) {{ out[row] = r; }}\n"
            ),
            RowOp::Max => format!(
                "{head}    var acc = -3.4028235e38;\n    for (var i = lidx; i < p.n; i += 256u) {{ acc = max(acc, ld_x(base + i)); }}\n    let r = wg_max(acc, {args});\n    if (lidx == 0u) {{ out[row] = r; }}\n"
            ),
            RowOp::Softmax => format!(
                "{head}    var m = -3.4028235e38;\n    for (var i = lidx; i < p.n; i += 256u) {{ m = max(m, ld_x(base + i)); }}\n    let mx = wg_max(m, {args});\n    var s = 0.0;\n    for (var i = lidx; i < p.n; i += 256u) {{ s += exp(ld_x(base + i) - mx); }}\n    let inv = 1.0 / wg_sum(s, {args});\n    for (var i = lidx; i < p.n; i += 256u) {{ out[row * p.n + i] = exp(ld_x(base + i) - mx) * inv; }}\n"
            ),
        };
        KernelBuilder::new(name, *env)
            .workgroup(WG, 1, 1)
            .subgroup_builtins()
            .storage("x", Access::Read, "array<u32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["rows", "n", "off"])
            .prelude(&pre)
            .body(&body)
            .build()
    }
}

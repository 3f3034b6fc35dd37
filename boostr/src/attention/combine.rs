//! The pass that merges per-split partial results (decode splits, prefill segments).

use numr::gpu::{Access, KernelBuilder, KernelEnv, KernelSource};

use super::NEG;
use crate::ops_common::{OpsError, Result};

/// Invocations per combine workgroup.
pub const COMBINE_WG: u32 = 256;

/// Merges per-split partial results into the normalised output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnCombine {
    /// Elements per head: a multiple of 4 up to 256.
    pub head_dim: u32,
}

impl AttnCombine {
    /// WGSL. Bindings `o_part` (vec4 rows), `ml`, `out` (rw); params `rows, splits, out_off`. One
    /// workgroup of [`COMBINE_WG`] invocations per row: `head_dim / 4` invocations per split
    /// lane, the split lanes summed through workgroup memory (`COMBINE_WG / (head_dim / 4)`
    /// lanes; the invocations past the last whole lane compute values no one reads). Unsupported
    /// head_dim (not a multiple of 4 from 4 to 256): a typed error.
    pub fn source(&self, env: &KernelEnv) -> Result<KernelSource> {
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(4) || self.head_dim > 256 {
            return Err(OpsError::Unsupported {
                what: "attention head size",
                reason: format!("AttnCombine: head size {} (a multiple of 4 up to 256)", self.head_dim),
            });
        }
        let hd4 = self.head_dim / 4;
        let nl = COMBINE_WG / hd4;
        let mut pre = crate::ops_common::tree_reduce_fns(COMBINE_WG);
        pre.push_str(&format!("var<workgroup> cacc: array<vec4<f32>, {COMBINE_WG}>;\n"));
        let body = format!(
            "    let row = min(wg_linear, p.rows - 1u);
    var mx = {NEG};
    for (var s = lidx; s < p.splits; s += {COMBINE_WG}u) {{ mx = max(mx, ml[(s * p.rows + row) * 2u]); }}
    mx = red_max(mx, lidx);
    var l = 0.0;
    for (var s = lidx; s < p.splits; s += {COMBINE_WG}u) {{
        let m = ml[(s * p.rows + row) * 2u];
        l += select(0.0, exp(m - mx), m > -1e29) * ml[(s * p.rows + row) * 2u + 1u];
    }}
    l = red_sum(l, lidx);
    let d = lidx % {hd4}u;
    var acc = vec4<f32>(0.0);
    for (var s = lidx / {hd4}u; s < p.splits; s += {nl}u) {{
        let m = ml[(s * p.rows + row) * 2u];
        acc += select(0.0, exp(m - mx), m > -1e29) * o_part[(s * p.rows + row) * {hd4}u + d];
    }}
    cacc[lidx] = acc;
    workgroupBarrier();
    if (lidx < {hd4}u && wg_linear < p.rows) {{
        for (var i = 1u; i < {nl}u; i++) {{ acc += cacc[i * {hd4}u + lidx]; }}
        let o = acc * select(0.0, 1.0 / l, l > 0.0);
        let b = p.out_off + row * {hd}u + 4u * lidx;
        out[b] = o.x; out[b + 1u] = o.y; out[b + 2u] = o.z; out[b + 3u] = o.w;
    }}
",
            hd = self.head_dim
        );
        Ok(KernelBuilder::new(format!("attn_combine_hd{}", self.head_dim), *env)
            .workgroup(COMBINE_WG, 1, 1)
            .storage("o_part", Access::Read, "array<vec4<f32>>")
            .storage("ml", Access::Read, "array<f32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["rows", "splits", "out_off"])
            .prelude(&pre)
            .body(&body)
            .build())
    }
}

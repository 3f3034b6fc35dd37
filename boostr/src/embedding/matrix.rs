//! The gather kernel: an embedding table in any format the matrix kernels decode, read from a
//! [`QuantMatrix`] through the shared block decoders ([`crate::quant::decode`]). The table keeps
//! the matrix kernels' layout, so a tied model's embedding and LM head are one matrix on the
//! device, uploaded once.
//!
//! One thread decodes one chunk of 32 elements of one token's row (`dqf`), scales it and writes
//! it; one dispatch per part of the matrix, each writing only the tokens whose id falls inside
//! its rows (the first also zeroes the rows of out-of-range ids).

use numr::gpu::{Access, Binding, GpuContext, KernelBuilder, KernelEnv, KernelSource, Plan, PlanDispatch};

use crate::ops_common::{GpuView, Result, step_grid};
use crate::quant::decode::decoder;
use crate::quant::kernel_common::set_part;
use crate::quant::{QuantMatrix, WeightKind};

/// Threads per workgroup of the gather.
const WG: u32 = 64;

/// The gather kernel for one weight kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatrixGather {
    /// The table's decoder.
    pub kind: WeightKind,
}

impl MatrixGather {
    /// One variant per kind the matrix kernels decode.
    pub fn all() -> Vec<MatrixGather> {
        WeightKind::all().into_iter().map(|kind| MatrixGather { kind }).collect()
    }

    /// WGSL. Bindings `ids`, `wv` and `ws` (one part's buffer, as the matrix kernels bind it),
    /// `out` (rw); params: the part's, as the matrix kernels take them (`rows`, `row0`, `n_out`,
    /// `cpr`, `k4`, the section offsets, `cpg`), and
    /// `n_tok, scale, id0, id_end, vocab, zero_oob, out_off`: token `t < n_tok` takes the id at
    /// `ids[id0 + t]` when `id0 + t < id_end` (else an out-of-range id); an id in `row0 .. row0 +
    /// rows` reads row `id - row0` of this part, an id at or past `vocab` writes zeros where
    /// `zero_oob = 1` (the first part's dispatch), any other id is another part's. Thread `i < n_tok * cpr` writes chunk `i % cpr` of token `i / cpr`:
    /// `out[out_off + t * cpr * 32 ..][kc * 32 .. + 32]`.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        let body = "    let i = wg_linear * 64u + lidx;
    if (i >= p.n_tok * p.cpr) { return; }
    let t = i / p.cpr;
    let kc = i - t * p.cpr;
    var id = 0xffffffffu;
    if (p.id0 + t < p.id_end) { id = ids[p.id0 + t]; }
    let o = p.out_off + (t * p.cpr + kc) * 32u;
    if (id >= p.vocab) {
        if (p.zero_oob == 1u) {
            for (var j = 0u; j < 32u; j++) { out[o + j] = 0.0; }
        }
        return;
    }
    if (id < p.row0 || id - p.row0 >= p.rows) { return; }
    let v = dqf((id - p.row0) * p.cpr + kc);
    let s = bitcast<f32>(p.scale);
    for (var j = 0u; j < 8u; j++) {
        let x = v[j] * s;
        out[o + 4u * j] = x.x;
        out[o + 4u * j + 1u] = x.y;
        out[o + 4u * j + 2u] = x.z;
        out[o + 4u * j + 3u] = x.w;
    }
";
        KernelBuilder::new(format!("embedding_matrix_{}", self.kind.name()).to_lowercase(), *env)
            .workgroup(WG, 1, 1)
            .storage("ids", Access::Read, "array<u32>")
            .storage("wv", Access::Read, "array<vec4<u32>>")
            .storage("ws", Access::Read, "array<u32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&[
                "rows", "row0", "n_out", "cpr", "k4", "qs4", "qh", "qh4", "sc", "dof", "mof", "cpg", "n_tok", "scale", "id0", "id_end", "vocab", "zero_oob",
                "out_off",
            ])
            .prelude(&decoder(self.kind))
            .body(body)
            .build()
    }
}

/// What [`super::EmbeddingPlan`] passes for one gather: the id view, the output, the scale and
/// the step bounds it checked.
pub(super) struct GatherArgs<'a> {
    pub ids: &'a GpuView,
    pub id_end: u32,
    pub out: &'a GpuView,
    pub max_tok: u32,
    pub scale: f32,
}

/// One dispatch per part of `w` (validated here): the gather of step tokens' rows.
pub(super) fn matrix_plan(ctx: &GpuContext, w: &QuantMatrix, a: GatherArgs<'_>, env: &KernelEnv) -> Result<Plan> {
    let kernel = ctx.kernel(&MatrixGather { kind: w.kind() }.source(env))?;
    let cpr = w.chunks_per_row();
    let (max_tok, cpr32) = (a.max_tok, crate::ops_common::to_u32(OP, "chunks per row", cpr)?);
    let total = crate::ops_common::mul(OP, "max_tok x chunks", max_tok as usize, cpr)?;
    crate::ops_common::to_u32(OP, "max_tok x chunks", total)?;
    let id_off = a.ids.offset_u32(OP)?;
    let out_off = a.out.offset_u32(OP)?;
    let mut plan = Plan::new();
    for (i, part) in w.parts.iter().enumerate() {
        let b: [Binding; 4] = [a.ids.binding.clone(), part.binding(), part.binding(), a.out.binding.clone()];
        let group = ctx.bind(&kernel, &b)?;
        let grid = step_grid(ctx, total as u64, WG as u64, move |s| s.n_tok.min(max_tok) as u64 * cpr32 as u64)?;
        // The part's parameters, as every matrix kernel gets them.
        let d = set_part(PlanDispatch::new(&kernel, group, [1, 1, 1])?, w, part)
            .map_err(super::quant_err)?
            .set_f32("scale", a.scale)?
            .set("id_end", a.id_end)?
            .set_usize("vocab", w.rows)?
            .set("zero_oob", (i == 0) as u32)?
            .set("out_off", out_off)?
            .per_step("n_tok", move |s| s.n_tok.min(max_tok))?
            // Saturates: a slot past the buffer reads as an out-of-range id (zeros).
            .per_step("id0", move |s| id_off.saturating_add(s.token))?
            .grid_per_step(grid);
        plan.push(d);
    }
    Ok(plan)
}

const OP: &str = "embedding plan";

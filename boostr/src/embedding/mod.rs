//! Token embedding gather from a quantized table. Two layouts:
//! - Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16 and F32 tables ([`EMBEDDING_FORMATS`]) in
//!   [`PackedWeights`]' arrays, gathered by [`Embedding`], whose WGSL mirrors
//!   [`crate::formats::packed_decode`] element by element (the CPU decoder
//!   [`PackedWeights::dequantize_row`] is the reference). A table larger than one binding is
//!   split by rows into chunks, each with its own buffers.
//! - Any other format the matrix kernels decode (the K-quants, BF16, AWQ/GPTQ int4) as a
//!   [`QuantMatrix`], gathered by [`MatrixGather`] through the shared block decoders: no table is
//!   widened to f32 on the host, and a tied model's LM head and embedding can be one matrix
//!   ([`GpuEmbedding::from_matrix`]).
//!
//! Every chunk's (or part's) dispatch writes only the tokens whose id falls inside it.
//!
//! [`EmbeddingPlan`] gathers from a GPU buffer of u32 ids (`ids[step.token .. step.token +
//! step.n_tok]`), so a decode loop can feed argmax's output to the next token's embedding with no
//! CPU round trip. Ids are not checked on the GPU: **a row whose id is at or past the vocabulary
//! (or whose slot is past the end of the id buffer) becomes zeros**, and nothing is read out of
//! bounds. The eager [`GpuEmbedding::embed`] checks ids on the host
//! ([`OpsError::TokenOutOfRange`]) and runs the same plan.

mod matrix;
mod plan;

pub use matrix::MatrixGather;
pub use plan::EmbeddingPlan;

use crate::ops_common::OpPlan;
use std::sync::Arc;

use half::f16;
use numr::gpu::{Access, GpuBuffer, GpuContext, KernelBuilder, KernelEnv, KernelSource, StepValues};
use numr::{DType, Tensor};

use crate::formats::{GgmlType, PackedFormat, PackedWeights};
use crate::ops_common::{GpuView, OpsError, Result, tensor_view, to_u32, upload_u32};
use crate::quant::{QuantError, QuantMatrix, binding_limit};

/// The gather kernel's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Embedding {
    /// Format of the table's rows (one of [`EMBEDDING_FORMATS`]).
    pub format: GgmlType,
}

/// Formats the gather supports.
pub const EMBEDDING_FORMATS: [GgmlType; 7] = [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

impl Embedding {
    /// One variant per format in [`EMBEDDING_FORMATS`].
    pub fn all() -> Vec<Embedding> {
        EMBEDDING_FORMATS.iter().map(|&format| Embedding { format }).collect()
    }

    /// WGSL. Bindings `ids`, `qs`, `qh`, `dd`, `mm`, `out` (rw); params `n_tok, cols, bpr, row0,
    /// rows, scale, id0, id_end, vocab, zero_oob, out_off`.
    ///
    /// Token `t < n_tok` takes the id at `ids[id0 + t]` when `id0 + t < id_end` (else an
    /// out-of-range id). An id in `row0 .. row0 + rows` reads row `id - row0` of this chunk (its
    /// blocks lie inside the chunk's buffers, by construction in [`GpuEmbedding::new`]); an id at
    /// or past `vocab` writes zeros where `zero_oob = 1` (one chunk's dispatch); any other id is
    /// another chunk's. Writes `out[out_off + t * cols + e]`, `e < cols`: [`EmbeddingPlan::new`]
    /// checks the output and id views.
    pub fn source(&self, env: &KernelEnv) -> KernelSource {
        use GgmlType::*;
        let value = match self.format {
            F32 => "bitcast<f32>(qs[r * p.bpr + e])",
            F16 => "half(qs[r * p.bpr + e / 2u], e)",
            Q4_0 => "half(dd[g / 2u], g) * (f32(nib(g, el)) - 8.0)",
            Q4_1 => "half(dd[g / 2u], g) * f32(nib(g, el)) + half(mm[g / 2u], g)",
            Q5_0 => "half(dd[g / 2u], g) * (f32(nib(g, el) | (((qh[g] >> el) & 1u) << 4u)) - 16.0)",
            Q5_1 => "half(dd[g / 2u], g) * f32(nib(g, el) | (((qh[g] >> el) & 1u) << 4u)) + half(mm[g / 2u], g)",
            Q8_0 => "f32(bitcast<i32>(qs[g * 8u + el / 4u] << (24u - 8u * (el % 4u))) >> 24u) * half(dd[g / 2u], g)",
            _ => "0.0",
        };
        let pre = "fn half(w: u32, i: u32) -> f32 { let v = unpack2x16float(w); return select(v.x, v.y, (i & 1u) == 1u); }
fn nib(g: u32, el: u32) -> u32 { return (qs[g * 4u + (el % 16u) / 4u] >> (8u * (el % 4u) + 4u * (el / 16u))) & 15u; }
";
        let body = format!(
            "    let i = wg_linear * 256u + lidx;
    if (i >= p.n_tok * p.cols) {{ return; }}
    let t = i / p.cols;
    let e = i - t * p.cols;
    var id = 0xffffffffu;
    if (p.id0 + t < p.id_end) {{ id = ids[p.id0 + t]; }}
    if (id >= p.vocab) {{
        if (p.zero_oob == 1u) {{ out[p.out_off + i] = 0.0; }}
        return;
    }}
    if (id < p.row0 || id - p.row0 >= p.rows) {{ return; }}
    let r = id - p.row0;
    let g = r * p.bpr + e / 32u;
    let el = e % 32u;
    out[p.out_off + i] = ({value}) * bitcast<f32>(p.scale);
"
        );
        KernelBuilder::new(format!("embedding_{}", self.format.name()).to_lowercase(), *env)
            .workgroup(256, 1, 1)
            .storage("ids", Access::Read, "array<u32>")
            .storage("qs", Access::Read, "array<u32>")
            .storage("qh", Access::Read, "array<u32>")
            .storage("dd", Access::Read, "array<u32>")
            .storage("mm", Access::Read, "array<u32>")
            .storage("out", Access::ReadWrite, "array<f32>")
            .params(&["n_tok", "cols", "bpr", "row0", "rows", "scale", "id0", "id_end", "vocab", "zero_oob", "out_off"])
            .prelude(pre)
            .body(&body)
            .build()
    }
}

struct Chunk {
    row0: usize,
    rows: usize,
    qs: Arc<GpuBuffer>,
    qh: Arc<GpuBuffer>,
    d: Arc<GpuBuffer>,
    m: Arc<GpuBuffer>,
}

/// How a [`GpuEmbedding`] holds its rows.
enum Table {
    /// [`Embedding`]'s arrays, split by rows into chunks.
    Chunks { format: GgmlType, bpr: usize, chunks: Vec<Chunk> },
    /// A matrix in the matrix kernels' layout, read by [`MatrixGather`].
    Matrix(Arc<QuantMatrix>),
}

/// An embedding table on the GPU, split by rows where one binding cannot hold it.
pub struct GpuEmbedding {
    vocab: usize,
    cols: usize,
    table: Table,
}

/// A matrix error as the embedding's.
fn quant_err(e: QuantError) -> OpsError {
    match e {
        QuantError::Gpu(e) => OpsError::Numr(e),
        QuantError::Format(e) => OpsError::Format(e),
        e => OpsError::Unsupported { what: "embedding table", reason: e.to_string() },
    }
}

fn f16_words(v: &[f16]) -> Vec<u32> {
    v.chunks(2).map(|c| c[0].to_bits() as u32 | (c.get(1).map_or(0, |h| h.to_bits() as u32) << 16)).collect()
}

impl GpuEmbedding {
    /// Uploads `table` (rows = vocabulary): the formats of [`EMBEDDING_FORMATS`] in chunks of
    /// their own arrays, any other as a [`QuantMatrix`]. `max_chunk_bytes` caps each array of a
    /// chunk, or each part of the matrix (defaults to the adapter's binding limit; tests lower it
    /// to exercise the split).
    pub fn new(ctx: &GpuContext, table: &PackedWeights, max_chunk_bytes: Option<u64>) -> Result<GpuEmbedding> {
        let format = match table.format() {
            PackedFormat::Ggml(t) if EMBEDDING_FORMATS.contains(&t) => t,
            _ => {
                let limit = max_chunk_bytes.unwrap_or(u64::MAX).min(binding_limit(ctx));
                let w = QuantMatrix::upload_with_limit(ctx, "embedding", table, limit).map_err(quant_err)?;
                return Self::from_matrix(Arc::new(w));
            }
        };
        let limits = &ctx.capabilities().limits;
        let max = max_chunk_bytes.unwrap_or(u64::MAX).min(limits.max_storage_buffer_binding_size).min(limits.max_buffer_size);
        let bpr = table.blocks_per_row();
        let (qw, hw) = (table.qs_words_per_block(), table.qh_words_per_block());
        let row_bytes = (bpr * qw * 4).max(bpr * hw * 4).max(bpr * 2) as u64;
        let per_chunk = ((max / row_bytes.max(1)) as usize).min(table.rows()).max(1);
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < table.rows() {
            let rows = per_chunk.min(table.rows() - row0);
            let (b0, b1) = (row0 * bpr, (row0 + rows) * bpr);
            let d = if table.has_d() { f16_words(&table.d()[b0..b1]) } else { vec![] };
            let m = if table.has_m() { f16_words(&table.m()[b0..b1]) } else { vec![] };
            chunks.push(Chunk {
                row0,
                rows,
                qs: upload_u32(ctx, &table.qs()[b0 * qw..b1 * qw])?,
                qh: upload_u32(ctx, &table.qh()[b0 * hw..b1 * hw])?,
                d: upload_u32(ctx, &d)?,
                m: upload_u32(ctx, &m)?,
            });
            row0 += rows;
        }
        Ok(GpuEmbedding { vocab: table.rows(), cols: table.cols(), table: Table::Chunks { format, bpr, chunks } })
    }

    /// A table that is already on the device as a matrix (rows = vocabulary; a tied model's LM
    /// head), gathered through the matrix kernels' decoders; checked with
    /// [`QuantMatrix::validate`].
    pub fn from_matrix(w: Arc<QuantMatrix>) -> Result<GpuEmbedding> {
        w.validate().map_err(quant_err)?;
        Ok(GpuEmbedding { vocab: w.rows, cols: w.cols, table: Table::Matrix(w) })
    }

    /// The matrix holding the table, where it is one ([`Self::from_matrix`], or a format outside
    /// [`EMBEDDING_FORMATS`]).
    pub fn matrix(&self) -> Option<&Arc<QuantMatrix>> {
        match &self.table {
            Table::Matrix(w) => Some(w),
            Table::Chunks { .. } => None,
        }
    }

    /// Row chunks (one dispatch each).
    pub fn n_chunks(&self) -> usize {
        match &self.table {
            Table::Chunks { chunks, .. } => chunks.len(),
            Table::Matrix(w) => w.parts.len(),
        }
    }

    /// Rows of the table (the vocabulary).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Values in a row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Gathers rows `ids` (times `scale`, e.g. Gemma's `sqrt(hidden)`) into `[ids.len(), cols]`
    /// f32, eagerly through an [`EmbeddingPlan`]. A bad id is an error and nothing is recorded.
    pub fn embed(&self, ctx: &GpuContext, ids: &[u32], scale: f32) -> Result<Tensor> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(OpsError::TokenOutOfRange { id, vocab: self.vocab });
        }
        let out = Tensor::zeros(&[ids.len(), self.cols], DType::F32, &numr::Device::Gpu(ctx.clone()))?;
        if ids.is_empty() {
            return Ok(out);
        }
        let idv = GpuView::whole(&upload_u32(ctx, ids)?);
        let plan = EmbeddingPlan::new(ctx, self, &idv, ids.len(), scale, Some(tensor_view("embedding", "out", &out, DType::F32)?))?;
        plan.run(ctx, &StepValues::chunk(0, to_u32("embedding", "tokens", ids.len())?))?;
        Ok(out)
    }
}

/// CPU reference: rows of the packed table's own decoder, times `scale`. An id past the table is
/// [`OpsError::TokenOutOfRange`].
pub fn embedding_ref(table: &PackedWeights, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(ids.len() * table.cols());
    for &id in ids {
        if id as usize >= table.rows() {
            return Err(OpsError::TokenOutOfRange { id, vocab: table.rows() });
        }
        out.extend(table.dequantize_row(id as usize)?.iter().map(|v| v * scale));
    }
    Ok(out)
}

/// CPU reference of the plan's gather: as [`embedding_ref`], but an id past the table gives a row
/// of zeros (what the GPU writes), not an error.
pub fn embedding_ref_lenient(table: &PackedWeights, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(ids.len() * table.cols());
    for &id in ids {
        if id as usize >= table.rows() {
            out.extend(std::iter::repeat_n(0.0, table.cols()));
        } else {
            out.extend(table.dequantize_row(id as usize)?.iter().map(|v| v * scale));
        }
    }
    Ok(out)
}

//! Token embedding gather from a table in any format the matrix kernels decode (GGUF's legacy
//! and K-quant blocks, F32/F16/BF16, AWQ/GPTQ int4). The table is a [`QuantMatrix`] (rows =
//! vocabulary), read by [`MatrixGather`] through the matrix kernels' shared block decoders, so
//! a tied model's LM head and its embedding table are one matrix on the device
//! ([`GpuEmbedding::from_matrix`]). For every legacy format and the floats the gathered values
//! equal the CPU decoder's ([`PackedWeights::dequantize_row`], the reference) bit for bit: the
//! decoders' `a * q + b` is exact there (a small integer times an f16, plus an f16 multiple).
//!
//! A table larger than one binding is split by rows into parts; every part's dispatch writes only
//! the tokens whose id falls inside it.
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

use numr::gpu::{GpuContext, StepValues};
use numr::{DType, Tensor};

use crate::formats::PackedWeights;
use crate::ops_common::{GpuView, OpsError, Result, tensor_view, to_u32, upload_u32};
use crate::quant::{QuantError, QuantMatrix, binding_limit};

/// An embedding table on the GPU: a matrix split by rows where one binding cannot hold it.
pub struct GpuEmbedding {
    w: Arc<QuantMatrix>,
}

/// A matrix error as the embedding's.
pub(super) fn quant_err(e: QuantError) -> OpsError {
    match e {
        QuantError::Gpu(e) => OpsError::Numr(e),
        QuantError::Format(e) => OpsError::Format(e),
        e => OpsError::Unsupported { what: "embedding table", reason: e.to_string() },
    }
}

impl GpuEmbedding {
    /// Uploads `table` (rows = vocabulary) as a matrix. `max_part_bytes` caps each part
    /// (defaults to the adapter's binding limit; tests lower it to exercise the split).
    pub fn new(ctx: &GpuContext, table: &PackedWeights, max_part_bytes: Option<u64>) -> Result<GpuEmbedding> {
        let limit = max_part_bytes.unwrap_or(u64::MAX).min(binding_limit(ctx));
        let w = QuantMatrix::upload_with_limit(ctx, "embedding", table, limit).map_err(quant_err)?;
        Self::from_matrix(Arc::new(w))
    }

    /// A table that is already on the device as a matrix (rows = vocabulary; a tied model's LM
    /// head); checked with [`QuantMatrix::validate`].
    pub fn from_matrix(w: Arc<QuantMatrix>) -> Result<GpuEmbedding> {
        w.validate().map_err(quant_err)?;
        Ok(GpuEmbedding { w })
    }

    /// The matrix holding the table.
    pub fn matrix(&self) -> &Arc<QuantMatrix> {
        &self.w
    }

    /// Row parts (one dispatch each).
    pub fn n_chunks(&self) -> usize {
        self.w.parts.len()
    }

    /// Rows of the table (the vocabulary).
    pub fn vocab(&self) -> usize {
        self.w.rows
    }

    /// Values in a row.
    pub fn cols(&self) -> usize {
        self.w.cols
    }

    /// Gathers rows `ids` (times `scale`, e.g. Gemma's `sqrt(hidden)`) into `[ids.len(), cols]`
    /// f32, eagerly through an [`EmbeddingPlan`]. A bad id is an error and nothing is recorded.
    pub fn embed(&self, ctx: &GpuContext, ids: &[u32], scale: f32) -> Result<Tensor> {
        let vocab = self.vocab();
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(OpsError::TokenOutOfRange { id, vocab });
        }
        let out = Tensor::zeros(&[ids.len(), self.cols()], DType::F32, &numr::Device::Gpu(ctx.clone()))?;
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

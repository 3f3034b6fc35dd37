//! Weights by name for the executors, with the typed errors the engine promises: a missing
//! tensor, a tensor of the wrong shape, an unsupported tensor type, each naming the tensor.
//!
//! [`WeightSource`] is the engine's view of a [`TensorSource`] (the one trait by which every
//! model file hands out tensors): what it adds is checking against the graph and decoding, all
//! built on the source's own `tensor_meta` and `tensor_data`. A GGUF file takes it as is; a
//! Hugging Face model ([`super::HfModel`]) changes what its format does differently.

use boostr::formats::{GgmlType, PackedWeights, repack};

use crate::gguf::GgufFile;
use crate::model_file::{TensorDType, TensorSource};
use crate::safetensors::SafeDType;

use super::EngineError;
use super::graph::{MatRef, ModelGraph, VecRef};

/// A matrix's stored bytes and type, shape checked against the graph.
#[derive(Clone, Copy, Debug)]
pub struct RawMat<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Storage type.
    pub ty: GgmlType,
    /// The stored bytes (`rows` rows of `cols` elements in `ty`'s blocks).
    pub bytes: &'a [u8],
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

impl RawMat<'_> {
    /// The packed layout boostr's kernels and CPU references read.
    pub fn packed(&self) -> Result<PackedWeights, EngineError> {
        repack(self.ty, self.bytes, self.rows, self.cols)
            .map_err(|e| EngineError::Unsupported { what: format!("tensor {} of type {}: {e}", self.name, self.ty.name()) })
    }
}

/// How a matrix is stored in the source: its size and format, for progress and traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMat {
    /// Bytes the matrix occupies in the source (AWQ/GPTQ: `qweight`, `qzeros`, `scales`).
    pub bytes: u64,
    /// The format's name (`Q4_0`, `F16`, `AWQ`, `GPTQ`).
    pub format: String,
}

/// The weights of a model for the executors: a [`TensorSource`]'s tensors checked against the
/// graph's [`MatRef`]s and [`VecRef`]s and decoded, with typed errors naming the tensor. Every
/// method has a default built on [`TensorSource::tensor_meta`] and
/// [`TensorSource::tensor_data`]; a source overrides what its format stores differently.
pub trait WeightSource: TensorSource + Send + Sync {
    /// The matrix `m`, checked to be `[m.rows, m.cols]` (ggml order `[cols, rows]`, or
    /// `[cols, 1, rows]` like LFM2's conv taps), as stored bytes of a supported ggml type.
    /// Sources of other formats (AWQ/GPTQ int4) give [`EngineError::TensorType`] here and
    /// serve the matrix through [`Self::packed`].
    fn mat<'a>(&'a self, m: &'a MatRef) -> Result<RawMat<'a>, EngineError> {
        stored_mat(self, m)
    }
    /// The matrix `m` in boostr's packed layout (what both executors load), checked.
    fn packed(&self, m: &MatRef) -> Result<PackedWeights, EngineError> {
        self.mat(m)?.packed()
    }
    /// The matrix `m` as the file stores it, checked as [`Self::mat`] checks it, where that is
    /// a ggml block type; `None` where the source builds it otherwise (AWQ/GPTQ int4, served by
    /// [`Self::packed`]). A loader lays the GPU sections out straight from these bytes.
    fn file_rows<'a>(&'a self, m: &'a MatRef) -> Result<Option<RawMat<'a>>, EngineError> {
        self.mat(m).map(Some)
    }
    /// How the matrix `m` is stored, checked as [`Self::packed`] checks it but not unpacked.
    fn stored(&self, m: &MatRef) -> Result<StoredMat, EngineError> {
        let raw = self.mat(m)?;
        Ok(StoredMat { bytes: raw.bytes.len() as u64, format: raw.ty.name().to_string() })
    }
    /// The vector `v` as f32, checked to hold `v.len` values.
    fn vec(&self, v: &VecRef) -> Result<Vec<f32>, EngineError> {
        f32_vec(self, v)
    }
    /// The matrix `m` as f32 rows (small f32 weights such as LFM2's conv taps).
    fn mat_f32(&self, m: &MatRef) -> Result<Vec<f32>, EngineError> {
        let raw = self.mat(m)?;
        boostr::formats::dequantize(raw.ty, raw.bytes, m.rows * m.cols)
            .map_err(|e| EngineError::TensorType { name: m.name.clone(), ty: format!("{} ({e})", raw.ty.name()) })
    }
}

impl WeightSource for GgufFile {}

/// The ggml type of a tensor's element type: GGUF's own, or the safetensors floats.
fn ggml_type(d: TensorDType) -> Option<GgmlType> {
    match d {
        TensorDType::Ggml(t) => Some(t),
        TensorDType::Safetensors(SafeDType::F32) => Some(GgmlType::F32),
        TensorDType::Safetensors(SafeDType::F16) => Some(GgmlType::F16),
        TensorDType::Safetensors(SafeDType::BF16) => Some(GgmlType::BF16),
        TensorDType::Safetensors(_) => None,
    }
}

fn file_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::File { reason: e.to_string() }
}

/// [`WeightSource::mat`] of any source: the tensor as stored, checked.
pub fn stored_mat<'a, S: TensorSource + ?Sized>(src: &'a S, m: &'a MatRef) -> Result<RawMat<'a>, EngineError> {
    let meta = src.tensor_meta(&m.name).ok_or_else(|| EngineError::MissingTensor { name: m.name.clone() })?;
    let d = &meta.dims;
    let n: u64 = d.iter().product();
    let inner_ones = d.len() < 3 || d[1] == 1;
    if d.len() > 3 || !inner_ones || d.first().copied() != Some(m.cols as u64) || n != (m.rows * m.cols) as u64 {
        return Err(EngineError::TensorShape { name: m.name.clone(), dims: meta.dims, expected: vec![m.cols as u64, m.rows as u64] });
    }
    let ty = ggml_type(meta.dtype).filter(|&t| supported(t)).ok_or_else(|| EngineError::TensorType { name: m.name.clone(), ty: meta.dtype.to_string() })?;
    let bytes = src.tensor_data(&m.name).map_err(file_err)?;
    Ok(RawMat { name: &m.name, ty, bytes, rows: m.rows, cols: m.cols })
}

/// [`WeightSource::vec`] of any source: the tensor widened to f32, checked.
pub fn f32_vec<S: TensorSource + ?Sized>(src: &S, v: &VecRef) -> Result<Vec<f32>, EngineError> {
    let meta = src.tensor_meta(&v.name).ok_or_else(|| EngineError::MissingTensor { name: v.name.clone() })?;
    let n: u64 = meta.dims.iter().product();
    if n != v.len as u64 || meta.dims.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(EngineError::TensorShape { name: v.name.clone(), dims: meta.dims, expected: vec![v.len as u64] });
    }
    let ty = ggml_type(meta.dtype).ok_or_else(|| EngineError::TensorType { name: v.name.clone(), ty: meta.dtype.to_string() })?;
    let bytes = src.tensor_data(&v.name).map_err(file_err)?;
    boostr::formats::dequantize(ty, bytes, v.len).map_err(|e| EngineError::TensorType { name: v.name.clone(), ty: format!("{} ({e})", ty.name()) })
}

/// Storage types the mat-vec kernels and the CPU path run (those boostr decodes).
pub fn supported(ty: GgmlType) -> bool {
    ty.ensure_supported().is_ok()
}

/// Checks every weight the graph names (presence, shape, type) before anything is uploaded, so
/// a bad file fails at once with the first offending tensor named.
pub fn check_all(graph: &ModelGraph, src: &dyn WeightSource) -> Result<(), EngineError> {
    for op in &graph.ops {
        for m in op.mats() {
            src.stored(m)?;
        }
        for v in op.vecs() {
            src.vec(v)?;
        }
    }
    Ok(())
}

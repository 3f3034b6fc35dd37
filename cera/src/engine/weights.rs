//! Weights by name for the executors, with the typed errors the engine promises: a missing
//! tensor, a tensor of the wrong shape, an unsupported tensor type, each naming the tensor.

use boostr::formats::{GgmlType, PackedWeights, repack};

use crate::gguf::GgufFile;

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

/// Where weights come from: a GGUF file, or a Hugging Face folder ([`super::HfModel`]).
pub trait WeightSource: Send + Sync {
    /// The matrix `m`, checked to be `[m.rows, m.cols]`, as stored bytes of a GGUF type.
    /// Sources of other formats (AWQ/GPTQ int4) give [`EngineError::TensorType`] here and
    /// serve the matrix through [`Self::packed`].
    fn mat(&self, m: &MatRef) -> Result<RawMat<'_>, EngineError>;
    /// The matrix `m` in boostr's packed layout (what both executors load), checked.
    fn packed(&self, m: &MatRef) -> Result<PackedWeights, EngineError> {
        self.mat(m)?.packed()
    }
    /// How the matrix `m` is stored, checked as [`Self::packed`] checks it but not unpacked.
    fn stored(&self, m: &MatRef) -> Result<StoredMat, EngineError> {
        let raw = self.mat(m)?;
        Ok(StoredMat { bytes: raw.bytes.len() as u64, format: raw.ty.name().to_string() })
    }
    /// The vector `v` as f32, checked to hold `v.len` values.
    fn vec(&self, v: &VecRef) -> Result<Vec<f32>, EngineError>;
    /// Whether a tensor exists.
    fn has(&self, name: &str) -> bool;
    /// The matrix `m` as f32 rows (small f32 weights such as LFM2's conv taps).
    fn mat_f32(&self, m: &MatRef) -> Result<Vec<f32>, EngineError> {
        let raw = self.mat(m)?;
        boostr::formats::dequantize(raw.ty, raw.bytes, m.rows * m.cols)
            .map_err(|e| EngineError::TensorType { name: m.name.clone(), ty: format!("{} ({e})", raw.ty.name()) })
    }
}

impl WeightSource for GgufFile {
    fn mat(&self, m: &MatRef) -> Result<RawMat<'_>, EngineError> {
        let info = self.tensor(&m.name).ok_or_else(|| EngineError::MissingTensor { name: m.name.clone() })?;
        if info.dims.len() > 2 || info.dims.first().copied() != Some(m.cols as u64) || info.n_elements != (m.rows * m.cols) as u64 {
            return Err(EngineError::TensorShape { name: m.name.clone(), dims: info.dims.clone(), expected: vec![m.cols as u64, m.rows as u64] });
        }
        let ty = info.ty;
        if !supported(ty) {
            return Err(EngineError::TensorType { name: m.name.clone(), ty: ty.name().to_string() });
        }
        let bytes = self.tensor_data(&m.name).map_err(|e| EngineError::File { reason: e.to_string() })?;
        Ok(RawMat { name: &info.name, ty, bytes, rows: m.rows, cols: m.cols })
    }

    fn vec(&self, v: &VecRef) -> Result<Vec<f32>, EngineError> {
        let info = self.tensor(&v.name).ok_or_else(|| EngineError::MissingTensor { name: v.name.clone() })?;
        if info.n_elements != v.len as u64 || info.dims.iter().filter(|&&d| d != 1).count() > 1 {
            return Err(EngineError::TensorShape { name: v.name.clone(), dims: info.dims.clone(), expected: vec![v.len as u64] });
        }
        let ty = info.ty;
        let bytes = self.tensor_data(&v.name).map_err(|e| EngineError::File { reason: e.to_string() })?;
        boostr::formats::dequantize(ty, bytes, v.len).map_err(|e| EngineError::TensorType { name: v.name.clone(), ty: format!("{} ({e})", ty.name()) })
    }

    fn has(&self, name: &str) -> bool {
        self.tensor(name).is_some()
    }
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

//! Errors of the safetensors reader.

use std::path::PathBuf;

/// Why a safetensors model could not be read, or a tensor not handed out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    /// A file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file is shorter than the 8-byte header length.
    #[error("file of {file_len} bytes is too short for a safetensors header")]
    TooShort {
        /// The file's length.
        file_len: u64,
    },
    /// The header length field claims more bytes than the file has (or than is sane).
    #[error("header length {header_len} does not fit in a file of {file_len} bytes (limit {limit})")]
    HeaderTooLarge {
        /// The length the file claims.
        header_len: u64,
        /// The file's length.
        file_len: u64,
        /// The largest header accepted.
        limit: u64,
    },
    /// The header is not the JSON object safetensors defines.
    #[error("invalid safetensors header: {0}")]
    InvalidHeader(String),
    /// A dtype string safetensors does not define, or one the engine does not know (the
    /// sub-byte `F4`, `F6_E2M3`, `F6_E3M2`).
    #[error("tensor `{name}` has unknown dtype `{dtype}`")]
    UnknownDType {
        /// The tensor.
        name: String,
        /// The dtype string.
        dtype: String,
    },
    /// A known dtype whose data this crate does not hand out.
    #[error("tensor `{name}` has dtype {dtype}, which is not supported")]
    UnsupportedDType {
        /// The tensor.
        name: String,
        /// The dtype.
        dtype: String,
    },
    /// Shape and byte range disagree, or the element count overflows.
    #[error("tensor `{name}` with dtype {dtype} and shape {shape:?} needs {expected} bytes but spans {actual}")]
    ShapeMismatch {
        /// The tensor.
        name: String,
        /// The dtype.
        dtype: String,
        /// The shape (row-major).
        shape: Vec<u64>,
        /// Bytes the shape needs (saturated on overflow).
        expected: u64,
        /// Bytes the offsets span.
        actual: u64,
    },
    /// Data offsets outside the data section (a truncated file), or reversed.
    #[error("tensor `{name}` data [{start}, {end}) lies outside the data section of {data_len} bytes")]
    OutOfBounds {
        /// The tensor.
        name: String,
        /// Start offset.
        start: u64,
        /// End offset.
        end: u64,
        /// The data section's length.
        data_len: u64,
    },
    /// Two tensors whose bytes overlap.
    #[error("tensors `{first}` and `{second}` overlap")]
    Overlap {
        /// One tensor.
        first: String,
        /// The other.
        second: String,
    },
    /// A tensor that does not start where the one before it (by offset) ends: safetensors data
    /// has no gaps.
    #[error("tensor `{name}` starts at byte {start} of the data section, but the tensors before it end at byte {expected}")]
    NotContiguous {
        /// The tensor.
        name: String,
        /// Its start offset.
        start: u64,
        /// Where the tensors before it end.
        expected: u64,
    },
    /// Bytes after the last tensor: safetensors data ends with the last tensor.
    #[error("the tensors end at byte {end} of the data section, which has {data_len} bytes")]
    TrailingData {
        /// Where the last tensor ends.
        end: u64,
        /// The data section's length.
        data_len: u64,
    },
    /// A tensor name that appears in two shards.
    #[error("tensor `{name}` appears in more than one shard")]
    DuplicateTensor {
        /// The tensor.
        name: String,
    },
    /// The shard index is malformed or names files that are not there.
    #[error("invalid shard index {path}: {reason}")]
    InvalidIndex {
        /// The index file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `config.json` is malformed or lacks a required field.
    #[error("invalid config.json: {0}")]
    InvalidConfig(String),
    /// A folder without `model.safetensors` or `model.safetensors.index.json`.
    #[error("no model.safetensors or model.safetensors.index.json in {0}")]
    NoModel(PathBuf),
    /// No tensor by that name.
    #[error("no tensor named `{name}`")]
    TensorNotFound {
        /// The name asked for.
        name: String,
    },
    /// AWQ/GPTQ tensors that do not fit together.
    #[error("quantized layer `{name}`: {reason}")]
    InvalidQuantization {
        /// The layer (internal name without suffix).
        name: String,
        /// What is wrong.
        reason: String,
    },
}

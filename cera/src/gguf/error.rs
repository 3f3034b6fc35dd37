//! Errors of the GGUF reader. Every malformed file ends in one of these, never in a panic.

use std::path::{Path, PathBuf};

use boostr::formats::GgmlType;

/// A metadata look-up that failed: the key is missing or holds another type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// The key is not in the file.
    #[error("metadata key `{key}` is missing")]
    Missing {
        /// The key that was asked for.
        key: String,
    },
    /// The key exists but its value has another type (or does not fit the requested one).
    #[error("metadata key `{key}` is {found}, expected {expected}")]
    WrongType {
        /// The key that was asked for.
        key: String,
        /// What the caller wanted.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
}

/// Why a GGUF file could not be read, or a tensor not handed out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened or mapped.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// A version other than 2 or 3 (version 1 and big-endian files included).
    #[error("unsupported GGUF version {version} (supported: 2, 3){hint}")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
        /// An explanation for recognisable cases, such as a big-endian file.
        hint: &'static str,
    },
    /// The file ends inside the header.
    #[error("GGUF header truncated while reading {what} at byte {offset} (file is {file_len} bytes)")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where it started.
        offset: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A count (tensors, keys, array elements, string bytes) that cannot fit in the file.
    #[error("{what} count {count} is impossible for a file of {file_len} bytes")]
    ImpossibleCount {
        /// What was counted.
        what: &'static str,
        /// The count found.
        count: u64,
        /// The file's length.
        file_len: u64,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("metadata key `{key}` has unknown value type {type_id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The type id found.
        type_id: u32,
    },
    /// Arrays nested deeper than the reader allows.
    #[error("metadata key `{key}` nests arrays deeper than {max} levels")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The deepest nesting allowed.
        max: usize,
    },
    /// A boolean byte other than 0 or 1.
    #[error("metadata key `{key}` holds bool byte {value}, expected 0 or 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte found.
        value: u8,
    },
    /// The same metadata key twice.
    #[error("metadata key `{key}` appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a power of two, zero, or not a u32.
    #[error("invalid general.alignment: {reason}")]
    InvalidAlignment {
        /// What is wrong with it.
        reason: String,
    },
    /// Two tensors with the same name.
    #[error("tensor `{name}` appears twice")]
    DuplicateTensor {
        /// The tensor name.
        name: String,
    },
    /// More than four dimensions.
    #[error("tensor `{name}` has {n_dims} dimensions (at most 4 allowed)")]
    TooManyDims {
        /// The tensor name.
        name: String,
        /// The dimension count found.
        n_dims: u32,
    },
    /// A shape that is empty, has a zero or negative dimension, overflows, or does not fit the
    /// type's block size.
    #[error("tensor `{name}` has invalid shape {dims:?}: {reason}")]
    InvalidShape {
        /// The tensor name.
        name: String,
        /// The dimensions (ggml order, innermost first).
        dims: Vec<u64>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A ggml type id that ggml never defined.
    #[error("tensor `{name}` has unknown ggml type id {type_id}")]
    UnknownType {
        /// The tensor name.
        name: String,
        /// The type id found.
        type_id: u32,
    },
    /// A known ggml type whose data this crate does not hand out.
    #[error("tensor `{name}` has type {ty}, which is not supported")]
    UnsupportedType {
        /// The tensor name.
        name: String,
        /// The type.
        ty: GgmlType,
    },
    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor `{name}` data offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The tensor name.
        name: String,
        /// The offset (relative to the data section).
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor data that runs past the end of the file (a truncated file, or a bad offset).
    #[error(
        "the file is truncated (or a tensor offset is wrong): its tensors need {expected_len} bytes, the file has {file_len}; \
         tensor `{name}` data [{start}, {end}) lies outside the data section of {data_len} bytes"
    )]
    TensorOutOfBounds {
        /// The tensor name.
        name: String,
        /// Start, relative to the data section.
        start: u64,
        /// End, relative to the data section (saturated on overflow).
        end: u64,
        /// The data section's length.
        data_len: u64,
        /// The file size the header implies: the data section's start plus the end of the
        /// tensor that ends last (saturated on overflow).
        expected_len: u64,
        /// The file's size.
        file_len: u64,
    },
    /// Two tensors whose data ranges overlap.
    #[error("tensors `{first}` and `{second}` overlap in the data section")]
    OverlappingTensors {
        /// One tensor.
        first: String,
        /// The other tensor.
        second: String,
    },
    /// No tensor by that name.
    #[error("no tensor named `{name}`")]
    TensorNotFound {
        /// The name asked for.
        name: String,
    },
    /// A metadata look-up failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// An error in the file at `path`: what [`GgufFile::open`](super::GgufFile::open) returns
    /// for a malformed file. [`GgufError::inner`] is the error itself.
    #[error("{path}: {source}")]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never `InFile` itself).
        #[source]
        source: Box<GgufError>,
    },
}

impl GgufError {
    /// The error without the file it came from: the inner error of [`GgufError::InFile`], else
    /// `self`. Match on this to tell what went wrong, whether or not the path is attached:
    /// `matches!(e.inner(), GgufError::BadMagic { .. })`.
    pub fn inner(&self) -> &GgufError {
        match self {
            GgufError::InFile { source, .. } => source.inner(),
            other => other,
        }
    }

    /// The file the error is about, where known.
    pub fn path(&self) -> Option<&Path> {
        match self {
            GgufError::InFile { path, .. } | GgufError::Io { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Attaches the file's path, unless the error names it already.
    pub(crate) fn in_file(self, path: &Path) -> GgufError {
        match self {
            e @ (GgufError::InFile { .. } | GgufError::Io { .. }) => e,
            e => GgufError::InFile { path: path.to_path_buf(), source: Box::new(e) },
        }
    }
}

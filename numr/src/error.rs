//! Typed errors for everything numr does. Nothing in numr panics on bad input.

use crate::dtype::DType;

/// Every failure numr can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NumrError {
    #[error("dtype mismatch in {op}: expected {expected}, got {got}")]
    DTypeMismatch { op: &'static str, expected: DType, got: DType },

    #[error("shape mismatch in {op}: {lhs:?} vs {rhs:?}")]
    ShapeMismatch { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },

    #[error("{op} does not support dtype {dtype}")]
    UnsupportedDType { op: &'static str, dtype: DType },

    #[error("invalid view in {op}: {reason}")]
    InvalidView { op: &'static str, reason: String },

    #[error("data length {got} does not match shape {shape:?} ({expected} elements)")]
    LengthMismatch { shape: Vec<usize>, expected: usize, got: usize },

    #[error("tensors live on different devices ({op})")]
    DeviceMismatch { op: &'static str },

    #[error("no GPU adapter found{}", if .filter.is_empty() { String::new() } else { format!(" matching {}", .filter) })]
    NoAdapter { filter: String },

    #[error("failed to create the GPU device on {adapter}: {reason}")]
    DeviceCreation { adapter: String, reason: String },

    #[error("buffer of {bytes} bytes exceeds the adapter's max_buffer_size of {limit} bytes")]
    BufferTooLarge { bytes: u64, limit: u64 },

    #[error("binding of {bytes} bytes exceeds the adapter's max_storage_buffer_binding_size of {limit} bytes")]
    BindingTooLarge { bytes: u64, limit: u64 },

    #[error("kernel {kernel} needs {needed} storage buffers, the adapter allows {limit} per shader stage")]
    TooManyBindings { kernel: String, needed: u32, limit: u32 },

    #[error("kernel {kernel} needs {needed} bytes of parameters, at most {limit} are supported")]
    ParamsTooLarge { kernel: String, needed: usize, limit: usize },

    #[error("dispatch of {workgroups} workgroups exceeds the 2-D grid limit ({limit} per dimension)")]
    GridTooLarge { workgroups: u64, limit: u32 },

    #[error("GPU out of memory while {context}")]
    OutOfMemory { context: String },

    #[error("GPU validation error while {context}: {message}")]
    Validation { context: String, message: String },

    #[error("GPU internal error while {context}: {message}")]
    Internal { context: String, message: String },

    #[error("shader compilation failed for {kernel}: {message}")]
    ShaderCompile { kernel: String, message: String },

    #[error("buffer mapping failed: {0}")]
    Map(String),

    #[error("GPU device lost: {0}")]
    DeviceLost(String),

    #[error("feature {0} is not available on this adapter")]
    MissingFeature(&'static str),
    /// A size or offset a kernel takes as a 32-bit word does not fit one (a Metal adapter
    /// reports bindings as large as a whole buffer, so a view can hold more than 2^32 elements).
    #[error("{what} = {value} in {op} does not fit a 32-bit kernel parameter")]
    SizeOverflow { op: &'static str, what: &'static str, value: u64 },
}

pub type Result<T, E = NumrError> = std::result::Result<T, E>;

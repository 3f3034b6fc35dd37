//! Typed errors for everything numr does. Nothing in numr panics on bad input.

use crate::dtype::DType;

/// Every failure numr can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NumrError {
    /// An operand has another dtype than the op requires.
    #[error("dtype mismatch in {op}: expected {expected}, got {got}")]
    DTypeMismatch {
        /// The op that checked.
        op: &'static str,
        /// The dtype it needs.
        expected: DType,
        /// The dtype it was given.
        got: DType,
    },

    /// Two operands' shapes are incompatible for the op (broadcast, reshape, matmul).
    #[error("shape mismatch in {op}: {lhs:?} vs {rhs:?}")]
    ShapeMismatch {
        /// The op that checked.
        op: &'static str,
        /// Shape of the first operand.
        lhs: Vec<usize>,
        /// Shape of the second operand (or the expected shape).
        rhs: Vec<usize>,
    },

    /// The op has no kernel or reference for this dtype.
    #[error("{op} does not support dtype {dtype}")]
    UnsupportedDType {
        /// The op that was asked.
        op: &'static str,
        /// The dtype it does not handle.
        dtype: DType,
    },

    /// A view (slice, reshape, transpose, byte range) is out of bounds or not expressible.
    #[error("invalid view in {op}: {reason}")]
    InvalidView {
        /// The op that made the view.
        op: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// Host data has a different element count than the shape it was given.
    #[error("data length {got} does not match shape {shape:?} ({expected} elements)")]
    LengthMismatch {
        /// The requested shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements the data holds.
        got: usize,
    },

    /// Operands live on different devices (the CPU and a GPU, or two GPU contexts).
    #[error("tensors live on different devices ({op})")]
    DeviceMismatch {
        /// The op that checked.
        op: &'static str,
    },

    /// A device-specific op ([`crate::ops::cpu`], [`crate::ops::gpu`]) was given a tensor that
    /// lives on the other device.
    #[error("{op} runs on the {expected}, given a tensor on the {got}")]
    WrongDevice {
        /// The op that checked.
        op: &'static str,
        /// The device it runs on: `"CPU"` or `"GPU"`.
        expected: &'static str,
        /// The device of the tensor it was given.
        got: &'static str,
    },

    /// The op needs a tensor of another rank (a reduction over the last axis of a scalar, a
    /// matmul of a vector).
    #[error("{op} needs a tensor of rank {needed}, given rank {got}")]
    NeedsRank {
        /// The op that checked.
        op: &'static str,
        /// The ranks it takes (`"at least 1"`, `"3"`).
        needed: &'static str,
        /// The rank it was given.
        got: usize,
    },

    /// No wgpu adapter (matching `NUMR_ADAPTER` / `NUMR_BACKEND`, if set) was found.
    #[error("no GPU adapter found{}", if .filter.is_empty() { String::new() } else { format!(" matching {}", .filter) })]
    NoAdapter {
        /// The adapter filter that was applied; empty when none.
        filter: String,
    },

    /// An adapter was asked for (`NUMR_ADAPTER`, [`GpuOptions::adapter`](crate::GpuOptions)),
    /// by name or index, and none of the adapters found matches it.
    #[error("no GPU adapter matches `{filter}` (NUMR_ADAPTER: a name substring or an index); found: {}", adapter_list(.found))]
    AdapterNotFound {
        /// The name substring or index asked for.
        filter: String,
        /// The adapters found, as `index: name (backend, type)` (the index is what the filter
        /// takes).
        found: Vec<String>,
    },

    /// `request_device` failed on the chosen adapter.
    #[error("failed to create the GPU device on {adapter}: {reason}")]
    DeviceCreation {
        /// The adapter's name.
        adapter: String,
        /// wgpu's error, as text.
        reason: String,
    },

    /// A buffer would exceed the adapter's `max_buffer_size`.
    #[error("buffer of {bytes} bytes exceeds the adapter's max_buffer_size of {limit} bytes")]
    BufferTooLarge {
        /// Requested size in bytes.
        bytes: u64,
        /// The adapter's limit in bytes.
        limit: u64,
    },

    /// A storage binding would exceed the adapter's `max_storage_buffer_binding_size`.
    #[error("binding of {bytes} bytes exceeds the adapter's max_storage_buffer_binding_size of {limit} bytes")]
    BindingTooLarge {
        /// Requested binding size in bytes.
        bytes: u64,
        /// The adapter's limit in bytes.
        limit: u64,
    },

    /// A kernel declares more storage buffers than the adapter allows per shader stage.
    #[error("kernel {kernel} needs {needed} storage buffers, the adapter allows {limit} per shader stage")]
    TooManyBindings {
        /// The kernel's label.
        kernel: String,
        /// Storage buffers it declares.
        needed: u32,
        /// `max_storage_buffers_per_shader_stage`.
        limit: u32,
    },

    /// A kernel's parameters are larger than it declares, or than numr's parameter slot holds.
    #[error("kernel {kernel} needs {needed} bytes of parameters, at most {limit} are supported")]
    ParamsTooLarge {
        /// The kernel's label.
        kernel: String,
        /// Bytes of parameters given (or declared).
        needed: usize,
        /// Bytes the kernel (or numr) takes at most.
        limit: usize,
    },

    /// A dispatch needs more workgroups than the adapter's per-dimension grid limit allows.
    #[error("dispatch of {workgroups} workgroups exceeds the 2-D grid limit ({limit} per dimension)")]
    GridTooLarge {
        /// Workgroups requested in total.
        workgroups: u64,
        /// `max_compute_workgroups_per_dimension`.
        limit: u32,
    },

    /// wgpu reported an out-of-memory error scope.
    #[error("GPU out of memory while {context}")]
    OutOfMemory {
        /// What numr was doing.
        context: String,
    },

    /// wgpu reported a validation error, or a recording check failed (a bind group for another
    /// layout, a misaligned or out-of-bounds copy).
    #[error("GPU validation error while {context}: {message}")]
    Validation {
        /// What numr was doing.
        context: String,
        /// wgpu's message.
        message: String,
    },

    /// wgpu reported an internal error.
    #[error("GPU internal error while {context}: {message}")]
    Internal {
        /// What numr was doing.
        context: String,
        /// wgpu's message.
        message: String,
    },

    /// WGSL failed to compile into a pipeline, or was generated for another
    /// [`ParamMode`](crate::gpu::ParamMode) than the context's.
    #[error("shader compilation failed for {kernel}: {message}")]
    ShaderCompile {
        /// The kernel's label.
        kernel: String,
        /// The compiler's diagnostics.
        message: String,
    },

    /// Mapping a readback buffer failed.
    #[error("buffer mapping failed: {0}")]
    Map(String),

    /// The device was lost (driver reset, timeout); the context cannot be used any more.
    #[error("GPU device lost: {0}")]
    DeviceLost(String),

    /// The op needs a wgpu feature (named) the adapter does not offer.
    #[error("feature {0} is not available on this adapter")]
    MissingFeature(&'static str),
    /// A size or offset a kernel takes as a 32-bit word does not fit one (a Metal adapter
    /// reports bindings as large as a whole buffer, so a view can hold more than 2^32 elements).
    #[error("{what} = {value} in {op} does not fit a 32-bit kernel parameter")]
    SizeOverflow {
        /// The op that checked.
        op: &'static str,
        /// Which size or offset.
        what: &'static str,
        /// Its value.
        value: u64,
    },
}

/// `Result` with [`NumrError`] as the default error.
pub type Result<T, E = NumrError> = std::result::Result<T, E>;

/// The adapters of [`NumrError::AdapterNotFound`], for its message.
fn adapter_list(found: &[String]) -> String {
    if found.is_empty() { "none".into() } else { found.join("; ") }
}

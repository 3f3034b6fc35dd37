//! Typed errors of the weight-format layer.

use thiserror::Error;

/// Result alias used throughout [`crate::formats`].
pub type Result<T> = std::result::Result<T, FormatError>;

/// Everything that can go wrong while decoding, repacking or multiplying weights.
///
/// Every variant names the format it concerns, so a model loader can surface the message as is.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FormatError {
    /// A known format that this crate does not decode (IQ*, TQ*, MXFP4, integer types, ...).
    #[error("weight format {format} is not supported")]
    Unsupported {
        /// The format's name as ggml spells it (for example `IQ2_XXS`).
        format: &'static str,
    },
    /// A ggml type id that no known ggml version defines.
    #[error("unknown ggml type id {id}")]
    UnknownGgmlType {
        /// The raw type id read from the file.
        id: u32,
    },
    /// A byte buffer whose length does not match the shape it was given with.
    #[error("{format} {what}: expected {expected} bytes, got {actual}")]
    ByteLength {
        /// The format being decoded.
        format: &'static str,
        /// Which buffer (for example `data`, `qweight`, `scales`).
        what: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length that was passed.
        actual: usize,
    },
    /// An element count (a row, or a whole tensor) that is not a whole number of blocks.
    #[error("{format}: {n_elements} elements is not a multiple of the block size {block_size}")]
    NotBlockMultiple {
        /// The format being decoded.
        format: &'static str,
        /// The offending element count.
        n_elements: usize,
        /// Elements per block of the format.
        block_size: usize,
    },
    /// A shape that the format cannot represent (AWQ/GPTQ dimensions, group sizes, ...).
    #[error("{format}: invalid shape: {reason}")]
    InvalidShape {
        /// The format being decoded.
        format: &'static str,
        /// A human-readable reason, naming the dimensions involved.
        reason: String,
    },
    /// A GPTQ `g_idx` that is not sequential (`g_idx[k] == k / group_size`): an act-order
    /// (`desc_act=True`) checkpoint, which is not supported.
    #[error("GPTQ act-order (non-sequential g_idx) is not supported: g_idx[{k}] = {found}, expected {expected}")]
    ActOrder {
        /// The first input index whose group differs from `k / group_size`.
        k: usize,
        /// The group index stored in `g_idx`.
        found: i64,
        /// The group index a sequential layout has there.
        expected: usize,
    },
    /// A row index past the end of a packed matrix.
    #[error("row {row} out of range for a matrix of {rows} rows")]
    RowOutOfRange {
        /// The requested row.
        row: usize,
        /// The number of rows.
        rows: usize,
    },
    /// A slice of values (activations, an output buffer) whose length does not match the shape.
    #[error("{what}: expected {expected} values, got {actual}")]
    Length {
        /// Which slice (for example `x` or `out`).
        what: &'static str,
        /// The length the shape implies.
        expected: usize,
        /// The length that was passed.
        actual: usize,
    },
}

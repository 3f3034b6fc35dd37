//! Quantized matrix products on the GPU: weight upload, GEMV (decode), GEMM (prefill) and the
//! fused kernels (RMSNorm + GEMV, Q/K/V in one dispatch), for every weight format of
//! [`crate::formats`].
//!
//! - [`QuantMatrix`]: the GPU layout, made at upload from a
//!   [`PackedWeights`](crate::formats::PackedWeights): one buffer per part with the sections
//!   `qs | qh | scales | d | m` (each 16-byte aligned; quants as u32 words read as `vec4<u32>`,
//!   `d`/`m` as f16 pairs). A matrix larger than one binding is split by rows into several
//!   parts, each dispatched on its own; a single row that does not fit is
//!   [`QuantError::RowTooLarge`], naming the tensor.
//! - [`decode`]: the WGSL block decoders, one per format, shared by every kernel.
//! - [`gemv::QuantGemv`]: the mat-vec for 1..=8 activation rows, with the fused RMSNorm
//!   prologue and the split Q/K/V epilogue as options of the same config.
//! - [`gemv_q8::QuantGemvQ8`]: the integer-dot mat-vec (activations quantized to int8 per 32
//!   by [`q8_activations::QuantizeQ8`], or normalised and quantized in one dispatch by
//!   [`q8_activations::RmsNormQuantizeQ8`]; `dot4I8Packed` against the decoders' quant bytes).
//! - [`gemm::QuantGemm`]: the tiled mat-mat (workgroup-memory tiles) and the cooperative-matrix
//!   mat-mat (f16 16x16x16 tiles, f32 accumulate); split over K into partial sums where its grid
//!   is small, which [`split_sum::SplitSumPlan`] adds up in a fixed order.
//!
//! Kernels require `cols % 32 == 0` (every real weight has it; K-quants need 256 anyway).
//!
//! # Plans
//! Every op here is used through a plan built once ([`GemvPlan`], [`Q8GemvPlan`], [`GemmPlan`],
//! [`Q8Activations`]): each is a [`numr::gpu::Plan`] (kernels, bind groups, parameters filled by
//! name) plus the checks that make it sound. A plan validates every binding it binds when it is
//! built (each short one is [`QuantError::BufferTooSmall`], naming it), and records with
//! `record(&mut Recorder, &StepValues)`; `plan()` gives the [`numr::gpu::Plan`] for an engine to
//! append. Per-step values: the GEMM's and the quantizer's row count is `step.n_tok` (the plan is
//! built for a maximum; the grid follows the step, rows past `n_tok` are not computed); a GEMV's
//! activation rows are fixed when it is built.
//!
//! A config's `source()` is always compiled with naga's bounds checks; a plan built from a config
//! with `unchecked: true` drops them (`KernelSource::assume_in_bounds`) once it has validated
//! what the kernel's bounds invariant needs (stated next to each such call).

pub mod decode;
pub mod gemm;
pub mod gemv;
mod gemv_output;
pub mod gemv_q8;
mod gemv_q8_plan;
pub mod half_rows;
pub(crate) mod kernel_common;
mod part_plan;
pub mod prepared;
pub mod q8_activations;
pub mod q8_epilogue;
pub mod rope_kv;
pub mod split_sum;
pub mod upload;
mod validate;

use crate::formats::{FormatError, GgmlType, PackedFormat};

pub use gemm::{GemmPlan, QuantGemm};
pub use gemv::{GemvIo, GemvOutput, GemvPlan, Prologue, QuantGemv};
pub use gemv_q8::QuantGemvQ8;
pub use gemv_q8_plan::Q8GemvPlan;
pub use half_rows::HalfRowsPlan;
pub use prepared::{BlockRows, MatrixRows, PreparedMatrix, WordPool};
pub use q8_activations::{DeferredRmsQuantizeQ8, GluQuantizeQ8, Q8Activations, QuantizeQ8, RmsNormQuantizeQ8};
pub use q8_epilogue::Q8Epilogue;
pub use rope_kv::RopeKv;
pub use split_sum::SplitSumPlan;
pub use upload::{QuantMatrix, QuantPart, binding_limit};

/// The decoder a kernel needs: a GGUF type, or the int4 layout shared by AWQ and GPTQ (whose
/// group size is a runtime parameter, so one kernel serves every group size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightKind {
    /// A supported GGUF type ([`GgmlType::SUPPORTED`]).
    Ggml(GgmlType),
    /// AWQ / GPTQ int4 with per-group scales and zeros ([`PackedFormat::Int4`]).
    Int4,
}

impl WeightKind {
    /// The kind that decodes `format`.
    pub fn of(format: PackedFormat) -> WeightKind {
        match format {
            PackedFormat::Ggml(t) => WeightKind::Ggml(t),
            _ => WeightKind::Int4,
        }
    }
    /// The GGUF type's name, or `"INT4"` (for kernel names).
    pub fn name(self) -> &'static str {
        match self {
            WeightKind::Ggml(t) => t.name(),
            WeightKind::Int4 => "INT4",
        }
    }
    /// Every kind the kernels decode (for validation and benchmarks).
    pub fn all() -> Vec<WeightKind> {
        let mut v: Vec<WeightKind> = GgmlType::SUPPORTED.iter().map(|&t| WeightKind::Ggml(t)).collect();
        v.push(WeightKind::Int4);
        v
    }
}

/// Failures of the quantized ops.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QuantError {
    /// A weight-format error (unsupported type, bad block data).
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A numr error (allocation, kernel compilation, binding or grid limits).
    #[error(transparent)]
    Gpu(#[from] numr::NumrError),
    /// A single matrix row is larger than one binding, so no row split can upload it.
    #[error("tensor {name}: one row needs {row_bytes} bytes, more than one binding ({limit} bytes) can hold")]
    RowTooLarge {
        /// The tensor's name.
        name: String,
        /// Bytes of one row's sections.
        row_bytes: u64,
        /// The binding limit in bytes.
        limit: u64,
    },
    /// A matrix the kernels cannot take (columns not a multiple of 32, a feature the adapter
    /// lacks).
    #[error("tensor {name}: {reason}")]
    Unsupported {
        /// The tensor's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// Shapes that do not agree (outputs, row counts, a kernel for another format).
    #[error("{what}: {reason}")]
    Shape {
        /// The op or plan that checked.
        what: &'static str,
        /// What does not agree.
        reason: String,
    },
    /// A binding smaller than the plan's kernel reads or writes.
    #[error("{op}: binding {buffer} holds {actual} bytes, {needed} needed")]
    BufferTooSmall {
        /// The op or plan that checked.
        op: &'static str,
        /// Which binding.
        buffer: &'static str,
        /// Bytes the kernel accesses.
        needed: u64,
        /// Bytes the binding holds.
        actual: u64,
    },
    /// A size, count or index range that does not fit the kernels' 32-bit words.
    #[error("{what} = {value} does not fit 32 bits")]
    TooLarge {
        /// Which size or index.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A kernel configuration that is not well formed (tile shapes, thread counts, ...).
    #[error("invalid {what} configuration: {reason}")]
    Config {
        /// The configuration type.
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A step with more tokens than the plan was built for.
    #[error("{op}: a step of {n_tok} tokens, the plan was built for at most {max}")]
    StepTooLarge {
        /// The plan.
        op: &'static str,
        /// Tokens in the step.
        n_tok: u32,
        /// Tokens the plan was built for.
        max: usize,
    },
}

/// `Result` with [`QuantError`].
pub type Result<T> = std::result::Result<T, QuantError>;

//! boostr: ML ops on numr. Every GPU kernel is WGSL generated from a typed config, with a plain CPU
//! reference beside it: weight formats, quantized GEMV/GEMM, norms, activations, RoPE, attention,
//! the KV cache, short convolution, embedding and sampling, each as a plan built once and
//! recorded per step.
#![warn(missing_docs)]

pub mod act;
pub mod attention;
pub mod bias;
pub mod conv;
pub mod embedding;
pub mod formats;
pub mod kv_cache;
pub mod norm;
pub mod ops_common;
pub mod paged;
pub mod quant;
pub mod rope;
pub mod sampling;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

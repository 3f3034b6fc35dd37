//! numr: the tensor core of the stack. DTypes, shapes and strided views, a [`Tensor`] on the CPU
//! or a wgpu device, a buffer pool, a pipeline cache, and a recorder that puts many dispatches
//! into one command encoder and one submit.
//!
//! ```no_run
//! use numr::{Device, Tensor};
//! let gpu = Device::gpu()?;
//! let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &gpu)?;
//! let b = a.matmul(&a)?.softmax_last()?;
//! println!("{:?}", b.to_vec::<f32>()?);
//! # Ok::<(), numr::NumrError>(())
//! ```
#![warn(missing_docs)]

pub mod device;
pub mod dtype;
pub mod error;
pub mod gpu;
pub mod ops;
pub mod shape;
pub mod tensor;

pub use device::Device;
pub use dtype::{DType, Element};
pub use error::{NumrError, Result};
pub use gpu::{GpuContext, GpuOptions};
pub use shape::Layout;
pub use tensor::Tensor;
pub mod kernels;
pub mod testing;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

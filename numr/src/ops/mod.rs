//! The core ops, one API on both devices. Each op checks its inputs, then runs the CPU reference
//! ([`cpu`]) or records the generated kernel into the GPU context's stream ([`gpu`]).
//!
//! Semantics: floats compute in f32 (f64 in the CPU reference) and round once to the output
//! dtype; integer add/mul wrap on overflow on the GPU; casts saturate like Rust's `as`.

pub mod cpu;
pub mod gpu;

use crate::dtype::DType;
use crate::error::{NumrError, Result};
use crate::kernels::binary::{BINARY_DTYPES, BinaryOp};
use crate::kernels::reduce::RowOp;
use crate::shape::broadcast_shape;
use crate::tensor::{Storage, Tensor};

impl Tensor {
    /// A contiguous copy (or `self` when already contiguous with offset 0).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() && self.layout.offset() == 0 {
            return Ok(self.clone());
        }
        self.convert(self.dtype)
    }

    /// A deep copy into a new contiguous buffer (vec4 copies when the source allows).
    pub fn copy(&self) -> Result<Tensor> {
        self.convert(self.dtype)
    }

    /// Casts to `dtype` (saturating for integers, round-to-nearest-even for floats).
    pub fn cast(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        self.convert(dtype)
    }

    fn convert(&self, dtype: DType) -> Result<Tensor> {
        match &self.storage {
            Storage::Cpu(_) => cpu::convert(self, dtype),
            Storage::Gpu(_) => gpu::convert(self, dtype),
        }
    }

    fn binary(&self, other: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let name = if op == BinaryOp::Add { "add" } else { "mul" };
        self.check_same_device(other, name)?;
        if self.dtype != other.dtype {
            return Err(NumrError::DTypeMismatch { op: name, expected: self.dtype, got: other.dtype });
        }
        if !BINARY_DTYPES.contains(&self.dtype) {
            return Err(NumrError::UnsupportedDType { op: name, dtype: self.dtype });
        }
        let shape = broadcast_shape(self.shape(), other.shape())?;
        let a = self.broadcast_to(&shape)?;
        let b = other.broadcast_to(&shape)?;
        match &self.storage {
            Storage::Cpu(_) => cpu::binary(&a, Some(&b), op, 0.0),
            Storage::Gpu(_) => gpu::binary(&a, Some(&b), op, 0.0),
        }
    }

    /// Elementwise sum, with numpy broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Add)
    }

    /// Elementwise product, with numpy broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, BinaryOp::Mul)
    }

    /// `self * s` (for integer dtypes `s` is converted to the dtype first).
    pub fn scale(&self, s: f64) -> Result<Tensor> {
        if !BINARY_DTYPES.contains(&self.dtype) {
            return Err(NumrError::UnsupportedDType { op: "scale", dtype: self.dtype });
        }
        match &self.storage {
            Storage::Cpu(_) => cpu::binary(self, None, BinaryOp::Scale, s),
            Storage::Gpu(_) => gpu::binary(self, None, BinaryOp::Scale, s),
        }
    }

    fn row_op(&self, op: RowOp, name: &'static str) -> Result<Tensor> {
        if !self.dtype.is_float() {
            return Err(NumrError::UnsupportedDType { op: name, dtype: self.dtype });
        }
        row_len(self, name)?;
        match &self.storage {
            Storage::Cpu(_) => cpu::row_op(self, op),
            Storage::Gpu(_) => gpu::row_op(self, op),
        }
    }

    /// Sum over the last axis (the axis is removed).
    pub fn sum_last(&self) -> Result<Tensor> {
        self.row_op(RowOp::Sum, "sum")
    }

    /// Maximum over the last axis (the axis is removed).
    pub fn max_last(&self) -> Result<Tensor> {
        self.row_op(RowOp::Max, "max")
    }

    /// Softmax over the last axis.
    pub fn softmax_last(&self) -> Result<Tensor> {
        self.row_op(RowOp::Softmax, "softmax")
    }

    /// Matrix product over the last two axes: `[.., M, K] · [.., K, N] -> [.., M, N]`, batched over
    /// one leading axis (`[B, M, K] · [B, K, N]`, or `[B, M, K] · [K, N]` with the right side
    /// broadcast). f32 or f16; f16 accumulates in f32.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.check_same_device(other, "matmul")?;
        if self.dtype != other.dtype {
            return Err(NumrError::DTypeMismatch { op: "matmul", expected: self.dtype, got: other.dtype });
        }
        if !matches!(self.dtype, DType::F32 | DType::F16) {
            return Err(NumrError::UnsupportedDType { op: "matmul", dtype: self.dtype });
        }
        let (ra, rb) = (self.rank(), other.rank());
        let mismatch = || NumrError::ShapeMismatch { op: "matmul", lhs: self.shape().to_vec(), rhs: other.shape().to_vec() };
        if !(2..=3).contains(&ra) || !(2..=3).contains(&rb) || rb > ra {
            return Err(mismatch());
        }
        let a = if ra == 2 { self.reshape(&[1, self.shape()[0], self.shape()[1]])? } else { self.clone() };
        let (batch, m, k) = (a.shape()[0], a.shape()[1], a.shape()[2]);
        let b = if rb == 2 { other.broadcast_to(&[batch, other.shape()[0], other.shape()[1]])? } else { other.clone() };
        if b.shape()[1] != k || (b.shape()[0] != batch && b.shape()[0] != 1) {
            return Err(mismatch());
        }
        let b = b.broadcast_to(&[batch, k, b.shape()[2]])?;
        let out = match &self.storage {
            Storage::Cpu(_) => cpu::matmul(&a, &b)?,
            Storage::Gpu(_) => gpu::matmul(&a, &b)?,
        };
        if ra == 2 { out.reshape(&[m, out.shape()[2]]) } else { Ok(out) }
    }
}

/// The length of `t`'s last axis ([`NumrError::NeedsRank`] for a scalar).
pub(crate) fn row_len(t: &Tensor, op: &'static str) -> Result<usize> {
    t.shape().last().copied().ok_or(NumrError::NeedsRank { op, needed: "at least 1", got: 0 })
}

/// Checks the operands of `cpu::binary` / `gpu::binary`: `b` given exactly for add and mul, on
/// `a`'s device, of `a`'s dtype and shape (the [`Tensor`] methods broadcast before).
pub(crate) fn check_binary(a: &Tensor, b: Option<&Tensor>, op: BinaryOp) -> Result<()> {
    let name = match op {
        BinaryOp::Add => "add",
        BinaryOp::Mul => "mul",
        BinaryOp::Scale => "scale",
    };
    match (b, op) {
        (None, BinaryOp::Scale) => Ok(()),
        (Some(_), BinaryOp::Scale) => Err(NumrError::InvalidView { op: name, reason: "scale takes no second operand".into() }),
        (None, _) => Err(NumrError::InvalidView { op: name, reason: "needs a second operand".into() }),
        (Some(b), _) => {
            a.check_same_device(b, name)?;
            if a.dtype != b.dtype {
                return Err(NumrError::DTypeMismatch { op: name, expected: a.dtype, got: b.dtype });
            }
            if a.shape() != b.shape() {
                return Err(NumrError::ShapeMismatch { op: name, lhs: a.shape().to_vec(), rhs: b.shape().to_vec() });
            }
            Ok(())
        }
    }
}

/// `(batch, m, k, n)` of the operands of `cpu::matmul` / `gpu::matmul`: `a: [B, M, K]` and
/// `b: [B, K, N]` on one device, of one dtype ([`Tensor::matmul`] reshapes and broadcasts before).
pub(crate) fn matmul_dims(a: &Tensor, b: &Tensor) -> Result<(usize, usize, usize, usize)> {
    a.check_same_device(b, "matmul")?;
    if a.dtype != b.dtype {
        return Err(NumrError::DTypeMismatch { op: "matmul", expected: a.dtype, got: b.dtype });
    }
    for t in [a, b] {
        if t.rank() != 3 {
            return Err(NumrError::NeedsRank { op: "matmul", needed: "3", got: t.rank() });
        }
    }
    let (sa, sb) = (a.shape(), b.shape());
    if sb[0] != sa[0] || sb[1] != sa[2] {
        return Err(NumrError::ShapeMismatch { op: "matmul", lhs: sa.to_vec(), rhs: sb.to_vec() });
    }
    Ok((sa[0], sa[1], sa[2], sb[2]))
}

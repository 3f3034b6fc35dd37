//! CPU references for the core ops: plain loops in f64 over the strided views, rounded once to
//! the output dtype. These are the oracles of the GPU parity tests.

use super::{check_binary, matmul_dims, row_len};
use crate::dtype::{DType, write_f64};
use crate::error::{NumrError, Result};
use crate::kernels::binary::BinaryOp;
use crate::kernels::reduce::RowOp;
use crate::tensor::{Storage, Tensor};

/// The elements of a view, in row-major order, as f64 ([`NumrError::WrongDevice`] for a GPU
/// tensor).
fn gather(t: &Tensor, op: &'static str) -> Result<Vec<f64>> {
    let Storage::Cpu(bytes) = &t.storage else { return Err(NumrError::WrongDevice { op, expected: "CPU", got: "GPU" }) };
    t.layout.indices().map(|i| crate::dtype::read_f64(t.dtype, bytes, i)).collect()
}

fn build(values: impl ExactSizeIterator<Item = f64>, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let mut bytes = vec![0u8; values.len() * dtype.size()];
    for (i, v) in values.enumerate() {
        write_f64(dtype, &mut bytes, i, v)?;
    }
    Ok(Tensor::cpu_from_bytes(bytes, dtype, shape))
}

/// A contiguous CPU copy of the view `t` in `dtype` (the reference of `contiguous`/`cast`).
/// A GPU tensor is [`NumrError::WrongDevice`].
pub fn convert(t: &Tensor, dtype: DType) -> Result<Tensor> {
    build(gather(t, "convert")?.into_iter(), dtype, t.shape())
}

/// Integer results wrap like the GPU's 32-bit arithmetic.
fn wrap(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::I32 => (v as i64 as i32) as f64,
        DType::U32 => (v as i64 as u32) as f64,
        _ => v,
    }
}

/// `op(a, b)` elementwise over views of one shape (`b` is `None` for [`BinaryOp::Scale`], which
/// uses `s`); the [`Tensor`] methods check dtypes and broadcast first. Typed errors for a GPU
/// tensor, a missing or extra `b`, or a `b` of another dtype or shape.
pub fn binary(a: &Tensor, b: Option<&Tensor>, op: BinaryOp, s: f64) -> Result<Tensor> {
    check_binary(a, b, op)?;
    let x = gather(a, "elementwise")?;
    let d = a.dtype;
    let y = b.map(|b| gather(b, "elementwise")).transpose()?.unwrap_or_default();
    let s = match d {
        DType::I32 => s as i32 as f64,
        DType::U32 => s as u32 as f64,
        _ => s as f32 as f64,
    };
    let out: Vec<f64> = match op {
        BinaryOp::Add => x.iter().zip(&y).map(|(p, q)| wrap(d, p + q)).collect(),
        BinaryOp::Mul => x.iter().zip(&y).map(|(p, q)| wrap(d, p * q)).collect(),
        BinaryOp::Scale => x.iter().map(|p| wrap(d, p * s)).collect(),
    };
    build(out.into_iter(), d, a.shape())
}

/// `op` over the last axis of `t` (rank >= 1, a float dtype), in `t`'s dtype: the axis is removed
/// for sum and max, kept for softmax. A GPU tensor or a scalar is a typed error.
pub fn row_op(t: &Tensor, op: RowOp) -> Result<Tensor> {
    let n = row_len(t, "row op")?;
    let x = gather(t, "row op")?;
    let rows = x.len().checked_div(n).unwrap_or(0);
    let mut out = Vec::new();
    for r in 0..rows {
        let row = &x[r * n..r * n + n];
        match op {
            RowOp::Sum => out.push(row.iter().sum()),
            RowOp::Max => out.push(row.iter().cloned().fold(f64::NEG_INFINITY, f64::max)),
            RowOp::Softmax => {
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                out.extend(row.iter().map(|v| (v - m).exp() / s));
            }
        }
    }
    let shape = match op {
        RowOp::Softmax => t.shape().to_vec(),
        _ => t.shape()[..t.rank() - 1].to_vec(),
    };
    build(out.into_iter(), t.dtype, &shape)
}

/// `a: [B, M, K]`, `b: [B, K, N]` (possibly broadcast views). Typed errors for GPU tensors,
/// other ranks, dtypes that differ or shapes that do not chain.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (batch, m, k, n) = matmul_dims(a, b)?;
    let x = gather(a, "matmul")?;
    let y = gather(b, "matmul")?;
    let mut out = vec![0f64; batch * m * n];
    for bi in 0..batch {
        for i in 0..m {
            for kk in 0..k {
                let av = x[(bi * m + i) * k + kk];
                let yrow = &y[(bi * k + kk) * n..(bi * k + kk) * n + n];
                let orow = &mut out[(bi * m + i) * n..(bi * m + i) * n + n];
                for (o, bv) in orow.iter_mut().zip(yrow) {
                    *o += av * bv;
                }
            }
        }
    }
    build(out.into_iter(), a.dtype, &[batch, m, n])
}

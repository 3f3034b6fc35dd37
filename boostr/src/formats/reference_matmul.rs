//! CPU reference matrix products over [`PackedWeights`], the oracle for the GPU GEMV/GEMM.

use super::error::{FormatError, Result};
use super::packed::PackedWeights;

/// `y = x · Wᵀ` for activations `x` of `m x cols` (row-major) and the packed `rows x cols`
/// weight `W`; returns `m x rows` (row-major): `y[i][r] = Σ_c x[i][c] * W[r][c]`.
///
/// Each weight row is decoded with [`PackedWeights::dequantize_row`] (so it equals the
/// reference dequantization bit for bit); products are exact in f64, summed in f64 in increasing
/// `c`, and each sum is rounded once to f32. With `m = 1` this is the mat-vec.
pub fn matmul_ref(packed: &PackedWeights, x: &[f32], m: usize) -> Result<Vec<f32>> {
    let (rows, cols) = (packed.rows(), packed.cols());
    // `m * cols` (or `m * rows`) past usize is an inconsistent length too, never a panic.
    let expected = m.checked_mul(cols).ok_or(FormatError::Length { what: "x (m * cols overflows)", expected: usize::MAX, actual: x.len() })?;
    if x.len() != expected {
        return Err(FormatError::Length { what: "x", expected, actual: x.len() });
    }
    let out = m.checked_mul(rows).ok_or(FormatError::Length { what: "y (m * rows overflows)", expected: usize::MAX, actual: 0 })?;
    let mut y = vec![0.0f32; out];
    let mut w = vec![0.0f32; cols];
    for r in 0..rows {
        packed.dequantize_row_into(r, &mut w)?;
        for i in 0..m {
            let xi = &x[i * cols..(i + 1) * cols];
            let acc: f64 = xi.iter().zip(&w).map(|(&a, &b)| a as f64 * b as f64).sum();
            y[i * rows + r] = acc as f32;
        }
    }
    Ok(y)
}

/// The mat-vec `y = W · x` for one activation vector of `cols` values; returns `rows` values.
pub fn matvec_ref(packed: &PackedWeights, x: &[f32]) -> Result<Vec<f32>> {
    matmul_ref(packed, x, 1)
}

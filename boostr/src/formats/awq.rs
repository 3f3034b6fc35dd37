//! AWQ int4 weights (AutoAWQ "GEMM" layout), as stored in safetensors.
//!
//! For a linear layer with `K = in_features`, `N = out_features` and group size `G`:
//!
//! - `qweight`: int32 `[K, N / 8]`. Word `j` of row `k` holds output columns `8j .. 8j + 8`;
//!   column `8j + c` is the nibble at bit shift [`AWQ_SHIFTS`]`[c]` = `0, 16, 4, 20, 8, 24, 12, 28`
//!   (the interleaved "AWQ order": nibble slot `p` holds column `[0, 2, 4, 6, 1, 3, 5, 7][p]`).
//! - `qzeros`: int32 `[K / G, N / 8]`, packed the same way; the zero point is used as stored.
//! - `scales`: f16 `[K / G, N]`.
//!
//! `w[k][n] = (q[k][n] - z[k / G][n]) * s[k / G][n]`.

use super::error::Result;
use super::int4::{Int4Matrix, Int4Scheme, check_dims, check_len, halves, words};
use super::packed::PackedWeights;

/// Bit shift of output column `c` (0..8) inside an AWQ-packed word.
pub const AWQ_SHIFTS: [u32; 8] = [0, 16, 4, 20, 8, 24, 12, 28];

/// The three tensors of one AWQ linear layer, as raw little-endian bytes.
#[derive(Debug, Clone, Copy)]
pub struct AwqTensors<'a> {
    /// int32 `[in_features, out_features / 8]`.
    pub qweight: &'a [u8],
    /// int32 `[in_features / group_size, out_features / 8]`.
    pub qzeros: &'a [u8],
    /// f16 `[in_features / group_size, out_features]`.
    pub scales: &'a [u8],
    /// `K`.
    pub in_features: usize,
    /// `N`.
    pub out_features: usize,
    /// `G` (32, 64, 128, ...; a positive multiple of 32 that divides `K`).
    pub group_size: usize,
}

/// The quant of input `k`, output `n` from AWQ `qweight` words (`n_out` output columns).
#[inline]
pub(crate) fn quant_at(qweight: &[u32], n_out: usize, k: usize, n: usize) -> u32 {
    (qweight[k * (n_out / 8) + n / 8] >> AWQ_SHIFTS[n % 8]) & 0xF
}

/// Writes the packed quant words (see [`super::packed_decode`]) of an AWQ `qweight` of `k`
/// inputs and `n` outputs into `qs` (`n` rows of `k / 8` words).
///
/// A blocked transpose: 32 consecutive rows of one qweight column of words give four words
/// to each of its eight output rows; columns are walked in tiles of 16 (one cache line).
pub(crate) fn pack_runs(qweight: &[u32], k: usize, n: usize, qs: &mut [u32]) {
    let (words_per_row, word_cols) = (k / 8, n / 8);
    for j0 in (0..word_cols).step_by(16) {
        for k0 in (0..k).step_by(32) {
            for j in j0..(j0 + 16).min(word_cols) {
                let column: [u32; 32] = std::array::from_fn(|l| qweight[(k0 + l) * word_cols + j]);
                for (c, &shift) in AWQ_SHIFTS.iter().enumerate() {
                    let out = &mut qs[(8 * j + c) * words_per_row + k0 / 8..][..4];
                    super::int4::pack_run(|l| (column[l] >> shift) & 0xF, out);
                }
            }
        }
    }
}

/// Unpacks an AWQ-ordered int32 matrix of `rows x cols/8` words into `rows x cols` nibbles
/// (row-major), undoing the interleaved column order.
fn unpack_awq(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for w in words(bytes) {
        out.extend(AWQ_SHIFTS.iter().map(|&shift| ((w >> shift) & 0xF) as u8));
    }
    out
}

impl AwqTensors<'_> {
    fn unpack(&self) -> Result<Int4Matrix> {
        let (k, n, gs) = (self.in_features, self.out_features, self.group_size);
        let scheme = Int4Scheme::Awq;
        check_dims(scheme, k, n, gs)?;
        let groups = k / gs;
        check_len(scheme, "qweight", self.qweight, k * n / 8 * 4)?;
        check_len(scheme, "qzeros", self.qzeros, groups * n / 8 * 4)?;
        check_len(scheme, "scales", self.scales, groups * n * 2)?;
        Ok(Int4Matrix { scheme, k, n, group_size: gs, qweight: words(self.qweight).collect(), z: unpack_awq(self.qzeros), s: halves(self.scales) })
    }

    /// Reference dequantization to f32, `[K, N]` row-major (`w[k * N + n]`).
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        Ok(self.unpack()?.dequantize())
    }

    /// The GPU layout: `rows = N`, `cols = K` (see [`super::packed_decode`]).
    pub fn repack(&self) -> Result<PackedWeights> {
        self.unpack()?.repack()
    }
}

//! GPTQ int4 weights, as stored in safetensors.
//!
//! For a linear layer with `K = in_features`, `N = out_features` and group size `G`:
//!
//! - `qweight`: int32 `[K / 8, N]`. Word `(r, n)` holds inputs `k = 8r + i` for `i` in `0..8`,
//!   input `8r + i` in the nibble at bit shift `4i`.
//! - `qzeros`: int32 `[K / G, N / 8]`. Word `(g, j)` holds the zero points of output columns
//!   `8j + i` at bit shift `4i` (sequential order, unlike AWQ).
//! - `scales`: f16 `[K / G, N]`.
//! - `g_idx` (optional): int32 `[K]`, the group of each input.
//!
//! `w[k][n] = (q[k][n] - (z[g][n] + offset)) * s[g][n]` with `g = g_idx[k]` and `offset` from
//! [`GptqZeroOffset`].
//!
//! Act-order: only a sequential `g_idx` (`g_idx[k] == k / G`, what `desc_act=False` checkpoints
//! store) is accepted. A permuted `g_idx` (`desc_act=True`) is rejected with
//! [`FormatError::ActOrder`]: the packed GPU layout assumes a
//! group is a run of consecutive inputs.

use super::error::{FormatError, Result};
use super::int4::{Int4Matrix, Int4Scheme, check_dims, check_len, halves, words};
use super::packed::PackedWeights;

/// How stored GPTQ zero points map to the zero point used in dequantization.
///
/// GPTQ v1 checkpoints (`checkpoint_format: "gptq"` or absent in `quantize_config.json`, i.e.
/// AutoGPTQ's and most published GPTQ models) store `zero - 1`, so the decoder adds 1: a
/// symmetric 4-bit checkpoint stores 7 (`0x77777777`) and dequantizes with zero point 8. GPTQ v2
/// checkpoints (`checkpoint_format: "gptq_v2"`) store the zero point itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GptqZeroOffset {
    /// v1: effective zero = stored + 1 (the common format, and the default).
    #[default]
    V1PlusOne,
    /// v2: effective zero = stored.
    V2AsStored,
}

impl GptqZeroOffset {
    fn offset(self) -> u8 {
        match self {
            GptqZeroOffset::V1PlusOne => 1,
            GptqZeroOffset::V2AsStored => 0,
        }
    }
}

/// The quant of input `k`, output `n` from GPTQ `qweight` words (`n_out` output columns):
/// word `(k / 8, n)`, nibble `k % 8`.
#[inline]
pub(crate) fn quant_at(qweight: &[u32], n_out: usize, k: usize, n: usize) -> u32 {
    (qweight[(k / 8) * n_out + n] >> (4 * (k % 8))) & 0xF
}

/// Spreads the eight nibbles of `w` to the low halves of eight bytes (nibble `i` to byte `i`).
#[inline]
fn spread_nibbles(w: u32) -> u64 {
    let mut x = w as u64;
    x = (x | x << 16) & 0x0000_FFFF_0000_FFFF;
    x = (x | x << 8) & 0x00FF_00FF_00FF_00FF;
    (x | x << 4) & 0x0F0F_0F0F_0F0F_0F0F
}

/// Writes the packed quant words (see [`super::packed_decode`]) of a GPTQ `qweight` of `k`
/// inputs and `n` outputs into `qs` (`n` rows of `k / 8` words).
///
/// Four qweight words of one column hold a run of 32 inputs in order; the run's bytes pair input
/// `l` with input `16 + l`, which is two nibble spreads and a shift. Columns are walked in tiles
/// so that every output row is written sequentially.
pub(crate) fn pack_runs(qweight: &[u32], k: usize, n: usize, qs: &mut [u32]) {
    let words_per_row = k / 8;
    for n0 in (0..n).step_by(64) {
        for r in (0..k / 8).step_by(4) {
            for col in n0..(n0 + 64).min(n) {
                let w = |i: usize| qweight[(r + i) * n + col];
                let lo = spread_nibbles(w(0)) | spread_nibbles(w(2)) << 4;
                let hi = spread_nibbles(w(1)) | spread_nibbles(w(3)) << 4;
                let out = &mut qs[col * words_per_row + r..][..4];
                out.copy_from_slice(&[lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32]);
            }
        }
    }
}

/// The tensors of one GPTQ linear layer, as raw little-endian bytes.
#[derive(Debug, Clone, Copy)]
pub struct GptqTensors<'a> {
    /// int32 `[in_features / 8, out_features]`.
    pub qweight: &'a [u8],
    /// int32 `[in_features / group_size, out_features / 8]`.
    pub qzeros: &'a [u8],
    /// f16 `[in_features / group_size, out_features]`.
    pub scales: &'a [u8],
    /// int32 `[in_features]`, if the checkpoint has it; it must be sequential.
    pub g_idx: Option<&'a [u8]>,
    /// `K`.
    pub in_features: usize,
    /// `N`.
    pub out_features: usize,
    /// `G` (32, 64, 128, ...; a positive multiple of 32 that divides `K`). A checkpoint's
    /// `group_size: -1` means one group: pass `K`.
    pub group_size: usize,
    /// How stored zero points are offset.
    pub zero_offset: GptqZeroOffset,
}

impl GptqTensors<'_> {
    fn unpack(&self) -> Result<Int4Matrix> {
        let (k, n, gs) = (self.in_features, self.out_features, self.group_size);
        let scheme = Int4Scheme::Gptq;
        check_dims(scheme, k, n, gs)?;
        let groups = k / gs;
        check_len(scheme, "qweight", self.qweight, k / 8 * n * 4)?;
        check_len(scheme, "qzeros", self.qzeros, groups * n / 8 * 4)?;
        check_len(scheme, "scales", self.scales, groups * n * 2)?;
        if let Some(g_idx) = self.g_idx {
            check_len(scheme, "g_idx", g_idx, k * 4)?;
            for (kk, g) in words(g_idx).enumerate() {
                let found = g as i32 as i64;
                if found != (kk / gs) as i64 {
                    return Err(FormatError::ActOrder { k: kk, found, expected: kk / gs });
                }
            }
        }
        let offset = self.zero_offset.offset();
        let mut z = Vec::with_capacity(groups * n);
        for w in words(self.qzeros) {
            z.extend((0..8).map(|i| ((w >> (4 * i)) & 0xF) as u8 + offset));
        }
        Ok(Int4Matrix { scheme, k, n, group_size: gs, qweight: words(self.qweight).collect(), z, s: halves(self.scales) })
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

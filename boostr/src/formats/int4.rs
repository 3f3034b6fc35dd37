//! What AWQ and GPTQ share: an int4 matrix with per-group scales and zero points.
//!
//! Both describe a linear layer with `K` input and `N` output features and groups of `G`
//! consecutive input elements. Once their bit packing is undone (see [`super::awq`] and
//! [`super::gptq`]) both are the same thing: for `k` in `0..K`, `n` in `0..N`, `g = k / G`,
//!
//! `w[k][n] = (q[k][n] - z[g][n]) * s[g][n]`
//!
//! with `q` in 0..16, `z` the effective zero point (0..=16) and `s` an f16 scale. The reference
//! computes it in f32: the integer difference is exact, and so is its product with an f16 scale.

use half::f16;

use super::error::{FormatError, Result};
use super::packed::{PackedFormat, PackedWeights};

/// Which safetensors int4 scheme a matrix came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Int4Scheme {
    /// AutoAWQ's GEMM layout.
    Awq,
    /// GPTQ (AutoGPTQ / GPTQModel / transformers) layout.
    Gptq,
}

impl Int4Scheme {
    /// `"AWQ"` or `"GPTQ"`.
    pub fn name(self) -> &'static str {
        match self {
            Int4Scheme::Awq => "AWQ",
            Int4Scheme::Gptq => "GPTQ",
        }
    }
}

/// An int4 matrix: the checkpoint's quant words as they are, zero points and scales unpacked
/// to logical `[group][col]` order.
pub(crate) struct Int4Matrix {
    pub scheme: Int4Scheme,
    pub k: usize,
    pub n: usize,
    pub group_size: usize,
    /// The `qweight` words in the checkpoint's layout (read through [`Int4Matrix::q`]).
    pub qweight: Vec<u32>,
    /// `z[g * N + n]`, the effective zero point.
    pub z: Vec<u8>,
    /// `s[g * N + n]`.
    pub s: Vec<f16>,
}

/// Checks the dimensions shared by AWQ and GPTQ: `N % 8 == 0`, `G > 0`, `G % 32 == 0` (the
/// packed layout works in runs of 32 inputs, and real checkpoints use 32, 64, 128 or `K`) and
/// `K % G == 0`.
pub(crate) fn check_dims(scheme: Int4Scheme, k: usize, n: usize, group_size: usize) -> Result<()> {
    let bad = |reason: String| Err(FormatError::InvalidShape { format: scheme.name(), reason });
    if !n.is_multiple_of(8) {
        return bad(format!("out_features {n} is not a multiple of 8"));
    }
    if group_size == 0 || !group_size.is_multiple_of(32) {
        return bad(format!("group size {group_size} is not a positive multiple of 32"));
    }
    if !k.is_multiple_of(group_size) {
        return bad(format!("in_features {k} is not a multiple of the group size {group_size}"));
    }
    Ok(())
}

/// Checks one buffer's byte length.
pub(crate) fn check_len(scheme: Int4Scheme, what: &'static str, bytes: &[u8], expected: usize) -> Result<()> {
    if bytes.len() != expected {
        return Err(FormatError::ByteLength { format: scheme.name(), what, expected, actual: bytes.len() });
    }
    Ok(())
}

/// Reads little-endian 32-bit words.
pub(crate) fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

/// Reads little-endian f16 values.
pub(crate) fn halves(bytes: &[u8]) -> Vec<f16> {
    bytes.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect()
}

/// Packs 32 quants of one output row (input `k0 + l` at `q[l]`) into the four words of a run:
/// byte `l` of the run holds `q[l]` in its low nibble and `q[16 + l]` in its high nibble.
#[inline]
pub(crate) fn pack_run(q: impl Fn(usize) -> u32, out: &mut [u32]) {
    for (w, word) in out.iter_mut().enumerate().take(4) {
        *word = (0..4).fold(0, |acc, b| {
            let l = 4 * w + b;
            acc | (q(l) | q(16 + l) << 4) << (8 * b)
        });
    }
}

impl Int4Matrix {
    /// The quant of input `k`, output `n` (0..16), unpacked from `qweight`.
    #[inline]
    fn q(&self, k: usize, n: usize) -> u32 {
        match self.scheme {
            Int4Scheme::Awq => super::awq::quant_at(&self.qweight, self.n, k, n),
            Int4Scheme::Gptq => super::gptq::quant_at(&self.qweight, self.n, k, n),
        }
    }

    /// The reference dequantization, `[K, N]` row-major (`w[k * N + n]`), the checkpoint's own
    /// orientation.
    pub(crate) fn dequantize(&self) -> Vec<f32> {
        let (n_cols, gs) = (self.n, self.group_size);
        let mut out = vec![0.0f32; self.k * n_cols];
        for (k, row) in out.chunks_exact_mut(n_cols.max(1)).enumerate() {
            let g = k / gs;
            for (n, w) in row.iter_mut().enumerate() {
                let q = self.q(k, n) as i32;
                let z = self.z[g * n_cols + n] as i32;
                *w = (q - z) as f32 * self.s[g * n_cols + n].to_f32();
            }
        }
        out
    }

    /// The GPU layout: transposed to `rows = N` output features of `cols = K` inputs, one `d`
    /// (scale) and one `m` (zero point) per group. Each run of 32 inputs `k0 .. k0 + 32` of a row
    /// is 16 bytes (four words) laid out like a Q4_0 block's `qs`: byte `l` holds input `k0 + l`
    /// in its low nibble and `k0 + 16 + l` in its high nibble.
    pub(crate) fn repack(&self) -> Result<PackedWeights> {
        let format = PackedFormat::Int4 { scheme: self.scheme, group_size: self.group_size };
        let mut p = PackedWeights::zeroed(format, self.n, self.k)?;
        let groups = self.k / self.group_size;
        match self.scheme {
            Int4Scheme::Awq => super::awq::pack_runs(&self.qweight, self.k, self.n, &mut p.qs),
            Int4Scheme::Gptq => super::gptq::pack_runs(&self.qweight, self.k, self.n, &mut p.qs),
        }
        for n in 0..self.n {
            for g in 0..groups {
                p.d[n * groups + g] = self.s[g * self.n + n];
                p.m[n * groups + g] = f16::from_f32(self.z[g * self.n + n] as f32);
            }
        }
        Ok(p)
    }
}

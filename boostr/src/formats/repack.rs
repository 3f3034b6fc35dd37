//! Repacking GGUF tensors from their file blocks into the [`PackedWeights`] GPU layout.
//!
//! Every field of a block goes to its own array with its bytes unchanged (ggml's in-block order
//! is kept), so this is a copy per field. The resulting bit positions are documented in
//! [`super::packed_decode`].

use half::f16;

use super::error::{FormatError, Result};
use super::ggml_type::GgmlType;
use super::packed::{PackedFormat, PackedWeights};

/// Byte ranges of a block's fields: (offset, length) of `qs`, `qh` and `scales`, and the
/// offsets of the f16 `d` and `m` (None when absent).
struct Fields {
    qs: (usize, usize),
    qh: (usize, usize),
    scales: (usize, usize),
    d: Option<usize>,
    m: Option<usize>,
}

/// Where each field sits in a block (the layouts of [`super::legacy`] and [`super::kquants`]).
fn fields(ty: GgmlType) -> Fields {
    use GgmlType::*;
    let f = |qs, qh, scales, d, m| Fields { qs, qh, scales, d, m };
    let none = (0, 0);
    match ty {
        Q4_0 => f((2, 16), none, none, Some(0), None),
        Q4_1 => f((4, 16), none, none, Some(0), Some(2)),
        Q5_0 => f((6, 16), (2, 4), none, Some(0), None),
        Q5_1 => f((8, 16), (4, 4), none, Some(0), Some(2)),
        Q8_0 => f((2, 32), none, none, Some(0), None),
        Q2_K => f((16, 64), none, (0, 16), Some(80), Some(82)),
        Q3_K => f((32, 64), (0, 32), (96, 12), Some(108), None),
        Q4_K => f((16, 128), none, (4, 12), Some(0), Some(2)),
        Q5_K => f((48, 128), (16, 32), (4, 12), Some(0), Some(2)),
        // Q6_K: ql -> qs, qh -> qh, the signed scales -> scales.
        _ => f((0, 128), (128, 64), (192, 16), Some(208), None),
    }
}

/// Packs bytes into little-endian u32 words (`dst.len() * 4 == bytes.len()`): a plain copy on
/// little-endian hosts.
pub(crate) fn bytes_to_words(bytes: &[u8], dst: &mut [u32]) {
    #[cfg(target_endian = "little")]
    bytemuck::cast_slice_mut::<u32, u8>(dst).copy_from_slice(bytes);
    #[cfg(not(target_endian = "little"))]
    for (w, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// Splits whole blocks of the block type `ty` (`bytes`, as a GGUF file stores them) into their
/// fields: block `i`'s quant, bit-plane and scale words go to `qs`, `qh` and `scales` at `i`
/// times the format's words per block, and its f16 `d` and `m` (as bits) to `d(i, ..)` and
/// `m(i, ..)`. The caller checks the type (a supported block type, not F32/F16/BF16) and sizes
/// the slices; this is the one copy of every field, shared by [`repack`] and the GPU layout.
pub(crate) fn split_blocks(
    ty: GgmlType,
    bytes: &[u8],
    qs: &mut [u32],
    qh: &mut [u32],
    scales: &mut [u32],
    mut d: impl FnMut(usize, u16),
    mut m: impl FnMut(usize, u16),
) {
    let f = fields(ty);
    let ts = ty.type_size();
    let (nqs, nqh, nsc) = (f.qs.1 / 4, f.qh.1 / 4, f.scales.1 / 4);
    for (i, block) in bytes.chunks_exact(ts).enumerate() {
        bytes_to_words(&block[f.qs.0..f.qs.0 + f.qs.1], &mut qs[i * nqs..(i + 1) * nqs]);
        if nqh > 0 {
            bytes_to_words(&block[f.qh.0..f.qh.0 + f.qh.1], &mut qh[i * nqh..(i + 1) * nqh]);
        }
        if nsc > 0 {
            bytes_to_words(&block[f.scales.0..f.scales.0 + f.scales.1], &mut scales[i * nsc..(i + 1) * nsc]);
        }
        if let Some(at) = f.d {
            d(i, u16::from_le_bytes([block[at], block[at + 1]]));
        }
        if let Some(at) = f.m {
            m(i, u16::from_le_bytes([block[at], block[at + 1]]));
        }
    }
}

/// Repacks a GGUF tensor of `rows x cols` elements (`cols` contiguous, as ggml stores a weight
/// of `ne0 = cols`, `ne1 = rows`) into the GPU layout.
///
/// Errors: [`FormatError::Unsupported`] for types without a decoder,
/// [`FormatError::NotBlockMultiple`] when `cols` is not a whole number of blocks, and
/// [`FormatError::ByteLength`] when `bytes` is not exactly `rows` rows.
pub fn repack(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize) -> Result<PackedWeights> {
    ty.ensure_supported()?;
    let row_bytes = ty.bytes_for(cols)?;
    let expected = rows * row_bytes;
    if bytes.len() != expected {
        return Err(FormatError::ByteLength { format: ty.name(), what: "data", expected, actual: bytes.len() });
    }
    let mut p = PackedWeights::zeroed(PackedFormat::Ggml(ty), rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(p);
    }
    match ty {
        GgmlType::F32 => bytes_to_words(bytes, &mut p.qs),
        GgmlType::F16 | GgmlType::BF16 => {
            let wpr = p.blocks_per_row();
            for (src, dst) in bytes.chunks_exact(row_bytes).zip(p.qs.chunks_exact_mut(wpr)) {
                for (w, c) in dst.iter_mut().zip(src.chunks(4)) {
                    let lo = u16::from_le_bytes([c[0], c[1]]) as u32;
                    let hi = if c.len() == 4 { u16::from_le_bytes([c[2], c[3]]) as u32 } else { 0 };
                    *w = lo | hi << 16;
                }
            }
        }
        _ => {
            debug_assert_eq!(4 * p.geometry.qs_words, fields(ty).qs.1);
            let PackedWeights { qs, qh, scales, d, m, .. } = &mut p;
            split_blocks(ty, bytes, qs, qh, scales, |i, b| d[i] = f16::from_bits(b), |i, b| m[i] = f16::from_bits(b));
        }
    }
    Ok(p)
}

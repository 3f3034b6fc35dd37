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

/// Packs bytes into little-endian u32 words (`dst.len() * 4 == bytes.len()`).
pub(crate) fn bytes_to_words(bytes: &[u8], dst: &mut [u32]) {
    for (w, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

fn read_f16(b: &[u8], at: usize) -> f16 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]]))
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
            let f = fields(ty);
            let geo = p.geometry;
            debug_assert_eq!(4 * geo.qs_words, f.qs.1);
            for (g, block) in bytes.chunks_exact(ty.type_size()).enumerate() {
                let copy = |(at, len): (usize, usize), dst: &mut [u32]| {
                    bytes_to_words(&block[at..at + len], &mut dst[g * len / 4..(g + 1) * len / 4]);
                };
                copy(f.qs, &mut p.qs);
                copy(f.qh, &mut p.qh);
                copy(f.scales, &mut p.scales);
                if let Some(at) = f.d {
                    p.d[g] = read_f16(block, at);
                }
                if let Some(at) = f.m {
                    p.m[g] = read_f16(block, at);
                }
            }
        }
    }
    Ok(p)
}

//! Repacking GGUF tensors from their file blocks into the [`PackedWeights`] GPU layout.
//!
//! The bit positions produced here are documented in [`super::packed_decode`].

use half::f16;

use super::error::{FormatError, Result};
use super::ggml_type::GgmlType;
use super::packed::{PackedFormat, PackedWeights};
use super::{kquants, legacy};

/// Packs `values` (each `bits` wide, in element order) into `dst`: value `i` sits at bit
/// `bits * (i % per_word)` of word `i / per_word`, with `per_word = 32 / bits`.
pub(crate) fn pack_bits(values: &[u8], bits: usize, dst: &mut [u32]) {
    let per_word = 32 / bits;
    for (word, chunk) in dst.iter_mut().zip(values.chunks(per_word)) {
        *word = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &v)| acc | (v as u32) << (bits * i));
    }
}

/// Packs bytes into little-endian u32 words (`dst.len() * 4 == bytes.len()`).
fn bytes_to_words(bytes: &[u8], dst: &mut [u32]) {
    for (w, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
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
        return Err(FormatError::ByteLength {
            format: ty.name(),
            what: "data",
            expected,
            actual: bytes.len(),
        });
    }
    let mut p = PackedWeights::zeroed(PackedFormat::Ggml(ty), rows, cols)?;
    if rows == 0 || cols == 0 {
        return Ok(p);
    }
    match ty {
        GgmlType::F32 => bytes_to_words(bytes, &mut p.qs),
        GgmlType::F16 | GgmlType::BF16 => {
            let wpr = p.blocks_per_row();
            for (src, dst) in bytes
                .chunks_exact(row_bytes)
                .zip(p.qs.chunks_exact_mut(wpr))
            {
                for (w, c) in dst.iter_mut().zip(src.chunks(4)) {
                    let lo = u16::from_le_bytes([c[0], c[1]]) as u32;
                    let hi = if c.len() == 4 {
                        u16::from_le_bytes([c[2], c[3]]) as u32
                    } else {
                        0
                    };
                    *w = lo | hi << 16;
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            repack_legacy(ty, bytes, &mut p)
        }
        _ => repack_kquant(ty, bytes, &mut p),
    }
    Ok(p)
}

fn repack_legacy(ty: GgmlType, bytes: &[u8], p: &mut PackedWeights) {
    let geo = p.geometry;
    let q_bits = if ty == GgmlType::Q8_0 { 8 } else { 4 };
    for (g, block) in bytes.chunks_exact(ty.type_size()).enumerate() {
        let f = legacy::fields(ty, block);
        pack_bits(
            &f.q,
            q_bits,
            &mut p.qs[g * geo.qs_words..(g + 1) * geo.qs_words],
        );
        if geo.qh_words == 1 {
            p.qh[g] = f.qh;
        }
        p.d[g] = f16::from_bits(f.d);
        if geo.has_m {
            p.m[g] = f16::from_bits(f.m);
        }
    }
}

fn repack_kquant(ty: GgmlType, bytes: &[u8], p: &mut PackedWeights) {
    let geo = p.geometry;
    let (lo_bits, hi_bits) = match ty {
        GgmlType::Q2_K => (2, 0),
        GgmlType::Q3_K => (2, 1),
        GgmlType::Q4_K => (4, 0),
        GgmlType::Q5_K => (4, 1),
        _ => (4, 2), // Q6_K
    };
    for (g, block) in bytes.chunks_exact(ty.type_size()).enumerate() {
        let f = kquants::fields(ty, block);
        pack_bits(
            &f.lo,
            lo_bits,
            &mut p.qs[g * geo.qs_words..(g + 1) * geo.qs_words],
        );
        if hi_bits > 0 {
            pack_bits(
                &f.hi,
                hi_bits,
                &mut p.qh[g * geo.qh_words..(g + 1) * geo.qh_words],
            );
        }
        let sw = geo.scale_words;
        bytes_to_words(&f.scales[..4 * sw], &mut p.scales[g * sw..(g + 1) * sw]);
        p.d[g] = f16::from_bits(f.d);
        if geo.has_m {
            p.m[g] = f16::from_bits(f.dmin);
        }
    }
}

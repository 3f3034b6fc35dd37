//! The CPU decoder of the [`PackedWeights`] layout, which the WGSL kernels mirror word for word.
//!
//! # Notation
//! Block `b` of row `r` has the global index `g = r * blocks_per_row + b`. Its words are
//! `QS = qs[g * QW ..][.. QW]`, `QH = qh[g * HW ..][.. HW]`, `SC = scales[g * SW ..][.. SW]`
//! (QW, HW, SW per format below), and its constants `d[g]`, `m[g]` (f16, widened to f32).
//! `e` is the element index inside the block. Helpers, all on little-endian u32 words:
//!
//! - `nib(W, e)  = (W[e / 8]  >> (4 * (e % 8)))  & 0xF`  (8 elements per word, in order)
//! - `pair(W, e) = (W[e / 16] >> (2 * (e % 16))) & 0x3`  (16 elements per word)
//! - `bit(W, e)  = (W[e / 32] >> (e % 32))       & 0x1`  (32 elements per word)
//! - `byte(W, i) = (W[i / 4]  >> (8 * (i % 4)))  & 0xFF` (4 bytes per word)
//!
//! # Layout per format
//! | format | block | QW | HW | SW | d | m    | value of element `e` (f32, in this order)                |
//! |--------|-------|----|----|----|---|------|----------------------------------------------------------|
//! | F32    | 1     | 1  | -  | -  | - | -    | `bitcast<f32>(QS[0])`                                    |
//! | F16    | 2     | 1  | -  | -  | - | -    | half `e` of `QS[0]` (low half first), widened            |
//! | BF16   | 2     | 1  | -  | -  | - | -    | `bitcast<f32>(((QS[0] >> 16 e) & 0xFFFF) << 16)`         |
//! | Q4_0   | 32    | 4  | -  | -  | d | -    | `d * (nib(QS,e) - 8)`                                    |
//! | Q4_1   | 32    | 4  | -  | -  | d | m    | `d * nib(QS,e) + m`                                      |
//! | Q5_0   | 32    | 4  | 1  | -  | d | -    | `d * ((nib(QS,e) \| bit(QH,e) << 4) - 16)`               |
//! | Q5_1   | 32    | 4  | 1  | -  | d | m    | `d * (nib(QS,e) \| bit(QH,e) << 4) + m`                  |
//! | Q8_0   | 32    | 8  | -  | -  | d | -    | `i8(byte(QS,e)) * d`                                     |
//! | Q2_K   | 256   | 16 | -  | 4  | d | dmin | `s = byte(SC,e/16)`: `(d * (s & 15)) * pair(QS,e) - (dmin * (s >> 4))` |
//! | Q3_K   | 256   | 16 | 8  | 3  | d | -    | `(d * (i8(byte(A,e/16)) - 32)) * (pair(QS,e) - (bit(QH,e) ? 0 : 4))` |
//! | Q4_K   | 256   | 32 | -  | 3  | d | dmin | `(sc, mn) = k4(SC, e/32)`: `(d * sc) * nib(QS,e) - (dmin * mn)` |
//! | Q5_K   | 256   | 32 | 8  | 3  | d | dmin | as Q4_K with `q = nib(QS,e) \| bit(QH,e) << 4`           |
//! | Q6_K   | 256   | 32 | 16 | 4  | d | -    | `(d * i8(byte(SC,e/16))) * ((nib(QS,e) \| pair(QH,e) << 4) - 32)` |
//! | AWQ/GPTQ | G   | G/8| -  | -  | scale | zero | `(nib(QS,e) - zero) * scale`                        |
//!
//! F16/BF16 rows with an odd element count end in a half-used word (the high half is zero).
//! An F32/F16/BF16 row starts at word `r * blocks_per_row`.
//!
//! Q2_K: word `w` of `QS` is exactly sub-block `w` (16 elements); scale byte `i` is sub-block `i`.
//!
//! Q3_K scales (`SC` = the 12 stored bytes as 3 words `a0, a1, a2`) unpack with ggml's mask trick
//! into four words `A` whose byte `k` is sub-block `k`'s six-bit scale; with `k1 = 0x03030303`
//! and `k2 = 0x0F0F0F0F`:
//! `A0 = (a0 & k2) | ((a2 & k1) << 4)`, `A1 = (a1 & k2) | (((a2 >> 2) & k1) << 4)`,
//! `A2 = ((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4)`, `A3 = ((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4)`.
//!
//! Q4_K/Q5_K scales (`SC` = the 12 stored bytes as `w0, w1, w2`), `k4(SC, i)` for sub-block
//! `i` of 32 elements (words `4i..4i+4` of `QS`), with `j = i % 4`:
//! `i < 4`: `sc = (w0 >> 8j) & 63`, `mn = (w1 >> 8j) & 63`;
//! `i >= 4`: `sc = ((w2 >> 8j) & 15) | (((w0 >> (8j + 6)) & 3) << 4)`,
//! `mn = ((w2 >> (8j + 4)) & 15) | (((w1 >> (8j + 6)) & 3) << 4)`.
//!
//! Q6_K: `QS` holds the low nibbles in element order, `QH` the top two bits in element order,
//! `SC` the sixteen signed scale bytes (sub-blocks of 16).
//!
//! AWQ/GPTQ: a row is one output feature `n`, the block is a quantization group of `G` input
//! elements; `d` is the group scale and `m` the group zero point (GPTQ's v1 `+1` already applied),
//! an integer in 0..=16 stored exactly as f16.

use super::float::{bf16_bits_to_f32, f16_bits_to_f32};
use super::ggml_type::GgmlType;
use super::packed::{PackedFormat, PackedWeights};

#[inline]
fn nib(w: &[u32], e: usize) -> u32 {
    (w[e / 8] >> (4 * (e % 8))) & 0xF
}

#[inline]
fn pair(w: &[u32], e: usize) -> u32 {
    (w[e / 16] >> (2 * (e % 16))) & 0x3
}

#[inline]
fn bit(w: &[u32], e: usize) -> u32 {
    (w[e / 32] >> (e % 32)) & 0x1
}

#[inline]
fn byte(w: &[u32], i: usize) -> u32 {
    (w[i / 4] >> (8 * (i % 4))) & 0xFF
}

/// Q3_K: the 12 stored scale bytes as three words, unpacked to four words of six-bit scales.
fn q3k_unpack_scales(sc: &[u32]) -> [u32; 4] {
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0F0F_0F0F;
    let (a0, a1, a2) = (sc[0], sc[1], sc[2]);
    [
        (a0 & K2) | ((a2 & K1) << 4),
        (a1 & K2) | (((a2 >> 2) & K1) << 4),
        ((a0 >> 4) & K2) | (((a2 >> 4) & K1) << 4),
        ((a1 >> 4) & K2) | (((a2 >> 6) & K1) << 4),
    ]
}

/// Q4_K/Q5_K: scale and min of sub-block `i` (0..8) from the three stored scale words.
fn k4_scale_min(sc: &[u32], i: usize) -> (u32, u32) {
    let sh = 8 * (i % 4);
    if i < 4 {
        ((sc[0] >> sh) & 63, (sc[1] >> sh) & 63)
    } else {
        (
            ((sc[2] >> sh) & 15) | (((sc[0] >> (sh + 6)) & 3) << 4),
            ((sc[2] >> (sh + 4)) & 15) | (((sc[1] >> (sh + 6)) & 3) << 4),
        )
    }
}

/// Decodes row `row` of `p` into `out` (`out.len() == p.cols()`; the row index is checked by
/// the caller).
pub(crate) fn decode_row(p: &PackedWeights, row: usize, out: &mut [f32]) {
    let bpr = p.blocks_per_row();
    let geo = p.geometry;
    match p.format {
        PackedFormat::Ggml(GgmlType::F32) => {
            for (o, &w) in out.iter_mut().zip(&p.qs[row * bpr..]) {
                *o = f32::from_bits(w);
            }
        }
        PackedFormat::Ggml(t @ (GgmlType::F16 | GgmlType::BF16)) => {
            let words = &p.qs[row * bpr..(row + 1) * bpr];
            for (c, o) in out.iter_mut().enumerate() {
                let half = ((words[c / 2] >> (16 * (c % 2))) & 0xFFFF) as u16;
                *o = if t == GgmlType::F16 {
                    f16_bits_to_f32(half)
                } else {
                    bf16_bits_to_f32(half)
                };
            }
        }
        format => {
            for (b, chunk) in out.chunks_exact_mut(geo.block_size).enumerate() {
                let g = row * bpr + b;
                let qs = &p.qs[g * geo.qs_words..(g + 1) * geo.qs_words];
                let qh = &p.qh[g * geo.qh_words..(g + 1) * geo.qh_words];
                let sc = &p.scales[g * geo.scale_words..(g + 1) * geo.scale_words];
                let d = p.d.get(g).map_or(0.0, |v| v.to_f32());
                let m = p.m.get(g).map_or(0.0, |v| v.to_f32());
                decode_block(format, qs, qh, sc, d, m, chunk);
            }
        }
    }
}

/// Decodes one block of a quantized format from its packed words.
fn decode_block(
    format: PackedFormat,
    qs: &[u32],
    qh: &[u32],
    sc: &[u32],
    d: f32,
    m: f32,
    out: &mut [f32],
) {
    use GgmlType::*;
    let ggml = match format {
        PackedFormat::Int4 { .. } => {
            for (e, o) in out.iter_mut().enumerate() {
                *o = (nib(qs, e) as f32 - m) * d;
            }
            return;
        }
        PackedFormat::Ggml(t) => t,
    };
    match ggml {
        Q4_0 => out.iter_mut().enumerate().for_each(|(e, o)| {
            *o = d * (nib(qs, e) as i32 - 8) as f32;
        }),
        Q4_1 => out.iter_mut().enumerate().for_each(|(e, o)| {
            *o = d * nib(qs, e) as f32 + m;
        }),
        Q5_0 => out.iter_mut().enumerate().for_each(|(e, o)| {
            *o = d * ((nib(qs, e) | bit(qh, e) << 4) as i32 - 16) as f32;
        }),
        Q5_1 => out.iter_mut().enumerate().for_each(|(e, o)| {
            *o = d * (nib(qs, e) | bit(qh, e) << 4) as f32 + m;
        }),
        Q8_0 => out.iter_mut().enumerate().for_each(|(e, o)| {
            *o = (byte(qs, e) as u8 as i8) as f32 * d;
        }),
        Q2_K => {
            for (i, sub) in out.chunks_exact_mut(16).enumerate() {
                let s = byte(sc, i);
                let dl = d * (s & 15) as f32;
                let ml = m * (s >> 4) as f32;
                for (l, o) in sub.iter_mut().enumerate() {
                    *o = dl * pair(qs, 16 * i + l) as f32 - ml;
                }
            }
        }
        Q3_K => {
            let a = q3k_unpack_scales(sc);
            for (i, sub) in out.chunks_exact_mut(16).enumerate() {
                let dl = d * (byte(&a, i) as u8 as i8 as i32 - 32) as f32;
                for (l, o) in sub.iter_mut().enumerate() {
                    let e = 16 * i + l;
                    let offset = if bit(qh, e) == 1 { 0 } else { 4 };
                    *o = dl * (pair(qs, e) as i32 - offset) as f32;
                }
            }
        }
        Q4_K | Q5_K => {
            for (i, sub) in out.chunks_exact_mut(32).enumerate() {
                let (s, mn) = k4_scale_min(sc, i);
                let d1 = d * s as f32;
                let m1 = m * mn as f32;
                for (l, o) in sub.iter_mut().enumerate() {
                    let e = 32 * i + l;
                    let high = if ggml == Q5_K { bit(qh, e) << 4 } else { 0 };
                    *o = d1 * (nib(qs, e) | high) as f32 - m1;
                }
            }
        }
        Q6_K => {
            for (i, sub) in out.chunks_exact_mut(16).enumerate() {
                let dl = d * (byte(sc, i) as u8 as i8) as f32;
                for (l, o) in sub.iter_mut().enumerate() {
                    let e = 16 * i + l;
                    *o = dl * ((nib(qs, e) | pair(qh, e) << 4) as i32 - 32) as f32;
                }
            }
        }
        // Geometry::of rejected every other type when the PackedWeights was built.
        _ => out.fill(0.0),
    }
}

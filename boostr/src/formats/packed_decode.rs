//! The CPU decoder of the [`PackedWeights`] layout, which the WGSL kernels mirror word for word.
//!
//! # Arrays of a block
//! Block `b` of row `r` has the global index `g = r * blocks_per_row + b`. Its words are
//! `QS = qs[g * QW ..][.. QW]`, `QH = qh[g * HW ..][.. HW]`, `SC = scales[g * SW ..][.. SW]`
//! (QW, HW, SW per format below) and its constants `d[g]`, `m[g]` (f16, widened to f32).
//! For the GGUF quants each array holds the bytes of one ggml block field unchanged, as
//! little-endian words: ggml's in-block order is kept. `e` is the element index in the block and
//! `at(W, i, s, mask) = (W[i / 4] >> (8 * (i % 4) + s)) & mask` reads bits `s..` of byte `i`.
//!
//! Because the order is ggml's, `(W[w] >> s) & 0x0F0F0F0F` (4-bit), `& 0x03030303` (2-bit) or
//! `& 0x01010101` (bit planes) always yields four *consecutive* elements, one per byte, ready for
//! `dot4I8Packed` against plainly packed 8-bit activations.
//!
//! # Layout per format
//! | format | block | QW | HW | SW | d | m    | quant of element `e`                                   |
//! |--------|-------|----|----|----|---|------|--------------------------------------------------------|
//! | F32    | 1     | 1  | -  | -  | - | -    | `bitcast<f32>(QS[0])`                                  |
//! | F16    | 2     | 1  | -  | -  | - | -    | half `e` of `QS[0]` (low half first), widened          |
//! | BF16   | 2     | 1  | -  | -  | - | -    | `bitcast<f32>(((QS[0] >> 16 e) & 0xFFFF) << 16)`       |
//! | Q4_0   | 32    | 4  | -  | -  | d | -    | `q = at(QS, e % 16, 4 (e / 16), 15)`                   |
//! | Q4_1   | 32    | 4  | -  | -  | d | m    | as Q4_0                                                |
//! | Q5_0   | 32    | 4  | 1  | -  | d | -    | as Q4_0, `\| ((QH[0] >> e) & 1) << 4`                  |
//! | Q5_1   | 32    | 4  | 1  | -  | d | m    | as Q5_0                                                |
//! | Q8_0   | 32    | 8  | -  | -  | d | -    | `q = i8(at(QS, e, 0, 255))`                            |
//! | Q2_K   | 256   | 16 | -  | 4  | d | dmin | `q = at(QS, 32 (e / 128) + e % 32, 2 ((e / 32) % 4), 3)` |
//! | Q3_K   | 256   | 16 | 8  | 3  | d | -    | as Q2_K; high bit `at(QH, e % 32, e / 32, 1)`          |
//! | Q4_K   | 256   | 32 | -  | 3  | d | dmin | `q = at(QS, 32 (e / 64) + e % 32, 4 ((e / 32) % 2), 15)` |
//! | Q5_K   | 256   | 32 | 8  | 3  | d | dmin | as Q4_K, `\| at(QH, e % 32, e / 32, 1) << 4`           |
//! | Q6_K   | 256   | 32 | 16 | 4  | d | -    | `at(QS, 64 (e / 128) + e % 64, 4 ((e / 64) % 2), 15) \| at(QH, 32 (e / 128) + e % 32, 2 ((e / 32) % 4), 3) << 4` |
//! | AWQ/GPTQ | G   | G/8| -  | -  | scale | zero | `q = at(QS, 16 (e / 32) + e % 16, 4 ((e % 32) / 16), 15)` |
//!
//! # Values (f32 arithmetic, in exactly this order, no fused multiply-add)
//! - Q4_0: `d * (q - 8)`; Q5_0: `d * (q - 16)`; Q4_1, Q5_1: `d * q + m`; Q8_0: `q * d`.
//! - Q2_K: sub-block `i = e / 16`, `s = at(SC, i, 0, 255)`:
//!   `(d * (s & 15)) * q - (dmin * (s >> 4))`.
//! - Q3_K: `(d * (sc - 32)) * (q - (high ? 0 : 4))` with `sc` = byte `e / 16` of the four words
//!   `A` that ggml's mask trick unpacks from the three `SC` words `a0, a1, a2`
//!   (`k1 = 0x03030303`, `k2 = 0x0F0F0F0F`):
//!   `A0 = (a0 & k2) | ((a2 & k1) << 4)`, `A1 = (a1 & k2) | (((a2 >> 2) & k1) << 4)`,
//!   `A2 = ((a0 >> 4) & k2) | (((a2 >> 4) & k1) << 4)`,
//!   `A3 = ((a1 >> 4) & k2) | (((a2 >> 6) & k1) << 4)`.
//! - Q4_K, Q5_K: sub-block `i = e / 32`, `(d * sc) * q - (dmin * mn)` with, for `j = i % 4` and
//!   the three `SC` words `w0, w1, w2` (ggml's `get_scale_min_k4`):
//!   `i < 4`: `sc = (w0 >> 8j) & 63`, `mn = (w1 >> 8j) & 63`;
//!   `i >= 4`: `sc = ((w2 >> 8j) & 15) | (((w0 >> (8j + 6)) & 3) << 4)`,
//!   `mn = ((w2 >> (8j + 4)) & 15) | (((w1 >> (8j + 6)) & 3) << 4)`.
//! - Q6_K: `(d * i8(at(SC, e / 16, 0, 255))) * (q - 32)`.
//! - AWQ/GPTQ: a row is one output feature, the block is one quantization group of `G` inputs
//!   (a multiple of 32), `d` its scale and `m` its zero point (GPTQ v1's `+1` already applied; an
//!   integer in 0..=16, exact in f16): `(q - m) * d`. Each run of 32 inputs is four words laid
//!   out like a Q4_0 block's `qs`.
//!
//! F16/BF16 rows with an odd element count end in a half-used word (the high half is zero); an
//! F32/F16/BF16 row starts at word `r * blocks_per_row`.

use super::float::{bf16_bits_to_f32, f16_bits_to_f32};
use super::ggml_type::GgmlType;
use super::packed::{PackedFormat, PackedWeights};

/// Bits `shift..` of byte `i` of a word array, masked.
#[inline]
fn at(w: &[u32], i: usize, shift: usize, mask: u32) -> u32 {
    (w[i / 4] >> (8 * (i % 4) + shift)) & mask
}

/// Q3_K: the 12 stored scale bytes as three words, unpacked to four words of six-bit scales.
fn q3k_unpack_scales(sc: &[u32]) -> [u32; 4] {
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0F0F_0F0F;
    let (a0, a1, a2) = (sc[0], sc[1], sc[2]);
    [(a0 & K2) | ((a2 & K1) << 4), (a1 & K2) | (((a2 >> 2) & K1) << 4), ((a0 >> 4) & K2) | (((a2 >> 4) & K1) << 4), ((a1 >> 4) & K2) | (((a2 >> 6) & K1) << 4)]
}

/// Q4_K/Q5_K: scale and min of sub-block `i` (0..8) from the three stored scale words.
fn k4_scale_min(sc: &[u32], i: usize) -> (u32, u32) {
    let sh = 8 * (i % 4);
    if i < 4 {
        ((sc[0] >> sh) & 63, (sc[1] >> sh) & 63)
    } else {
        (((sc[2] >> sh) & 15) | (((sc[0] >> (sh + 6)) & 3) << 4), ((sc[2] >> (sh + 4)) & 15) | (((sc[1] >> (sh + 6)) & 3) << 4))
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
                *o = if t == GgmlType::F16 { f16_bits_to_f32(half) } else { bf16_bits_to_f32(half) };
            }
        }
        format => {
            for (b, chunk) in out.chunks_exact_mut(geo.block_size).enumerate() {
                let g = row * bpr + b;
                let block = Block {
                    qs: &p.qs[g * geo.qs_words..(g + 1) * geo.qs_words],
                    qh: &p.qh[g * geo.qh_words..(g + 1) * geo.qh_words],
                    sc: &p.scales[g * geo.scale_words..(g + 1) * geo.scale_words],
                    d: p.d.get(g).map_or(0.0, |v| v.to_f32()),
                    m: p.m.get(g).map_or(0.0, |v| v.to_f32()),
                };
                decode_block(format, &block, chunk);
            }
        }
    }
}

/// One packed block's words and constants.
struct Block<'a> {
    qs: &'a [u32],
    qh: &'a [u32],
    sc: &'a [u32],
    d: f32,
    m: f32,
}

/// Decodes one block of a quantized format from its packed words.
fn decode_block(format: PackedFormat, b: &Block<'_>, out: &mut [f32]) {
    use GgmlType::*;
    let (qs, qh, sc, d, m) = (b.qs, b.qh, b.sc, b.d, b.m);
    let q4 = |e: usize| at(qs, 16 * (e / 32) + e % 16, 4 * ((e % 32) / 16), 15);
    let ggml = match format {
        PackedFormat::Int4 { .. } => {
            for (e, o) in out.iter_mut().enumerate() {
                *o = (q4(e) as f32 - m) * d;
            }
            return;
        }
        PackedFormat::Ggml(t) => t,
    };
    let q5 = |e: usize| q4(e) | ((qh.first().copied().unwrap_or(0) >> e) & 1) << 4;
    for (e, o) in out.iter_mut().enumerate() {
        *o = match ggml {
            Q4_0 => d * (q4(e) as i32 - 8) as f32,
            Q4_1 => d * q4(e) as f32 + m,
            Q5_0 => d * (q5(e) as i32 - 16) as f32,
            Q5_1 => d * q5(e) as f32 + m,
            Q8_0 => (at(qs, e, 0, 255) as u8 as i8) as f32 * d,
            Q2_K => {
                let s = at(sc, e / 16, 0, 255);
                let q = at(qs, 32 * (e / 128) + e % 32, 2 * ((e / 32) % 4), 3);
                (d * (s & 15) as f32) * q as f32 - (m * (s >> 4) as f32)
            }
            Q3_K => {
                let s = at(&q3k_unpack_scales(sc), e / 16, 0, 255) as i32 - 32;
                let q = at(qs, 32 * (e / 128) + e % 32, 2 * ((e / 32) % 4), 3) as i32;
                let offset = if at(qh, e % 32, e / 32, 1) == 1 { 0 } else { 4 };
                (d * s as f32) * (q - offset) as f32
            }
            Q4_K | Q5_K => {
                let (s, mn) = k4_scale_min(sc, e / 32);
                let mut q = at(qs, 32 * (e / 64) + e % 32, 4 * ((e / 32) % 2), 15);
                if ggml == Q5_K {
                    q |= at(qh, e % 32, e / 32, 1) << 4;
                }
                (d * s as f32) * q as f32 - (m * mn as f32)
            }
            Q6_K => {
                let s = at(sc, e / 16, 0, 255) as u8 as i8;
                let lo = at(qs, 64 * (e / 128) + e % 64, 4 * ((e / 64) % 2), 15);
                let hi = at(qh, 32 * (e / 128) + e % 32, 2 * ((e / 32) % 4), 3);
                (d * s as f32) * ((lo | hi << 4) as i32 - 32) as f32
            }
            // Geometry::of rejected every other type when the PackedWeights was built.
            _ => 0.0,
        };
    }
}

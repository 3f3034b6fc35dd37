//! Reference decoding of the ggml K-quantizations: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
//!
//! Each uses super-blocks of [`QK_K`] = 256 elements split into sub-blocks with their own
//! integer scales. File layouts (little-endian, packed, in this order):
//!
//! | type | bytes | fields                                                                        |
//! |------|-------|-------------------------------------------------------------------------------|
//! | Q2_K | 84    | `scales: [u8; 16]`, `qs: [u8; 64]`, `d: f16`, `dmin: f16`                      |
//! | Q3_K | 110   | `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]`, `d: f16`                |
//! | Q4_K | 144   | `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qs: [u8; 128]`                     |
//! | Q5_K | 176   | `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]`, `qs: [u8; 128]`     |
//! | Q6_K | 210   | `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`                  |
//!
//! Where element `e` of the super-block lives (`j`, `s`, `h`, `l` as in each formula):
//! - Q2_K/Q3_K 2-bit quants: `e = 128 j + 32 s + l` is bits `2s..2s+2` of `qs[32 j + l]`.
//!   Q2_K has 16 sub-blocks of 16 (`e / 16`); `scales[i]` holds the scale in its low nibble and
//!   the min in its high nibble: `y = (d * sc) * q - (dmin * mn)`.
//! - Q3_K high bit: `e = 32 i + l` is bit `i` of `hmask[l]`; a set bit means no offset, a clear
//!   bit subtracts 4. Its 16 six-bit scales (sub-blocks of 16) are packed in 12 bytes: scale `k`
//!   has low bits `scales[k % 8] >> (4 (k / 8)) & 15` and high bits
//!   `scales[8 + k % 4] >> (2 (k / 4)) & 3`, and is used as `sc - 32`:
//!   `y = (d * (sc - 32)) * (q - (hbit ? 0 : 4))`.
//! - Q4_K/Q5_K 4-bit quants: `e = 64 j + 32 h + l` is nibble `h` of `qs[32 j + l]`; Q5_K's bit 4
//!   of element `e = 32 i + l` is bit `i` of `qh[l]`. Eight sub-blocks of 32, with six-bit scale and
//!   min packed in 12 bytes (ggml's `get_scale_min_k4`): for `i < 4`, `sc = b[i] & 63`,
//!   `mn = b[i + 4] & 63`; for `i >= 4`, `sc = (b[i + 4] & 15) | ((b[i - 4] >> 6) << 4)` and
//!   `mn = (b[i + 4] >> 4) | ((b[i] >> 6) << 4)`. `y = (d * sc) * q - (dmin * mn)`.
//! - Q6_K: low four bits of `e = 128 j + 64 h + l` (`l < 64`) are nibble `h` of `ql[64 j + l]`;
//!   the high two bits of `e = 128 j + 32 s + l` are bits `2s..2s+2` of `qh[32 j + l]`. Sixteen
//!   sub-blocks of 16 with signed 8-bit scales: `y = (d * sc) * (q - 32)`.
//!
//! All arithmetic is f32, in the order written, as in ggml's reference and gguf-py.

use super::float::read_f16;
use super::ggml_type::{GgmlType, QK_K};

/// ggml's `get_scale_min_k4`: the six-bit scale and min of sub-block `i` (0..8).
fn scale_min_k4(i: usize, b: &[u8]) -> (u8, u8) {
    if i < 4 { (b[i] & 63, b[i + 4] & 63) } else { ((b[i + 4] & 0x0F) | ((b[i - 4] >> 6) << 4), (b[i + 4] >> 4) | ((b[i] >> 6) << 4)) }
}

/// Q3_K's sixteen six-bit scales, unpacked from their 12 bytes (before subtracting 32).
fn q3k_scales(b: &[u8]) -> [u8; 16] {
    let mut sc = [0u8; 16];
    for (k, s) in sc.iter_mut().enumerate() {
        let lo = (b[k % 8] >> (4 * (k / 8))) & 0x0F;
        let hi = (b[8 + k % 4] >> (2 * (k / 4))) & 0x03;
        *s = lo | (hi << 4);
    }
    sc
}

/// Decodes one K-quant super-block into `out[..256]`, element by element, straight from the
/// file bytes.
pub(crate) fn dequant_block(ty: GgmlType, b: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::Q2_K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (read_f16(b, 80), read_f16(b, 82));
            for e in 0..QK_K {
                let (j, s, l) = (e / 128, (e / 32) % 4, e % 32);
                let q = (qs[32 * j + l] >> (2 * s)) & 3;
                let sc = scales[e / 16];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                out[e] = dl * q as f32 - ml;
            }
        }
        GgmlType::Q3_K => {
            let (hmask, qs) = (&b[0..32], &b[32..96]);
            let sc = q3k_scales(&b[96..108]);
            let d = read_f16(b, 108);
            for e in 0..QK_K {
                let (j, s, l) = (e / 128, (e / 32) % 4, e % 32);
                let q = ((qs[32 * j + l] >> (2 * s)) & 3) as i32;
                let high_set = (hmask[e % 32] >> (e / 32)) & 1 == 1;
                let dl = d * (sc[e / 16] as i32 - 32) as f32;
                out[e] = dl * (q - if high_set { 0 } else { 4 }) as f32;
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (read_f16(b, 0), read_f16(b, 2));
            let scales = &b[4..16];
            let (qh, qs): (&[u8], &[u8]) = if ty == GgmlType::Q5_K { (&b[16..48], &b[48..176]) } else { (&[], &b[16..144]) };
            for e in 0..QK_K {
                let (j, h, l) = (e / 64, (e / 32) % 2, e % 32);
                let mut q = (qs[32 * j + l] >> (4 * h)) & 0x0F;
                if !qh.is_empty() {
                    q |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
                }
                let (sc, mn) = scale_min_k4(e / 32, scales);
                let d1 = d * sc as f32;
                let m1 = dmin * mn as f32;
                out[e] = d1 * q as f32 - m1;
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = read_f16(b, 208);
            for e in 0..QK_K {
                let j = e / 128;
                let (h, l64) = ((e / 64) % 2, e % 64);
                let (s, l32) = ((e / 32) % 4, e % 32);
                let lo = (ql[64 * j + l64] >> (4 * h)) & 0x0F;
                let hi = (qh[32 * j + l32] >> (2 * s)) & 3;
                let q = (lo | (hi << 4)) as i32 - 32;
                out[e] = d * (scales[e / 16] as i8) as f32 * q as f32;
            }
        }
        _ => unreachable!("kquants::dequant_block called with {ty}"),
    }
}

//! Reference decoding of the legacy ggml quantizations: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
//!
//! All use blocks of [`QK`] = 32 elements. File layouts (little-endian, packed, no padding):
//!
//! | type | bytes | fields in order                                   | value of element `j`       |
//! |------|-------|---------------------------------------------------|----------------------------|
//! | Q4_0 | 18    | `d: f16`, `qs: [u8; 16]`                          | `d * (q - 8)`              |
//! | Q4_1 | 20    | `d: f16`, `m: f16`, `qs: [u8; 16]`                | `d * q + m`                |
//! | Q5_0 | 22    | `d: f16`, `qh: [u8; 4]`, `qs: [u8; 16]`           | `d * (q - 16)`             |
//! | Q5_1 | 24    | `d: f16`, `m: f16`, `qh: [u8; 4]`, `qs: [u8; 16]` | `d * q + m`                |
//! | Q8_0 | 34    | `d: f16`, `qs: [i8; 32]`                          | `q * d`                    |
//!
//! For the 4- and 5-bit types the low four bits of element `j < 16` are the low nibble of
//! `qs[j]`, and those of element `j + 16` the high nibble of `qs[j]`. For the 5-bit types bit 4 of
//! element `j` is bit `j` of `qh` read as a little-endian u32. All arithmetic is f32 with the
//! scale widened from f16, in the order written above (no fused multiply-add), which is what
//! ggml's reference and gguf-py compute.

use super::float::read_f16;
use super::ggml_type::{GgmlType, QK};

/// Decodes one block of a legacy type into `out[..32]`, straight from the file bytes.
pub(crate) fn dequant_block(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    let d = read_f16(block, 0);
    let half = QK / 2;
    match ty {
        GgmlType::Q4_0 => {
            let qs = &block[2..18];
            for j in 0..half {
                out[j] = d * ((qs[j] & 0x0F) as i32 - 8) as f32;
                out[j + half] = d * ((qs[j] >> 4) as i32 - 8) as f32;
            }
        }
        GgmlType::Q4_1 => {
            let m = read_f16(block, 2);
            let qs = &block[4..20];
            for j in 0..half {
                out[j] = d * (qs[j] & 0x0F) as f32 + m;
                out[j + half] = d * (qs[j] >> 4) as f32 + m;
            }
        }
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let qs = &block[6..22];
            for j in 0..half {
                let h0 = ((qh >> j) & 1) << 4;
                let h1 = ((qh >> (j + half)) & 1) << 4;
                out[j] = d * (((qs[j] & 0x0F) as u32 | h0) as i32 - 16) as f32;
                out[j + half] = d * (((qs[j] >> 4) as u32 | h1) as i32 - 16) as f32;
            }
        }
        GgmlType::Q5_1 => {
            let m = read_f16(block, 2);
            let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
            let qs = &block[8..24];
            for j in 0..half {
                let h0 = ((qh >> j) & 1) << 4;
                let h1 = ((qh >> (j + half)) & 1) << 4;
                out[j] = d * ((qs[j] & 0x0F) as u32 | h0) as f32 + m;
                out[j + half] = d * ((qs[j] >> 4) as u32 | h1) as f32 + m;
            }
        }
        GgmlType::Q8_0 => {
            for j in 0..QK {
                out[j] = (block[2 + j] as i8) as f32 * d;
            }
        }
        _ => unreachable!("legacy::dequant_block called with {ty}"),
    }
}

//! Reference decoding of the plain floating-point types F32, F16 and BF16.
//!
//! File layout: little-endian elements, no blocks. F16 widens exactly to f32. BF16 is the top
//! half of an f32: `f32::from_bits((b as u32) << 16)`, which is exact for every bit pattern.

use half::f16;

/// Decodes little-endian f32 values. `out.len() * 4 == data.len()` is the caller's contract.
pub(crate) fn decode_f32(data: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// Decodes little-endian IEEE half values, widening each exactly to f32.
pub(crate) fn decode_f16(data: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
        *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

/// Decodes little-endian bfloat16 values: each is the high 16 bits of an f32.
pub(crate) fn decode_bf16(data: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
        *o = bf16_bits_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// Widens bfloat16 bits to f32 by placing them in the high half of the word.
#[inline]
pub(crate) fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Widens IEEE half bits to f32 (exact).
#[inline]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Reads the little-endian f16 at `data[at..at + 2]` and widens it to f32.
#[inline]
pub(crate) fn read_f16(data: &[u8], at: usize) -> f32 {
    f16_bits_to_f32(u16::from_le_bytes([data[at], data[at + 1]]))
}

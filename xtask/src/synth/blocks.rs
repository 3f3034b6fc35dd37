//! Random quantized rows, written straight as block bytes (nothing is quantized).
//!
//! A row is first filled with random bytes, which makes every quant value uniform over its range;
//! then each block's scale fields are set so that the dequantized weights have an RMS of about
//! `1 / sqrt(cols)` (a unit-RMS input then gives a unit-RMS output) and a mean of about zero:
//!
//! | type | value                      | `E[value² / scale²]`                         | scales set        |
//! |------|----------------------------|----------------------------------------------|-------------------|
//! | Q4_0 | `d (q - 8)`, q in 0..16     | 21.5                                         | `d`               |
//! | Q4_1 | `d q + m`, `m = -7.5 d`     | 21.25                                        | `d`, `m`          |
//! | Q5_0 | `d (q - 16)`, q in 0..32    | 85.5                                         | `d`               |
//! | Q8_0 | `d q`, q in -128..128       | 5461.5                                       | `d`               |
//! | Q4_K | `d sc q - dmin mn`          | `E[sc²] 21.25` (sc = mn in 16..32, dmin = 7.5 d) | `d`, `dmin`, 8 × (sc, mn) |
//! | Q6_K | `d sc (q - 32)`, q in 0..64 | `E[sc²] 341.5` (sc in 8..16)                 | `d`, 16 × sc      |
//!
//! Each block's scale is further multiplied by a random factor in [0.8, 1.2] (compensated in the
//! RMS), and for the types whose quants are not centred (Q4_0, Q5_0, Q8_0, Q6_K) by a random
//! sign, which makes the mean zero. The sub-scale ranges keep the f16 super-block scales well away from zero even for
//! 14336-long rows. Scale magnitudes are finite and positive by construction; [`f16_bits`]
//! refuses anything else, so no NaN/Inf f16 is ever written.

use boostr::formats::GgmlType;

/// wyrand: a fast 64-bit generator (one multiply per output), good enough for weights.
#[derive(Clone, Debug)]
pub struct Rng(u64);

/// splitmix64's finaliser, to turn (seed, tensor, row) into independent starting states.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    /// The generator of row `row` of tensor `tensor` for `seed`: the same row always gets the
    /// same bytes, whatever the chunking or thread count.
    pub fn for_row(seed: u64, tensor: u64, row: u64) -> Rng {
        Rng(mix(mix(mix(seed) ^ tensor) ^ row.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) ^ t) as u64
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform integer in `lo..hi`.
    pub fn range(&mut self, lo: u8, hi: u8) -> u8 {
        lo + (self.next_u64() % u64::from(hi - lo)) as u8
    }

    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// The f16 bits of a scale; panics on a value that is not finite and positive as f16.
pub fn f16_bits(x: f32) -> [u8; 2] {
    let h = half::f16::from_f32(x);
    assert!(h.is_finite() && h > half::f16::ZERO, "scale {x} is not a finite positive f16");
    h.to_bits().to_le_bytes()
}

/// `E[jitter²]` for a jitter uniform in [0.8, 1.2].
const JITTER_MS: f32 = 1.0 + 0.16 / 12.0;

/// `E[sc²]` for Q4_K's sub-scales (uniform in 16..32) and Q6_K's (uniform in 8..16).
const Q4K_SC_MS: f32 = 573.5;
const Q6K_SC_MS: f32 = 137.5;

/// `E[value²]` over the random quants of a block whose scales are all 1 (see the module table).
fn unit_ms(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::Q4_0 => 21.5,
        GgmlType::Q4_1 => 21.25,
        GgmlType::Q5_0 => 85.5,
        GgmlType::Q8_0 => 5461.5,
        GgmlType::Q4_K => Q4K_SC_MS * 21.25,
        GgmlType::Q6_K => Q6K_SC_MS * 341.5,
        other => panic!("no random blocks for {other}"),
    }
}

/// Packs Q4_K's eight 6-bit (scale, min) pairs into 12 bytes, as ggml's `get_scale_min_k4`
/// unpacks them.
fn pack_q4k_scales(sc: &[u8; 8], mn: &[u8; 8], out: &mut [u8]) {
    for i in 0..4 {
        out[i] = (sc[i] & 63) | ((sc[i + 4] >> 4) << 6);
        out[i + 4] = (mn[i] & 63) | ((mn[i + 4] >> 4) << 6);
        out[i + 8] = (sc[i + 4] & 15) | ((mn[i + 4] & 15) << 4);
    }
}

/// Writes one random row of `cols` elements of `ty` into `out` (exactly the row's bytes).
pub fn fill_row(ty: GgmlType, cols: usize, rng: &mut Rng, out: &mut [u8]) {
    debug_assert_eq!(Ok(out.len()), ty.bytes_for(cols));
    if ty == GgmlType::F32 {
        for c in out.chunks_exact_mut(4) {
            let x = (rng.unit() * 2.0 - 1.0) * 3f32.sqrt() / (cols as f32).sqrt();
            c.copy_from_slice(&x.to_le_bytes());
        }
        return;
    }
    rng.fill(out);
    // Scale of a block with unit jitter, so that the row's RMS is 1 / sqrt(cols).
    let d0 = 1.0 / ((cols as f32) * unit_ms(ty) * JITTER_MS).sqrt();
    for b in out.chunks_exact_mut(ty.type_size()) {
        let d = d0 * (0.8 + 0.4 * rng.unit());
        // The symmetric types' quants are not centred (Q4_0's `q - 8` is -8..8, mean -0.5): a
        // random sign of `d` (as ggml's own quantizer gives) takes the bias out of the mean.
        let signed = |x: f32, r: &mut Rng| {
            let mut h = f16_bits(x);
            h[1] |= ((r.next_u64() & 1) as u8) << 7;
            h
        };
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => b[..2].copy_from_slice(&signed(d, rng)),
            GgmlType::Q4_1 => {
                b[..2].copy_from_slice(&f16_bits(d));
                // The offset is negative: its f16 is the positive value's with the sign bit set.
                let m = f16_bits(7.5 * d);
                b[2..4].copy_from_slice(&[m[0], m[1] | 0x80]);
            }
            GgmlType::Q4_K => {
                b[..2].copy_from_slice(&f16_bits(d));
                b[2..4].copy_from_slice(&f16_bits(7.5 * d));
                let sc: [u8; 8] = std::array::from_fn(|_| rng.range(16, 32));
                pack_q4k_scales(&sc, &sc, &mut b[4..16]);
            }
            GgmlType::Q6_K => {
                for s in &mut b[192..208] {
                    *s = rng.range(8, 16);
                }
                b[208..210].copy_from_slice(&signed(d, rng));
            }
            other => panic!("no random blocks for {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(ty: GgmlType, cols: usize) -> (f64, f64) {
        let rows = 64;
        let row_bytes = ty.bytes_for(cols).unwrap();
        let mut bytes = vec![0u8; rows * row_bytes];
        for (r, out) in bytes.chunks_exact_mut(row_bytes).enumerate() {
            fill_row(ty, cols, &mut Rng::for_row(7, 1, r as u64), out);
        }
        let v = boostr::formats::dequantize(ty, &bytes, rows * cols).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{ty}");
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let rms = (v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / n).sqrt();
        (mean, rms * (cols as f64).sqrt())
    }

    #[test]
    fn every_type_has_the_target_rms_and_zero_mean() {
        for ty in [GgmlType::F32, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            for cols in [256usize, 4096, 14336] {
                let (mean, rel_rms) = stats(ty, cols);
                assert!((rel_rms - 1.0).abs() < 0.05, "{ty} cols {cols}: rms x sqrt(cols) = {rel_rms}");
                assert!(mean.abs() * (cols as f64).sqrt() < 0.05, "{ty} cols {cols}: mean {mean}");
            }
        }
    }

    #[test]
    fn q4k_scales_unpack_as_packed() {
        let sc = [1, 17, 33, 63, 40, 5, 62, 31];
        let mn = [63, 2, 48, 7, 19, 60, 0, 44];
        let mut b = [0u8; 12];
        pack_q4k_scales(&sc, &mn, &mut b);
        for i in 0..8 {
            let (s, m) = if i < 4 { (b[i] & 63, b[i + 4] & 63) } else { ((b[i + 4] & 15) | ((b[i - 4] >> 6) << 4), (b[i + 4] >> 4) | ((b[i] >> 6) << 4)) };
            assert_eq!((s, m), (sc[i], mn[i]), "sub-block {i}");
        }
    }
}

//! Integer-dot mat-muls of the CPU executor (the `int8` activations of
//! [`crate::engine::DecodeGemv`]): the activations are quantized to int8 per block of 32, as
//! llama.cpp's CPU path does (`d = max|x| / 127`, `q = round(x / d)`), and each weight block's
//! integer values meet them in integer dot products.
//!
//! A weight block of 32 with integer values `u` (Q4: the nibbles, Q5: five bits, Q8_0: the
//! signed bytes) decodes as `w = A u + B` per element (Q4_0: `A = d, B = -8 d`; Q4_1 and Q5_1:
//! `A = d, B = m`; Q5_0: `B = -16 d`; Q8_0: `B = 0`; Q4_K and Q5_K, whose super-blocks of 256
//! hold eight such blocks: `A = d scale_j, B = -(dmin min_j)` with the 6-bit scale and min of
//! sub-block `j`). With the activation block `x = d_x q`:
//!
//! `Σ w x = A d_x Σ u q + B s_x`, where `s_x = d_x Σ q`.
//!
//! So the only error beyond f32 rounding is the activations' int8 rounding (at most `d_x / 2`
//! per element); the tests check the kernels against a float64 product of the decoded weights
//! and the dequantized activations.
//!
//! The vector kernels (AVX2, `x86_int8.rs`) compute the same sums as [`dot_scalar`], the
//! reference here, up to f32 rounding. Formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K; a
//! matrix of any other format (Q6_K's sub-blocks of 16 among them) runs the f32 path.

use boostr::formats::{GgmlType, PackedFormat, PackedWeights};

/// Values per block.
pub(super) const QK: usize = 32;

/// Activation rows quantized to int8 per block of 32.
#[derive(Debug, Default)]
pub(super) struct Q8Acts {
    /// Values per row (a multiple of 32).
    pub(super) cols: usize,
    /// `[token][cols]` int8 values.
    pub(super) q: Vec<i8>,
    /// `[token][block]` scale `d_x`.
    pub(super) d: Vec<f32>,
    /// `[token][block]` `d_x * Σ q`.
    pub(super) s: Vec<f32>,
}

impl Q8Acts {
    /// Rows `0 .. n_tok` of `x` (rows of `cols`, a multiple of 32).
    pub(super) fn quantize(x: &[f32], n_tok: usize, cols: usize) -> Q8Acts {
        let bpr = cols / QK;
        let mut a = Q8Acts { cols, q: vec![0; n_tok * cols], d: vec![0.0; n_tok * bpr], s: vec![0.0; n_tok * bpr] };
        for (b, (xb, qb)) in x[..n_tok * cols].chunks_exact(QK).zip(a.q.chunks_exact_mut(QK)).enumerate() {
            let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                *q = (v * inv).round().clamp(-127.0, 127.0) as i8;
                sum += *q as i32;
            }
            a.d[b] = d;
            a.s[b] = d * sum as f32;
        }
        a
    }

    /// Blocks per row.
    #[cfg(test)]
    pub(super) fn blocks(&self) -> usize {
        self.cols / QK
    }
}

/// A matrix prepared for integer dots: its format's block layout.
#[derive(Clone, Copy, Debug)]
pub(super) struct Int8Rows<'a> {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    /// Blocks of 32 per row.
    pub(super) bpr: usize,
    pub(super) qs: &'a [u8],
    pub(super) qh: &'a [u32],
    /// K-quants: three words of 6-bit scales and mins per super-block.
    pub(super) sc: &'a [u32],
    /// f16 scales: one per block of 32, or per super-block (K-quants).
    pub(super) d: &'a [u8],
    /// f16 mins (Q4_1, Q5_1) or super-block mins (K-quants).
    pub(super) m: &'a [u8],
}

impl<'a> Int8Rows<'a> {
    /// `p` when its format has an integer-dot kernel and its arrays hold every block.
    pub(super) fn of(p: &'a PackedWeights) -> Option<Int8Rows<'a>> {
        use GgmlType::*;
        let ty = match p.format() {
            PackedFormat::Ggml(ty @ (Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K)) => ty,
            _ => return None,
        };
        let (units, rows) = (p.blocks_per_row(), p.rows());
        let per = ty.block_size() / QK;
        let (bpr, all) = (units * per, rows * units);
        let qs: &[u8] = bytemuck::cast_slice(p.qs());
        let five = matches!(ty, Q5_0 | Q5_1 | Q5_K);
        let m = if p.has_m() { p.m_bytes() } else { &[][..] };
        let sized = p.cols() == bpr * QK
            && qs.len() >= all * per * qs_bytes(ty)
            && (!five || p.qh().len() >= all * if per > 1 { 8 } else { 1 })
            && (per == 1 || p.scales().len() >= all * 3)
            && p.has_d()
            && p.d_bytes().len() >= 2 * all
            && (!matches!(ty, Q4_1 | Q5_1 | Q4_K | Q5_K) || m.len() >= 2 * all);
        sized.then(|| Int8Rows { ty, rows, bpr, qs, qh: p.qh(), sc: p.scales(), d: p.d_bytes(), m })
    }

    /// Whether the format groups eight blocks of 32 into a super-block (Q4_K, Q5_K).
    pub(super) fn k_quant(&self) -> bool {
        matches!(self.ty, GgmlType::Q4_K | GgmlType::Q5_K)
    }

    /// Whether the values are signed bytes (Q8_0) rather than unsigned small integers.
    #[cfg(test)]
    pub(super) fn signed(&self) -> bool {
        self.ty == GgmlType::Q8_0
    }

    /// Bytes of quants per block.
    pub(super) fn qs_bytes(&self) -> usize {
        qs_bytes(self.ty)
    }

    /// Block `g`'s `(A, B)` (`w = A u + B`; see the module docs), as the f32 decoders form them.
    #[cfg(test)]
    pub(super) fn affine(&self, g: usize) -> (f32, f32) {
        use GgmlType::*;
        let h = |b: &[u8], i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
        if self.k_quant() {
            let (sb, j) = (g / 8, g % 8);
            let (scale, min) = k4_scale_min(&self.sc[3 * sb..3 * sb + 3], j);
            return (h(self.d, sb) * scale as f32, -(h(self.m, sb) * min as f32));
        }
        let d = h(self.d, g);
        match self.ty {
            Q4_0 => (d, -8.0 * d),
            Q5_0 => (d, -16.0 * d),
            Q4_1 | Q5_1 => (d, h(self.m, g)),
            _ => (d, 0.0),
        }
    }

    /// Row `row`'s integer values, one byte per element (`out`: `bpr * 32` bytes; Q8_0's are
    /// the signed bytes' bits).
    #[cfg(test)]
    pub(super) fn unpack_scalar(&self, row: usize, out: &mut [u8]) {
        if self.k_quant() {
            let units = self.bpr / 8;
            for u in 0..units {
                let sb = row * units + u;
                let (q, h) = (&self.qs[128 * sb..128 * (sb + 1)], bytemuck::cast_slice::<u32, u8>(self.qh));
                for e in 0..256 {
                    let (j, i) = (e / 32, e % 32);
                    let nib = (q[32 * (j / 2) + i] >> (4 * (j % 2))) & 15;
                    let hi = if self.ty == GgmlType::Q5_K { ((h[32 * sb + i] >> j) & 1) << 4 } else { 0 };
                    out[256 * u + e] = nib | hi;
                }
            }
            return;
        }
        let n = self.qs_bytes();
        for b in 0..self.bpr {
            let g = row * self.bpr + b;
            let q = &self.qs[g * n..(g + 1) * n];
            let o = &mut out[b * QK..(b + 1) * QK];
            if self.signed() {
                o.copy_from_slice(q);
                continue;
            }
            let hi = if matches!(self.ty, GgmlType::Q5_0 | GgmlType::Q5_1) { self.qh[g] } else { 0 };
            for e in 0..QK {
                let nib = if e < 16 { q[e] & 15 } else { q[e - 16] >> 4 };
                o[e] = nib | ((((hi >> e) & 1) as u8) << 4);
            }
        }
    }
}

/// Sub-block `i`'s 6-bit scale and min from a K-quant super-block's three scale words.
pub(super) fn k4_scale_min(sc: &[u32], i: usize) -> (u32, u32) {
    let sh = 8 * (i % 4);
    if i < 4 {
        ((sc[0] >> sh) & 63, (sc[1] >> sh) & 63)
    } else {
        (((sc[2] >> sh) & 15) | (((sc[0] >> (sh + 6)) & 3) << 4), ((sc[2] >> (sh + 4)) & 15) | (((sc[1] >> (sh + 6)) & 3) << 4))
    }
}

/// Bytes of quants per block of 32.
fn qs_bytes(ty: GgmlType) -> usize {
    if ty == GgmlType::Q8_0 { 32 } else { 16 }
}

/// Row `row` (unpacked in `u`, its blocks' `(A, B)` in `ab`) times token `t` of `x`: the
/// reference of the vector kernels.
#[cfg(test)]
pub(super) fn dot_scalar(signed: bool, u: &[u8], ab: &[(f32, f32)], x: &Q8Acts, t: usize) -> f32 {
    let bpr = x.blocks();
    let mut acc = 0.0f32;
    for (b, &(a, bb)) in ab.iter().enumerate().take(bpr) {
        let xq = &x.q[(t * bpr + b) * QK..(t * bpr + b + 1) * QK];
        let wu = &u[b * QK..(b + 1) * QK];
        let i: i32 = wu.iter().zip(xq).map(|(&w, &q)| if signed { w as i8 as i32 } else { w as i32 } * q as i32).sum();
        acc += a * x.d[t * bpr + b] * i as f32 + bb * x.s[t * bpr + b];
    }
    acc
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use boostr::formats::repack;

    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        boostr::ops_common::pseudo_random(n, seed, 1.0)
    }

    /// `rows x cols` of `ty` from deterministic bytes, every block's f16 scale (and min) a
    /// finite value in about `±0.05`.
    pub(crate) fn packed(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> PackedWeights {
        let n = ty.bytes_for(rows * cols).unwrap();
        let vals = rnd(n, seed);
        let mut raw: Vec<u8> = vals.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
        let block = ty.bytes_for(ty.block_size()).unwrap();
        let scales = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K) { 2 } else { 1 };
        for (b, blk) in raw.chunks_exact_mut(block).enumerate() {
            for j in 0..scales {
                let v = half::f16::from_f32(0.05 * vals[(b * 7 + j) % vals.len()]);
                blk[2 * j..2 * j + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        repack(ty, &raw, rows, cols).expect("repack")
    }

    /// The formats with integer-dot kernels.
    pub(crate) const FORMATS: [GgmlType; 7] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K];

    /// Every format: the scalar integer dot equals the float64 product of boostr's decoded row
    /// and the dequantized activations.
    #[test]
    fn integer_dots_equal_the_decoded_product() {
        let (rows, cols, n_tok) = (5, 512, 3);
        let x = rnd(n_tok * cols, 8);
        let acts = Q8Acts::quantize(&x, n_tok, cols);
        for (i, ty) in FORMATS.into_iter().enumerate() {
            let p = packed(ty, rows, cols, 20 + i as u64);
            let r = Int8Rows::of(&p).expect("an int8 format");
            let mut u = vec![0u8; cols];
            let mut dec = vec![0.0f32; cols];
            for row in 0..rows {
                r.unpack_scalar(row, &mut u);
                let ab: Vec<(f32, f32)> = (0..r.bpr).map(|b| r.affine(row * r.bpr + b)).collect();
                p.dequantize_row_into(row, &mut dec).unwrap();
                for t in 0..n_tok {
                    let want: f64 = (0..cols).map(|e| dec[e] as f64 * acts.d[t * r.bpr + e / QK] as f64 * acts.q[t * cols + e] as f64).sum();
                    let got = dot_scalar(r.signed(), &u, &ab, &acts, t) as f64;
                    assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{ty:?} row {row} token {t}: {got} vs {want}");
                }
            }
        }
    }

    /// The activations' rounding: each value within half a step of its block's scale.
    #[test]
    fn activations_round_to_half_a_step() {
        let cols = 64;
        let mut x = rnd(2 * cols, 9);
        x[cols..cols + QK].fill(0.0);
        let a = Q8Acts::quantize(&x, 2, cols);
        for (e, &v) in x.iter().enumerate() {
            let d = a.d[e / QK];
            assert!((d * a.q[e] as f32 - v).abs() <= d / 2.0 + 1e-7, "element {e}");
        }
        assert_eq!((a.d[2], a.s[2]), (0.0, 0.0), "an all-zero block");
        let sum: i32 = a.q[..QK].iter().map(|&q| q as i32).sum();
        assert_eq!(a.s[0], a.d[0] * sum as f32);
    }
}

//! AVX2 integer-dot kernels of the CPU executor (see `int8.rs` for the scheme): per weight block
//! of 32, the integer values `u` (unpacked from the nibbles, or Q8_0's signed bytes) and the
//! token's int8 activations go through `maddubs` (u8 x i8 pairs summed to i16; at most
//! `2 * 31 * 127`, or `2 * 127 * 127` for Q8_0 whose signs move onto the activations, so nothing
//! saturates) and `madd` (to eight i32), and the block's sum is scaled by `A d_x` into an f32
//! accumulator; the `B s_x` terms accumulate beside.
//!
//! A row meets one or two tokens per pass: each block is unpacked in registers once for both.
//! Every token's f32 operations are the same, in the same order, whether it shares the pass or
//! not, so a token's result does not depend on the step it is in (the activations' int8
//! rounding would turn the smallest difference into a whole quantization step).

use std::arch::x86_64::*;

use boostr::formats::GgmlType;

use super::int8::{Int8Rows, Q8Acts, QK, k4_scale_min};
use super::x86::{Avx2, half, hsum};

impl Avx2 {
    /// `out[(t - tokens.start) * stride] = row . x_t` for the tokens `t` of `x` in `tokens`
    /// (rows of the matrix's width: checked, as `row < r.rows`).
    pub(super) fn int8_row(self, r: &Int8Rows<'_>, row: usize, x: &Q8Acts, tokens: std::ops::Range<usize>, out: &mut [f32], stride: usize) {
        let (bpr, t0, n) = (r.bpr, tokens.start, tokens.len());
        assert!(x.cols == bpr * QK && row < r.rows && x.d.len() >= (t0 + n) * bpr, "int8 row: shapes");
        assert!(n == 0 || out.len() > (n - 1) * stride, "int8 row: output");
        // Scale units per row: blocks of 32, or super-blocks of 256 (K-quants).
        let kq = r.k_quant();
        let units = if kq { bpr / 8 } else { bpr };
        let g0 = row * units;
        let qh = match r.ty {
            GgmlType::Q5_0 | GgmlType::Q5_1 => &r.qh[g0..g0 + units],
            GgmlType::Q5_K => &r.qh[8 * g0..8 * (g0 + units)],
            _ => &r.qh[0..0],
        };
        let w = Row {
            qs: r.qs.as_ptr().wrapping_add(row * bpr * r.qs_bytes()),
            qh,
            sc: if kq { &r.sc[3 * g0..3 * (g0 + units)] } else { &r.sc[0..0] },
            d: &r.d[2 * g0..2 * (g0 + units)],
            m: if r.m.is_empty() { r.m } else { &r.m[2 * g0..2 * (g0 + units)] },
        };
        let tok = |t: usize| Tok { xq: x.q[t * x.cols..(t + 1) * x.cols].as_ptr(), dx: &x.d[t * bpr..(t + 1) * bpr], sx: &x.s[t * bpr..(t + 1) * bpr] };
        let mut t = 0;
        while t < n {
            let k = (n - t).min(2);
            let ts = [tok(t0 + t), tok(t0 + t + k - 1)];
            // SAFETY: the token proves the target features; `Int8Rows::of` checked that the
            // arrays hold every block of every row (`row < rows` above), and each token holds
            // `bpr * 32` values and `bpr` scales (the slices above).
            let y = unsafe {
                use GgmlType::*;
                match (r.ty, k) {
                    (Q4_0, 1) => rows::<0, 1>(&w, ts),
                    (Q4_1, 1) => rows::<1, 1>(&w, ts),
                    (Q5_0, 1) => rows::<2, 1>(&w, ts),
                    (Q5_1, 1) => rows::<3, 1>(&w, ts),
                    (Q4_K, 1) => rows::<5, 1>(&w, ts),
                    (Q5_K, 1) => rows::<6, 1>(&w, ts),
                    (_, 1) => rows::<4, 1>(&w, ts),
                    (Q4_0, _) => rows::<0, 2>(&w, ts),
                    (Q4_1, _) => rows::<1, 2>(&w, ts),
                    (Q5_0, _) => rows::<2, 2>(&w, ts),
                    (Q5_1, _) => rows::<3, 2>(&w, ts),
                    (Q4_K, _) => rows::<5, 2>(&w, ts),
                    (Q5_K, _) => rows::<6, 2>(&w, ts),
                    _ => rows::<4, 2>(&w, ts),
                }
            };
            for (j, v) in y.iter().enumerate().take(k) {
                out[(t + j) * stride] = *v;
            }
            t += k;
        }
    }
}

/// One weight row's blocks.
struct Row<'a> {
    /// Quants: 16 bytes per block, 32 for Q8_0 (K-quants: 128 per super-block).
    qs: *const u8,
    /// Q5's fifth bits, one word per block (Q5_K: 8 words per super-block; else empty).
    qh: &'a [u32],
    /// K-quants: three words of 6-bit scales and mins per super-block (else empty).
    sc: &'a [u32],
    /// f16 scales, and mins (Q4_1, Q5_1; K-quants: per super-block; else empty).
    d: &'a [u8],
    m: &'a [u8],
}

/// One token's activations: int8 values, and per block `d_x` and `d_x Σ q`.
#[derive(Clone, Copy)]
struct Tok<'a> {
    xq: *const i8,
    dx: &'a [f32],
    sx: &'a [f32],
}

/// One row times `N` (1 or 2) tokens: for eight blocks at a time the f16 scales (and mins) are
/// converted together, `A d_x` formed in one vector per token, and each block's integer sums
/// scaled by their lane; the `B s_x` terms accumulate beside. `KIND`: 0 Q4_0, 1 Q4_1, 2 Q5_0,
/// 3 Q5_1, 4 Q8_0, 5 Q4_K, 6 Q5_K (whose eight lanes are one super-block's sub-blocks). Token
/// `j`'s operations do not depend on `N`.
///
/// # Safety
/// The CPU has the target features; `w.qs` holds the row's `dx.len()` blocks, `w.qh` (Q5) and
/// `w.d` / `w.m` (`m`: Q4_1, Q5_1) theirs, and each of the first `N` tokens `32 dx.len()` values
/// and `dx.len()` scales.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const KIND: u8, const N: usize>(w: &Row<'_>, t: [Tok<'_>; 2]) -> [f32; 2] {
    let bpr = t[0].dx.len();
    let (five, has_m, kq) = (KIND == 2 || KIND == 3, KIND == 1 || KIND == 3, KIND >= 5);
    let weights = |b: usize| -> __m256i {
        // SAFETY: block b < bpr of the row (the caller's contract).
        unsafe {
            if kq {
                // Sub-block j of super-block sb: nibble j % 2 of the 32 bytes at 32 (j / 2);
                // Q5_K's bit 4 is bit j of the super-block's 32 qh bytes.
                let (sb, j) = (b / 8, (b % 8) as i32);
                let raw = _mm256_loadu_si256(w.qs.wrapping_add(128 * sb + 32 * (b % 8 / 2)) as *const __m256i);
                let q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(4 * (j % 2))), _mm256_set1_epi8(15));
                if KIND == 6 {
                    let h = _mm256_loadu_si256(w.qh.as_ptr().wrapping_add(8 * sb) as *const __m256i);
                    let bit = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
                    _mm256_or_si256(q, _mm256_slli_epi16(bit, 4))
                } else {
                    q
                }
            } else if KIND == 4 {
                _mm256_loadu_si256(w.qs.wrapping_add(QK * b) as *const __m256i)
            } else if five {
                block_u::<true>(w.qs.wrapping_add(16 * b), w.qh[b])
            } else {
                block_u::<false>(w.qs.wrapping_add(16 * b), 0)
            }
        }
    };
    // SAFETY: block b < bpr of token j < N.
    let acts = |j: usize, b: usize| unsafe { _mm256_loadu_si256(t[j].xq.wrapping_add(QK * b) as *const __m256i) };
    let bias = |dv: __m256, mv: __m256| match KIND {
        0 => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
        2 => _mm256_mul_ps(dv, _mm256_set1_ps(-16.0)),
        1 | 3 => mv,
        _ => _mm256_setzero_ps(),
    };
    let z = _mm256_setzero_ps();
    let (mut a0, mut a1, mut bacc) = ([z; 2], [z; 2], [z; 2]);
    let mut b = 0;
    while b + 8 <= bpr {
        let (dv, bv) = if kq {
            // One super-block: its f16 scale and min times the sub-blocks' 6-bit ones.
            let sb = b / 8;
            let (mut sc, mut mn) = ([0.0f32; 8], [0.0f32; 8]);
            for j in 0..8 {
                let (s, m) = k4_scale_min(&w.sc[3 * sb..3 * sb + 3], j);
                (sc[j], mn[j]) = (s as f32, m as f32);
            }
            // SAFETY: eight f32 in each array.
            let (sv, mnv) = unsafe { (_mm256_loadu_ps(sc.as_ptr()), _mm256_loadu_ps(mn.as_ptr())) };
            let dv = _mm256_mul_ps(_mm256_set1_ps(half(w.d, sb)), sv);
            (dv, _mm256_sub_ps(z, _mm256_mul_ps(_mm256_set1_ps(half(w.m, sb)), mnv)))
        } else {
            // SAFETY: eight f16 at 2 b of `d` (and `m`).
            let (dv, mv) = unsafe {
                let dv = _mm256_cvtph_ps(_mm_loadu_si128(w.d.as_ptr().wrapping_add(2 * b) as *const __m128i));
                (dv, if has_m { _mm256_cvtph_ps(_mm_loadu_si128(w.m.as_ptr().wrapping_add(2 * b) as *const __m128i)) } else { dv })
            };
            (dv, bias(dv, mv))
        };
        let mut coef = [z; 2];
        for j in 0..N {
            // SAFETY: eight f32 at b of the token's `dx` and `sx`.
            let (dx, sx) = unsafe { (_mm256_loadu_ps(t[j].dx.as_ptr().wrapping_add(b)), _mm256_loadu_ps(t[j].sx.as_ptr().wrapping_add(b))) };
            coef[j] = _mm256_mul_ps(dv, dx);
            bacc[j] = _mm256_fmadd_ps(bv, sx, bacc[j]);
        }
        macro_rules! lane {
            ($l:literal, $acc:ident) => {
                let u = weights(b + $l);
                for j in 0..N {
                    let s = isum(u, acts(j, b + $l), KIND == 4);
                    $acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_permutevar8x32_ps(coef[j], _mm256_set1_epi32($l)), $acc[j]);
                }
            };
        }
        lane!(0, a0);
        lane!(1, a1);
        lane!(2, a0);
        lane!(3, a1);
        lane!(4, a0);
        lane!(5, a1);
        lane!(6, a0);
        lane!(7, a1);
        b += 8;
    }
    let mut tail = [0.0f32; 2];
    while b < bpr {
        let dv = half(w.d, b);
        let mv = if has_m { half(w.m, b) } else { 0.0 };
        let bv = match KIND {
            0 => -8.0 * dv,
            2 => -16.0 * dv,
            1 | 3 => mv,
            _ => 0.0,
        };
        let u = weights(b);
        for j in 0..N {
            a0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum(u, acts(j, b), KIND == 4)), _mm256_set1_ps(dv * t[j].dx[b]), a0[j]);
            tail[j] += bv * t[j].sx[b];
        }
        b += 1;
    }
    let mut y = [0.0f32; 2];
    for j in 0..N {
        y[j] = hsum(_mm256_add_ps(a0[j], a1[j])) + hsum(bacc[j]) + tail[j];
    }
    y
}

/// Block `b`'s 32 values `0..16` or `0..32` as bytes: element `e < 16` the low nibble of byte
/// `e`, `e >= 16` the high nibble of byte `e - 16`; with `FIVE`, bit `e` of `qh` as bit 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block_u<const FIVE: bool>(qs: *const u8, qh: u32) -> __m256i {
    let v = unsafe { _mm_loadu_si128(qs as *const __m128i) };
    let m = _mm_set1_epi8(15);
    let u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
    if !FIVE {
        return u;
    }
    // Byte e takes byte e / 8 of qh, keeps bit e % 8, and turns it into 16.
    let h = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
    _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(16)))
}

/// The eight i32 partial sums of `u . q` over one block (`u` unsigned, or signed bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn isum(u: __m256i, q: __m256i, signed: bool) -> __m256i {
    let p = if signed { _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(q, u)) } else { _mm256_maddubs_epi16(u, q) };
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

#[cfg(test)]
mod tests {
    use super::super::int8::{
        Int8Rows, Q8Acts, dot_scalar,
        tests::{FORMATS, packed},
    };
    use super::*;

    /// Every format, widths with an odd block count and one under eight blocks: each token's
    /// sum is the scalar reference's, and bit for bit the same alone as in a step of three
    /// (a pair and a single).
    #[test]
    fn vector_integer_dots_equal_the_scalar_reference() {
        let Some(k) = Avx2::detect() else { return };
        for cols in [96, 32 * 19, 512, 768] {
            let (rows, n_tok) = (4, 3);
            let x = boostr::ops_common::pseudo_random(n_tok * cols, 5, 2.0);
            let acts = Q8Acts::quantize(&x, n_tok, cols);
            for (i, ty) in FORMATS.into_iter().enumerate() {
                if !cols.is_multiple_of(ty.block_size()) {
                    continue;
                }
                let p = packed(ty, rows, cols, 40 + i as u64);
                let r = Int8Rows::of(&p).unwrap();
                let mut u = vec![0u8; cols];
                for row in 0..rows {
                    r.unpack_scalar(row, &mut u);
                    let ab: Vec<(f32, f32)> = (0..r.bpr).map(|b| r.affine(row * r.bpr + b)).collect();
                    let mut many = vec![0.0f32; 2 * n_tok];
                    k.int8_row(&r, row, &acts, 0..n_tok, &mut many, 2);
                    for t in 0..n_tok {
                        let want = dot_scalar(r.signed(), &u, &ab, &acts, t);
                        let mut one = [0.0f32];
                        k.int8_row(&r, row, &acts, t..t + 1, &mut one, 1);
                        assert!((one[0] - want).abs() <= 1e-5 * (1.0 + want.abs()), "{ty:?} {cols} row {row} token {t}: {} vs {want}", one[0]);
                        assert_eq!(many[2 * t].to_bits(), one[0].to_bits(), "{ty:?} {cols} row {row} token {t}: the same bits alone and in a step of three");
                    }
                }
            }
        }
    }
}

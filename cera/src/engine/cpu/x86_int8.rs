//! AVX2 integer-dot kernels of the CPU executor (see `int8.rs` for the scheme): per weight block
//! of 32, the integer values `u` (unpacked from the nibbles, or Q8_0's signed bytes) and the
//! token's int8 activations go through `maddubs` (u8 x i8 pairs summed to i16; at most
//! `2 * 31 * 127`, or `2 * 127 * 127` for Q8_0 whose signs move onto the activations, so nothing
//! saturates) and `madd` (to eight i32), and the block's sum is scaled by `A d_x` into an f32
//! accumulator; the `B s_x` terms are a dot product over the blocks.
//!
//! One token (decode): each block is unpacked in registers and used at once. More tokens: the
//! row is unpacked once into a scratch and the tokens pass over it two at a time.

use std::arch::x86_64::*;

use boostr::formats::GgmlType;

use super::int8::{Int8Rows, Q8Acts, QK};
use super::x86::{Avx2, half, hsum};

/// Per-thread scratch of the integer dots: a row's unpacked values, its blocks' `A` and `B`,
/// one token's coefficients.
#[derive(Default)]
pub(super) struct Int8Scratch {
    u: Vec<u8>,
    a: Vec<f32>,
    b: Vec<f32>,
    coef: Vec<f32>,
    coef2: Vec<f32>,
}

impl Avx2 {
    /// `out[t * stride] = row . x_t` for the tokens `t0 .. t0 + n` of `x` (whose rows are the
    /// matrix's width: the caller checks `x.cols == r.bpr * 32` and `row < r.rows`).
    pub(super) fn int8_row(self, r: &Int8Rows<'_>, row: usize, x: &Q8Acts, t0: usize, n: usize, out: &mut [f32], stride: usize, s: &mut Int8Scratch) {
        let bpr = r.bpr;
        assert!(x.cols == bpr * QK && row < r.rows && x.d.len() >= (t0 + n) * bpr, "int8 row: shapes");
        assert!(n == 0 || out.len() > (n - 1) * stride, "int8 row: output");
        let g0 = row * bpr;
        let (qs, five) = (r.qs.as_ptr().wrapping_add(g0 * r.qs_bytes()), matches!(r.ty, GgmlType::Q5_0 | GgmlType::Q5_1));
        let qh = &r.qh[if five { g0..g0 + bpr } else { 0..0 }];
        if n == 1 {
            let (dx, sx) = (&x.d[t0 * bpr..(t0 + 1) * bpr], &x.s[t0 * bpr..(t0 + 1) * bpr]);
            let xq = x.q[t0 * x.cols..(t0 + 1) * x.cols].as_ptr();
            let d = &r.d[2 * g0..2 * (g0 + bpr)];
            let m = if r.m.is_empty() { r.m } else { &r.m[2 * g0..2 * (g0 + bpr)] };
            let t = Tok { xq, dx, sx };
            // SAFETY: the token proves the target features; `Int8Rows::of` checked that the
            // arrays hold every block of every row (`row < rows` above), `xq` holds the token's
            // `bpr * 32` values.
            out[0] = unsafe {
                use GgmlType::*;
                match r.ty {
                    Q4_0 => row1::<0>(qs, qh, d, m, t),
                    Q4_1 => row1::<1>(qs, qh, d, m, t),
                    Q5_0 => row1::<2>(qs, qh, d, m, t),
                    Q5_1 => row1::<3>(qs, qh, d, m, t),
                    _ => row1::<4>(qs, qh, d, m, t),
                }
            };
            return;
        }
        s.a.resize(bpr, 0.0);
        s.b.resize(bpr, 0.0);
        s.coef.resize(bpr, 0.0);
        // SAFETY: the token proves the target features; `Int8Rows::of` checked that the arrays
        // hold every block of every row, and `row < rows`.
        unsafe { self.affine(r, g0, &mut s.a, &mut s.b) };
        if n > 1 {
            s.u.resize(bpr * QK, 0);
            // SAFETY: as above; `u` holds `bpr` blocks.
            unsafe {
                match (r.signed(), five) {
                    (true, _) => std::ptr::copy_nonoverlapping(qs, s.u.as_mut_ptr(), bpr * QK),
                    (false, true) => unpack::<true>(qs, qh, bpr, s.u.as_mut_ptr()),
                    (false, false) => unpack::<false>(qs, qh, bpr, s.u.as_mut_ptr()),
                }
            }
        }
        s.coef2.resize(bpr, 0.0);
        let mut t = 0;
        while t < n {
            let pair = t + 1 < n;
            let (ta, tb) = (t0 + t, t0 + t + usize::from(pair));
            let tok = |tt: usize| (&x.d[tt * bpr..(tt + 1) * bpr], &x.s[tt * bpr..(tt + 1) * bpr], x.q[tt * x.cols..(tt + 1) * x.cols].as_ptr());
            let ((da, sa, xa), (db, sb, xb)) = (tok(ta), tok(tb));
            // SAFETY: as above, for both tokens (`tb` is `ta` for a last odd token).
            let [ya, yb] = unsafe {
                let bias = [coefs(&s.a, &s.b, da, sa, &mut s.coef), coefs(&s.a, &s.b, db, sb, &mut s.coef2)];
                let [ya, yb] = dot_unpacked2(s.u.as_ptr(), r.signed(), [xa, xb], [s.coef.as_ptr(), s.coef2.as_ptr()], bpr);
                [ya + bias[0], yb + bias[1]]
            };
            out[t * stride] = ya;
            if pair {
                out[(t + 1) * stride] = yb;
            }
            t += 2;
        }
    }

    /// The row's `A` and `B` per block (`w = A u + B`), from its f16 scales eight at a time.
    ///
    /// # Safety
    /// The CPU has the target features; blocks `g0 .. g0 + a.len()` exist in `r`.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn affine(self, r: &Int8Rows<'_>, g0: usize, a: &mut [f32], b: &mut [f32]) {
        let bpr = a.len();
        let (d, m) = (&r.d[2 * g0..2 * (g0 + bpr)], if r.m.is_empty() { &[][..] } else { &r.m[2 * g0..2 * (g0 + bpr)] });
        let mut i = 0;
        while i + 8 <= bpr {
            // SAFETY: eight f16 at 2 i of `d` (and `m`), eight f32 at i of `a` and `b`.
            unsafe {
                let dv = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().wrapping_add(2 * i) as *const __m128i));
                _mm256_storeu_ps(a.as_mut_ptr().wrapping_add(i), dv);
                let bv = match r.ty {
                    GgmlType::Q4_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
                    GgmlType::Q5_0 => _mm256_mul_ps(dv, _mm256_set1_ps(-16.0)),
                    GgmlType::Q4_1 | GgmlType::Q5_1 => _mm256_cvtph_ps(_mm_loadu_si128(m.as_ptr().wrapping_add(2 * i) as *const __m128i)),
                    _ => _mm256_setzero_ps(),
                };
                _mm256_storeu_ps(b.as_mut_ptr().wrapping_add(i), bv);
            }
            i += 8;
        }
        for j in i..bpr {
            (a[j], b[j]) = r.affine(g0 + j);
        }
    }
}

/// One token's activations: int8 values, and per block `d_x` and `d_x Σ q`.
#[derive(Clone, Copy)]
struct Tok<'a> {
    xq: *const i8,
    dx: &'a [f32],
    sx: &'a [f32],
}

/// One row times one token, everything fused: for eight blocks at a time the f16 scales (and
/// mins) are converted together, `A d_x` formed in one vector, and each block's integer sum
/// scaled by its lane; the `B s_x` terms accumulate beside. `KIND`: 0 Q4_0, 1 Q4_1, 2 Q5_0,
/// 3 Q5_1, 4 Q8_0.
///
/// # Safety
/// The CPU has the target features; `qs` holds the row's `dx.len()` blocks (16 bytes each, 32
/// for Q8_0), `qh` (Q5) and `d` / `m` (`m`: Q4_1, Q5_1) theirs, `t.xq` `32 dx.len()` values.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row1<const KIND: u8>(qs: *const u8, qh: &[u32], d: &[u8], m: &[u8], t: Tok<'_>) -> f32 {
    let bpr = t.dx.len();
    let five = KIND == 2 || KIND == 3;
    let block = |b: usize| -> __m256i {
        // SAFETY: block b < bpr of the row and of the token (the caller's contract).
        unsafe {
            let q = _mm256_loadu_si256(t.xq.wrapping_add(QK * b) as *const __m256i);
            if KIND == 4 {
                isum(_mm256_loadu_si256(qs.wrapping_add(QK * b) as *const __m256i), q, true)
            } else if five {
                isum(block_u::<true>(qs.wrapping_add(16 * b), qh[b]), q, false)
            } else {
                isum(block_u::<false>(qs.wrapping_add(16 * b), 0), q, false)
            }
        }
    };
    let bias = |dv: __m256, mv: __m256| match KIND {
        0 => _mm256_mul_ps(dv, _mm256_set1_ps(-8.0)),
        2 => _mm256_mul_ps(dv, _mm256_set1_ps(-16.0)),
        1 | 3 => mv,
        _ => _mm256_setzero_ps(),
    };
    let (mut a0, mut a1, mut bacc) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps());
    let mut b = 0;
    while b + 8 <= bpr {
        // SAFETY: eight f16 at 2 b of `d` (and `m`), eight f32 at b of `dx` and `sx`.
        let (dv, mv, dx, sx) = unsafe {
            let dv = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().wrapping_add(2 * b) as *const __m128i));
            let mv = if KIND == 1 || KIND == 3 { _mm256_cvtph_ps(_mm_loadu_si128(m.as_ptr().wrapping_add(2 * b) as *const __m128i)) } else { dv };
            (dv, mv, _mm256_loadu_ps(t.dx.as_ptr().wrapping_add(b)), _mm256_loadu_ps(t.sx.as_ptr().wrapping_add(b)))
        };
        let coef = _mm256_mul_ps(dv, dx);
        bacc = _mm256_fmadd_ps(bias(dv, mv), sx, bacc);
        macro_rules! lane {
            ($j:literal, $acc:ident) => {
                $acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block(b + $j)), _mm256_permutevar8x32_ps(coef, _mm256_set1_epi32($j)), $acc);
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
    let mut tail = 0.0;
    while b < bpr {
        let dv = half(d, b);
        let mv = if KIND == 1 || KIND == 3 { half(m, b) } else { 0.0 };
        let bv = match KIND {
            0 => -8.0 * dv,
            2 => -16.0 * dv,
            1 | 3 => mv,
            _ => 0.0,
        };
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block(b)), _mm256_set1_ps(dv * t.dx[b]), a0);
        tail += bv * t.sx[b];
        b += 1;
    }
    hsum(_mm256_add_ps(a0, a1)) + hsum(bacc) + tail
}

/// `coef[b] = a[b] * dx[b]`; returns `Σ b[b] * sx[b]`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn coefs(a: &[f32], b: &[f32], dx: &[f32], sx: &[f32], coef: &mut [f32]) -> f32 {
    let n = a.len();
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: eight f32 at i of each slice (all `n` long).
        unsafe {
            let (av, dv) = (_mm256_loadu_ps(a.as_ptr().wrapping_add(i)), _mm256_loadu_ps(dx.as_ptr().wrapping_add(i)));
            _mm256_storeu_ps(coef.as_mut_ptr().wrapping_add(i), _mm256_mul_ps(av, dv));
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(b.as_ptr().wrapping_add(i)), _mm256_loadu_ps(sx.as_ptr().wrapping_add(i)), acc);
        }
        i += 8;
    }
    let mut bias = hsum(acc);
    for j in i..n {
        coef[j] = a[j] * dx[j];
        bias += b[j] * sx[j];
    }
    bias
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

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const FIVE: bool>(qs: *const u8, qh: &[u32], bpr: usize, out: *mut u8) {
    for b in 0..bpr {
        let h = if FIVE { qh[b] } else { 0 };
        // SAFETY: block b's 16 bytes and 32 output bytes exist (the caller's contract).
        unsafe { _mm256_storeu_si256(out.wrapping_add(QK * b) as *mut __m256i, block_u::<FIVE>(qs.wrapping_add(16 * b), h)) };
    }
}

/// The eight i32 partial sums of `u . q` over one block (`u` unsigned, or signed bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn isum(u: __m256i, q: __m256i, signed: bool) -> __m256i {
    let p = if signed { _mm256_maddubs_epi16(_mm256_sign_epi8(u, u), _mm256_sign_epi8(q, u)) } else { _mm256_maddubs_epi16(u, q) };
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// `Σ_b coef_t[b] * (u_b . q_t,b)` for two tokens over 32-byte blocks of unpacked values (each
/// block of `u` loaded once for both).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_unpacked2(u: *const u8, signed: bool, xq: [*const i8; 2], coef: [*const f32; 2], bpr: usize) -> [f32; 2] {
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    // SAFETY: `bpr` blocks of 32 bytes at `u` and at both `xq`, `bpr` coefficients each.
    unsafe {
        for b in 0..bpr {
            let w = _mm256_loadu_si256(u.wrapping_add(QK * b) as *const __m256i);
            let s0 = isum(w, _mm256_loadu_si256(xq[0].wrapping_add(QK * b) as *const __m256i), signed);
            let s1 = isum(w, _mm256_loadu_si256(xq[1].wrapping_add(QK * b) as *const __m256i), signed);
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_broadcast_ss(&*coef[0].wrapping_add(b)), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_broadcast_ss(&*coef[1].wrapping_add(b)), a1);
        }
    }
    [hsum(a0), hsum(a1)]
}

#[cfg(test)]
mod tests {
    use super::super::int8::{Int8Rows, Q8Acts, dot_scalar, tests::packed};
    use super::*;

    /// Every format, one token (the packed kernels) and three (the unpacked ones), widths with
    /// an odd block count and one under eight blocks: the scalar reference's sums.
    #[test]
    fn vector_integer_dots_equal_the_scalar_reference() {
        let Some(k) = Avx2::detect() else { return };
        for cols in [96, 32 * 19] {
            let (rows, n_tok) = (4, 3);
            let x = boostr::ops_common::pseudo_random(n_tok * cols, 5, 2.0);
            let acts = Q8Acts::quantize(&x, n_tok, cols);
            for (i, ty) in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0].into_iter().enumerate() {
                let p = packed(ty, rows, cols, 40 + i as u64);
                let r = Int8Rows::of(&p).unwrap();
                let mut s = Int8Scratch::default();
                let mut u = vec![0u8; cols];
                for row in 0..rows {
                    r.unpack_scalar(row, &mut u);
                    let ab: Vec<(f32, f32)> = (0..r.bpr).map(|b| r.affine(row * r.bpr + b)).collect();
                    let mut many = vec![0.0f32; 2 * n_tok];
                    k.int8_row(&r, row, &acts, 0, n_tok, &mut many, 2, &mut s);
                    for t in 0..n_tok {
                        let want = dot_scalar(r.signed(), &u, &ab, &acts, t);
                        let mut one = [0.0f32];
                        k.int8_row(&r, row, &acts, t, 1, &mut one, 1, &mut s);
                        for (what, got) in [("one token", one[0]), ("three tokens", many[2 * t])] {
                            assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{ty:?} {cols} row {row} token {t} ({what}): {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
}

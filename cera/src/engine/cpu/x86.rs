//! AVX2 + FMA + F16C kernels of the CPU executor: dot products of weight rows with activation
//! rows, `y += a x`, and row decoders of boostr's packed weight layout.
//!
//! The decoders are bit-identical to boostr's CPU decoder (`PackedWeights::dequantize_row_into`,
//! which the GPU kernels mirror): the same f32 operations in the same order (a multiply, then an
//! add or a subtract, never fused), eight elements at a time; `kernels.rs` tests it. The tiled
//! dot products keep one 8-lane accumulator per (row, token) pair, so a row's product with a
//! token is the same whichever tile computes it. Decode steps (one or two tokens) multiply each
//! row as it is decoded, without the round trip through the scratch, in several accumulators
//! (the same sums up to f32 rounding).
//!
//! Every function here that is `unsafe` is so only for its `#[target_feature]` (callable only
//! through [`Avx2`], which exists only where the CPU has the features) and its raw vector loads
//! and stores, whose extents the safe wrappers check before the loop.
//!
//! Loads use `lddqu` and stores are aligned plain stores into 32-byte aligned scratch (the
//! decoders' output, the attention accumulator): `_mm256_loadu_ps` / `_mm256_storeu_ps` go
//! through `ptr::read_unaligned` / `write_unaligned`, whose debug-build precondition checks
//! (`copy_nonoverlapping`'s) cost ten times the arithmetic in the dev profile the tests run in.

use std::arch::x86_64::*;

use boostr::formats::{GgmlType, PackedFormat, PackedWeights};

use super::int8::k4_scale_min;

/// Proof that the running CPU has AVX2, FMA and F16C (made only by [`Avx2::detect`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx2(());

fn check(w: &[f32], rows: usize, n: usize, x: &[&[f32]]) {
    assert!(w.len() >= rows * n && x.iter().all(|x| x.len() >= n), "dot kernel: operands shorter than {rows} x {n}");
}

impl Avx2 {
    /// The token when the CPU has the features.
    pub(super) fn detect() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")).then_some(Avx2(()))
    }

    /// `[t][r] = w_r . x_t` for the 4 rows of `w` (`n` each, contiguous) and `x0`, `x1`.
    pub(super) fn dot4x2(self, w: &[f32], n: usize, x0: &[f32], x1: &[f32]) -> [[f32; 4]; 2] {
        check(w, 4, n, &[x0, x1]);
        // SAFETY: the token proves the target features; the lengths were just checked.
        unsafe { dot4x2(w.as_ptr(), n, x0.as_ptr(), x1.as_ptr()) }
    }

    /// `[r] = w_r . x0` for 4 rows.
    pub(super) fn dot4x1(self, w: &[f32], n: usize, x0: &[f32]) -> [f32; 4] {
        check(w, 4, n, &[x0]);
        // SAFETY: as above.
        unsafe { dot4x1(w.as_ptr(), n, x0.as_ptr()) }
    }

    /// `[t] = w . x_t` for one row.
    pub(super) fn dot1x2(self, w: &[f32], n: usize, x0: &[f32], x1: &[f32]) -> [f32; 2] {
        check(w, 1, n, &[x0, x1]);
        // SAFETY: as above.
        unsafe { dot1x2(w.as_ptr(), n, x0.as_ptr(), x1.as_ptr()) }
    }

    /// `w . x` over `n` elements.
    pub(super) fn dot1x1(self, w: &[f32], n: usize, x: &[f32]) -> f32 {
        check(w, 1, n, &[x]);
        // SAFETY: as above.
        unsafe { dot1x1(w.as_ptr(), n, x.as_ptr()) }
    }

    /// `y += a * x` over `y.len()` elements (`x` at least as long); `false` (nothing done)
    /// unless `y` is 32-byte aligned and a whole number of 8 lanes.
    pub(super) fn axpy(self, y: &mut [f32], a: f32, x: &[f32]) -> bool {
        assert!(x.len() >= y.len(), "axpy: short x");
        if !(y.as_ptr() as usize).is_multiple_of(32) || !y.len().is_multiple_of(8) {
            return false;
        }
        // SAFETY: as above; `y` is aligned for the stores.
        unsafe { axpy(y.as_mut_ptr(), y.len(), a, x.as_ptr()) };
        true
    }

    /// `p` prepared for the vector decoders, or `None` for a format without one here.
    pub(super) fn rows(self, p: &PackedWeights) -> Option<Rows<'_>> {
        use GgmlType::*;
        let ty = match p.format() {
            PackedFormat::Ggml(ty @ (F32 | F16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K)) => ty,
            _ => return None,
        };
        let (bpr, n) = (p.blocks_per_row(), p.cols());
        let whole = if ty.block_size() > 2 { n == bpr * ty.block_size() } else { n.is_multiple_of(8) };
        let (qw, hw, sw) = (p.qs_words_per_block(), p.qh_words_per_block(), p.scale_words_per_block());
        let blocks = p.rows() * bpr;
        let (d, m) = (if p.has_d() { p.d_bytes() } else { &[][..] }, if p.has_m() { p.m_bytes() } else { &[][..] });
        let sized = p.qs().len() >= blocks * qw
            && p.qh().len() >= blocks * hw
            && p.scales().len() >= blocks * sw
            && (!p.has_d() || d.len() >= 2 * blocks)
            && (!p.has_m() || m.len() >= 2 * blocks);
        (whole && sized).then(|| Rows { ty, rows: p.rows(), bpr, n, qw, hw, sw, qs: p.qs(), qh: p.qh(), sc: p.scales(), d, m })
    }

    /// Decodes row `row` into `out[..cols]`; `false` (nothing written) when `out` is not
    /// 32-byte aligned.
    pub(super) fn decode_row(self, r: &Rows<'_>, row: usize, out: &mut [f32]) -> bool {
        let out = &mut out[..r.n];
        if !(out.as_ptr() as usize).is_multiple_of(32) {
            return false;
        }
        // SAFETY: `out` holds the row, 32-byte aligned (checked).
        unsafe { self.decode(r, row, Store(out.as_mut_ptr())) };
        true
    }

    /// `w_row . x` with the row decoded on the fly (the same value as decoding it and calling
    /// [`Avx2::dot1x1`], up to f32 rounding).
    pub(super) fn dot_row1(self, r: &Rows<'_>, row: usize, x: &[f32]) -> f32 {
        let x = &x[..r.n];
        // SAFETY: the token proves the target features; `x` holds a row's worth of values (the
        // slice above checked it).
        unsafe {
            let s = self.decode(r, row, Dot1 { x: x.as_ptr(), acc: [_mm256_setzero_ps(); 4] });
            sum4(s.acc[0], s.acc[1], s.acc[2], s.acc[3])
        }
    }

    /// As [`Avx2::dot_row1`] for two activation rows.
    pub(super) fn dot_row2(self, r: &Rows<'_>, row: usize, x0: &[f32], x1: &[f32]) -> [f32; 2] {
        let (x0, x1) = (&x0[..r.n], &x1[..r.n]);
        // SAFETY: as above.
        unsafe {
            let s = self.decode(r, row, Dot2 { x0: x0.as_ptr(), x1: x1.as_ptr(), acc: [_mm256_setzero_ps(); 4] });
            [sum4(s.acc[0], s.acc[2], _mm256_setzero_ps(), _mm256_setzero_ps()), sum4(s.acc[1], s.acc[3], _mm256_setzero_ps(), _mm256_setzero_ps())]
        }
    }

    /// Decodes row `row` into `sink`.
    ///
    /// # Safety
    /// `sink` takes `cols` values.
    unsafe fn decode<S: Sink>(self, r: &Rows<'_>, row: usize, sink: S) -> S {
        assert!(row < r.rows, "row {row} of {}", r.rows);
        let (g0, bpr, n) = (row * r.bpr, r.bpr, r.n);
        let qs = &r.qs[g0 * r.qw..(g0 + bpr) * r.qw];
        let qh = &r.qh[g0 * r.hw..(g0 + bpr) * r.hw];
        let sc = &r.sc[g0 * r.sw..(g0 + bpr) * r.sw];
        let d = if r.d.is_empty() { r.d } else { &r.d[2 * g0..2 * (g0 + bpr)] };
        let m = if r.m.is_empty() { r.m } else { &r.m[2 * g0..2 * (g0 + bpr)] };
        use GgmlType::*;
        // SAFETY: the token proves the target features. Each decoder reads `bpr` blocks of the
        // row slices above (whose lengths are `bpr` blocks of the format's words: `qs`, `qh`,
        // `sc` and two bytes of `d`, `m` per block) and puts `bpr * block_size == cols` values
        // (checked by `Avx2::rows`; F32/F16: `cols` a multiple of 8) at multiples of 8.
        unsafe {
            match r.ty {
                F32 => decode_f32(qs.as_ptr() as *const f32, n, sink),
                F16 => decode_f16(qs.as_ptr() as *const u8, n, sink),
                Q4_0 => decode_q4::<S, false, false, 8>(qs, qh, d, m, n, sink),
                Q4_1 => decode_q4::<S, false, true, 0>(qs, qh, d, m, n, sink),
                Q5_0 => decode_q4::<S, true, false, 16>(qs, qh, d, m, n, sink),
                Q5_1 => decode_q4::<S, true, true, 0>(qs, qh, d, m, n, sink),
                Q8_0 => decode_q8_0(qs, d, n, sink),
                Q4_K => decode_q4k::<S, false>(qs, qh, sc, d, m, n, sink),
                Q5_K => decode_q4k::<S, true>(qs, qh, sc, d, m, n, sink),
                _ => decode_q6k(qs, qh, sc, d, n, sink),
            }
        }
    }
}

/// A packed matrix prepared for the vector decoders (format checked, arrays sized): the
/// per-matrix work done once, not per row.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rows<'a> {
    ty: GgmlType,
    rows: usize,
    bpr: usize,
    n: usize,
    qw: usize,
    hw: usize,
    sw: usize,
    qs: &'a [u32],
    qh: &'a [u32],
    sc: &'a [u32],
    d: &'a [u8],
    m: &'a [u8],
}

/// Eight f32 at `p + i`, unaligned (the callers checked the extent).
macro_rules! ld {
    ($p:expr, $i:expr) => {
        _mm256_castsi256_ps(_mm256_lddqu_si256($p.wrapping_add($i) as *const __m256i))
    };
}

/// Sixteen bytes at `p + i`, unaligned.
macro_rules! ld16 {
    ($p:expr, $i:expr) => {
        _mm_lddqu_si128($p.wrapping_add($i) as *const __m128i)
    };
}

/// Where a decoder puts eight decoded values at element offset `off` of the row (offsets come
/// in increasing order).
trait Sink: Copy {
    /// # Safety
    /// The CPU has the target features and `off + 8` lies within the sink's extent.
    unsafe fn put(&mut self, off: usize, v: __m256);
}

/// Stores the row (32-byte aligned, `cols` long).
#[derive(Clone, Copy)]
struct Store(*mut f32);

impl Sink for Store {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn put(&mut self, off: usize, v: __m256) {
        unsafe { *(self.0.wrapping_add(off) as *mut __m256) = v };
    }
}

/// Multiplies the row with one activation row as it is decoded, in four accumulators (the
/// 8-lane groups `off / 8` taken modulo 4) so that the FMA latency overlaps; the same sum as the
/// `dot*` kernels up to f32 rounding.
#[derive(Clone, Copy)]
struct Dot1 {
    x: *const f32,
    acc: [__m256; 4],
}

impl Sink for Dot1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn put(&mut self, off: usize, v: __m256) {
        let y = unsafe { ld!(self.x, off) };
        match (off >> 3) & 3 {
            0 => self.acc[0] = _mm256_fmadd_ps(v, y, self.acc[0]),
            1 => self.acc[1] = _mm256_fmadd_ps(v, y, self.acc[1]),
            2 => self.acc[2] = _mm256_fmadd_ps(v, y, self.acc[2]),
            _ => self.acc[3] = _mm256_fmadd_ps(v, y, self.acc[3]),
        }
    }
}

/// As [`Dot1`] with two activation rows (two accumulators each).
#[derive(Clone, Copy)]
struct Dot2 {
    x0: *const f32,
    x1: *const f32,
    acc: [__m256; 4],
}

impl Sink for Dot2 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn put(&mut self, off: usize, v: __m256) {
        let (y0, y1) = unsafe { (ld!(self.x0, off), ld!(self.x1, off)) };
        if (off >> 3) & 1 == 0 {
            self.acc[0] = _mm256_fmadd_ps(v, y0, self.acc[0]);
            self.acc[1] = _mm256_fmadd_ps(v, y1, self.acc[1]);
        } else {
            self.acc[2] = _mm256_fmadd_ps(v, y0, self.acc[2]);
            self.acc[3] = _mm256_fmadd_ps(v, y1, self.acc[3]);
        }
    }
}

/// The lanes summed in a fixed order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// `hsum((a + b) + (c + d))`.
#[target_feature(enable = "avx2,fma,f16c")]
fn sum4(a: __m256, b: __m256, c: __m256, d: __m256) -> f32 {
    hsum(_mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)))
}

/// [`hsum`], then the scalar tail `n8..n`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn finish(v: __m256, w: *const f32, x: *const f32, n8: usize, n: usize) -> f32 {
    let mut s = hsum(v);
    for j in n8..n {
        s += unsafe { *w.wrapping_add(j) * *x.wrapping_add(j) };
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot4x2(w: *const f32, n: usize, x0: *const f32, x1: *const f32) -> [[f32; 4]; 2] {
    let (w0, w1, w2, w3) = (w, w.wrapping_add(n), w.wrapping_add(2 * n), w.wrapping_add(3 * n));
    let z = _mm256_setzero_ps();
    let (mut a0, mut a1, mut a2, mut a3, mut b0, mut b1, mut b2, mut b3) = (z, z, z, z, z, z, z, z);
    let n8 = n & !7;
    let mut i = 0;
    while i < n8 {
        let (v0, v1, v2, v3, y0, y1) = unsafe { (ld!(w0, i), ld!(w1, i), ld!(w2, i), ld!(w3, i), ld!(x0, i), ld!(x1, i)) };
        a0 = _mm256_fmadd_ps(v0, y0, a0);
        a1 = _mm256_fmadd_ps(v1, y0, a1);
        a2 = _mm256_fmadd_ps(v2, y0, a2);
        a3 = _mm256_fmadd_ps(v3, y0, a3);
        b0 = _mm256_fmadd_ps(v0, y1, b0);
        b1 = _mm256_fmadd_ps(v1, y1, b1);
        b2 = _mm256_fmadd_ps(v2, y1, b2);
        b3 = _mm256_fmadd_ps(v3, y1, b3);
        i += 8;
    }
    unsafe {
        [
            [finish(a0, w0, x0, n8, n), finish(a1, w1, x0, n8, n), finish(a2, w2, x0, n8, n), finish(a3, w3, x0, n8, n)],
            [finish(b0, w0, x1, n8, n), finish(b1, w1, x1, n8, n), finish(b2, w2, x1, n8, n), finish(b3, w3, x1, n8, n)],
        ]
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot4x1(w: *const f32, n: usize, x0: *const f32) -> [f32; 4] {
    let (w0, w1, w2, w3) = (w, w.wrapping_add(n), w.wrapping_add(2 * n), w.wrapping_add(3 * n));
    let z = _mm256_setzero_ps();
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    let n8 = n & !7;
    let mut i = 0;
    while i < n8 {
        let (v0, v1, v2, v3, y0) = unsafe { (ld!(w0, i), ld!(w1, i), ld!(w2, i), ld!(w3, i), ld!(x0, i)) };
        a0 = _mm256_fmadd_ps(v0, y0, a0);
        a1 = _mm256_fmadd_ps(v1, y0, a1);
        a2 = _mm256_fmadd_ps(v2, y0, a2);
        a3 = _mm256_fmadd_ps(v3, y0, a3);
        i += 8;
    }
    unsafe { [finish(a0, w0, x0, n8, n), finish(a1, w1, x0, n8, n), finish(a2, w2, x0, n8, n), finish(a3, w3, x0, n8, n)] }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot1x2(w: *const f32, n: usize, x0: *const f32, x1: *const f32) -> [f32; 2] {
    let (mut a0, mut b0) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let n8 = n & !7;
    let mut i = 0;
    while i < n8 {
        let (v0, y0, y1) = unsafe { (ld!(w, i), ld!(x0, i), ld!(x1, i)) };
        a0 = _mm256_fmadd_ps(v0, y0, a0);
        b0 = _mm256_fmadd_ps(v0, y1, b0);
        i += 8;
    }
    unsafe { [finish(a0, w, x0, n8, n), finish(b0, w, x1, n8, n)] }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot1x1(w: *const f32, n: usize, x0: *const f32) -> f32 {
    let mut a0 = _mm256_setzero_ps();
    let n8 = n & !7;
    let mut i = 0;
    while i < n8 {
        let (v0, y0) = unsafe { (ld!(w, i), ld!(x0, i)) };
        a0 = _mm256_fmadd_ps(v0, y0, a0);
        i += 8;
    }
    unsafe { finish(a0, w, x0, n8, n) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy(y: *mut f32, n: usize, a: f32, x: *const f32) {
    let n8 = n & !7;
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i < n8 {
        unsafe {
            let p = y.wrapping_add(i) as *mut __m256;
            *p = _mm256_fmadd_ps(av, ld!(x, i), *p);
        }
        i += 8;
    }
}

/// The f16 number `b` of little-endian halves `h`, widened (exactly).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn half(h: &[u8], b: usize) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([h[2 * b], h[2 * b + 1]]) as i32)))
}

/// The low and high eight bytes of `v`, zero-extended to i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn u8x16(v: __m128i) -> (__m256i, __m256i) {
    (_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))
}

/// `(v >> s) & mask` per lane (`s` a run-time count).
macro_rules! bits {
    ($v:expr, $s:expr, $mask:expr) => {
        _mm256_and_si256(_mm256_srl_epi32($v, _mm_cvtsi32_si128($s as i32)), $mask)
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_f32<S: Sink>(p: *const f32, n: usize, mut sink: S) -> S {
    for c in 0..n / 8 {
        unsafe { sink.put(8 * c, ld!(p, 8 * c)) };
    }
    sink
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_f16<S: Sink>(p: *const u8, n: usize, mut sink: S) -> S {
    for c in 0..n / 8 {
        unsafe { sink.put(8 * c, _mm256_cvtph_ps(ld16!(p, 16 * c))) };
    }
    sink
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q8_0<S: Sink>(qs: &[u32], d: &[u8], n: usize, mut sink: S) -> S {
    let qp = qs.as_ptr() as *const u8;
    for b in 0..n / 32 {
        let (p, o) = (qp.wrapping_add(32 * b), 32 * b);
        let dv = _mm256_set1_ps(half(d, b));
        unsafe {
            let (v0, v1) = (ld16!(p, 0), ld16!(p, 16));
            let q = |v: __m128i| _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), dv);
            sink.put(o, q(v0));
            sink.put(o + 8, q(_mm_srli_si128(v0, 8)));
            sink.put(o + 16, q(v1));
            sink.put(o + 24, q(_mm_srli_si128(v1, 8)));
        }
    }
    sink
}

/// Q4_0, Q4_1, Q5_0, Q5_1 (`FIVE`: a fifth bit; `M`: `d q + m` instead of `d (q - OFF)`):
/// element `e < 16` is the low nibble of byte `e`, `e >= 16` the high nibble of byte `e - 16`,
/// Q5's bit 4 is bit `e` of the block's `qh` word.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q4<S: Sink, const FIVE: bool, const M: bool, const OFF: i32>(qs: &[u32], qh: &[u32], d: &[u8], m: &[u8], n: usize, mut sink: S) -> S {
    let qp = qs.as_ptr() as *const u8;
    let (m15, one, off) = (_mm256_set1_epi32(15), _mm256_set1_epi32(1), _mm256_set1_epi32(OFF));
    let e0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let e8 = _mm256_add_epi32(e0, _mm256_set1_epi32(8));
    let e16 = _mm256_add_epi32(e0, _mm256_set1_epi32(16));
    let e24 = _mm256_add_epi32(e0, _mm256_set1_epi32(24));
    for b in 0..n / 32 {
        let (p, o) = (qp.wrapping_add(16 * b), 32 * b);
        let dv = _mm256_set1_ps(half(d, b));
        let mv = if M { _mm256_set1_ps(half(m, b)) } else { _mm256_setzero_ps() };
        let (r0, r1) = u8x16(unsafe { ld16!(p, 0) });
        let (mut q0, mut q1) = (_mm256_and_si256(r0, m15), _mm256_and_si256(r1, m15));
        let (mut q2, mut q3) = (_mm256_srli_epi32(r0, 4), _mm256_srli_epi32(r1, 4));
        if FIVE {
            let h = _mm256_set1_epi32(qh.get(b).copied().unwrap_or(0) as i32);
            let bit = |e: __m256i| _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(h, e), one), 4);
            q0 = _mm256_or_si256(q0, bit(e0));
            q1 = _mm256_or_si256(q1, bit(e8));
            q2 = _mm256_or_si256(q2, bit(e16));
            q3 = _mm256_or_si256(q3, bit(e24));
        }
        let val = |q: __m256i| {
            let x = _mm256_cvtepi32_ps(_mm256_sub_epi32(q, off));
            if M { _mm256_add_ps(_mm256_mul_ps(dv, x), mv) } else { _mm256_mul_ps(dv, x) }
        };
        unsafe {
            sink.put(o, val(q0));
            sink.put(o + 8, val(q1));
            sink.put(o + 16, val(q2));
            sink.put(o + 24, val(q3));
        }
    }
    sink
}

/// Q4_K / Q5_K (`FIVE`): element `e` is nibble `(e / 32) % 2` of byte `32 (e / 64) + e % 32`,
/// Q5's bit 4 is bit `e / 32` of `qh` byte `e % 32`; sub-block `e / 32` has a 6-bit scale and
/// min.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q4k<S: Sink, const FIVE: bool>(qs: &[u32], qh: &[u32], sc: &[u32], d: &[u8], m: &[u8], n: usize, mut sink: S) -> S {
    let (qp, hp) = (qs.as_ptr() as *const u8, qh.as_ptr() as *const u8);
    let (m15, one) = (_mm256_set1_epi32(15), _mm256_set1_epi32(1));
    for b in 0..n / 256 {
        let (p, h) = (qp.wrapping_add(128 * b), hp.wrapping_add(32 * b));
        let s = &sc[3 * b..3 * b + 3];
        let (db, mb) = (half(d, b), half(m, b));
        for i in 0..8 {
            let (scale, min) = k4_scale_min(s, i);
            let (av, bv) = (_mm256_set1_ps(db * scale as f32), _mm256_set1_ps(mb * min as f32));
            let (pi, o, shift) = (p.wrapping_add(32 * (i / 2)), 256 * b + 32 * i, 4 * (i % 2));
            let (r0, r1) = u8x16(unsafe { ld16!(pi, 0) });
            let (r2, r3) = u8x16(unsafe { ld16!(pi, 16) });
            let (h0, h1, h2, h3) = if FIVE {
                let ((h0, h1), (h2, h3)) = (u8x16(unsafe { ld16!(h, 0) }), u8x16(unsafe { ld16!(h, 16) }));
                (h0, h1, h2, h3)
            } else {
                let z = _mm256_setzero_si256();
                (z, z, z, z)
            };
            let val = |r: __m256i, h: __m256i| {
                let mut q = bits!(r, shift, m15);
                if FIVE {
                    q = _mm256_or_si256(q, _mm256_slli_epi32(bits!(h, i, one), 4));
                }
                _mm256_sub_ps(_mm256_mul_ps(av, _mm256_cvtepi32_ps(q)), bv)
            };
            unsafe {
                sink.put(o, val(r0, h0));
                sink.put(o + 8, val(r1, h1));
                sink.put(o + 16, val(r2, h2));
                sink.put(o + 24, val(r3, h3));
            }
        }
    }
    sink
}

/// Q6_K: element `e` (half `h = e / 128`, `c = e % 128`) is nibble `c / 64` of `qs` byte
/// `64 h + c % 64` with bits 4-5 from bits `2 (c / 32)` of `qh` byte `32 h + c % 32`, minus 32;
/// an i8 scale per 16 elements.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q6k<S: Sink>(qs: &[u32], qh: &[u32], sc: &[u32], d: &[u8], n: usize, mut sink: S) -> S {
    let (qp, hp) = (qs.as_ptr() as *const u8, qh.as_ptr() as *const u8);
    let (m15, m3, m32) = (_mm256_set1_epi32(15), _mm256_set1_epi32(3), _mm256_set1_epi32(32));
    for b in 0..n / 256 {
        let mut scales = [0i8; 16];
        for (j, w) in sc[4 * b..4 * b + 4].iter().enumerate() {
            for (i, byte) in w.to_le_bytes().into_iter().enumerate() {
                scales[4 * j + i] = byte as i8;
            }
        }
        let db = half(d, b);
        for hc in 0..8 {
            let (h, c) = (hc / 4, hc % 4);
            let lo = qp.wrapping_add(128 * b + 64 * h + 32 * (c % 2));
            let hi = hp.wrapping_add(64 * b + 32 * h);
            let e = 128 * h + 32 * c;
            let o = 256 * b + e;
            let ((l0, l1), (l2, l3)) = (u8x16(unsafe { ld16!(lo, 0) }), u8x16(unsafe { ld16!(lo, 16) }));
            let ((u0, u1), (u2, u3)) = (u8x16(unsafe { ld16!(hi, 0) }), u8x16(unsafe { ld16!(hi, 16) }));
            let (s0, s1) = (_mm256_set1_ps(db * scales[e / 16] as f32), _mm256_set1_ps(db * scales[e / 16 + 1] as f32));
            let val = |l: __m256i, u: __m256i, s: __m256| {
                let q = _mm256_sub_epi32(_mm256_or_si256(bits!(l, 4 * (c / 2), m15), _mm256_slli_epi32(bits!(u, 2 * c, m3), 4)), m32);
                _mm256_mul_ps(s, _mm256_cvtepi32_ps(q))
            };
            unsafe {
                sink.put(o, val(l0, u0, s0));
                sink.put(o + 8, val(l1, u1, s0));
                sink.put(o + 16, val(l2, u2, s1));
                sink.put(o + 24, val(l3, u3, s1));
            }
        }
    }
    sink
}

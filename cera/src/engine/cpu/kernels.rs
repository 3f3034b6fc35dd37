//! The inner loops of the CPU executor, chosen once at load: AVX2 + FMA + F16C where the CPU has
//! them (`x86.rs`), else portable Rust. Row decoding falls back to boostr's own decoder
//! (`PackedWeights::dequantize_row_into`) for every format without a vector decoder, and the
//! vector decoders are tested bit for bit against it.

use boostr::formats::PackedWeights;

#[cfg(target_arch = "x86_64")]
use super::x86::{Avx2, Rows};

/// Which implementation of the inner loops runs.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kernels {
    /// Plain Rust (eight independent accumulators per dot product).
    Portable,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
}

impl Kernels {
    /// The fastest implementation this CPU runs.
    pub(super) fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if let Some(a) = Avx2::detect() {
            return Kernels::Avx2(a);
        }
        Kernels::Portable
    }

    /// `p` prepared for decoding rows (the per-matrix work done once).
    pub(super) fn rows(self, p: &PackedWeights) -> RowSrc<'_> {
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(a) = self
            && let Some(r) = a.rows(p)
        {
            return RowSrc::Vector(a, r, p);
        }
        RowSrc::Plain(p)
    }

    /// `[t][r] = w_r . x_t` for 4 contiguous rows of `w` (`n` each) and two tokens. A (row,
    /// token) product is the same in every `dot*` kernel.
    pub(super) fn dot4x2(self, w: &[f32], n: usize, x0: &[f32], x1: &[f32]) -> [[f32; 4]; 2] {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(a) => a.dot4x2(w, n, x0, x1),
            Kernels::Portable => [self.dot4x1(w, n, x0), self.dot4x1(w, n, x1)],
        }
    }

    /// `[r] = w_r . x0` for 4 rows.
    pub(super) fn dot4x1(self, w: &[f32], n: usize, x0: &[f32]) -> [f32; 4] {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(a) => a.dot4x1(w, n, x0),
            Kernels::Portable => std::array::from_fn(|r| dot_portable(&w[r * n..(r + 1) * n], &x0[..n])),
        }
    }

    /// `[t] = w . x_t` for one row.
    pub(super) fn dot1x2(self, w: &[f32], n: usize, x0: &[f32], x1: &[f32]) -> [f32; 2] {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(a) => a.dot1x2(w, n, x0, x1),
            Kernels::Portable => [self.dot1x1(w, n, x0), self.dot1x1(w, n, x1)],
        }
    }

    /// `w . x` over `n` elements.
    pub(super) fn dot1x1(self, w: &[f32], n: usize, x: &[f32]) -> f32 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(a) => a.dot1x1(w, n, x),
            Kernels::Portable => dot_portable(&w[..n], &x[..n]),
        }
    }

    /// `a . b` over `a.len()` elements.
    pub(super) fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        self.dot1x1(a, a.len(), b)
    }

    /// `y += a * x`.
    pub(super) fn axpy(self, y: &mut [f32], a: f32, x: &[f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Kernels::Avx2(k) if k.axpy(y, a, x) => {}
            _ => y.iter_mut().zip(x).for_each(|(y, &x)| *y += a * x),
        }
    }
}

/// A matrix ready for row decoding: through the vector decoders, or boostr's own decoder.
#[derive(Clone, Copy, Debug)]
pub(super) enum RowSrc<'a> {
    /// AVX2 decoders.
    #[cfg(target_arch = "x86_64")]
    Vector(Avx2, Rows<'a>, &'a PackedWeights),
    /// `PackedWeights::dequantize_row_into`.
    Plain(&'a PackedWeights),
}

impl RowSrc<'_> {
    /// Decodes row `row` into `out[..cols]` (the caller checks `row < rows`).
    pub(super) fn decode_row(&self, row: usize, out: &mut [f32]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            RowSrc::Vector(a, r, p) => {
                if !a.decode_row(r, row, out) {
                    let _ = p.dequantize_row_into(row, out);
                }
            }
            // The row index is in range and `out` holds a row (both checked by the callers),
            // the only errors boostr's decoder reports.
            RowSrc::Plain(p) => {
                let _ = p.dequantize_row_into(row, out);
            }
        }
    }

    /// `w_row . x` with the row decoded on the fly (the value decoding the row and
    /// [`Kernels::dot1x1`] give, up to f32 rounding: other accumulators); `None` without a
    /// vector decoder (the caller decodes).
    pub(super) fn dot_row1(&self, row: usize, x: &[f32]) -> Option<f32> {
        match self {
            #[cfg(target_arch = "x86_64")]
            RowSrc::Vector(a, r, _) => Some(a.dot_row1(r, row, x)),
            RowSrc::Plain(_) => None,
        }
    }

    /// As [`RowSrc::dot_row1`] for two activation rows.
    pub(super) fn dot_row2(&self, row: usize, x0: &[f32], x1: &[f32]) -> Option<[f32; 2]> {
        match self {
            #[cfg(target_arch = "x86_64")]
            RowSrc::Vector(a, r, _) => Some(a.dot_row2(r, row, x0, x1)),
            RowSrc::Plain(_) => None,
        }
    }
}

/// Eight f32 on a 32-byte boundary.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Lanes([f32; 8]);

/// A growable f32 scratch buffer whose start is 32-byte aligned (the vector kernels store into
/// it with aligned stores).
pub(super) struct AlignedBuf(Vec<Lanes>);

impl AlignedBuf {
    /// Empty.
    pub(super) const fn new() -> AlignedBuf {
        AlignedBuf(Vec::new())
    }

    /// The first `n` values (grown with zeros as needed).
    pub(super) fn get(&mut self, n: usize) -> &mut [f32] {
        if self.0.len() < n.div_ceil(8) {
            self.0.resize(n.div_ceil(8), Lanes([0.0; 8]));
        }
        // SAFETY: `Lanes` is `repr(C)` over `[f32; 8]` (size 32, no padding), so the vector's
        // buffer holds `8 * len >= n` initialised f32s; the borrow of `self` guards it.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr() as *mut f32, n) }
    }
}

/// Eight independent accumulators (lane `i` sums elements `i mod 8`), then a fixed reduction.
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use boostr::formats::{GgmlType, repack};

    /// Deterministic bytes (xorshift).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn vector_decoders_match_boostrs_decoder_bit_for_bit() {
        use GgmlType::*;
        let k = Kernels::detect();
        let (rows, cols) = (5, 512);
        for (i, ty) in [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K].into_iter().enumerate() {
            let raw = bytes(ty.bytes_for(rows * cols).unwrap(), i as u64 + 1);
            let p = repack(ty, &raw, rows, cols).unwrap();
            let mut buf = AlignedBuf::new();
            let got = buf.get(cols);
            for r in 0..rows {
                #[cfg(target_arch = "x86_64")]
                if let Kernels::Avx2(a) = k {
                    let vector = !matches!(ty, BF16 | Q2_K | Q3_K);
                    assert_eq!(a.rows(&p).is_some(), vector, "{}: a vector decoder or not", ty.name());
                }
                let src = k.rows(&p);
                src.decode_row(r, got);
                let want = p.dequantize_row(r).unwrap();
                let (x0, x1): (Vec<f32>, Vec<f32>) = (0..cols).map(|c| ((c % 7) as f32 - 3.0, (c % 5) as f32 * 0.25)).unzip();
                if let Some(f) = src.dot_row1(r, &x0) {
                    let close =
                        |a: f32, b: f32| (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * (1.0 + a.abs().max(b.abs())) || (a.is_infinite() && a == b);
                    let (f2, u2) = (src.dot_row2(r, &x0, &x1).unwrap(), k.dot1x2(got, cols, &x0, &x1));
                    let unfused = k.dot1x1(got, cols, &x0);
                    assert!(close(f, unfused) && close(f2[0], u2[0]) && close(f2[1], u2[1]), "{}: fused {f} {f2:?} vs {unfused} {u2:?}", ty.name());
                }
                for (c, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{} row {r} col {c}: {g} vs boostr {w} ({k:?})", ty.name());
                }
            }
        }
    }

    #[test]
    fn dot_products_agree_across_tiles_and_with_f64() {
        let k = Kernels::detect();
        let n = 203;
        let f = |seed| bytes(4 * n, seed).iter().map(|&b| b as f32 / 64.0 - 2.0).collect::<Vec<f32>>();
        let (w, x0, x1) = (f(1), f(2), f(3));
        let x0 = &x0[..n];
        let x1 = &x1[..n];
        let t42 = k.dot4x2(&w, n, x0, x1);
        for r in 0..4 {
            let row = &w[r * n..(r + 1) * n];
            assert_eq!(t42[0][r].to_bits(), k.dot1x1(row, n, x0).to_bits());
            assert_eq!(t42[1][r].to_bits(), k.dot4x1(&w, n, x1)[r].to_bits());
            assert_eq!(t42[1][r].to_bits(), k.dot1x2(row, n, x0, x1)[1].to_bits());
            for (t, x) in [x0, x1].into_iter().enumerate() {
                let exact: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                assert!((t42[t][r] as f64 - exact).abs() < 1e-4, "{} vs {exact}", t42[t][r]);
                assert!((Kernels::Portable.dot(row, x) as f64 - exact).abs() < 1e-4);
            }
        }
        let mut y = x0.to_vec();
        k.axpy(&mut y, 0.5, x1);
        for i in 0..n {
            assert!((y[i] - (x0[i] + 0.5 * x1[i])).abs() < 1e-6);
        }
    }
}

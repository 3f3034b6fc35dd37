//! `out = x W^T` over quantized weights: the output rows are cut into chunks the threads share;
//! a thread decodes a block of its chunk's rows into a thread-local scratch once and multiplies
//! it with every activation row of the step, so a weight row is decoded once per step however
//! many tokens it carries.

use std::cell::RefCell;
use std::sync::Arc;

use boostr::formats::PackedWeights;

use super::int8::{Int8Rows, Q8Acts};
use super::kernels::{AlignedBuf, Kernels, RowSrc};
use super::pool::{Job, MAX_CHUNKS, Pool};
use crate::engine::EngineError;

/// Rows decoded together (their f32 copy stays in L2 while every token passes over it).
const ROW_BLOCK: usize = 16;
/// Below this many multiply-adds a product runs on the calling thread alone.
const PARALLEL_MIN: usize = 1 << 16;
/// Multiply-adds per chunk at least (the hand-over of a chunk costs about a microsecond).
const CHUNK_MIN: usize = 1 << 15;

/// Matrices of equal width whose rows are concatenated (fused Q/K/V, fused gate/up).
#[derive(Debug)]
pub(super) struct MatGroup {
    parts: Vec<Arc<PackedWeights>>,
    /// First global row of each part.
    starts: Vec<usize>,
    rows: usize,
    cols: usize,
    /// Every part has an integer-dot kernel (`int8.rs`).
    int8: bool,
}

impl MatGroup {
    /// The group of `parts` (non-empty, equal `cols`; the caller checks).
    pub(super) fn new(parts: Vec<Arc<PackedWeights>>) -> MatGroup {
        let cols = parts.first().map_or(0, |p| p.cols());
        let mut starts = Vec::with_capacity(parts.len());
        let mut rows = 0;
        for p in &parts {
            starts.push(rows);
            rows += p.rows();
        }
        let int8 = parts.iter().all(|p| Int8Rows::of(p).is_some());
        MatGroup { parts, starts, rows, cols, int8 }
    }

    /// Output features (all parts).
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub(super) fn cols(&self) -> usize {
        self.cols
    }

    /// The index of the part holding global row `row`.
    fn part_of(&self, row: usize) -> usize {
        self.starts.partition_point(|&s| s <= row) - 1
    }

    /// Rows `[a, b)` times one or two activation rows with each row decoded on the fly (decode
    /// steps: no scratch round trip); `false` where a part has no fused decoder.
    fn fused(&self, k: Kernels, a: usize, b: usize, x: &[f32], n_tok: usize, out: &mut [f32]) -> bool {
        let (cols, m) = (self.cols, b - a);
        let mut cur = Cursor::new(self, k, a);
        for r in a..b {
            let (src, pr) = cur.at(r);
            if n_tok == 1 {
                match src.dot_row1(pr, x) {
                    Some(v) => out[r - a] = v,
                    None => return false,
                }
            } else {
                match src.dot_row2(pr, &x[..cols], &x[cols..2 * cols]) {
                    Some([v0, v1]) => (out[r - a], out[m + r - a]) = (v0, v1),
                    None => return false,
                }
            }
        }
        true
    }
}

/// Row decoding over a group, the current part prepared once.
struct Cursor<'a> {
    g: &'a MatGroup,
    k: Kernels,
    part: usize,
    src: RowSrc<'a>,
}

impl<'a> Cursor<'a> {
    fn new(g: &'a MatGroup, k: Kernels, row: usize) -> Cursor<'a> {
        let part = g.part_of(row);
        Cursor { g, k, part, src: k.rows(&g.parts[part]) }
    }

    /// The source of global row `row` (rows come in increasing order) and its local index.
    fn at(&mut self, row: usize) -> (&RowSrc<'a>, usize) {
        while row >= self.g.starts[self.part] + self.g.parts[self.part].rows() {
            self.part += 1;
            self.src = self.k.rows(&self.g.parts[self.part]);
        }
        (&self.src, row - self.g.starts[self.part])
    }
}

/// Rows `[a, b)` of chunk `c` of `n`: contiguous, multiples of 4 but for the last.
fn share(rows: usize, c: usize, n: usize) -> (usize, usize) {
    let cut = |i: usize| if i == n { rows } else { (rows * i / n) & !3 };
    (cut(c), cut(c + 1))
}

struct LinearJob {
    k: Kernels,
    g: Arc<MatGroup>,
    x: Arc<Vec<f32>>,
    /// The step's activation rows quantized to int8 (the integer-dot path), else `None`.
    xq: Option<Arc<Q8Acts>>,
    /// First activation row and row count.
    t0: usize,
    n_tok: usize,
    chunks: usize,
}

thread_local! {
    static SCRATCH: RefCell<AlignedBuf> = const { RefCell::new(AlignedBuf::new()) };
}

impl LinearJob {
    /// Rows `[a, b)` by integer dots against `xq` into `out` (`[token][b - a]`); `false` without
    /// the vector kernels.
    fn int8(&self, xq: &Q8Acts, a: usize, b: usize, out: &mut [f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(k) = self.k {
            let (g, m) = (&self.g, b - a);
            let mut part = g.part_of(a);
            let mut rows = Int8Rows::of(&g.parts[part]);
            for r in a..b {
                while r >= g.starts[part] + g.parts[part].rows() {
                    part += 1;
                    rows = Int8Rows::of(&g.parts[part]);
                }
                let rows = rows.as_ref().expect("MatGroup::int8 checked every part");
                k.int8_row(rows, r - g.starts[part], xq, 0..self.n_tok, &mut out[r - a..], m);
            }
            return true;
        }
        let _ = (xq, a, b, out);
        false
    }
}

impl Job for LinearJob {
    fn chunks(&self) -> usize {
        self.chunks
    }

    fn run(&self, c: usize, out: &mut Vec<f32>) {
        let (a, b) = share(self.g.rows, c, self.chunks);
        let (cols, n_tok, m) = (self.g.cols, self.n_tok, b - a);
        out.clear();
        out.resize(n_tok * m, 0.0);
        if let Some(xq) = &self.xq
            && self.int8(xq, a, b, out)
        {
            return;
        }
        let x = &self.x[self.t0 * cols..(self.t0 + n_tok) * cols];
        if n_tok <= 2 && self.g.fused(self.k, a, b, x, n_tok, out) {
            return;
        }
        SCRATCH.with_borrow_mut(|scratch| {
            let wbuf = scratch.get(ROW_BLOCK * cols);
            let mut cur = Cursor::new(&self.g, self.k, a);
            let mut r0 = a;
            while r0 < b {
                let r1 = (r0 + ROW_BLOCK).min(b);
                for r in r0..r1 {
                    let (src, pr) = cur.at(r);
                    src.decode_row(pr, &mut wbuf[(r - r0) * cols..(r - r0 + 1) * cols]);
                }
                let mut t = 0;
                while t < n_tok {
                    let xt = |i: usize| &x[(t + i) * cols..(t + i + 1) * cols];
                    let pair = t + 1 < n_tok;
                    let mut r = r0;
                    while r < r1 {
                        let wr = &wbuf[(r - r0) * cols..];
                        let o = r - a;
                        match (r + 4 <= r1, pair) {
                            (true, true) => {
                                let d = self.k.dot4x2(wr, cols, xt(0), xt(1));
                                out[t * m + o..t * m + o + 4].copy_from_slice(&d[0]);
                                out[(t + 1) * m + o..(t + 1) * m + o + 4].copy_from_slice(&d[1]);
                                r += 4;
                            }
                            (true, false) => {
                                let d = self.k.dot4x1(wr, cols, xt(0));
                                out[t * m + o..t * m + o + 4].copy_from_slice(&d);
                                r += 4;
                            }
                            (false, true) => {
                                let d = self.k.dot1x2(wr, cols, xt(0), xt(1));
                                (out[t * m + o], out[(t + 1) * m + o]) = (d[0], d[1]);
                                r += 1;
                            }
                            (false, false) => {
                                out[t * m + o] = self.k.dot1x1(wr, cols, xt(0));
                                r += 1;
                            }
                        }
                    }
                    t += if pair { 2 } else { 1 };
                }
                r0 = r1;
            }
        });
    }
}

/// `out[t][..g.rows()] = x[t0 + t] W^T` for `n_tok` rows of `x` (rows of `g.cols()`); `out`
/// rows are `out_stride` apart. With `int8`, a group whose formats have integer-dot kernels
/// multiplies the rows quantized to int8 (`int8.rs`), whatever the number of tokens (so a
/// token's numbers do not depend on how a prompt is cut into steps); others take the f32 path.
#[allow(clippy::too_many_arguments)]
pub(super) fn linear(
    pool: &mut Pool,
    k: Kernels,
    int8: bool,
    g: &Arc<MatGroup>,
    x: &Arc<Vec<f32>>,
    t0: usize,
    n_tok: usize,
    out: &mut [f32],
    out_stride: usize,
) -> Result<(), EngineError> {
    let work = g.rows * g.cols * n_tok;
    let parallel = work >= PARALLEL_MIN && pool.threads() > 1;
    let chunks = if parallel { (work / CHUNK_MIN).min(g.rows / 8).clamp(1, MAX_CHUNKS) } else { 1 };
    let vector = !matches!(k, Kernels::Portable);
    let xq = (int8 && g.int8 && vector).then(|| Arc::new(Q8Acts::quantize(&x[t0 * g.cols..], n_tok, g.cols)));
    pool.run(Arc::new(LinearJob { k, g: g.clone(), x: x.clone(), xq, t0, n_tok, chunks }), parallel)?;
    for c in 0..chunks {
        let (a, b) = share(g.rows, c, chunks);
        let res = pool.result(c);
        for t in 0..n_tok {
            out[t * out_stride + a..t * out_stride + b].copy_from_slice(&res[t * (b - a)..(t + 1) * (b - a)]);
        }
    }
    Ok(())
}

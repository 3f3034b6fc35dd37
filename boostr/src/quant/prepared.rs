//! [`PreparedMatrix`]: a [`QuantMatrix`] laid out on the host, each part's words ready to be
//! written to its buffer. This is the host half of an upload and needs no device, so a loader can
//! prepare many matrices on several threads and write them to the device from one.
//!
//! A matrix is laid out from [`MatrixRows`]: rows already repacked ([`PackedWeights`]), or rows
//! still in a GGUF file's blocks ([`BlockRows`]), which are split into the part's sections
//! straight from the file's bytes (one copy, no intermediate arrays). A [`WordPool`] lets a
//! loader hand each part's storage back once it is written, so the next matrix reuses memory
//! already in place instead of faulting in fresh pages.

use std::sync::{Arc, Mutex};

use numr::gpu::{BulkUpload, GpuBuffer, GpuContext};

use super::upload::{QuantMatrix, QuantPart, Sections, sections};
use super::{QuantError, Result};
use crate::formats::packed::Geometry;
use crate::formats::repack::{bytes_to_words, split_blocks};
use crate::formats::{FormatError, GgmlType, PackedFormat, PackedWeights};

/// Rows of a GGUF tensor as the file stores them: `rows` rows of `cols` elements in `ty`'s
/// blocks. Made by [`BlockRows::new`], which checks the type and the length.
#[derive(Clone, Copy, Debug)]
pub struct BlockRows<'a> {
    ty: GgmlType,
    bytes: &'a [u8],
    rows: usize,
    cols: usize,
}

impl<'a> BlockRows<'a> {
    /// Checks that `ty` is a type the kernels decode, that `cols` is a whole number of its blocks
    /// (and even for F16/BF16, whose words hold two elements) and that `bytes` is exactly `rows`
    /// rows.
    pub fn new(ty: GgmlType, bytes: &'a [u8], rows: usize, cols: usize) -> Result<BlockRows<'a>> {
        ty.ensure_supported()?;
        Geometry::of(PackedFormat::Ggml(ty))?;
        if matches!(ty, GgmlType::F16 | GgmlType::BF16) && !cols.is_multiple_of(2) {
            return Err(FormatError::NotBlockMultiple { format: ty.name(), n_elements: cols, block_size: 2 }.into());
        }
        let expected = rows
            .checked_mul(ty.bytes_for(cols)?)
            .ok_or_else(|| FormatError::InvalidShape { format: ty.name(), reason: format!("{rows} rows of {cols} elements overflow") })?;
        if bytes.len() != expected {
            return Err(FormatError::ByteLength { format: ty.name(), what: "data", expected, actual: bytes.len() }.into());
        }
        Ok(BlockRows { ty, bytes, rows, cols })
    }
}

/// The rows of one matrix to lay out.
#[derive(Clone, Copy, Debug)]
pub enum MatrixRows<'a> {
    /// Rows already in boostr's packed arrays (AWQ/GPTQ, narrowed F32, a table shared with the
    /// embedding).
    Packed(&'a PackedWeights),
    /// Rows still in a GGUF file's blocks.
    Blocks(BlockRows<'a>),
}

impl MatrixRows<'_> {
    /// The format the rows are laid out in.
    pub fn format(&self) -> PackedFormat {
        match self {
            MatrixRows::Packed(p) => p.format(),
            MatrixRows::Blocks(b) => PackedFormat::Ggml(b.ty),
        }
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        match self {
            MatrixRows::Packed(p) => p.rows(),
            MatrixRows::Blocks(b) => b.rows,
        }
    }

    /// Elements per row (input features).
    pub fn cols(&self) -> usize {
        match self {
            MatrixRows::Packed(p) => p.cols(),
            MatrixRows::Blocks(b) => b.cols,
        }
    }

    /// Writes blocks `b0 .. b0 + n` of this matrix as blocks `at ..` of a part whose sections
    /// are `s` and whose words are `words` (zeroed by the caller).
    fn fill(&self, g: &Geometry, b0: usize, n: usize, s: &Sections, at: usize, words: &mut [u32]) {
        let (qs, rest) = words.split_at_mut(s.qh as usize);
        let (qh, rest) = rest.split_at_mut((s.sc - s.qh) as usize);
        let (sc, rest) = rest.split_at_mut((s.d - s.sc) as usize);
        let (d, m) = rest.split_at_mut((s.m - s.d) as usize);
        let (qs, qh, sc) = (&mut qs[at * g.qs_words..], &mut qh[at * g.qh_words..], &mut sc[at * g.scale_words..]);
        match self {
            MatrixRows::Packed(p) => {
                let copy = |dst: &mut [u32], src: &[u32], per: usize| dst[..n * per].copy_from_slice(&src[b0 * per..(b0 + n) * per]);
                copy(qs, p.qs(), g.qs_words);
                copy(qh, p.qh(), g.qh_words);
                copy(sc, p.scales(), g.scale_words);
                for i in 0..n {
                    if g.has_d {
                        put_half(d, at + i, p.d()[b0 + i].to_bits());
                    }
                    if g.has_m {
                        put_half(m, at + i, p.m()[b0 + i].to_bits());
                    }
                }
            }
            MatrixRows::Blocks(b) => {
                let ts = b.ty.type_size();
                if matches!(b.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                    // One word a block: an f32, or two f16/bf16 (the low one first).
                    bytes_to_words(&b.bytes[b0 * 4..(b0 + n) * 4], &mut qs[..n]);
                    return;
                }
                let bytes = &b.bytes[b0 * ts..(b0 + n) * ts];
                split_blocks(b.ty, bytes, qs, qh, sc, |i, v| put_half(d, at + i, v), |i, v| put_half(m, at + i, v));
            }
        }
    }
}

/// Sets f16 number `i` of a section of f16 pairs (the low half of a word first).
fn put_half(words: &mut [u32], i: usize, bits: u16) {
    let (w, shift) = (i / 2, 16 * (i % 2));
    words[w] = (words[w] & !(0xffff << shift)) | (bits as u32) << shift;
}

/// Spare word vectors for [`PreparedMatrix::lay_out`], handed back by
/// [`PreparedMatrix::upload_bulk`]: a loader preparing matrix after matrix reuses memory it has
/// already touched. Keeps at most `max` spares (the largest ones); thread-safe.
#[derive(Debug)]
pub struct WordPool {
    spare: Mutex<Vec<Vec<u32>>>,
    max: usize,
}

impl WordPool {
    /// A pool that keeps at most `max` spare vectors.
    pub fn new(max: usize) -> WordPool {
        WordPool { spare: Mutex::new(Vec::new()), max }
    }

    /// `n` zeroed words: the smallest spare that holds them, else a new vector.
    pub fn take(&self, n: usize) -> Vec<u32> {
        let found = {
            let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
            let best = spare.iter().enumerate().filter(|(_, v)| v.capacity() >= n).min_by_key(|(_, v)| v.capacity()).map(|(i, _)| i);
            best.map(|i| spare.swap_remove(i))
        };
        match found {
            Some(mut v) => {
                v.clear();
                v.resize(n, 0);
                v
            }
            None => vec![0; n],
        }
    }

    /// Keeps `v` for a later [`Self::take`] (when the pool is full, the smallest of the spares
    /// and `v` is dropped).
    pub fn give(&self, v: Vec<u32>) {
        if self.max == 0 {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < self.max {
            spare.push(v);
        } else if let Some((i, _)) = spare.iter().enumerate().min_by_key(|(_, s)| s.capacity()).filter(|(_, s)| s.capacity() < v.capacity()) {
            spare[i] = v;
        }
    }

    /// Spare vectors held now.
    pub fn spares(&self) -> usize {
        self.spare.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// A [`QuantMatrix`] laid out on the host, each part's words ready to be written to its buffer.
#[derive(Clone, Debug)]
pub struct PreparedMatrix {
    name: String,
    format: PackedFormat,
    rows: usize,
    cols: usize,
    /// Per part: its first row, its rows, its sections and its words.
    parts: Vec<(usize, usize, Sections, Vec<u32>)>,
}

impl PreparedMatrix {
    /// Lays `p` out in parts of at most `limit` bytes ([`super::binding_limit`] for a device's
    /// own).
    pub fn new(name: &str, p: &PackedWeights, limit: u64) -> Result<PreparedMatrix> {
        Self::lay_out(name, &[MatrixRows::Packed(p)], limit, None)
    }

    /// Lays the rows of `mats` (one format and column count), one matrix after the other, out as
    /// one matrix ([`super::upload::concat_rows`] without its copy).
    pub fn concat(name: &str, mats: &[&PackedWeights], limit: u64) -> Result<PreparedMatrix> {
        let rows: Vec<MatrixRows> = mats.iter().map(|&p| MatrixRows::Packed(p)).collect();
        Self::lay_out(name, &rows, limit, None)
    }

    /// Lays the rows of `mats` (one format and column count, packed or still in file blocks),
    /// one matrix after the other, out as one matrix in parts of at most `limit` bytes, each
    /// part's words filled straight from the matrices' own data; the words come from `pool`
    /// when one is given.
    pub fn lay_out(name: &str, mats: &[MatrixRows<'_>], limit: u64, pool: Option<&WordPool>) -> Result<PreparedMatrix> {
        let p = mats.first().ok_or(QuantError::Shape { what: "PreparedMatrix::lay_out", reason: "no matrices".into() })?;
        let (format, cols) = (p.format(), p.cols());
        if let Some(m) = mats.iter().find(|m| m.format() != format || m.cols() != cols) {
            return Err(QuantError::Shape {
                what: "PreparedMatrix::lay_out",
                reason: format!("{} x {} of {} vs {} x {} of {}", m.rows(), m.cols(), m.format().name(), p.rows(), cols, format.name()),
            });
        }
        let rows = mats.iter().map(|m| m.rows()).sum::<usize>();
        if cols % 32 != 0 || cols == 0 {
            return Err(QuantError::Unsupported { name: name.to_string(), reason: format!("{cols} columns; the GPU kernels need a positive multiple of 32") });
        }
        let geo = Geometry::of(format)?;
        let bpr = cols.div_ceil(geo.block_size);
        let one = sections(&geo, bpr)?.words as u64 * 4;
        if one > limit {
            return Err(QuantError::RowTooLarge { name: name.to_string(), row_bytes: one, limit });
        }
        // Rows per part: the largest count whose padded sections fit (linear estimate, then
        // shrink until it fits). Parts split at row boundaries, which are block boundaries (K-quant
        // and int4 groups stay whole); even part sizes keep f16 pairs aligned to rows (one part of
        // every row needs neither).
        let per_row = (bpr * (4 * (geo.qs_words + geo.qh_words + geo.scale_words) + 2 * (geo.has_d as usize + geo.has_m as usize))) as u64 + 1;
        let estimate = (limit.saturating_sub(64) / per_row).max(1);
        let mut rows_per_part = if estimate >= rows as u64 { rows.max(1) } else { estimate as usize & !1 }.max(1);
        while rows_per_part > 1 && !sections(&geo, rows_per_part * bpr).is_ok_and(|s| s.words as u64 * 4 <= limit) {
            rows_per_part = ((rows_per_part - 1).max(1) & !1).max(1);
        }
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < rows {
            let n = rows_per_part.min(rows - row0);
            let s = sections(&geo, n * bpr)?;
            let mut words = match pool {
                Some(pool) => pool.take(s.words as usize),
                None => vec![0; s.words as usize],
            };
            // `at`: blocks of the part written so far; `first`: the current matrix's first row.
            let (mut at, mut first) = (0, 0);
            for m in mats {
                let (lo, hi) = (row0.max(first), (row0 + n).min(first + m.rows()));
                if lo < hi {
                    m.fill(&geo, (lo - first) * bpr, (hi - lo) * bpr, &s, at, &mut words);
                    at += (hi - lo) * bpr;
                }
                first += m.rows();
            }
            parts.push((row0, n, s, words));
            row0 += n;
        }
        Ok(PreparedMatrix { name: name.to_string(), format, rows, cols, parts })
    }

    /// Bytes the parts take on the device.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.3.len() as u64 * 4).sum()
    }

    /// Writes the parts into buffers of their own on `ctx`.
    pub fn upload(self, ctx: &GpuContext) -> Result<QuantMatrix> {
        self.upload_with(|words| ctx.upload(words), None)
    }

    /// [`Self::upload`] through a bulk upload (a loader writing many matrices: its staging
    /// ring, batched submits); the data is on the device once the bulk upload is finished. The
    /// parts' words go back to `pool` once written.
    pub fn upload_bulk(self, bulk: &mut BulkUpload, pool: Option<&WordPool>) -> Result<QuantMatrix> {
        self.upload_with(|words| bulk.upload(words), pool)
    }

    fn upload_with(self, mut upload: impl FnMut(&[u8]) -> numr::Result<Arc<GpuBuffer>>, pool: Option<&WordPool>) -> Result<QuantMatrix> {
        let mut parts = Vec::with_capacity(self.parts.len());
        for (row0, rows, sections, words) in self.parts {
            parts.push(QuantPart { row0, rows, buffer: upload(bytemuck::cast_slice(&words))?, sections });
            if let Some(pool) = pool {
                pool.give(words);
            }
        }
        Ok(QuantMatrix { name: self.name, format: self.format, rows: self.rows, cols: self.cols, parts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::repack;
    use crate::quant::upload::concat_rows;

    fn random_bytes(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let n = rows * ty.bytes_for(cols).unwrap();
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 33) as u8
            })
            .collect()
    }

    fn random(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> PackedWeights {
        repack(ty, &random_bytes(ty, rows, cols, seed), rows, cols).unwrap()
    }

    fn cols_for(ty: GgmlType) -> usize {
        if ty.block_size() == 256 { 512 } else { 96 }
    }

    /// A limit that splits a matrix of this format into parts of three rows.
    fn three_row_limit(ty: GgmlType, cols: usize) -> u64 {
        let geo = Geometry::of(PackedFormat::Ggml(ty)).unwrap();
        sections(&geo, cols.div_ceil(geo.block_size) * 3).unwrap().words as u64 * 4
    }

    const TYPES: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// Laying several matrices out as one fills each part from the matrices' own arrays: the
    /// same sections and words as laying out their concatenation, with odd row counts (f16
    /// pairs straddling two matrices) and parts that split inside a matrix.
    #[test]
    fn concat_lays_out_what_concat_rows_gives() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q6_K, GgmlType::Q4_K] {
            let cols = cols_for(ty);
            let mats = [random(ty, 3, cols, 1), random(ty, 5, cols, 2), random(ty, 2, cols, 3)];
            let refs: Vec<&PackedWeights> = mats.iter().collect();
            let cat = concat_rows(&refs).unwrap();
            for limit in [u64::MAX, three_row_limit(ty, cols)] {
                let a = PreparedMatrix::concat("m", &refs, limit).unwrap();
                let b = PreparedMatrix::new("m", &cat, limit).unwrap();
                assert_eq!((a.rows, a.cols, a.format), (b.rows, b.cols, b.format));
                assert_eq!(a.parts, b.parts, "{ty:?}, limit {limit}");
                assert_eq!(a.parts.len() > 1, limit != u64::MAX, "{ty:?}");
            }
        }
        let other = random(GgmlType::Q8_0, 2, 96, 4);
        let q4 = random(GgmlType::Q4_0, 2, 96, 5);
        assert!(PreparedMatrix::concat("m", &[&q4, &other], u64::MAX).is_err());
    }

    /// Laying out straight from a file's blocks gives the words that repacking first gives, for
    /// every block type, one matrix or several (odd row counts), in one part or split, with and
    /// without a pool (whose recycled words hold the previous matrix's data).
    #[test]
    fn file_blocks_lay_out_what_repacking_gives() {
        let pool = WordPool::new(4);
        for ty in TYPES {
            let cols = cols_for(ty);
            let shapes = [(3, 11), (5, 12), (2, 13)];
            let bytes: Vec<Vec<u8>> = shapes.iter().map(|&(r, seed)| random_bytes(ty, r, cols, seed)).collect();
            let packed: Vec<PackedWeights> = shapes.iter().zip(&bytes).map(|(&(r, _), b)| repack(ty, b, r, cols).unwrap()).collect();
            let blocks: Vec<MatrixRows> = shapes.iter().zip(&bytes).map(|(&(r, _), b)| MatrixRows::Blocks(BlockRows::new(ty, b, r, cols).unwrap())).collect();
            let refs: Vec<&PackedWeights> = packed.iter().collect();
            for limit in [u64::MAX, three_row_limit(ty, cols)] {
                let want = PreparedMatrix::concat("m", &refs, limit).unwrap();
                for n in [1, 3] {
                    for p in [None, Some(&pool)] {
                        let got = PreparedMatrix::lay_out("m", &blocks[..n], limit, p).unwrap();
                        let want = if n == 1 { PreparedMatrix::new("m", &packed[0], limit).unwrap() } else { want.clone() };
                        assert_eq!((got.rows, got.cols, got.format), (want.rows, want.cols, want.format), "{ty:?}");
                        assert_eq!(got.parts, want.parts, "{ty:?}, {n} matrices, limit {limit}, pool {}", p.is_some());
                        // Hand the words back dirty: the next layout must not see them.
                        for (_, _, _, w) in got.parts {
                            pool.give(w);
                        }
                    }
                }
            }
        }
        assert!(pool.spares() <= 4);
    }

    /// File rows of the wrong length, a type without a decoder, and a mix of formats are typed
    /// errors.
    #[test]
    fn bad_file_rows_are_errors() {
        let b = random_bytes(GgmlType::Q4_0, 2, 64, 1);
        assert!(matches!(BlockRows::new(GgmlType::Q4_0, &b[1..], 2, 64), Err(QuantError::Format(FormatError::ByteLength { .. }))));
        assert!(matches!(BlockRows::new(GgmlType::Q4_0, &b, 2, 48), Err(QuantError::Format(_))));
        assert!(matches!(BlockRows::new(GgmlType::IQ2_XXS, &b, 2, 256), Err(QuantError::Format(FormatError::Unsupported { .. }))));
        let q8 = random_bytes(GgmlType::Q8_0, 2, 64, 2);
        let mats =
            [MatrixRows::Blocks(BlockRows::new(GgmlType::Q4_0, &b, 2, 64).unwrap()), MatrixRows::Blocks(BlockRows::new(GgmlType::Q8_0, &q8, 2, 64).unwrap())];
        assert!(matches!(PreparedMatrix::lay_out("m", &mats, u64::MAX, None), Err(QuantError::Shape { .. })));
    }

    /// The pool gives zeroed words, reuses the smallest spare that fits and keeps the largest
    /// spares when full.
    #[test]
    fn word_pool_reuses_and_bounds_its_spares() {
        let pool = WordPool::new(2);
        pool.give(vec![7; 100]);
        pool.give(vec![7; 10]);
        let v = pool.take(8);
        assert!(v.capacity() < 100 && v.iter().all(|&w| w == 0) && v.len() == 8);
        pool.give(vec![1; 50]);
        pool.give(vec![1; 5]);
        assert_eq!(pool.spares(), 2);
        let big = pool.take(60);
        assert!(big.capacity() >= 100 && big.len() == 60 && big.iter().all(|&w| w == 0));
        assert_eq!(pool.take(40).capacity(), 50);
    }
}

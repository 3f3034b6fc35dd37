//! [`QuantMatrix`]: a [`PackedWeights`] uploaded into GPU buffers, split by rows where one
//! binding cannot hold it.
//!
//! # GPU layout of one part (rows `row0 .. row0 + rows`)
//! One buffer, bound twice (as `array<vec4<u32>>` for wide quant loads and as `array<u32>`):
//!
//! | section | contents | per block |
//! |---|---|---|
//! | `qs` | the packed quant words of [`crate::formats::packed_decode`] | `QW` words |
//! | `qh` | the extra bit plane (Q5_*, Q3_K, Q5_K, Q6_K) | `HW` words |
//! | `sc` | the K-quants' packed sub-block scales | `SW` words |
//! | `d`  | one f16 scale per block, two per word | 2 bytes |
//! | `m`  | one f16 min / zero per block, two per word | 2 bytes |
//!
//! Each section starts on a 16-byte boundary, so `qs` and `qh` are `vec4<u32>`-addressable
//! (every format's per-block word count is a multiple of 4 except legacy `qh`, which is read as
//! single words). Blocks are in row order, so a part is a plain row range of the packed arrays.

use std::sync::Arc;

use half::f16;
use numr::gpu::{Binding, BulkUpload, GpuBuffer, GpuContext};

use super::validate::{mul, to_u32};
use super::{QuantError, Result, WeightKind};
use crate::formats::packed::Geometry;
use crate::formats::{PackedFormat, PackedWeights};

/// Word offsets of the sections inside a part's buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sections {
    /// Start of the packed quant words (always 0).
    pub qs: u32,
    /// Start of the extra bit plane (empty for formats without one).
    pub qh: u32,
    /// Start of the K-quants' sub-block scales.
    pub sc: u32,
    /// Start of the f16 block scales `d`, two per word.
    pub d: u32,
    /// Start of the f16 block minimums / zeros `m`, two per word.
    pub m: u32,
    /// Total words (a multiple of 4).
    pub words: u32,
}

/// One row range of a [`QuantMatrix`] in its own buffer.
#[derive(Clone, Debug)]
pub struct QuantPart {
    /// First matrix row of the part.
    pub row0: usize,
    /// Rows in the part (at least 1).
    pub rows: usize,
    /// The part's buffer, holding its sections.
    pub buffer: Arc<GpuBuffer>,
    /// Where each section starts in the buffer (in words).
    pub sections: Sections,
}

impl QuantPart {
    /// The buffer's binding (the same range serves as `wv` and `ws`).
    pub fn binding(&self) -> Binding {
        Binding { buffer: self.buffer.clone(), offset: 0, size: self.sections.words as u64 * 4 }
    }
}

/// A weight matrix on the GPU: `rows` output features of `cols` inputs.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    /// The tensor's name (for errors).
    pub name: String,
    /// The packed format it was uploaded from.
    pub format: PackedFormat,
    /// Output features (matrix rows).
    pub rows: usize,
    /// Input features per row (a positive multiple of 32).
    pub cols: usize,
    /// Row ranges `0..rows` in order, each in its own buffer.
    pub parts: Vec<QuantPart>,
}

fn pad4(w: usize) -> usize {
    w.div_ceil(4) * 4
}

/// Sections for `blocks` blocks of geometry `g`; [`QuantError::TooLarge`] when the part's words
/// do not fit 32 bits.
fn sections(g: &Geometry, blocks: usize) -> Result<Sections> {
    // Each section is checked to fit 32 bits before it is added (so the sums cannot overflow).
    let words = |per: usize| -> Result<usize> { Ok(to_u32("section words", pad4(mul("section words", blocks, per)?))? as usize) };
    let qs = 0;
    let qh = words(g.qs_words)?;
    let sc = qh + words(g.qh_words)?;
    let d = sc + words(g.scale_words)?;
    let halves = |on: bool| if on { pad4(blocks.div_ceil(2)) } else { 0 };
    let m = d + halves(g.has_d);
    let total = m + halves(g.has_m).max(if m == 0 { 4 } else { 0 });
    let w = |v: usize| to_u32("part words", v);
    Ok(Sections { qs: w(qs)?, qh: w(qh)?, sc: w(sc)?, d: w(d)?, m: w(m)?, words: w(total)? })
}

impl QuantMatrix {
    /// The decoder kind.
    pub fn kind(&self) -> WeightKind {
        WeightKind::of(self.format)
    }

    /// Chunks of 32 elements per row.
    pub fn chunks_per_row(&self) -> usize {
        self.cols / 32
    }

    /// Checks that the matrix is one the kernels can read in bounds: `cols` a positive multiple
    /// of 32 (int4 groups whole chunks that divide `cols`), parts that tile rows `0..rows` in
    /// order, each non-empty, with the sections [`QuantMatrix::upload`] makes for its rows, in a
    /// buffer that holds them, and chunk / row indices that fit 32 bits. Every plan calls it: the
    /// fields are public, and an unchecked kernel's weight reads are in bounds only when it holds.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(QuantError::Unsupported { name: self.name.clone(), reason });
        if self.cols == 0 || !self.cols.is_multiple_of(32) {
            return bad(format!("{} columns; the GPU kernels need a positive multiple of 32", self.cols));
        }
        let group = match self.format {
            PackedFormat::Int4 { group_size, .. } => Some(group_size),
            _ => None,
        };
        if let Some(g) = group.filter(|&g| g == 0 || !g.is_multiple_of(32) || !self.cols.is_multiple_of(g)) {
            return bad(format!("int4 groups of {g} (a multiple of 32 dividing {} columns)", self.cols));
        }
        let g = Geometry::of(self.format)?;
        let bpr = self.cols.div_ceil(g.block_size);
        to_u32("weight rows", self.rows)?;
        let mut row0 = 0;
        for (i, part) in self.parts.iter().enumerate() {
            if part.rows == 0 || part.row0 != row0 {
                return bad(format!("part {i} covers rows {}..{} (expected to start at {row0}, non-empty)", part.row0, part.row0 + part.rows));
            }
            to_u32("chunks of a part", mul("chunks of a part", part.rows, self.chunks_per_row())?)?;
            let want = sections(&g, mul("blocks of a part", part.rows, bpr)?)?;
            if part.sections != want {
                return bad(format!("part {i}: sections {:?} do not match its {} rows ({want:?})", part.sections, part.rows));
            }
            if part.buffer.len() < want.words as u64 * 4 {
                return Err(QuantError::BufferTooSmall { op: "quant matrix", buffer: "weight part", needed: want.words as u64 * 4, actual: part.buffer.len() });
            }
            row0 += part.rows;
        }
        if row0 != self.rows {
            return bad(format!("parts cover {row0} of {} rows", self.rows));
        }
        Ok(())
    }

    /// Uploads `p` with the adapter's own binding limit.
    pub fn upload(ctx: &GpuContext, name: &str, p: &PackedWeights) -> Result<QuantMatrix> {
        PreparedMatrix::new(name, p, binding_limit(ctx))?.upload(ctx)
    }

    /// Uploads `p`, splitting it by rows so that no part exceeds `limit` bytes (tests use a small
    /// limit to exercise splitting).
    pub fn upload_with_limit(ctx: &GpuContext, name: &str, p: &PackedWeights, limit: u64) -> Result<QuantMatrix> {
        PreparedMatrix::new(name, p, limit)?.upload(ctx)
    }
}

/// The most bytes one part of a matrix may take on `ctx` (its binding and buffer limits).
pub fn binding_limit(ctx: &GpuContext) -> u64 {
    ctx.capabilities().max_binding_size().min(ctx.capabilities().max_buffer_size())
}

/// A [`QuantMatrix`] laid out on the host, each part's words ready to be written to its buffer:
/// the host half of [`QuantMatrix::upload`], which needs no device, so that a loader can prepare
/// many matrices on several threads and write them to the device from one.
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
    /// Lays `p` out in parts of at most `limit` bytes ([`binding_limit`] for a device's own).
    pub fn new(name: &str, p: &PackedWeights, limit: u64) -> Result<PreparedMatrix> {
        Self::concat(name, &[p], limit)
    }

    /// Lays the rows of `mats` (one format and column count), one matrix after the other, out as
    /// one matrix ([`concat_rows`] without its copy: each part's words are filled from the
    /// matrices' own arrays).
    pub fn concat(name: &str, mats: &[&PackedWeights], limit: u64) -> Result<PreparedMatrix> {
        let p = *mats.first().ok_or(QuantError::Shape { what: "PreparedMatrix::concat", reason: "no matrices".into() })?;
        if let Some(m) = mats.iter().find(|m| m.format() != p.format() || m.cols() != p.cols()) {
            return Err(QuantError::Shape {
                what: "PreparedMatrix::concat",
                reason: format!("{} x {} of {} vs {} x {} of {}", m.rows(), m.cols(), m.format().name(), p.rows(), p.cols(), p.format().name()),
            });
        }
        let (rows, cols) = (mats.iter().map(|m| m.rows()).sum::<usize>(), p.cols());
        if cols % 32 != 0 || cols == 0 {
            return Err(QuantError::Unsupported {
                name: name.to_string(),
                reason: format!("{} columns; the GPU kernels need a positive multiple of 32", cols),
            });
        }
        let bpr = p.blocks_per_row();
        let geo = p.geometry;
        let one = sections(&geo, bpr)?.words as u64 * 4;
        if one > limit {
            return Err(QuantError::RowTooLarge { name: name.to_string(), row_bytes: one, limit });
        }
        // Rows per part: the largest count whose padded sections fit (linear estimate, then
        // shrink until it fits).
        let per_row = p.bytes_per_row_read() as u64 + 1;
        let estimate = (limit.saturating_sub(64) / per_row).max(1);
        // Keep K-quant / int4 groups whole: parts split at row boundaries, which are block
        // boundaries, so nothing more is needed. Even part sizes keep f16 pairs aligned to rows
        // (one part of every row needs neither).
        let mut rows_per_part = if estimate >= rows as u64 { rows.max(1) } else { estimate as usize & !1 }.max(1);
        while rows_per_part > 1 && !sections(&geo, rows_per_part * bpr).is_ok_and(|s| s.words as u64 * 4 <= limit) {
            rows_per_part = (rows_per_part - 1).max(1) & !1;
            rows_per_part = rows_per_part.max(1);
        }
        let mut parts = Vec::new();
        let mut row0 = 0;
        while row0 < rows.max(1) {
            let n = rows_per_part.min(rows - row0);
            if n == 0 {
                break;
            }
            let (s, words) = part_words(mats, row0, n)?;
            parts.push((row0, n, s, words));
            row0 += n;
        }
        Ok(PreparedMatrix { name: name.to_string(), format: p.format(), rows, cols, parts })
    }

    /// Bytes the parts take on the device.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.3.len() as u64 * 4).sum()
    }

    /// Writes the parts into buffers of their own on `ctx`.
    pub fn upload(self, ctx: &GpuContext) -> Result<QuantMatrix> {
        self.upload_with(|words| ctx.upload(words))
    }

    /// [`Self::upload`] through a bulk upload (a loader writing many matrices: its staging
    /// ring, batched submits); the data is on the device once the bulk upload is finished.
    pub fn upload_bulk(self, bulk: &mut BulkUpload) -> Result<QuantMatrix> {
        self.upload_with(|words| bulk.upload(words))
    }

    fn upload_with(self, mut upload: impl FnMut(&[u8]) -> numr::Result<Arc<GpuBuffer>>) -> Result<QuantMatrix> {
        let parts = self
            .parts
            .into_iter()
            .map(|(row0, rows, sections, words)| Ok(QuantPart { row0, rows, buffer: upload(bytemuck::cast_slice(&words))?, sections }))
            .collect::<Result<Vec<_>>>()?;
        Ok(QuantMatrix { name: self.name, format: self.format, rows: self.rows, cols: self.cols, parts })
    }
}

/// The sections and words of rows `row0 .. row0 + rows` of the rows of `mats` one after the
/// other (one format and column count, checked by the caller).
fn part_words(mats: &[&PackedWeights], row0: usize, rows: usize) -> Result<(Sections, Vec<u32>)> {
    let p = mats[0];
    let bpr = p.blocks_per_row();
    let nb = rows * bpr;
    let s = sections(&p.geometry, nb)?;
    let mut words = vec![0u32; s.words as usize];
    // `at`: blocks of the part written so far; `first`: the current matrix's first row.
    let (mut at, mut first) = (0, 0);
    for m in mats {
        let (lo, hi) = (row0.max(first), (row0 + rows).min(first + m.rows()));
        if lo < hi {
            let (b0, n) = ((lo - first) * bpr, (hi - lo) * bpr);
            let mut copy = |sec: u32, src: &[u32], per: usize| {
                let dst = sec as usize + at * per;
                words[dst..dst + n * per].copy_from_slice(&src[b0 * per..(b0 + n) * per]);
            };
            copy(s.qs, m.qs(), m.qs_words_per_block());
            copy(s.qh, m.qh(), m.qh_words_per_block());
            copy(s.sc, m.scales(), m.scale_words_per_block());
            let mut halves = |sec: u32, src: &[f16]| {
                for i in 0..n {
                    let (bits, g) = (src[b0 + i].to_bits() as u32, at + i);
                    words[sec as usize + g / 2] |= bits << (16 * (g % 2));
                }
            };
            if m.has_d() {
                halves(s.d, m.d());
            }
            if m.has_m() {
                halves(s.m, m.m());
            }
            at += n;
        }
        first += m.rows();
    }
    Ok((s, words))
}

/// Concatenates matrices of one format and column count by rows (Q, K and V into one matrix for
/// the fused projection). Errors when formats or column counts differ.
pub fn concat_rows(mats: &[&PackedWeights]) -> Result<PackedWeights> {
    let first = mats.first().ok_or(QuantError::Shape { what: "concat_rows", reason: "no matrices".into() })?;
    let mut out = (*first).clone();
    for m in &mats[1..] {
        if m.format() != first.format() || m.cols() != first.cols() {
            return Err(QuantError::Shape {
                what: "concat_rows",
                reason: format!("{} x {} of {} vs {} x {} of {}", m.rows(), m.cols(), m.format().name(), first.rows(), first.cols(), first.format().name()),
            });
        }
        let nb = out.n_blocks();
        out.qs.extend_from_slice(m.qs());
        out.qh.extend_from_slice(m.qh());
        out.scales.extend_from_slice(m.scales());
        if out.has_d() {
            out.d.truncate(nb);
            out.d.extend_from_slice(&m.d()[..m.n_blocks()]);
        }
        if out.has_m() {
            out.m.truncate(nb);
            out.m.extend_from_slice(&m.m()[..m.n_blocks()]);
        }
        out.rows += m.rows();
    }
    let nb = out.n_blocks();
    for v in [&mut out.d, &mut out.m] {
        if !v.is_empty() {
            v.resize(nb + nb % 2, f16::ZERO);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{GgmlType, repack};

    fn random(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> PackedWeights {
        let n = rows * ty.bytes_for(cols).unwrap();
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let bytes: Vec<u8> = (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 33) as u8
            })
            .collect();
        repack(ty, &bytes, rows, cols).unwrap()
    }

    /// Laying several matrices out as one fills each part from the matrices' own arrays: the
    /// same sections and words as laying out their concatenation, with odd row counts (f16
    /// pairs straddling two matrices) and parts that split inside a matrix.
    #[test]
    fn concat_lays_out_what_concat_rows_gives() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q6_K, GgmlType::Q4_K] {
            let cols = if ty.block_size() == 256 { 512 } else { 96 };
            let mats = [random(ty, 3, cols, 1), random(ty, 5, cols, 2), random(ty, 2, cols, 3)];
            let refs: Vec<&PackedWeights> = mats.iter().collect();
            let cat = concat_rows(&refs).unwrap();
            for limit in [u64::MAX, 3 * sections(&cat.geometry, cat.blocks_per_row() * 2).unwrap().words as u64 * 4 / 2] {
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
}

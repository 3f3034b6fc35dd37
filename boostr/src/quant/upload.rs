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
use numr::gpu::{Binding, GpuBuffer, GpuContext};

use super::prepared::PreparedMatrix;
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
pub(super) fn sections(g: &Geometry, blocks: usize) -> Result<Sections> {
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

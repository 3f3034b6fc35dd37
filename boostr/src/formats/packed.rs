//! [`PackedWeights`]: a weight matrix split into u32-aligned arrays for the GPU.
//!
//! File blocks are 18, 20, 22, 24, 34, 84, 110, ... bytes long, so they are never bound to a
//! shader as they are. At upload every block is split into separate arrays, each a whole number
//! of 32-bit words per block. Each GGUF field keeps its bytes as ggml stores them, so that
//! masking a word yields four consecutive elements:
//!
//! - `qs`: the quant words (the low bits of each element);
//! - `qh`: an extra bit plane (Q5_0/Q5_1 bit 4, Q3_K hmask, Q5_K bit 4, Q6_K top two bits);
//! - `scales`: the K-quants' packed sub-block scales, kept as stored (3 or 4 words);
//! - `d`: one f16 scale per block (the super-block `d`, or the AWQ/GPTQ group scale);
//! - `m`: one f16 per block for the second constant (`m` of Q4_1/Q5_1, `dmin` of the K-quants,
//!   the AWQ/GPTQ group zero point).
//!
//! Blocks of a row are contiguous in every array, and rows follow one another, so row `r`,
//! block `b` has the global block index `g = r * blocks_per_row + b` and its quant words are
//! `qs[g * qs_words_per_block ..][.. qs_words_per_block]` (likewise for `qh` and `scales`;
//! `d[g]`, `m[g]`). A subgroup that reads one row therefore streams contiguous, coalesced words.
//! Arrays a format does not use are empty. `d` and `m` are zero-padded to an even length so that
//! their byte views are whole u32 words (a buffer size wgpu accepts).
//!
//! The exact bit positions per format are documented in [`super::packed_decode`], beside the
//! CPU decoder that the WGSL kernels mirror.

use half::f16;

use super::error::{FormatError, Result};
use super::ggml_type::{GgmlType, QK, QK_K};
use super::int4::Int4Scheme;

/// The format of a [`PackedWeights`], which selects its decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PackedFormat {
    /// A repacked GGUF tensor of the given (supported) type.
    Ggml(GgmlType),
    /// A repacked AWQ or GPTQ int4 matrix, transposed so that a row is one output feature and
    /// runs along the input dimension. Both schemes share one packed layout.
    Int4 {
        /// Where the weights came from (informational; the decoder is the same).
        scheme: Int4Scheme,
        /// Input elements per quantization group (one `d`/`m` pair per group).
        group_size: usize,
    },
}

impl PackedFormat {
    /// A short name for messages (`"Q4_K"`, `"AWQ"`, `"GPTQ"`).
    pub fn name(&self) -> &'static str {
        match self {
            PackedFormat::Ggml(t) => t.name(),
            PackedFormat::Int4 { scheme, .. } => scheme.name(),
        }
    }
}

/// Words and constants per packed block of a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Elements per packed block.
    pub block_size: usize,
    /// u32 words of `qs` per block.
    pub qs_words: usize,
    /// u32 words of `qh` per block.
    pub qh_words: usize,
    /// u32 words of `scales` per block.
    pub scale_words: usize,
    /// Whether the block has a `d` entry.
    pub has_d: bool,
    /// Whether the block has an `m` entry.
    pub has_m: bool,
}

impl Geometry {
    /// The packed geometry of a format; [`FormatError::Unsupported`] for unsupported ggml types.
    pub(crate) fn of(format: PackedFormat) -> Result<Geometry> {
        use GgmlType::*;
        let g = |block_size, qs_words, qh_words, scale_words, has_d, has_m| Geometry { block_size, qs_words, qh_words, scale_words, has_d, has_m };
        Ok(match format {
            PackedFormat::Int4 { group_size, .. } => g(group_size, group_size / 8, 0, 0, true, true),
            PackedFormat::Ggml(t) => match t {
                F32 => g(1, 1, 0, 0, false, false),
                F16 | BF16 => g(2, 1, 0, 0, false, false),
                Q4_0 => g(QK, 4, 0, 0, true, false),
                Q4_1 => g(QK, 4, 0, 0, true, true),
                Q5_0 => g(QK, 4, 1, 0, true, false),
                Q5_1 => g(QK, 4, 1, 0, true, true),
                Q8_0 => g(QK, 8, 0, 0, true, false),
                Q2_K => g(QK_K, 16, 0, 4, true, true),
                Q3_K => g(QK_K, 16, 8, 3, true, false),
                Q4_K => g(QK_K, 32, 0, 3, true, true),
                Q5_K => g(QK_K, 32, 8, 3, true, true),
                Q6_K => g(QK_K, 32, 16, 4, true, false),
                other => {
                    return Err(FormatError::Unsupported { format: other.name() });
                }
            },
        })
    }
}

/// A weight matrix of `rows x cols` elements (row-major: a row is one output feature, `cols` is
/// the input dimension) in the GPU layout described in the module docs.
///
/// Built by [`super::repack()`] (GGUF types) or by the AWQ/GPTQ `repack` methods.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedWeights {
    pub(crate) format: PackedFormat,
    pub(crate) geometry: Geometry,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) qs: Vec<u32>,
    pub(crate) qh: Vec<u32>,
    pub(crate) scales: Vec<u32>,
    pub(crate) d: Vec<f16>,
    pub(crate) m: Vec<f16>,
}

impl PackedWeights {
    /// Allocates zeroed arrays for a `rows x cols` matrix. For F16/BF16 a row with an odd element
    /// count is padded to a whole word; every other format needs whole blocks per row.
    pub(crate) fn zeroed(format: PackedFormat, rows: usize, cols: usize) -> Result<PackedWeights> {
        let geometry = Geometry::of(format)?;
        let padded = matches!(format, PackedFormat::Ggml(GgmlType::F16 | GgmlType::BF16));
        if !padded && !cols.is_multiple_of(geometry.block_size) {
            return Err(FormatError::NotBlockMultiple { format: format.name(), n_elements: cols, block_size: geometry.block_size });
        }
        let blocks = rows * cols.div_ceil(geometry.block_size);
        let even = |n: usize| n + n % 2;
        Ok(PackedWeights {
            format,
            geometry,
            rows,
            cols,
            qs: vec![0; blocks * geometry.qs_words],
            qh: vec![0; blocks * geometry.qh_words],
            scales: vec![0; blocks * geometry.scale_words],
            d: vec![f16::ZERO; if geometry.has_d { even(blocks) } else { 0 }],
            m: vec![f16::ZERO; if geometry.has_m { even(blocks) } else { 0 }],
        })
    }

    /// The format, which selects the decoder.
    pub fn format(&self) -> PackedFormat {
        self.format
    }
    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Elements per row (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Elements per packed block (32, 256, the AWQ/GPTQ group size; 1 for F32, 2 for F16/BF16).
    pub fn block_size(&self) -> usize {
        self.geometry.block_size
    }
    /// Packed blocks per row (the last F16/BF16 block of an odd row is half padding).
    pub fn blocks_per_row(&self) -> usize {
        self.cols.div_ceil(self.geometry.block_size)
    }
    /// Packed blocks in the whole matrix.
    pub fn n_blocks(&self) -> usize {
        self.rows * self.blocks_per_row()
    }
    /// Logical elements in the matrix (`rows * cols`).
    pub fn n_elements(&self) -> usize {
        self.rows * self.cols
    }
    /// u32 words of `qs` per block.
    pub fn qs_words_per_block(&self) -> usize {
        self.geometry.qs_words
    }
    /// u32 words of `qh` per block (0 when the format has no extra bit plane).
    pub fn qh_words_per_block(&self) -> usize {
        self.geometry.qh_words
    }
    /// u32 words of `scales` per block (0 for formats without sub-block scales).
    pub fn scale_words_per_block(&self) -> usize {
        self.geometry.scale_words
    }
    /// Whether the `d` array is used.
    pub fn has_d(&self) -> bool {
        self.geometry.has_d
    }
    /// Whether the `m` array is used.
    pub fn has_m(&self) -> bool {
        self.geometry.has_m
    }
    /// The quant words.
    pub fn qs(&self) -> &[u32] {
        &self.qs
    }
    /// The extra bit-plane words (empty when unused).
    pub fn qh(&self) -> &[u32] {
        &self.qh
    }
    /// The packed sub-block scale words (empty when unused).
    pub fn scales(&self) -> &[u32] {
        &self.scales
    }
    /// One f16 scale per block, zero-padded to an even length (empty when unused).
    pub fn d(&self) -> &[f16] {
        &self.d
    }
    /// One f16 min/offset/zero per block, zero-padded to an even length (empty when unused).
    pub fn m(&self) -> &[f16] {
        &self.m
    }
    /// `qs` as bytes, for upload.
    pub fn qs_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.qs)
    }
    /// `qh` as bytes, for upload.
    pub fn qh_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.qh)
    }
    /// `scales` as bytes, for upload.
    pub fn scales_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.scales)
    }
    /// `d` as bytes (a multiple of 4), for upload.
    pub fn d_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.d)
    }
    /// `m` as bytes (a multiple of 4), for upload.
    pub fn m_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.m)
    }
    /// Total bytes of all arrays, padding included.
    pub fn total_bytes(&self) -> usize {
        self.qs_bytes().len() + self.qh_bytes().len() + self.scales_bytes().len() + self.d_bytes().len() + self.m_bytes().len()
    }
    /// Weight bytes a kernel reads to consume one full row (all arrays), for bandwidth accounting.
    pub fn bytes_per_row_read(&self) -> usize {
        let g = &self.geometry;
        let words = g.qs_words + g.qh_words + g.scale_words;
        let halves = g.has_d as usize + g.has_m as usize;
        self.blocks_per_row() * (4 * words + 2 * halves)
    }

    /// Checks a row index.
    pub(crate) fn check_row(&self, row: usize) -> Result<()> {
        if row >= self.rows {
            return Err(FormatError::RowOutOfRange { row, rows: self.rows });
        }
        Ok(())
    }

    /// Decodes row `row` from the packed arrays into f32, with the decoder the GPU mirrors.
    pub fn dequantize_row(&self, row: usize) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.cols];
        self.dequantize_row_into(row, &mut out)?;
        Ok(out)
    }

    /// Decodes row `row` into `out[..cols]`.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) -> Result<()> {
        self.check_row(row)?;
        if out.len() < self.cols {
            return Err(FormatError::Length { what: "out", expected: self.cols, actual: out.len() });
        }
        super::packed_decode::decode_row(self, row, &mut out[..self.cols]);
        Ok(())
    }

    /// Decodes the whole matrix, row-major (`rows * cols` values).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.n_elements()];
        if self.cols > 0 {
            for (r, chunk) in out.chunks_exact_mut(self.cols).enumerate() {
                super::packed_decode::decode_row(self, r, chunk);
            }
        }
        out
    }
}

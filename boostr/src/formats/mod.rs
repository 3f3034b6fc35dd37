//! Weight formats: CPU reference dequantization, the GPU upload layout, and reference products.
//!
//! Formats covered:
//! - GGUF/ggml: F32, F16, BF16, the legacy quants Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ([`legacy`]
//!   layouts) and the K-quants Q2_K .. Q6_K ([`kquants`] layouts). Every other ggml type (IQ*,
//!   TQ*, MXFP4, ...) is known by [`GgmlType`] but gives [`FormatError::Unsupported`].
//! - safetensors int4: AWQ ([`AwqTensors`]) and GPTQ ([`GptqTensors`], with its
//!   [`GptqZeroOffset`] option and sequential `g_idx` only).
//!
//! For each format there are three pieces:
//! 1. the reference dequantization from the file bytes ([`dequantize`], [`dequantize_row`],
//!    [`AwqTensors::dequantize`], [`GptqTensors::dequantize`]), checked bit for bit against
//!    gguf-py (GGUF) and a numpy reference written from the format definition (AWQ/GPTQ);
//! 2. the GPU layout made at upload ([`repack()`], [`AwqTensors::repack`],
//!    [`GptqTensors::repack`]) into [`PackedWeights`], with its own CPU decoder
//!    ([`PackedWeights::dequantize_row`]) whose bit positions are documented in
//!    [`packed_decode`] and which the WGSL kernels mirror;
//! 3. reference products over the packed layout ([`matmul_ref`], [`matvec_ref`]).
//!
//! Orientation: a GGUF weight of `ne0 = cols`, `ne1 = rows` is `rows` output features of `cols`
//! inputs, contiguous along the inputs. AWQ/GPTQ reference dequantization returns the checkpoint's
//! `[K, N]` (inputs major); their packed form is transposed to the same `rows = N`, `cols = K`
//! orientation as GGUF.

pub mod awq;
pub mod error;
pub mod float;
pub mod ggml_type;
pub mod gptq;
pub mod int4;
pub mod kquants;
pub mod legacy;
pub mod packed;
pub mod packed_decode;
pub mod reference_matmul;
pub mod repack;

pub use awq::{AWQ_SHIFTS, AwqTensors};
pub use error::{FormatError, Result};
pub use ggml_type::{GgmlType, QK, QK_K};
pub use gptq::{GptqTensors, GptqZeroOffset};
pub use int4::Int4Scheme;
pub use packed::{PackedFormat, PackedWeights};
pub use reference_matmul::{matmul_ref, matvec_ref};
pub use repack::repack;

/// Reference dequantization of `n_elements` values of a GGUF type from its file bytes.
///
/// `bytes` must be exactly the bytes of `n_elements` elements, which must be whole blocks.
/// The result equals gguf-py's `gguf.quants.dequantize` bit for bit.
pub fn dequantize(ty: GgmlType, bytes: &[u8], n_elements: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; n_elements];
    dequantize_into(ty, bytes, &mut out)?;
    Ok(out)
}

/// [`dequantize`] into a caller's buffer; `out.len()` is the element count.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    ty.ensure_supported()?;
    let expected = ty.bytes_for(out.len())?;
    if bytes.len() != expected {
        return Err(FormatError::ByteLength { format: ty.name(), what: "data", expected, actual: bytes.len() });
    }
    match ty {
        GgmlType::F32 => float::decode_f32(bytes, out),
        GgmlType::F16 => float::decode_f16(bytes, out),
        GgmlType::BF16 => float::decode_bf16(bytes, out),
        _ => {
            let blocks = bytes.chunks_exact(ty.type_size());
            let is_k = ty.block_size() == QK_K;
            for (block, o) in blocks.zip(out.chunks_exact_mut(ty.block_size())) {
                if is_k {
                    kquants::dequant_block(ty, block, o);
                } else {
                    legacy::dequant_block(ty, block, o);
                }
            }
        }
    }
    Ok(())
}

/// Reference dequantization of row `row` of a GGUF matrix whose rows hold `cols` elements.
///
/// `bytes` is the whole matrix (a whole number of rows); `cols` must be whole blocks.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], cols: usize, row: usize) -> Result<Vec<f32>> {
    ty.ensure_supported()?;
    let row_bytes = ty.bytes_for(cols)?;
    let rows = bytes.len().checked_div(row_bytes).unwrap_or(0);
    if rows * row_bytes != bytes.len() {
        return Err(FormatError::ByteLength { format: ty.name(), what: "data (whole rows)", expected: (rows + 1) * row_bytes, actual: bytes.len() });
    }
    if row >= rows {
        return Err(FormatError::RowOutOfRange { row, rows });
    }
    dequantize(ty, &bytes[row * row_bytes..(row + 1) * row_bytes], cols)
}

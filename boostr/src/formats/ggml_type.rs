//! The ggml tensor types: ids, names and block geometry. This is the one table of them in the
//! workspace: cera's GGUF reader and writer use it as is.
//!
//! The ids, names, block sizes and bytes per block are those of `enum ggml_type` in ggml.h and
//! `type_traits` in ggml.c. Every id ggml has defined is listed, removed types included
//! ([`GgmlType::is_removed`]), so a GGUF reader can name, size and skip any tensor; only the
//! types for which [`GgmlType::is_supported`] is true can be dequantized or repacked. The others
//! produce [`FormatError::Unsupported`] naming the type.

use super::error::{FormatError, Result};

/// Elements per block of the legacy quantizations (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub const QK: usize = 32;
/// Elements per super-block of the K-quantizations (Q2_K .. Q6_K).
pub const QK_K: usize = 256;

/// A ggml tensor type, numbered as in ggml and GGUF.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GgmlType {
    /// 32-bit IEEE float. ggml id 0, 4 bytes per element.
    F32,
    /// 16-bit IEEE float. ggml id 1, 2 bytes per element.
    F16,
    /// 4-bit quants with an f16 scale `d`: `x = d * (q - 8)`. ggml id 2, blocks of 32 in 18 bytes.
    Q4_0,
    /// 4-bit quants with an f16 scale `d` and minimum `m`: `x = d * q + m`.
    /// ggml id 3, blocks of 32 in 20 bytes.
    Q4_1,
    /// Removed from ggml (May 2023, before GGUF existed); not supported here.
    /// ggml id 4, blocks of 16 in 10 bytes (its last definition).
    Q4_2,
    /// Removed from ggml (May 2023, before GGUF existed); not supported here.
    /// ggml id 5, blocks of 16 in 12 bytes (its last definition).
    Q4_3,
    /// 5-bit quants (4 low bits plus a high-bit plane) with an f16 scale: `x = d * (q - 16)`.
    /// ggml id 6, blocks of 32 in 22 bytes.
    Q5_0,
    /// 5-bit quants with an f16 scale and minimum: `x = d * q + m`.
    /// ggml id 7, blocks of 32 in 24 bytes.
    Q5_1,
    /// int8 quants with an f16 scale: `x = d * q`. ggml id 8, blocks of 32 in 34 bytes.
    Q8_0,
    /// int8 quants with an f16 scale and an f16 per-block sum (ggml's activation format); not
    /// supported here. ggml id 9, blocks of 32 in 36 bytes.
    Q8_1,
    /// 2-bit K-quant: 16 sub-blocks of 16 with 4-bit scales and minimums, f16 `d` and `dmin`.
    /// ggml id 10, blocks of 256 in 84 bytes.
    Q2_K,
    /// 3-bit K-quant (2 low bits plus a high-bit mask): 16 sub-blocks of 16, 6-bit scales, f16 `d`.
    /// ggml id 11, blocks of 256 in 110 bytes.
    Q3_K,
    /// 4-bit K-quant: 8 sub-blocks of 32 with 6-bit scales and minimums, f16 `d` and `dmin`.
    /// ggml id 12, blocks of 256 in 144 bytes.
    Q4_K,
    /// 5-bit K-quant: Q4_K's layout plus a high-bit plane. ggml id 13, blocks of 256 in 176 bytes.
    Q5_K,
    /// 6-bit K-quant (4 low plus 2 high bits): 16 sub-blocks of 16 with int8 scales, f16 `d`.
    /// ggml id 14, blocks of 256 in 210 bytes.
    Q6_K,
    /// int8 K-quant with an f32 scale and sub-block sums (ggml's dot-product intermediate); not
    /// supported here.
    /// ggml id 15, blocks of 256 in 292 bytes.
    Q8_K,
    /// 2-bit i-quant (lattice codebook); not supported here. ggml id 16, blocks of 256 in 66 bytes.
    IQ2_XXS,
    /// 2-bit i-quant with sub-block scales; not supported here.
    /// ggml id 17, blocks of 256 in 74 bytes.
    IQ2_XS,
    /// 3-bit i-quant; not supported here. ggml id 18, blocks of 256 in 98 bytes.
    IQ3_XXS,
    /// 1-bit i-quant; not supported here. ggml id 19, blocks of 256 in 50 bytes.
    IQ1_S,
    /// 4-bit non-linear i-quant (a fixed 16-value table); not supported here.
    /// ggml id 20, blocks of 32 in 18 bytes.
    IQ4_NL,
    /// 3-bit i-quant with sign bits and scales; not supported here.
    /// ggml id 21, blocks of 256 in 110 bytes.
    IQ3_S,
    /// 2-bit i-quant with sign bits and scales; not supported here.
    /// ggml id 22, blocks of 256 in 82 bytes.
    IQ2_S,
    /// 4-bit non-linear i-quant with super-block scales; not supported here.
    /// ggml id 23, blocks of 256 in 136 bytes.
    IQ4_XS,
    /// Signed 8-bit integer; not supported here. ggml id 24, 1 byte per element.
    I8,
    /// Signed 16-bit integer; not supported here. ggml id 25, 2 bytes per element.
    I16,
    /// Signed 32-bit integer; not supported here. ggml id 26, 4 bytes per element.
    I32,
    /// Signed 64-bit integer; not supported here. ggml id 27, 8 bytes per element.
    I64,
    /// 64-bit IEEE float; not supported here. ggml id 28, 8 bytes per element.
    F64,
    /// 1-bit i-quant with finer scales; not supported here. ggml id 29, blocks of 256 in 56 bytes.
    IQ1_M,
    /// bfloat16 (f32's exponent, 8 mantissa bits). ggml id 30, 2 bytes per element.
    BF16,
    /// Q4_0 interleaved 4 by 4 for ARM; removed from ggml (repacked at load since); not
    /// supported here. ggml id 31, blocks of 32 in 18 bytes.
    Q4_0_4_4,
    /// Q4_0 interleaved 4 by 8; removed from ggml; not supported here.
    /// ggml id 32, blocks of 32 in 18 bytes.
    Q4_0_4_8,
    /// Q4_0 interleaved 8 by 8; removed from ggml; not supported here.
    /// ggml id 33, blocks of 32 in 18 bytes.
    Q4_0_8_8,
    /// Ternary quant (base-3 packed); not supported here. ggml id 34, blocks of 256 in 54 bytes.
    TQ1_0,
    /// Ternary quant (2 bits per weight); not supported here.
    /// ggml id 35, blocks of 256 in 66 bytes.
    TQ2_0,
    /// IQ4_NL interleaved 4 by 4; removed from ggml; not supported here.
    /// ggml id 36, blocks of 32 in 18 bytes.
    IQ4_NL_4_4,
    /// IQ4_NL interleaved 4 by 8; removed from ggml; not supported here.
    /// ggml id 37, blocks of 32 in 18 bytes.
    IQ4_NL_4_8,
    /// IQ4_NL interleaved 8 by 8; removed from ggml; not supported here.
    /// ggml id 38, blocks of 32 in 18 bytes.
    IQ4_NL_8_8,
    /// OCP microscaling FP4 (E2M1) with a shared E8M0 scale; not supported here.
    /// ggml id 39, blocks of 32 in 17 bytes.
    MXFP4,
    /// NVIDIA FP4 (E2M1) with FP8 sub-block scales; not supported here.
    /// ggml id 40, blocks of 64 in 36 bytes.
    NVFP4,
    /// 1-bit quant with an f16 scale per block; not supported here.
    /// ggml id 41, blocks of 128 in 18 bytes.
    Q1_0,
}

/// The removed types, which ggml no longer defines.
const REMOVED: [GgmlType; 8] = {
    use GgmlType::*;
    [Q4_2, Q4_3, Q4_0_4_4, Q4_0_4_8, Q4_0_8_8, IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8]
};

impl GgmlType {
    /// Every type, in id order: `ALL[id]` has that ggml id.
    pub const ALL: [GgmlType; 42] = {
        use GgmlType::*;
        [
            F32, F16, Q4_0, Q4_1, Q4_2, Q4_3, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S,
            IQ2_S, IQ4_XS, I8, I16, I32, I64, F64, IQ1_M, BF16, Q4_0_4_4, Q4_0_4_8, Q4_0_8_8, TQ1_0, TQ2_0, IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8, MXFP4, NVFP4,
            Q1_0,
        ]
    };

    /// The types this crate dequantizes and repacks.
    pub const SUPPORTED: [GgmlType; 13] = {
        use GgmlType::*;
        [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K]
    };

    /// (id, name, elements per block, bytes per block), as ggml defines them.
    const fn entry(self) -> (u32, &'static str, usize, usize) {
        use GgmlType::*;
        match self {
            F32 => (0, "F32", 1, 4),
            F16 => (1, "F16", 1, 2),
            Q4_0 => (2, "Q4_0", QK, 2 + QK / 2),
            Q4_1 => (3, "Q4_1", QK, 2 + 2 + QK / 2),
            Q4_2 => (4, "Q4_2", 16, 2 + 16 / 2),
            Q4_3 => (5, "Q4_3", 16, 2 + 2 + 16 / 2),
            Q5_0 => (6, "Q5_0", QK, 2 + 4 + QK / 2),
            Q5_1 => (7, "Q5_1", QK, 2 + 2 + 4 + QK / 2),
            Q8_0 => (8, "Q8_0", QK, 2 + QK),
            Q8_1 => (9, "Q8_1", QK, 2 + 2 + QK),
            Q2_K => (10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => (11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => (12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
            Q5_K => (13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
            Q6_K => (14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8_K => (15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => (16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
            IQ2_XS => (17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => (18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => (19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => (20, "IQ4_NL", QK, 2 + QK / 2),
            IQ3_S => (21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => (22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => (23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            I8 => (24, "I8", 1, 1),
            I16 => (25, "I16", 1, 2),
            I32 => (26, "I32", 1, 4),
            I64 => (27, "I64", 1, 8),
            F64 => (28, "F64", 1, 8),
            IQ1_M => (29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => (30, "BF16", 1, 2),
            Q4_0_4_4 => (31, "Q4_0_4_4", QK, 2 + QK / 2),
            Q4_0_4_8 => (32, "Q4_0_4_8", QK, 2 + QK / 2),
            Q4_0_8_8 => (33, "Q4_0_8_8", QK, 2 + QK / 2),
            TQ1_0 => (34, "TQ1_0", QK_K, 2 + 4 * 13),
            TQ2_0 => (35, "TQ2_0", QK_K, 2 + 64),
            IQ4_NL_4_4 => (36, "IQ4_NL_4_4", QK, 2 + QK / 2),
            IQ4_NL_4_8 => (37, "IQ4_NL_4_8", QK, 2 + QK / 2),
            IQ4_NL_8_8 => (38, "IQ4_NL_8_8", QK, 2 + QK / 2),
            MXFP4 => (39, "MXFP4", 32, 1 + 16),
            NVFP4 => (40, "NVFP4", 64, 4 + 32),
            Q1_0 => (41, "Q1_0", 128, 2 + 16),
        }
    }

    /// The type for a ggml/GGUF type id.
    ///
    /// Every id ggml has defined maps to a type (supported, unsupported or removed); ids never
    /// defined give [`FormatError::UnknownGgmlType`].
    pub fn from_ggml_id(id: u32) -> Result<GgmlType> {
        usize::try_from(id).ok().and_then(|i| Self::ALL.get(i)).copied().ok_or(FormatError::UnknownGgmlType { id })
    }

    /// The type whose ggml name is `name` (for example `"Q4_K"`), if any.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        Self::ALL.iter().find(|t| t.name() == name).copied()
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        self.entry().0
    }

    /// The name as ggml spells it (`"Q4_K"`, `"BF16"`, ...).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Elements per block (1 for plain element types).
    pub fn block_size(self) -> usize {
        self.entry().2
    }

    /// Bytes per block in the file layout.
    pub fn type_size(self) -> usize {
        self.entry().3
    }

    /// Whether ggml has removed the type (Q4_2, Q4_3, the interleaved Q4_0 and IQ4_NL variants).
    pub fn is_removed(self) -> bool {
        REMOVED.contains(&self)
    }

    /// Whether this crate dequantizes and repacks the type.
    pub fn is_supported(self) -> bool {
        Self::SUPPORTED.contains(&self)
    }

    /// `Ok(self)` for a supported type, [`FormatError::Unsupported`] naming it otherwise.
    pub fn ensure_supported(self) -> Result<GgmlType> {
        if self.is_supported() { Ok(self) } else { Err(FormatError::Unsupported { format: self.name() }) }
    }

    /// Bytes taken by `n_elements` elements; an error unless they form whole blocks, or if the
    /// size overflows `usize`.
    pub fn bytes_for(self, n_elements: usize) -> Result<usize> {
        let bs = self.block_size();
        if !n_elements.is_multiple_of(bs) {
            return Err(FormatError::NotBlockMultiple { format: self.name(), n_elements, block_size: bs });
        }
        (n_elements / bs)
            .checked_mul(self.type_size())
            .ok_or_else(|| FormatError::InvalidShape { format: self.name(), reason: format!("{n_elements} elements overflow the byte count") })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip_and_are_unique() {
        for (i, t) in GgmlType::ALL.iter().enumerate() {
            assert_eq!(t.id() as usize, i, "{t}");
            assert_eq!(GgmlType::from_ggml_id(t.id()), Ok(*t));
            assert_eq!(GgmlType::from_name(t.name()), Some(*t));
            assert_eq!(t.to_string(), t.name());
            assert!(GgmlType::ALL[i + 1..].iter().all(|o| o != t && o.name() != t.name()), "{t}");
        }
        for id in [GgmlType::ALL.len() as u32, 99, u32::MAX] {
            assert_eq!(GgmlType::from_ggml_id(id), Err(FormatError::UnknownGgmlType { id }));
        }
        assert_eq!(GgmlType::from_name("Q4_Z"), None);
    }

    #[test]
    fn removed_and_supported_are_disjoint() {
        assert!(REMOVED.iter().all(|t| !t.is_supported()));
        assert!(GgmlType::SUPPORTED.iter().all(|t| !t.is_removed()));
        assert_eq!(GgmlType::ALL.iter().filter(|t| t.is_removed()).count(), REMOVED.len());
    }

    #[test]
    fn bytes_for_checks_blocks_and_overflow() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Ok(288));
        assert!(matches!(GgmlType::Q4_K.bytes_for(100), Err(FormatError::NotBlockMultiple { .. })));
        assert!(matches!(GgmlType::F64.bytes_for(usize::MAX), Err(FormatError::InvalidShape { .. })));
    }
}

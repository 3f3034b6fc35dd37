//! The ggml tensor types that can appear in a GGUF file.
//!
//! Ids, names, block sizes and bytes per block are those of `enum ggml_type` in ggml.h and
//! `type_traits` in ggml.c. Types whose layouts this crate hands out are marked supported; the
//! rest are recognised (so `cera inspect` can name them) but [`crate::gguf::GgufFile::tensor_data`]
//! answers them with [`crate::gguf::GgufError::UnsupportedType`].

use std::fmt;

/// How elements of a ggml type are packed: `block_size` elements take `type_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    /// Elements per block (1 for plain scalar types).
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
}

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $layout:expr, $supported:literal; )*) => {
        /// A ggml tensor type, by its id in the GGUF file.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)]
        #[non_exhaustive]
        pub enum GgmlType {
            $(
                #[doc = concat!("`", $name, "` (ggml type id ", stringify!($id), ")")]
                $variant,
            )*
        }

        impl GgmlType {
            /// Every type this crate knows, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type for a ggml type id, or `None` for an id ggml never defined.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id {
                    $($id => Some(GgmlType::$variant),)*
                    _ => None,
                }
            }

            /// The ggml type id as stored in the file.
            pub fn id(self) -> u32 {
                match self { $(GgmlType::$variant => $id,)* }
            }

            /// The name ggml gives the type (`"Q4_K"`, `"BF16"`, ...).
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$variant => $name,)* }
            }

            /// Block layout, or `None` for types that were removed from ggml before any
            /// layout could be relied upon.
            pub fn layout(self) -> Option<BlockLayout> {
                match self { $(GgmlType::$variant => $layout,)* }
            }

            /// Whether [`crate::gguf::GgufFile::tensor_data`] hands out this type's bytes.
            pub fn is_supported(self) -> bool {
                match self { $(GgmlType::$variant => $supported,)* }
            }
        }
    };
}

const fn l(block_size: u64, type_size: u64) -> Option<BlockLayout> {
    Some(BlockLayout { block_size, type_size })
}

// Layouts: the K-quants use super-blocks of QK_K = 256 elements.
//   Q2_K:  scales[16] + qs[64] + d, dmin (f16)                = 84
//   Q3_K:  hmask[32] + qs[64] + scales[12] + d (f16)          = 110
//   Q4_K:  d, dmin (f16) + scales[12] + qs[128]               = 144
//   Q5_K:  d, dmin (f16) + scales[12] + qh[32] + qs[128]      = 176
//   Q6_K:  ql[128] + qh[64] + scales[16] + d (f16)            = 210
//   Q8_K:  d (f32) + qs[256] + bsums (i16)[16]                = 292
ggml_types! {
    F32 = 0, "F32", l(1, 4), true;
    F16 = 1, "F16", l(1, 2), true;
    Q4_0 = 2, "Q4_0", l(32, 18), true;
    Q4_1 = 3, "Q4_1", l(32, 20), true;
    Q4_2 = 4, "Q4_2", None, false;
    Q4_3 = 5, "Q4_3", None, false;
    Q5_0 = 6, "Q5_0", l(32, 22), true;
    Q5_1 = 7, "Q5_1", l(32, 24), true;
    Q8_0 = 8, "Q8_0", l(32, 34), true;
    Q8_1 = 9, "Q8_1", l(32, 36), false;
    Q2_K = 10, "Q2_K", l(256, 84), true;
    Q3_K = 11, "Q3_K", l(256, 110), true;
    Q4_K = 12, "Q4_K", l(256, 144), true;
    Q5_K = 13, "Q5_K", l(256, 176), true;
    Q6_K = 14, "Q6_K", l(256, 210), true;
    Q8_K = 15, "Q8_K", l(256, 292), false;
    IQ2_XXS = 16, "IQ2_XXS", l(256, 66), false;
    IQ2_XS = 17, "IQ2_XS", l(256, 74), false;
    IQ3_XXS = 18, "IQ3_XXS", l(256, 98), false;
    IQ1_S = 19, "IQ1_S", l(256, 50), false;
    IQ4_NL = 20, "IQ4_NL", l(32, 18), false;
    IQ3_S = 21, "IQ3_S", l(256, 110), false;
    IQ2_S = 22, "IQ2_S", l(256, 82), false;
    IQ4_XS = 23, "IQ4_XS", l(256, 136), false;
    I8 = 24, "I8", l(1, 1), false;
    I16 = 25, "I16", l(1, 2), false;
    I32 = 26, "I32", l(1, 4), false;
    I64 = 27, "I64", l(1, 8), false;
    F64 = 28, "F64", l(1, 8), false;
    IQ1_M = 29, "IQ1_M", l(256, 56), false;
    BF16 = 30, "BF16", l(1, 2), true;
    Q4_0_4_4 = 31, "Q4_0_4_4", l(32, 18), false;
    Q4_0_4_8 = 32, "Q4_0_4_8", l(32, 18), false;
    Q4_0_8_8 = 33, "Q4_0_8_8", l(32, 18), false;
    TQ1_0 = 34, "TQ1_0", l(256, 54), false;
    TQ2_0 = 35, "TQ2_0", l(256, 66), false;
    IQ4_NL_4_4 = 36, "IQ4_NL_4_4", l(32, 18), false;
    IQ4_NL_4_8 = 37, "IQ4_NL_4_8", l(32, 18), false;
    IQ4_NL_8_8 = 38, "IQ4_NL_8_8", l(32, 18), false;
    MXFP4 = 39, "MXFP4", l(32, 17), false;
}

impl GgmlType {
    /// Bytes taken by `n_elements` elements, or `None` if the count is not a whole number of
    /// blocks, the type has no layout, or the size overflows `u64`.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let layout = self.layout()?;
        if !n_elements.is_multiple_of(layout.block_size) {
            return None;
        }
        (n_elements / layout.block_size).checked_mul(layout.type_size)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for &t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(40), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn supported_layouts_match_ggml() {
        let expect = [
            (GgmlType::F32, 1, 4),
            (GgmlType::F16, 1, 2),
            (GgmlType::BF16, 1, 2),
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
        ];
        for (t, b, s) in expect {
            assert!(t.is_supported(), "{t}");
            assert_eq!(t.layout(), Some(BlockLayout { block_size: b, type_size: s }), "{t}");
        }
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::Q4_2.bytes_for(32), None);
    }
}

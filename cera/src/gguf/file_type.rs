//! `general.file_type`: the quantization mix a file was written as (`Q4_K_M`), the number
//! llama.cpp's `LLAMA_FTYPE_*` values give it. A mix names more than one tensor type (a
//! `Q4_K_M` file holds Q4_K and Q6_K matrices and F32 norms), so it is what a user knows the file
//! by, where the tensor types are not.

use super::GgufFile;

/// The known values, as llama.cpp numbers them (5 and 6, and 33 to 35, are gone from
/// llama.cpp; 4 is an old mix it no longer writes).
const FILE_TYPES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (4, "Q4_1_SOME_F16"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
];

/// The name of a `general.file_type` value (`15` → `Q4_K_M`), or `None` for a value llama.cpp
/// does not define.
pub fn file_type_name(value: u32) -> Option<&'static str> {
    FILE_TYPES.iter().find(|(v, _)| *v == value).map(|(_, n)| *n)
}

impl GgufFile {
    /// The quantization mix the file declares in `general.file_type` (`Q4_K_M`): `None` when
    /// the key is missing, is not an integer, or holds a value llama.cpp does not define.
    pub fn file_type(&self) -> Option<&'static str> {
        let v = self.metadata().get("general.file_type")?.as_i128()?;
        file_type_name(u32::try_from(v).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_known_values() {
        assert_eq!(file_type_name(0), Some("F32"));
        assert_eq!(file_type_name(2), Some("Q4_0"));
        assert_eq!(file_type_name(15), Some("Q4_K_M"));
        assert_eq!(file_type_name(32), Some("BF16"));
        assert_eq!((file_type_name(5), file_type_name(34), file_type_name(1024)), (None, None, None));
        assert!(FILE_TYPES.windows(2).all(|w| w[0].0 < w[1].0), "sorted, each once");
    }
}

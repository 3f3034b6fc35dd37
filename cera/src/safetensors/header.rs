//! One safetensors file: an 8-byte little-endian header length, a JSON header, then the data.
//!
//! The header maps tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets
//! relative to the data section) plus an optional `__metadata__` map of strings. The
//! [`safetensors`] crate (the reference implementation) parses and validates it against the
//! file's real length before any tensor is handed out: the header length, the JSON, each dtype
//! and shape, each range, the shape/dtype/size agreement, and that the tensors tile the data
//! section exactly (no overlaps, no gaps, nothing after the last one). Its errors are turned
//! into [`SafetensorsError`]s naming the tensor at fault by `super::diagnose`.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use safetensors::{Dtype, SafeTensors};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::diagnose;
use super::error::SafetensorsError;
use crate::storage::Storage;

/// Largest header accepted. This is the `safetensors` crate's limit (a private constant there),
/// repeated here for [`SafetensorsError::HeaderTooLarge`]'s message; the crate enforces it.
pub const MAX_HEADER: u64 = 100_000_000;

/// A safetensors element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(non_camel_case_types)]
pub enum SafeDType {
    /// `BOOL`
    BOOL,
    /// `U8`
    U8,
    /// `I8`
    I8,
    /// `F8_E5M2`
    F8_E5M2,
    /// `F8_E4M3`
    F8_E4M3,
    /// `F8_E8M0`
    F8_E8M0,
    /// `I16`
    I16,
    /// `U16`
    U16,
    /// `F16`
    F16,
    /// `BF16`
    BF16,
    /// `I32`
    I32,
    /// `U32`
    U32,
    /// `F32`
    F32,
    /// `F64`
    F64,
    /// `I64`
    I64,
    /// `U64`
    U64,
    /// `C64`
    C64,
}

impl SafeDType {
    /// The dtype for a header string.
    pub fn parse(s: &str) -> Option<SafeDType> {
        use SafeDType::*;
        Some(match s {
            "BOOL" => BOOL,
            "U8" => U8,
            "I8" => I8,
            "F8_E5M2" => F8_E5M2,
            "F8_E4M3" => F8_E4M3,
            "F8_E8M0" => F8_E8M0,
            "I16" => I16,
            "U16" => U16,
            "F16" => F16,
            "BF16" => BF16,
            "I32" => I32,
            "U32" => U32,
            "F32" => F32,
            "F64" => F64,
            "I64" => I64,
            "U64" => U64,
            "C64" => C64,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        use SafeDType::*;
        match self {
            BOOL | U8 | I8 | F8_E5M2 | F8_E4M3 | F8_E8M0 => 1,
            I16 | U16 | F16 | BF16 => 2,
            I32 | U32 | F32 => 4,
            F64 | I64 | U64 | C64 => 8,
        }
    }

    /// The header string.
    pub fn name(self) -> &'static str {
        use SafeDType::*;
        match self {
            BOOL => "BOOL",
            U8 => "U8",
            I8 => "I8",
            F8_E5M2 => "F8_E5M2",
            F8_E4M3 => "F8_E4M3",
            F8_E8M0 => "F8_E8M0",
            I16 => "I16",
            U16 => "U16",
            F16 => "F16",
            BF16 => "BF16",
            I32 => "I32",
            U32 => "U32",
            F32 => "F32",
            F64 => "F64",
            I64 => "I64",
            U64 => "U64",
            C64 => "C64",
        }
    }

    /// The dtype for one of the `safetensors` crate's. `None` for the sub-byte types (`F4`,
    /// `F6_E2M3`, `F6_E3M2`) and any the crate adds later: the engine has no use for them, and
    /// [`SafeDType::size`] counts whole bytes.
    pub(super) fn from_crate(d: Dtype) -> Option<SafeDType> {
        use SafeDType::*;
        Some(match d {
            Dtype::BOOL => BOOL,
            Dtype::U8 => U8,
            Dtype::I8 => I8,
            Dtype::F8_E5M2 => F8_E5M2,
            Dtype::F8_E4M3 => F8_E4M3,
            Dtype::F8_E8M0 => F8_E8M0,
            Dtype::I16 => I16,
            Dtype::U16 => U16,
            Dtype::F16 => F16,
            Dtype::BF16 => BF16,
            Dtype::I32 => I32,
            Dtype::U32 => U32,
            Dtype::F32 => F32,
            Dtype::F64 => F64,
            Dtype::I64 => I64,
            Dtype::U64 => U64,
            Dtype::C64 => C64,
            _ => return None,
        })
    }

    /// Whether tensor data of this type is handed out: floats F32/F16/BF16, and I32 for the
    /// packed AWQ/GPTQ tensors (`qweight`, `qzeros`, `g_idx`).
    pub fn is_supported(self) -> bool {
        matches!(self, SafeDType::F32 | SafeDType::F16 | SafeDType::BF16 | SafeDType::I32)
    }
}

impl std::fmt::Display for SafeDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeTensorInfo {
    /// Name as stored in the file.
    pub name: String,
    /// Element type.
    pub dtype: SafeDType,
    /// Shape, row-major (outermost first), as stored.
    pub shape: Vec<u64>,
    /// Byte range relative to the data section.
    pub start: u64,
    /// End of the byte range.
    pub end: u64,
}

/// An open safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    storage: Storage,
    data_offset: u64,
    tensors: Vec<SafeTensorInfo>,
    by_name: HashMap<String, usize>,
    metadata: HashMap<String, String>,
}

fn bad(msg: impl Into<String>) -> SafetensorsError {
    SafetensorsError::InvalidHeader(msg.into())
}

/// The header's keys in the order they are written. The crate keeps tensors in offset order
/// only; [`SafetensorsFile::tensors`] has always been in header order.
struct HeaderKeys(Vec<String>);

impl<'de> Deserialize<'de> for HeaderKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HeaderKeys, D::Error> {
        struct Keys;
        impl<'de> Visitor<'de> for Keys {
            type Value = HeaderKeys;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HeaderKeys, A::Error> {
                let mut keys = Vec::new();
                while let Some((k, IgnoredAny)) = map.next_entry::<String, IgnoredAny>()? {
                    keys.push(k);
                }
                Ok(HeaderKeys(keys))
            }
        }
        d.deserialize_map(Keys)
    }
}

impl SafetensorsFile {
    /// Memory-maps and validates a `.safetensors` file.
    pub fn open(path: &Path) -> Result<SafetensorsFile, SafetensorsError> {
        let storage = Storage::map(path).map_err(|source| SafetensorsError::Io { path: path.to_path_buf(), source })?;
        Self::from_storage(storage)
    }

    /// Parses a safetensors file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<SafetensorsFile, SafetensorsError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    /// Parses and validates the header of mapped or loaded bytes.
    pub fn from_storage(storage: Storage) -> Result<SafetensorsFile, SafetensorsError> {
        let (header_len, meta) = SafeTensors::read_metadata(&storage).map_err(|e| diagnose::explain(&storage, e))?;
        let header = &storage[8..8 + header_len];
        // Hand-written check: the format requires the header to start with `{`, but the crate
        // has that check commented out ("add when we move to 0.4.0") and lets JSON with leading
        // whitespace through.
        if header.first() != Some(&b'{') {
            return Err(bad("header does not start with '{'"));
        }
        let keys = serde_json::from_slice::<HeaderKeys>(header).map_err(|e| bad(e.to_string()))?.0;
        let mut tensors = Vec::with_capacity(keys.len());
        let mut by_name = HashMap::with_capacity(keys.len());
        for name in keys {
            // `__metadata__` is not a tensor; a repeated key is one tensor (the last value wins).
            let Some(info) = meta.info(&name) else { continue };
            if by_name.contains_key(&name) {
                continue;
            }
            // Hand-written check: the crate accepts the sub-byte dtypes, which the engine does
            // not know (see `SafeDType::from_crate`).
            let dtype =
                SafeDType::from_crate(info.dtype).ok_or_else(|| SafetensorsError::UnknownDType { name: name.clone(), dtype: info.dtype.to_string() })?;
            let shape = info.shape.iter().map(|&d| d as u64).collect();
            let (start, end) = (info.data_offsets.0 as u64, info.data_offsets.1 as u64);
            by_name.insert(name.clone(), tensors.len());
            tensors.push(SafeTensorInfo { name, dtype, shape, start, end });
        }
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(SafetensorsFile { storage, data_offset: 8 + header_len as u64, tensors, by_name, metadata })
    }

    /// Tensor entries, in header order.
    pub fn tensors(&self) -> &[SafeTensorInfo] {
        &self.tensors
    }

    /// One tensor's entry.
    pub fn tensor(&self, name: &str) -> Option<&SafeTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The `__metadata__` map.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// A tensor's bytes, for supported dtypes.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], SafetensorsError> {
        let t = self.tensor(name).ok_or_else(|| SafetensorsError::TensorNotFound { name: name.to_string() })?;
        if !t.dtype.is_supported() {
            return Err(SafetensorsError::UnsupportedDType { name: t.name.clone(), dtype: t.dtype.name().to_string() });
        }
        Ok(self.bytes_of(t))
    }

    /// A tensor's bytes, whatever its dtype.
    pub fn tensor_data_raw(&self, name: &str) -> Result<&[u8], SafetensorsError> {
        let t = self.tensor(name).ok_or_else(|| SafetensorsError::TensorNotFound { name: name.to_string() })?;
        Ok(self.bytes_of(t))
    }

    fn bytes_of(&self, t: &SafeTensorInfo) -> &[u8] {
        // The crate checked every range against the file length when the header was read.
        let s = (self.data_offset + t.start) as usize;
        &self.storage[s..(self.data_offset + t.end) as usize]
    }
}

/// Writes a safetensors file (for tests and synthetic models): `(name, dtype, shape, bytes)`.
pub fn write_safetensors(tensors: &[(&str, SafeDType, &[u64], &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape, data) in tensors {
        let end = offset + data.len() as u64;
        header.insert(name.to_string(), serde_json::json!({"dtype": dtype.name(), "shape": shape, "data_offsets": [offset, end]}));
        offset = end;
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap_or_default();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_match_the_crate() {
        use SafeDType::*;
        for d in [BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, C64] {
            let theirs: Dtype = serde_json::from_value(Value::String(d.name().into())).unwrap();
            assert_eq!(SafeDType::from_crate(theirs), Some(d));
            assert_eq!(theirs.bitsize() as u64, 8 * d.size(), "{d}");
            assert_eq!(SafeDType::parse(d.name()), Some(d));
        }
        assert_eq!(SafeDType::from_crate(Dtype::F4), None);
    }

    #[test]
    fn written_files_are_valid_for_the_crate() {
        let bytes = write_safetensors(&[("b", SafeDType::F16, &[2, 2], &[1; 8]), ("a", SafeDType::I32, &[1], &[2; 4]), ("e", SafeDType::F32, &[0], &[])]);
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("a").unwrap().data(), &[2; 4]);
        assert_eq!(st.tensor("b").unwrap().shape(), &[2, 2]);
        let f = SafetensorsFile::from_bytes(bytes).unwrap();
        assert_eq!(f.tensor_data("b").unwrap(), &[1; 8]);
        assert!(f.tensor_data("e").unwrap().is_empty());
    }

    #[test]
    fn header_order_and_metadata() {
        // The header lists `z` first although its bytes come second.
        let json =
            r#"{"z":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}"#;
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let f = SafetensorsFile::from_bytes(bytes).unwrap();
        let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["z", "a"]);
        assert_eq!(f.tensor("z").unwrap(), &SafeTensorInfo { name: "z".into(), dtype: SafeDType::F32, shape: vec![1], start: 4, end: 8 });
        assert_eq!(f.tensor_data("a").unwrap(), &[1, 2, 3, 4]);
        assert_eq!(f.tensor_data_raw("z").unwrap(), &[5, 6, 7, 8]);
        assert_eq!(f.metadata().get("format").map(String::as_str), Some("pt"));
        assert!(matches!(f.tensor_data("nope"), Err(SafetensorsError::TensorNotFound { .. })));
    }
}

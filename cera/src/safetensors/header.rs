//! One safetensors file: an 8-byte little-endian header length, a JSON header, then the data.
//!
//! The header maps tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets
//! relative to the data section) plus an optional `__metadata__` map of strings. Everything is
//! validated against the file's real length before any tensor is handed out: the header length,
//! each range, the shape/dtype/size agreement, and that no two tensors overlap.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::error::SafetensorsError;
use crate::storage::Storage;

/// Largest header accepted (the reference implementation's limit).
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

fn parse_entry(name: &str, v: &Value) -> Result<SafeTensorInfo, SafetensorsError> {
    let obj = v.as_object().ok_or_else(|| bad(format!("entry `{name}` is not an object")))?;
    let dtype_s = obj.get("dtype").and_then(Value::as_str).ok_or_else(|| bad(format!("`{name}` has no dtype")))?;
    let dtype = SafeDType::parse(dtype_s).ok_or_else(|| SafetensorsError::UnknownDType { name: name.to_string(), dtype: dtype_s.to_string() })?;
    let shape = obj
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(format!("`{name}` has no shape")))?
        .iter()
        .map(|d| d.as_u64().ok_or_else(|| bad(format!("`{name}` has a non-integer dimension"))))
        .collect::<Result<Vec<u64>, _>>()?;
    let offs =
        obj.get("data_offsets").and_then(Value::as_array).filter(|a| a.len() == 2).ok_or_else(|| bad(format!("`{name}` has no [begin, end] data_offsets")))?;
    let (Some(start), Some(end)) = (offs[0].as_u64(), offs[1].as_u64()) else {
        return Err(bad(format!("`{name}` has non-integer data_offsets")));
    };
    Ok(SafeTensorInfo { name: name.to_string(), dtype, shape, start, end })
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
        let file_len = storage.len() as u64;
        if file_len < 8 {
            return Err(SafetensorsError::TooShort { file_len });
        }
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&storage[..8]);
        let header_len = u64::from_le_bytes(len_bytes);
        if header_len > MAX_HEADER || header_len > file_len - 8 {
            return Err(SafetensorsError::HeaderTooLarge { header_len, file_len, limit: MAX_HEADER });
        }
        let header = &storage[8..8 + header_len as usize];
        if header.first() != Some(&b'{') {
            return Err(bad("header does not start with '{'"));
        }
        let json: Value = serde_json::from_slice(header).map_err(|e| bad(e.to_string()))?;
        let obj = json.as_object().ok_or_else(|| bad("header is not a JSON object"))?;
        let data_offset = 8 + header_len;
        let data_len = file_len - data_offset;
        let mut metadata = HashMap::new();
        let mut tensors = Vec::with_capacity(obj.len());
        for (name, v) in obj {
            if name == "__metadata__" {
                let m = v.as_object().ok_or_else(|| bad("__metadata__ is not an object"))?;
                for (k, v) in m {
                    let s = v.as_str().ok_or_else(|| bad(format!("__metadata__.{k} is not a string")))?;
                    metadata.insert(k.clone(), s.to_string());
                }
                continue;
            }
            let t = parse_entry(name, v)?;
            if t.start > t.end || t.end > data_len {
                return Err(SafetensorsError::OutOfBounds { name: t.name, start: t.start, end: t.end, data_len });
            }
            let expected = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(t.dtype.size()));
            if expected != Some(t.end - t.start) {
                return Err(SafetensorsError::ShapeMismatch {
                    dtype: t.dtype.name().to_string(),
                    expected: expected.unwrap_or(u64::MAX),
                    actual: t.end - t.start,
                    shape: t.shape,
                    name: t.name,
                });
            }
            tensors.push(t);
        }
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| (tensors[i].start, tensors[i].end));
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            // Empty tensors take no bytes and may share an offset.
            if a.end > b.start && a.start != a.end && b.start != b.end {
                return Err(SafetensorsError::Overlap { first: a.name.clone(), second: b.name.clone() });
            }
        }
        let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(SafetensorsFile { storage, data_offset, tensors, by_name, metadata })
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
        // Validated against the file length when the header was parsed.
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

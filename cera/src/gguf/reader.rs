//! The GGUF header parser: magic, version, metadata and tensor infos.
//!
//! Layout (all little-endian): `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata count,
//! the metadata key/value pairs, the tensor infos, padding up to `general.alignment` (default 32),
//! then the data section. Every count is checked against the bytes left before anything is
//! allocated, so a hostile header cannot make the reader allocate more than a small multiple of
//! the file's own size, and nesting is bounded so it cannot exhaust the stack.

use super::error::GgufError;
use super::metadata::{Metadata, MetadataArray, MetadataValue, ValueType};
use boostr::formats::GgmlType;

/// The default `general.alignment`.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most array nesting levels accepted in metadata.
pub const MAX_NESTING: usize = 16;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Most elements reserved ahead of reading them.
const PREALLOC_LIMIT: usize = 1 << 16;

/// One tensor's entry in the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (contiguous) one.
    pub dims: Vec<u64>,
    /// The element type.
    pub ty: GgmlType,
    /// Offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Number of elements (product of `dims`).
    pub n_elements: u64,
    /// Number of bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Dimensions in row-major order (outermost first), as PyTorch and safetensors write them.
    pub fn shape_row_major(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed header.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section in the file.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn file_len(&self) -> u64 {
        self.buf.len() as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated { what, offset: self.pos as u64, file_len: self.file_len() }),
        }
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `count` items of at least `min_size` bytes each can still fit in the file.
    fn check_count(&self, count: u64, min_size: u64, what: &'static str) -> Result<usize, GgufError> {
        let fits = count.checked_mul(min_size).is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(GgufError::ImpossibleCount { what, count, file_len: self.file_len() });
        }
        usize::try_from(count).map_err(|_| GgufError::ImpossibleCount { what, count, file_len: self.file_len() })
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, "string byte")?;
        let bytes = self.take(len, what)?;
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        })
    }
}

fn value_type(c: &mut Cursor<'_>, key: &str) -> Result<ValueType, GgufError> {
    let id = c.u32("metadata value type")?;
    ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType { key: key.to_string(), type_id: id })
}

fn bool_byte(c: &mut Cursor<'_>, key: &str) -> Result<bool, GgufError> {
    match c.u8("bool")? {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(GgufError::InvalidBool { key: key.to_string(), value }),
    }
}

fn read_value(c: &mut Cursor<'_>, ty: ValueType, key: &str) -> Result<MetadataValue, GgufError> {
    Ok(match ty {
        ValueType::U8 => MetadataValue::U8(c.u8("u8")?),
        ValueType::I8 => MetadataValue::I8(c.u8("i8")? as i8),
        ValueType::U16 => MetadataValue::U16(c.u16("u16")?),
        ValueType::I16 => MetadataValue::I16(c.u16("i16")? as i16),
        ValueType::U32 => MetadataValue::U32(c.u32("u32")?),
        ValueType::I32 => MetadataValue::I32(c.u32("i32")? as i32),
        ValueType::F32 => MetadataValue::F32(f32::from_bits(c.u32("f32")?)),
        ValueType::Bool => MetadataValue::Bool(bool_byte(c, key)?),
        ValueType::String => MetadataValue::String(c.string("string value")?),
        ValueType::U64 => MetadataValue::U64(c.u64("u64")?),
        ValueType::I64 => MetadataValue::I64(c.u64("i64")? as i64),
        ValueType::F64 => MetadataValue::F64(f64::from_bits(c.u64("f64")?)),
        ValueType::Array => MetadataValue::Array(read_array(c, key, 1)?),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetadataArray, GgufError> {
    if depth > MAX_NESTING {
        return Err(GgufError::NestingTooDeep { key: key.to_string(), max: MAX_NESTING });
    }
    let elem = value_type(c, key)?;
    let count = c.u64("array length")?;
    let n = c.check_count(count, elem.min_size(), "array element")?;
    macro_rules! collect {
        ($variant:ident, $read:expr) => {{
            // Grow with what is actually read, so a lying count cannot reserve memory up front.
            let mut v = Vec::with_capacity(n.min(PREALLOC_LIMIT));
            for _ in 0..n {
                v.push($read);
            }
            MetadataArray::$variant(v)
        }};
    }
    Ok(match elem {
        ValueType::U8 => MetadataArray::U8(c.take(n, "u8 array")?.to_vec()),
        ValueType::I8 => MetadataArray::I8(c.take(n, "i8 array")?.iter().map(|&b| b as i8).collect()),
        ValueType::U16 => collect!(U16, c.u16("u16")?),
        ValueType::I16 => collect!(I16, c.u16("i16")? as i16),
        ValueType::U32 => collect!(U32, c.u32("u32")?),
        ValueType::I32 => collect!(I32, c.u32("i32")? as i32),
        ValueType::F32 => collect!(F32, f32::from_bits(c.u32("f32")?)),
        ValueType::Bool => collect!(Bool, bool_byte(c, key)?),
        ValueType::String => collect!(String, c.string("string element")?),
        ValueType::U64 => collect!(U64, c.u64("u64")?),
        ValueType::I64 => collect!(I64, c.u64("i64")? as i64),
        ValueType::F64 => collect!(F64, f64::from_bits(c.u64("f64")?)),
        ValueType::Array => collect!(Array, read_array(c, key, depth + 1)?),
    })
}

fn read_tensor_info(c: &mut Cursor<'_>) -> Result<(TensorInfo, u32), GgufError> {
    let name = c.string("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    let Ok(ty) = GgmlType::from_ggml_id(type_id) else {
        return Err(GgufError::UnknownType { name, type_id });
    };
    let shape_err = |name: String, dims: Vec<u64>, reason| GgufError::InvalidShape { name, dims, reason };
    if dims.is_empty() {
        return Err(shape_err(name, dims, "no dimensions"));
    }
    if dims.contains(&0) {
        return Err(shape_err(name, dims, "zero-length dimension"));
    }
    if dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err(shape_err(name, dims, "dimension is negative as int64"));
    }
    let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d).filter(|&p| p <= i64::MAX as u64));
    let Some(n_elements) = n_elements else {
        return Err(shape_err(name, dims, "element count overflows int64"));
    };
    // Q4_2 and Q4_3 left ggml before GGUF existed: no GGUF file can hold them.
    if matches!(ty, GgmlType::Q4_2 | GgmlType::Q4_3) {
        return Err(GgufError::UnsupportedType { name, ty });
    }
    if dims[0] % ty.block_size() as u64 != 0 {
        return Err(shape_err(name, dims, "first dimension is not a multiple of the type's block size"));
    }
    let Some(n_bytes) = bytes_for(ty, n_elements) else {
        return Err(shape_err(name, dims, "byte size overflows"));
    };
    Ok((TensorInfo { name, dims, ty, offset, n_elements, n_bytes }, type_id))
}

/// Bytes taken by `n_elements` elements of `ty`, or `None` if they are not whole blocks or the
/// size overflows `u64`.
pub(crate) fn bytes_for(ty: GgmlType, n_elements: u64) -> Option<u64> {
    let (block, size) = (ty.block_size() as u64, ty.type_size() as u64);
    if !n_elements.is_multiple_of(block) {
        return None;
    }
    (n_elements / block).checked_mul(size)
}

fn alignment_of(md: &Metadata) -> Result<u64, GgufError> {
    let Some(v) = md.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let a = match v.as_i128() {
        Some(a) if (1..=u32::MAX as i128).contains(&a) => a as u64,
        Some(a) => {
            return Err(GgufError::InvalidAlignment { reason: format!("{a} is out of range") });
        }
        None => {
            return Err(GgufError::InvalidAlignment { reason: format!("has type {}, expected u32", v.type_description()) });
        }
    };
    if !a.is_power_of_two() {
        return Err(GgufError::InvalidAlignment { reason: format!("{a} is not a power of two") });
    }
    Ok(a)
}

/// Parses and validates the whole header of a GGUF file held in `buf`.
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(GgufError::UnsupportedVersion { version, hint: " (GGUF v1 is obsolete; re-convert the model)" });
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(GgufError::UnsupportedVersion { version, hint: " (the file looks big-endian)" });
        }
        _ => return Err(GgufError::UnsupportedVersion { version, hint: "" }),
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Each key/value takes at least 8 (key length) + 4 (type) + 1 byte; each tensor info at
    // least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    let n_kv = c.check_count(n_kv, 13, "metadata key")?;
    let n_tensors = c.check_count(n_tensors, 24, "tensor")?;

    let mut metadata = Metadata::default();
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = value_type(&mut c, &key)?;
        let value = read_value(&mut c, ty, &key)?;
        if !metadata.insert(key.clone(), value) {
            return Err(GgufError::DuplicateKey { key });
        }
    }
    let alignment = alignment_of(&metadata)?;

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors.min(PREALLOC_LIMIT));
    let mut seen = std::collections::HashSet::with_capacity(n_tensors.min(PREALLOC_LIMIT));
    for _ in 0..n_tensors {
        let (info, _) = read_tensor_info(&mut c)?;
        if !seen.insert(info.name.clone()) {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensors.push(info);
    }

    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    let data_len = c.file_len().saturating_sub(data_offset);
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::Misaligned { name: t.name.clone(), offset: t.offset, alignment });
        }
        let end = t.offset.checked_add(t.n_bytes);
        if end.is_none_or(|e| e > data_len) {
            // The size the whole header implies, for the message: a truncated file says how
            // much is missing.
            let last_end = tensors.iter().map(|t| t.offset.saturating_add(t.n_bytes)).max().unwrap_or(0);
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                start: t.offset,
                end: end.unwrap_or(u64::MAX),
                data_len,
                expected_len: data_offset.saturating_add(last_end),
                file_len: c.file_len(),
            });
        }
    }
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::OverlappingTensors { first: a.name.clone(), second: b.name.clone() });
        }
    }
    Ok(Header { version, metadata, tensors, alignment, data_offset })
}

//! GGUF metadata values and typed accessors.
//!
//! Values are copied out of the file when the header is parsed (they are small next to the
//! tensors, and the tokenizer needs owned strings anyway). Accessors are typed and their errors
//! name the key: `md.get_u32("llama.block_count")?`.

use std::collections::HashMap;
use std::fmt;

use super::error::MetadataError;

/// The value type ids of GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueType {
    /// `u8` (id 0)
    U8,
    /// `i8` (id 1)
    I8,
    /// `u16` (id 2)
    U16,
    /// `i16` (id 3)
    I16,
    /// `u32` (id 4)
    U32,
    /// `i32` (id 5)
    I32,
    /// `f32` (id 6)
    F32,
    /// `bool`, one byte (id 7)
    Bool,
    /// UTF-8 string with a u64 length (id 8)
    String,
    /// Typed array with a u64 length (id 9)
    Array,
    /// `u64` (id 10)
    U64,
    /// `i64` (id 11)
    I64,
    /// `f64` (id 12)
    F64,
}

impl ValueType {
    /// The type for an id, or `None` if GGUF does not define it.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The smallest number of bytes one value of this type takes in the file.
    pub(crate) fn min_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }

    /// Lower-case name, as used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetadataValue {
    /// `u8`
    U8(u8),
    /// `i8`
    I8(i8),
    /// `u16`
    U16(u16),
    /// `i16`
    I16(i16),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `f32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// A string. Invalid UTF-8 is replaced with U+FFFD.
    String(String),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f64`
    F64(f64),
    /// A typed array.
    Array(MetadataArray),
}

/// A typed GGUF array: all elements share one type. Arrays may nest.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetadataArray {
    /// `u8` elements
    U8(Vec<u8>),
    /// `i8` elements
    I8(Vec<i8>),
    /// `u16` elements
    U16(Vec<u16>),
    /// `i16` elements
    I16(Vec<i16>),
    /// `u32` elements
    U32(Vec<u32>),
    /// `i32` elements
    I32(Vec<i32>),
    /// `f32` elements
    F32(Vec<f32>),
    /// `bool` elements
    Bool(Vec<bool>),
    /// string elements
    String(Vec<String>),
    /// `u64` elements
    U64(Vec<u64>),
    /// `i64` elements
    I64(Vec<i64>),
    /// `f64` elements
    F64(Vec<f64>),
    /// nested arrays
    Array(Vec<MetadataArray>),
}

impl MetadataArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            MetadataArray::U8(_) => ValueType::U8,
            MetadataArray::I8(_) => ValueType::I8,
            MetadataArray::U16(_) => ValueType::U16,
            MetadataArray::I16(_) => ValueType::I16,
            MetadataArray::U32(_) => ValueType::U32,
            MetadataArray::I32(_) => ValueType::I32,
            MetadataArray::F32(_) => ValueType::F32,
            MetadataArray::Bool(_) => ValueType::Bool,
            MetadataArray::String(_) => ValueType::String,
            MetadataArray::U64(_) => ValueType::U64,
            MetadataArray::I64(_) => ValueType::I64,
            MetadataArray::F64(_) => ValueType::F64,
            MetadataArray::Array(_) => ValueType::Array,
        }
    }

    /// The elements as `i64` if they are all integers that fit (for integer arrays of any width).
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        Some(match self {
            MetadataArray::U8(v) => v.iter().map(|&x| x as i64).collect(),
            MetadataArray::I8(v) => v.iter().map(|&x| x as i64).collect(),
            MetadataArray::U16(v) => v.iter().map(|&x| x as i64).collect(),
            MetadataArray::I16(v) => v.iter().map(|&x| x as i64).collect(),
            MetadataArray::U32(v) => v.iter().map(|&x| x as i64).collect(),
            MetadataArray::I32(v) => v.iter().map(|&x| x as i64).collect(),
            MetadataArray::U64(v) => v.iter().map(|&x| i64::try_from(x).ok()).collect::<Option<_>>()?,
            MetadataArray::I64(v) => v.clone(),
            MetadataArray::Bool(v) => v.iter().map(|&x| x as i64).collect(),
            _ => return None,
        })
    }
}

impl MetadataValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
            MetadataValue::Array(_) => ValueType::Array,
        }
    }

    /// The value as an integer, for any integer type (bools excluded).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as a float, for `f32`/`f64` (and integers, which convert exactly enough for
    /// hyperparameters).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// A short description for messages: `u32`, `array of string`, ...
    pub fn type_description(&self) -> String {
        match self {
            MetadataValue::Array(a) => format!("array of {}", a.element_type().name()),
            other => other.value_type().name().to_string(),
        }
    }
}

impl fmt::Display for MetadataValue {
    /// Short human-readable rendering; long arrays are elided.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataValue::U8(v) => write!(f, "{v}"),
            MetadataValue::I8(v) => write!(f, "{v}"),
            MetadataValue::U16(v) => write!(f, "{v}"),
            MetadataValue::I16(v) => write!(f, "{v}"),
            MetadataValue::U32(v) => write!(f, "{v}"),
            MetadataValue::I32(v) => write!(f, "{v}"),
            MetadataValue::F32(v) => write!(f, "{v}"),
            MetadataValue::Bool(v) => write!(f, "{v}"),
            MetadataValue::String(s) => {
                let short: String = s.chars().take(60).collect();
                if short.len() < s.len() { write!(f, "{:?}... ({} bytes)", short, s.len()) } else { write!(f, "{s:?}") }
            }
            MetadataValue::U64(v) => write!(f, "{v}"),
            MetadataValue::I64(v) => write!(f, "{v}"),
            MetadataValue::F64(v) => write!(f, "{v}"),
            MetadataValue::Array(a) => write!(f, "[{} x {}]", a.len(), a.element_type().name()),
        }
    }
}

/// All metadata of a file, in file order, with look-up by key.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, MetadataValue)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds an entry; returns `false` (and keeps the first) if the key already exists.
    pub(crate) fn insert(&mut self, key: String, value: MetadataValue) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Sets a key, replacing its value if it exists (to adjust a file's metadata before building
    /// a tokenizer or template from it).
    pub fn set(&mut self, key: &str, value: MetadataValue) {
        match self.index.get(key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.insert(key.to_string(), value);
            }
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The raw value of a key.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether the key exists.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn require(&self, key: &str) -> Result<&MetadataValue, MetadataError> {
        self.get(key).ok_or_else(|| MetadataError::Missing { key: key.to_string() })
    }

    fn wrong(key: &str, expected: &'static str, found: &MetadataValue) -> MetadataError {
        MetadataError::WrongType { key: key.to_string(), expected, found: found.type_description() }
    }

    /// An integer value that fits in `u32` (any integer type is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32, MetadataError> {
        let v = self.require(key)?;
        v.as_i128().and_then(|i| u32::try_from(i).ok()).ok_or_else(|| Self::wrong(key, "u32", v))
    }

    /// An integer value that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, MetadataError> {
        let v = self.require(key)?;
        v.as_i128().and_then(|i| u64::try_from(i).ok()).ok_or_else(|| Self::wrong(key, "u64", v))
    }

    /// An integer value that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, MetadataError> {
        let v = self.require(key)?;
        v.as_i128().and_then(|i| i64::try_from(i).ok()).ok_or_else(|| Self::wrong(key, "i64", v))
    }

    /// A float value (`f32` or `f64`; `f64` is narrowed).
    pub fn get_f32(&self, key: &str) -> Result<f32, MetadataError> {
        let v = self.require(key)?;
        match *v {
            MetadataValue::F32(x) => Ok(x),
            MetadataValue::F64(x) => Ok(x as f32),
            _ => Err(Self::wrong(key, "f32", v)),
        }
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool, MetadataError> {
        let v = self.require(key)?;
        match *v {
            MetadataValue::Bool(b) => Ok(b),
            _ => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, MetadataError> {
        let v = self.require(key)?;
        match v {
            MetadataValue::String(s) => Ok(s),
            _ => Err(Self::wrong(key, "string", v)),
        }
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&MetadataArray, MetadataError> {
        let v = self.require(key)?;
        match v {
            MetadataValue::Array(a) => Ok(a),
            _ => Err(Self::wrong(key, "array", v)),
        }
    }

    /// An array of strings.
    pub fn get_string_array(&self, key: &str) -> Result<&[String], MetadataError> {
        let v = self.require(key)?;
        match v {
            MetadataValue::Array(MetadataArray::String(s)) => Ok(s),
            _ => Err(Self::wrong(key, "array of string", v)),
        }
    }

    /// An array of `f32`.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], MetadataError> {
        let v = self.require(key)?;
        match v {
            MetadataValue::Array(MetadataArray::F32(s)) => Ok(s),
            _ => Err(Self::wrong(key, "array of f32", v)),
        }
    }

    /// An array of integers of any width, converted to `i64`.
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>, MetadataError> {
        let v = self.require(key)?;
        match v {
            MetadataValue::Array(a) => a.to_i64_vec().ok_or_else(|| Self::wrong(key, "array of integers", v)),
            _ => Err(Self::wrong(key, "array of integers", v)),
        }
    }

    /// `Ok(None)` when the key is missing, otherwise like the accessor `f`.
    pub fn optional<'a, T>(&'a self, key: &str, f: impl FnOnce(&'a Self, &str) -> Result<T, MetadataError>) -> Result<Option<T>, MetadataError> {
        if self.contains(key) { f(self, key).map(Some) } else { Ok(None) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_access_and_errors_name_the_key() {
        let mut md = Metadata::default();
        md.insert("a.n".into(), MetadataValue::U64(7));
        md.insert("a.f".into(), MetadataValue::F64(0.5));
        md.insert("a.s".into(), MetadataValue::String("x".into()));
        md.insert("a.neg".into(), MetadataValue::I32(-1));
        assert!(!md.insert("a.n".into(), MetadataValue::U8(1)));
        assert_eq!(md.get_u32("a.n").unwrap(), 7);
        assert_eq!(md.get_f32("a.f").unwrap(), 0.5);
        assert_eq!(md.get_str("a.s").unwrap(), "x");
        let e = md.get_u32("a.missing").unwrap_err();
        assert!(e.to_string().contains("a.missing"));
        let e = md.get_u32("a.neg").unwrap_err();
        assert!(matches!(e, MetadataError::WrongType { .. }));
        assert!(e.to_string().contains("a.neg"));
        assert_eq!(md.optional("nope", Metadata::get_u32).unwrap(), None);
        assert_eq!(md.optional("a.n", Metadata::get_u32).unwrap(), Some(7));
    }
}

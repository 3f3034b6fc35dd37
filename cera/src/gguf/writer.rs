//! A small GGUF writer, for tests, fuzzing seeds and synthetic models.

use super::metadata::{MetadataArray, MetadataValue};
use super::reader::DEFAULT_ALIGNMENT;
use super::types::GgmlType;

/// Builds a valid GGUF file in memory.
///
/// Tensor data is laid out in insertion order, each tensor padded to the alignment
/// (`general.alignment` if set as a `u32` key, else 32).
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    version: u32,
    kvs: Vec<(String, MetadataValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufBuilder {
    /// A new, empty file of the given version (2 or 3).
    pub fn new(version: u32) -> GgufBuilder {
        GgufBuilder { version, kvs: Vec::new(), tensors: Vec::new() }
    }

    /// Adds a metadata key.
    pub fn kv(&mut self, key: &str, value: MetadataValue) -> &mut Self {
        self.kvs.push((key.to_string(), value));
        self
    }

    /// Adds a tensor; `dims` are in ggml order (innermost first) and `data` must have the size
    /// the type and shape imply.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    fn alignment(&self) -> u64 {
        self.kvs
            .iter()
            .find_map(|(k, v)| match (k.as_str(), v) {
                ("general.alignment", MetadataValue::U32(a)) if a.is_power_of_two() => Some(*a as u64),
                _ => None,
            })
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Serialises the file.
    pub fn build(&self) -> Vec<u8> {
        let align = self.alignment() as usize;
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            write_str(&mut out, k);
            out.extend_from_slice(&type_id(v).to_le_bytes());
            write_value(&mut out, v);
        }
        let mut offset = 0usize;
        for (name, dims, ty, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += data.len().div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(v: &MetadataValue) -> u32 {
    match v {
        MetadataValue::U8(_) => 0,
        MetadataValue::I8(_) => 1,
        MetadataValue::U16(_) => 2,
        MetadataValue::I16(_) => 3,
        MetadataValue::U32(_) => 4,
        MetadataValue::I32(_) => 5,
        MetadataValue::F32(_) => 6,
        MetadataValue::Bool(_) => 7,
        MetadataValue::String(_) => 8,
        MetadataValue::Array(_) => 9,
        MetadataValue::U64(_) => 10,
        MetadataValue::I64(_) => 11,
        MetadataValue::F64(_) => 12,
    }
}

fn array_type_id(a: &MetadataArray) -> u32 {
    match a {
        MetadataArray::U8(_) => 0,
        MetadataArray::I8(_) => 1,
        MetadataArray::U16(_) => 2,
        MetadataArray::I16(_) => 3,
        MetadataArray::U32(_) => 4,
        MetadataArray::I32(_) => 5,
        MetadataArray::F32(_) => 6,
        MetadataArray::Bool(_) => 7,
        MetadataArray::String(_) => 8,
        MetadataArray::Array(_) => 9,
        MetadataArray::U64(_) => 10,
        MetadataArray::I64(_) => 11,
        MetadataArray::F64(_) => 12,
    }
}

fn write_value(out: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        MetadataValue::U8(x) => out.push(*x),
        MetadataValue::I8(x) => out.push(*x as u8),
        MetadataValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => out.push(*x as u8),
        MetadataValue::String(s) => write_str(out, s),
        MetadataValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Array(a) => write_array(out, a),
    }
}

fn write_array(out: &mut Vec<u8>, a: &MetadataArray) {
    out.extend_from_slice(&array_type_id(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr, $f:expr) => {
            for x in $v {
                #[allow(clippy::redundant_closure_call)]
                ($f)(out, x)
            }
        };
    }
    match a {
        MetadataArray::U8(v) => out.extend_from_slice(v),
        MetadataArray::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        MetadataArray::U16(v) => each!(v, |o: &mut Vec<u8>, x: &u16| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::I16(v) => each!(v, |o: &mut Vec<u8>, x: &i16| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::U32(v) => each!(v, |o: &mut Vec<u8>, x: &u32| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::I32(v) => each!(v, |o: &mut Vec<u8>, x: &i32| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::F32(v) => each!(v, |o: &mut Vec<u8>, x: &f32| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        MetadataArray::String(v) => each!(v, |o: &mut Vec<u8>, x: &String| write_str(o, x)),
        MetadataArray::U64(v) => each!(v, |o: &mut Vec<u8>, x: &u64| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::I64(v) => each!(v, |o: &mut Vec<u8>, x: &i64| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::F64(v) => each!(v, |o: &mut Vec<u8>, x: &f64| o.extend_from_slice(&x.to_le_bytes())),
        MetadataArray::Array(v) => each!(v, |o: &mut Vec<u8>, x: &MetadataArray| write_array(o, x)),
    }
}

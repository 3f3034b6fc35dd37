//! GGUF writers: [`GgufBuilder`] builds a whole file in memory (tests, fuzzing seeds);
//! [`GgufWriter`] streams one to any [`Write`] with the tensor bytes given in order, so a
//! multi-gigabyte file never has to be held in memory (synthetic models). Both write the header
//! (metadata, tensor infos, padding to the data section) with the same code.

use std::io::{self, Write};

use super::metadata::{MetadataArray, MetadataValue};
use super::reader::{DEFAULT_ALIGNMENT, bytes_for};
use boostr::formats::GgmlType;

/// A tensor as the header describes it: name, dims in ggml order (innermost first), type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    /// Tensor name.
    pub name: String,
    /// Dimensions, innermost first.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
}

impl TensorDesc {
    /// A descriptor.
    pub fn new(name: impl Into<String>, dims: &[u64], ty: GgmlType) -> TensorDesc {
        TensorDesc { name: name.into(), dims: dims.to_vec(), ty }
    }

    /// The tensor's size in bytes, or `None` if the shape is not whole blocks of the type.
    pub fn n_bytes(&self) -> Option<u64> {
        let n = self.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        bytes_for(self.ty, n)
    }
}

/// The data alignment the keys ask for: `general.alignment` if set as a power-of-two `u32`,
/// else 32.
fn alignment_of(kvs: &[(String, MetadataValue)]) -> u64 {
    kvs.iter()
        .find_map(|(k, v)| match (k.as_str(), v) {
            ("general.alignment", MetadataValue::U32(a)) if a.is_power_of_two() => Some(*a as u64),
            _ => None,
        })
        .unwrap_or(DEFAULT_ALIGNMENT)
}

fn bad_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// The header up to the data section (padded to `align`), and each tensor's size in bytes.
fn header(version: u32, kvs: &[(String, MetadataValue)], tensors: &[TensorDesc], align: u64) -> io::Result<(Vec<u8>, Vec<u64>)> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        write_str(&mut out, k);
        out.extend_from_slice(&type_id(v).to_le_bytes());
        write_value(&mut out, v);
    }
    let mut sizes = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        let size = t.n_bytes().ok_or_else(|| bad_input(format!("tensor {}: dims {:?} are not whole blocks of {}", t.name, t.dims, t.ty)))?;
        write_str(&mut out, &t.name);
        out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&t.ty.id().to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset += size.div_ceil(align) * align;
        sizes.push(size);
    }
    out.resize((out.len() as u64).div_ceil(align) as usize * align as usize, 0);
    Ok((out, sizes))
}

/// Builds a valid GGUF file in memory.
///
/// Tensor data is laid out in insertion order, each tensor padded to the alignment
/// (`general.alignment` if set as a `u32` key, else 32).
#[derive(Debug, Clone)]
pub struct GgufBuilder {
    version: u32,
    kvs: Vec<(String, MetadataValue)>,
    tensors: Vec<(TensorDesc, Vec<u8>)>,
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
        self.tensors.push((TensorDesc::new(name, dims, ty), data));
        self
    }

    /// Serialises the file.
    ///
    /// # Panics
    /// If a tensor's data does not have the size its type and shape imply.
    pub fn build(&self) -> Vec<u8> {
        let descs: Vec<TensorDesc> = self.tensors.iter().map(|(d, _)| d.clone()).collect();
        let mut w = GgufWriter::new(Vec::new(), self.version, &self.kvs, &descs).expect("GgufBuilder: tensor shapes");
        for (_, data) in &self.tensors {
            w.write_tensor_data(data).expect("GgufBuilder: tensor data size");
        }
        w.finish().expect("GgufBuilder: all tensors written")
    }
}

/// Streams a GGUF file: the header is written when the writer is made (from the metadata and
/// every tensor's descriptor, so each tensor's aligned offset is known up front), then each
/// tensor's bytes are given in descriptor order, in one call or several.
///
/// A tensor's bytes are checked against the size its type and shape imply: more than that is an
/// error, and when it is complete the padding to the alignment (`general.alignment` if set as a
/// `u32` key, else 32) is written. [`GgufWriter::finish`] checks that every tensor is complete.
///
/// ```
/// use cera::gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue, TensorDesc};
/// let kvs = vec![("general.architecture".to_string(), MetadataValue::String("llama".into()))];
/// let tensors = [TensorDesc::new("a", &[32, 2], GgmlType::Q8_0), TensorDesc::new("b", &[3], GgmlType::F32)];
/// let mut w = GgufWriter::new(Vec::new(), 3, &kvs, &tensors)?;
/// w.write_tensor_data(&[0u8; 34])?; // the first row of `a`,
/// w.write_tensor_data(&[0u8; 34])?; // then the second
/// w.write_tensor_data(&[0u8; 12])?;
/// let f = GgufFile::from_bytes(w.finish()?).unwrap();
/// assert_eq!(f.tensor_data("b").unwrap().len(), 12);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct GgufWriter<W: Write> {
    out: W,
    align: u64,
    names: Vec<String>,
    sizes: Vec<u64>,
    /// The tensor being written and how many of its bytes have been.
    current: usize,
    done: u64,
}

impl<W: Write> GgufWriter<W> {
    /// Writes the header of a file of `version` (2 or 3) with these keys and tensors.
    ///
    /// An error if a tensor's dims are not whole blocks of its type, or if writing fails.
    pub fn new(mut out: W, version: u32, kvs: &[(String, MetadataValue)], tensors: &[TensorDesc]) -> io::Result<GgufWriter<W>> {
        let align = alignment_of(kvs);
        let (head, sizes) = header(version, kvs, tensors, align)?;
        out.write_all(&head)?;
        let names = tensors.iter().map(|t| t.name.clone()).collect();
        let mut w = GgufWriter { out, align, names, sizes, current: 0, done: 0 };
        w.skip_empty()?;
        Ok(w)
    }

    /// The data alignment in use.
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// The name of the tensor whose bytes come next, or `None` when all are written.
    pub fn next_tensor(&self) -> Option<&str> {
        self.names.get(self.current).map(String::as_str)
    }

    /// Zero-byte tensors are complete from the start.
    fn skip_empty(&mut self) -> io::Result<()> {
        while self.current < self.sizes.len() && self.done == self.sizes[self.current] {
            let pad = self.done.div_ceil(self.align) * self.align - self.done;
            self.out.write_all(&vec![0u8; pad as usize])?;
            self.current += 1;
            self.done = 0;
        }
        Ok(())
    }

    /// Writes the next `data.len()` bytes of the current tensor (moving on to the next tensor
    /// once it is complete). An error if `data` runs past the end of the current tensor or if
    /// every tensor is already written.
    pub fn write_tensor_data(&mut self, data: &[u8]) -> io::Result<()> {
        let Some(&size) = self.sizes.get(self.current) else {
            return Err(bad_input(format!("{} bytes of tensor data after the last tensor", data.len())));
        };
        if self.done + data.len() as u64 > size {
            let name = &self.names[self.current];
            return Err(bad_input(format!("tensor {name}: {} bytes given where {} remain", data.len(), size - self.done)));
        }
        self.out.write_all(data)?;
        self.done += data.len() as u64;
        self.skip_empty()
    }

    /// Flushes and returns the output; an error if a tensor is incomplete.
    pub fn finish(mut self) -> io::Result<W> {
        if let Some(name) = self.names.get(self.current) {
            return Err(bad_input(format!("tensor {name}: {} of {} bytes written", self.done, self.sizes[self.current])));
        }
        self.out.flush()?;
        Ok(self.out)
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

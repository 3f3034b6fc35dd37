//! Typed errors for the files the `safetensors` crate rejects.
//!
//! The crate decides whether a file is valid, but several of its errors name no tensor
//! (`TensorInvalidInfo`, `ValidationOverflow`, `MisalignedSlice`, `MetadataIncompleteBuffer`)
//! and two lump different faults together (`InvalidOffset`: reversed, overlapping or
//! non-contiguous ranges; `InvalidHeaderDeserialization`: malformed JSON, an unknown dtype, a
//! negative dimension). Only once the crate has rejected a file, [`explain`] re-reads the header
//! into the crate's own `TensorInfo` and walks it in the order the crate validates it to say
//! which tensor is at fault and how. It checks nothing of its own: the file stays rejected
//! whatever it finds, and where it finds nothing more precise the crate's message is kept.

use safetensors::SafeTensorError;
use safetensors::tensor::{Dtype, TensorInfo};
use serde::Deserialize;
use serde_json::Value;

use super::error::SafetensorsError;
use super::header::MAX_HEADER;

fn bad(msg: impl Into<String>) -> SafetensorsError {
    SafetensorsError::InvalidHeader(msg.into())
}

/// The [`SafetensorsError`] for a file of `bytes` that the crate rejected with `err`.
pub(super) fn explain(bytes: &[u8], err: SafeTensorError) -> SafetensorsError {
    use SafeTensorError as E;
    let file_len = bytes.len() as u64;
    let header_len = bytes.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default())).unwrap_or(0);
    // The header and data section, where the length field fits in the file.
    let header_end = usize::try_from(header_len).ok().and_then(|n| n.checked_add(8)).filter(|&end| end <= bytes.len());
    let sections = header_end.map(|end| (&bytes[8..end], (bytes.len() - end) as u64));
    match err {
        E::HeaderTooSmall => SafetensorsError::TooShort { file_len },
        E::HeaderTooLarge | E::InvalidHeaderLength => SafetensorsError::HeaderTooLarge { header_len, file_len, limit: MAX_HEADER },
        E::InvalidHeader(e) => bad(format!("header is not UTF-8: {e}")),
        E::InvalidHeaderDeserialization(e) => match sections.map(|(header, _)| entries(header)) {
            Some(Err(precise)) => precise,
            _ => bad(e.to_string()),
        },
        e @ (E::InvalidOffset(_) | E::TensorInvalidInfo | E::ValidationOverflow | E::MisalignedSlice | E::MetadataIncompleteBuffer) => {
            match sections.map(|(header, data_len)| entries(header).map(|ts| layout(ts, data_len))) {
                Some(Ok(Some(precise))) => precise,
                _ => bad(e.to_string()),
            }
        }
        other => bad(other.to_string()),
    }
}

/// The header's tensor entries in header order, or the first entry the crate cannot read.
fn entries(header: &[u8]) -> Result<Vec<(String, TensorInfo)>, SafetensorsError> {
    let obj: serde_json::Map<String, Value> = serde_json::from_slice(header).map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::with_capacity(obj.len());
    for (name, v) in obj {
        if name == "__metadata__" {
            continue;
        }
        match TensorInfo::deserialize(&v) {
            Ok(t) => out.push((name, t)),
            Err(e) => {
                if let Some(dtype) = v.get("dtype").filter(|d| Dtype::deserialize(*d).is_err()).and_then(Value::as_str) {
                    return Err(SafetensorsError::UnknownDType { name, dtype: dtype.to_string() });
                }
                return Err(bad(format!("tensor `{name}`: {e}")));
            }
        }
    }
    Ok(out)
}

/// The first fault in the tensors' layout, checked in the crate's order: by increasing offsets,
/// each range must start where the previous one ended and span exactly its shape's bytes, and
/// the last must end at the end of the data section.
fn layout(mut tensors: Vec<(String, TensorInfo)>, data_len: u64) -> Option<SafetensorsError> {
    tensors.sort_by_key(|(_, t)| t.data_offsets);
    let mut prev = "";
    let mut at = 0u64;
    for (name, t) in &tensors {
        let (start, end) = (t.data_offsets.0 as u64, t.data_offsets.1 as u64);
        if end < start {
            return Some(SafetensorsError::OutOfBounds { name: name.clone(), start, end, data_len });
        }
        if start < at {
            return Some(SafetensorsError::Overlap { first: prev.to_string(), second: name.clone() });
        }
        if start > at {
            return Some(SafetensorsError::NotContiguous { name: name.clone(), start, expected: at });
        }
        let bits = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).and_then(|n| n.checked_mul(t.dtype.bitsize()));
        if bits.is_some_and(|b| b % 8 != 0) {
            return Some(bad(format!("tensor `{name}` of {} {:?} is not a whole number of bytes", t.dtype, t.shape)));
        }
        let expected = bits.map(|b| (b / 8) as u64);
        if expected != Some(end - start) {
            return Some(SafetensorsError::ShapeMismatch {
                name: name.clone(),
                dtype: t.dtype.to_string(),
                shape: t.shape.iter().map(|&d| d as u64).collect(),
                expected: expected.unwrap_or(u64::MAX),
                actual: end - start,
            });
        }
        prev = name;
        at = end;
    }
    if at > data_len {
        let (name, t) = tensors.last()?;
        let (start, end) = (t.data_offsets.0 as u64, t.data_offsets.1 as u64);
        return Some(SafetensorsError::OutOfBounds { name: name.clone(), start, end, data_len });
    }
    (at < data_len).then_some(SafetensorsError::TrailingData { end: at, data_len })
}

//! A hand-written reader for GGUF model files (versions 2 and 3).
//!
//! The file is memory-mapped; the header (metadata and tensor infos) is parsed and validated when
//! the file is opened, and tensor bytes are handed out as `&[u8]` slices into the map, so nothing
//! is read from disk until a tensor is used.
//!
//! ```no_run
//! use cera::gguf::GgufFile;
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! println!("{}", file.metadata().get_str("general.architecture")?);
//! let hp = file.hparams()?;
//! println!("{} layers, {} heads", hp.block_count, hp.head_count);
//! let bytes: &[u8] = file.tensor_data("token_embd.weight")?;
//! # Ok::<(), cera::gguf::GgufError>(())
//! ```

mod error;
mod file_type;
mod hparams;
mod metadata;
mod reader;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The ggml tensor types: boostr's one table ([`boostr::formats::GgmlType`]), used as is.
pub use boostr::formats::GgmlType;
pub use error::{GgufError, MetadataError};
pub use file_type::file_type_name;
pub use hparams::{HyperParams, PerLayer};
pub use metadata::{Metadata, MetadataArray, MetadataValue, ValueType};
pub use reader::{DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NESTING, TensorInfo};
pub use writer::{GgufBuilder, GgufWriter, TensorDesc};

use crate::storage::Storage;

/// An open GGUF file: validated header plus lazily read tensor data.
#[derive(Debug)]
pub struct GgufFile {
    storage: Storage,
    path: Option<PathBuf>,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Opens and memory-maps a GGUF file, then parses and validates its header.
    ///
    /// Every error names the file: [`GgufError::Io`], or [`GgufError::InFile`] around what is
    /// wrong with the header (see [`GgufError::inner`]).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let storage = Storage::map(path).map_err(|source| GgufError::Io { path: path.to_path_buf(), source })?;
        let mut file = Self::from_storage(storage).map_err(|e| e.in_file(path))?;
        file.path = Some(path.to_path_buf());
        Ok(file)
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    /// Parses a GGUF file from already mapped or loaded bytes.
    pub fn from_storage(storage: Storage) -> Result<GgufFile, GgufError> {
        let header = reader::parse_header(&storage)?;
        let by_name = header.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            storage,
            path: None,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            by_name,
            alignment: header.alignment,
            data_offset: header.data_offset,
        })
    }

    /// The path the file was opened from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// All metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Total file length in bytes.
    pub fn file_len(&self) -> u64 {
        self.storage.len() as u64
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        Ok(self.metadata.get_str("general.architecture")?)
    }

    /// The architecture hyperparameters (`{arch}.block_count`, ...).
    pub fn hparams(&self) -> Result<HyperParams, GgufError> {
        Ok(HyperParams::from_metadata(&self.metadata)?)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of one tensor.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor of a supported type, as a slice into the map.
    ///
    /// Types that are recognised but not supported (IQ*, Q8_1, Q8_K, TQ*, I8..F64, MXFP4, ...)
    /// give [`GgufError::UnsupportedType`]; use [`GgufFile::tensor_data_raw`] to get their bytes
    /// anyway.
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::TensorNotFound { name: name.to_string() })?;
        if !info.ty.is_supported() {
            return Err(GgufError::UnsupportedType { name: info.name.clone(), ty: info.ty });
        }
        Ok(self.bytes_of(info))
    }

    /// The bytes of any tensor, whatever its type.
    pub fn tensor_data_raw(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.tensor(name).ok_or_else(|| GgufError::TensorNotFound { name: name.to_string() })?;
        Ok(self.bytes_of(info))
    }

    fn bytes_of(&self, info: &TensorInfo) -> &[u8] {
        // Bounds were validated when the header was parsed.
        let start = (self.data_offset + info.offset) as usize;
        &self.storage[start..start + info.n_bytes as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_round_trip() {
        let mut b = GgufBuilder::new(3);
        b.kv("general.architecture", MetadataValue::String("llama".into()));
        b.kv("general.alignment", MetadataValue::U32(64));
        b.kv("nested", MetadataValue::Array(MetadataArray::Array(vec![MetadataArray::String(vec!["a".into(), "b".into()]), MetadataArray::I32(vec![-1, 2])])));
        b.tensor("a", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]);
        b.tensor("b", &[3], GgmlType::F32, vec![2u8; 12]);
        b.tensor("c", &[32], GgmlType::IQ4_NL, vec![0u8; 18]);
        let f = GgufFile::from_bytes(b.build()).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(f.architecture().unwrap(), "llama");
        assert_eq!(f.tensor_data("a").unwrap(), &[1u8; 68][..]);
        assert_eq!(f.tensor_data("b").unwrap(), &[2u8; 12][..]);
        assert_eq!(f.tensor("b").unwrap().offset % 64, 0);
        match f.metadata().get("nested").unwrap() {
            MetadataValue::Array(MetadataArray::Array(v)) => assert_eq!(v.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(f.tensor_data("c"), Err(GgufError::UnsupportedType { ty: GgmlType::IQ4_NL, .. })));
        assert_eq!(f.tensor_data_raw("c").unwrap().len(), 18);
        assert!(matches!(f.tensor_data("zz"), Err(GgufError::TensorNotFound { .. })));
    }

    #[test]
    fn streaming_writer_checks_sizes_and_matches_the_builder() {
        let kvs = vec![("general.alignment".to_string(), MetadataValue::U32(64))];
        let descs = [TensorDesc::new("a", &[32, 2], GgmlType::Q8_0), TensorDesc::new("b", &[3], GgmlType::F32)];
        let mut w = GgufWriter::new(Vec::new(), 3, &kvs, &descs).unwrap();
        assert_eq!((w.alignment(), w.next_tensor()), (64, Some("a")));
        w.write_tensor_data(&[1u8; 34]).unwrap();
        assert!(w.write_tensor_data(&[1u8; 35]).is_err(), "past the end of a");
        w.write_tensor_data(&[1u8; 34]).unwrap();
        assert_eq!(w.next_tensor(), Some("b"));
        w.write_tensor_data(&[2u8; 8]).unwrap();
        let mut early = GgufWriter::new(Vec::new(), 3, &kvs, &descs).unwrap();
        early.write_tensor_data(&[1u8; 68]).unwrap();
        assert!(early.finish().is_err(), "b is incomplete");
        w.write_tensor_data(&[2u8; 4]).unwrap();
        assert!(w.write_tensor_data(&[0u8; 1]).is_err(), "after the last tensor");
        let streamed = w.finish().unwrap();
        let mut b = GgufBuilder::new(3);
        b.kv("general.alignment", MetadataValue::U32(64));
        b.tensor("a", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]).tensor("b", &[3], GgmlType::F32, vec![2u8; 12]);
        assert_eq!(streamed, b.build());
        let f = GgufFile::from_bytes(streamed).unwrap();
        assert_eq!(f.tensor_data("b").unwrap(), &[2u8; 12][..]);
        assert!(GgufWriter::new(Vec::new(), 3, &[], &[TensorDesc::new("bad", &[33], GgmlType::Q8_0)]).is_err(), "not whole blocks");
    }

    #[test]
    fn open_names_the_file() {
        let dir = std::env::temp_dir().join(format!("cera-gguf-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.gguf");
        std::fs::write(&bad, b"GGUF\x09\x00\x00\x00").unwrap();
        let e = GgufFile::open(&bad).unwrap_err();
        assert!(matches!(e.inner(), GgufError::UnsupportedVersion { version: 9, .. }), "{e:?}");
        assert_eq!(e.path(), Some(bad.as_path()));
        assert!(e.to_string().starts_with(&format!("{}: unsupported GGUF version 9", bad.display())), "{e}");
        let missing = dir.join("missing.gguf");
        let e = GgufFile::open(&missing).unwrap_err();
        assert!(matches!(e.inner(), GgufError::Io { .. }) && e.to_string().contains(&*missing.to_string_lossy()), "{e}");
        // The same bytes from memory: no path, and `inner` is the error itself.
        let e = GgufFile::from_bytes(b"GGUF\x09\x00\x00\x00".to_vec()).unwrap_err();
        assert!(matches!(e, GgufError::UnsupportedVersion { .. }) && e.path().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

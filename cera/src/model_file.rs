//! One way to open any model file and load tensors by internal name, whatever the format.
//!
//! [`ModelFile::open`] takes a `.gguf` file, a `.safetensors` file, a shard index, or a Hugging
//! Face model folder. [`TensorSource`] is implemented by all of them; tensor names are the
//! internal (GGUF) ones, such as `blk.0.attn_q.weight`, and shapes are in ggml order (innermost
//! dimension first) for both formats.
//!
//! ```no_run
//! use cera::model_file::{ModelFile, TensorSource};
//! let model = ModelFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let hp = model.hparams()?;
//! let meta = model.tensor_meta("blk.0.attn_q.weight").unwrap();
//! let bytes = model.tensor_data("blk.0.attn_q.weight")?;
//! # Ok::<(), cera::model_file::ModelError>(())
//! ```

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::chat_template::{BuiltinTemplate, ChatTemplate, TemplateError};
use crate::gguf::{GgmlType, GgufError, GgufFile, HyperParams};
use crate::safetensors::{SafeDType, SafetensorsError, SafetensorsModel};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Any error from opening a model or reading from it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// From the GGUF reader.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// From the safetensors reader.
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    /// A safetensors model that [`ModelFile::open`] could not open: the path it was given (a
    /// file, an index or a folder) and the reader's error.
    #[error("{}", in_path(path, source))]
    SafetensorsIn {
        /// The path given to [`ModelFile::open`].
        path: PathBuf,
        /// The safetensors reader's error.
        #[source]
        source: SafetensorsError,
    },
    /// From the tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// From the chat template.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The path is neither GGUF, safetensors, nor a model folder.
    #[error("{path}: not a GGUF file, safetensors file or Hugging Face model folder")]
    UnknownFormat {
        /// The path.
        path: PathBuf,
    },
    /// Something the model lacks (a config, a tokenizer file, ...).
    #[error("{0}")]
    Missing(String),
    /// The path could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// `{path}: {source}`, leaving out the path where the message names a path already.
fn in_path(path: &Path, source: &SafetensorsError) -> String {
    match source {
        SafetensorsError::Io { .. } | SafetensorsError::InvalidIndex { .. } | SafetensorsError::NoModel(_) => source.to_string(),
        _ => format!("{}: {source}", path.display()),
    }
}

impl ModelError {
    /// The GGUF reader's error, if this is one (without the path: [`GgufError::inner`]).
    pub fn as_gguf(&self) -> Option<&GgufError> {
        match self {
            ModelError::Gguf(e) => Some(e.inner()),
            _ => None,
        }
    }

    /// The safetensors reader's error, if this is one (with or without the path).
    pub fn as_safetensors(&self) -> Option<&SafetensorsError> {
        match self {
            ModelError::Safetensors(e) | ModelError::SafetensorsIn { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

/// A tensor element type from either format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorDType {
    /// A ggml type (GGUF).
    Ggml(GgmlType),
    /// A safetensors dtype.
    Safetensors(SafeDType),
}

impl std::fmt::Display for TensorDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorDType::Ggml(t) => write!(f, "{t}"),
            TensorDType::Safetensors(t) => write!(f, "{t}"),
        }
    }
}

/// What is known about a tensor without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// The internal name.
    pub name: String,
    /// The name as stored in the file.
    pub file_name: String,
    /// Element type.
    pub dtype: TensorDType,
    /// Dimensions in ggml order: innermost (contiguous) first.
    pub dims: Vec<u64>,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

/// Tensors by internal name, read lazily from a memory-mapped file: the one trait by which every
/// model file hands out its tensors. The engine's checked, decoding view of it is
/// [`WeightSource`](crate::engine::weights::WeightSource), built on these three methods.
pub trait TensorSource {
    /// Every tensor's internal name, in file order.
    fn tensor_names(&self) -> Vec<&str>;
    /// A tensor's metadata.
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta>;
    /// A tensor's bytes (a slice of the map); unsupported types give a typed error naming the
    /// tensor and the type.
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError>;
}

impl TensorSource for GgufFile {
    fn tensor_names(&self) -> Vec<&str> {
        self.tensors().iter().map(|t| t.name.as_str()).collect()
    }
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta> {
        self.tensor(name).map(|t| TensorMeta {
            name: t.name.clone(),
            file_name: t.name.clone(),
            dtype: TensorDType::Ggml(t.ty),
            dims: t.dims.clone(),
            n_bytes: t.n_bytes,
        })
    }
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError> {
        Ok(GgufFile::tensor_data(self, name)?)
    }
}

impl TensorSource for SafetensorsModel {
    fn tensor_names(&self) -> Vec<&str> {
        SafetensorsModel::tensor_names(self).collect()
    }
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta> {
        self.tensor(name).map(|t| TensorMeta {
            name: name.to_string(),
            file_name: t.name.clone(),
            dtype: TensorDType::Safetensors(t.dtype),
            dims: t.shape.iter().rev().copied().collect(),
            n_bytes: t.end - t.start,
        })
    }
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError> {
        Ok(SafetensorsModel::tensor_data(self, name)?)
    }
}

/// A model file of either format.
#[derive(Debug)]
#[non_exhaustive]
pub enum ModelFile {
    /// A GGUF file.
    Gguf(Box<GgufFile>),
    /// A Hugging Face safetensors model.
    Safetensors(Box<SafetensorsModel>),
}

impl ModelFile {
    /// Opens a GGUF file, a safetensors file or index, or a model folder; the kind is told by
    /// content (GGUF magic) or folder layout, not by file name.
    ///
    /// Every error names the path: GGUF errors through [`GgufError::InFile`] (or
    /// [`GgufError::Io`]), safetensors errors as [`ModelError::SafetensorsIn`].
    pub fn open(path: impl AsRef<Path>) -> Result<ModelFile, ModelError> {
        let path = path.as_ref();
        let safetensors = |path: &Path| match SafetensorsModel::open(path) {
            Ok(m) => Ok(ModelFile::Safetensors(Box::new(m))),
            Err(source) => Err(ModelError::SafetensorsIn { path: path.to_path_buf(), source }),
        };
        if path.is_dir() {
            return safetensors(path);
        }
        let mut magic = [0u8; 4];
        let mut f = std::fs::File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let n = f.read(&mut magic).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        if n == 4 && &magic == b"GGUF" {
            return Ok(ModelFile::Gguf(Box::new(GgufFile::open(path)?)));
        }
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json") {
            return safetensors(path);
        }
        if name.ends_with(".gguf") {
            // Let the GGUF reader say what is wrong with it.
            return Ok(ModelFile::Gguf(Box::new(GgufFile::open(path)?)));
        }
        Err(ModelError::UnknownFormat { path: path.to_path_buf() })
    }

    /// `"GGUF"` or `"safetensors"`.
    pub fn format_name(&self) -> &'static str {
        match self {
            ModelFile::Gguf(_) => "GGUF",
            ModelFile::Safetensors(_) => "safetensors",
        }
    }

    fn source(&self) -> &dyn TensorSource {
        match self {
            ModelFile::Gguf(g) => g.as_ref(),
            ModelFile::Safetensors(s) => s.as_ref(),
        }
    }

    /// The architecture hyperparameters.
    pub fn hparams(&self) -> Result<HyperParams, ModelError> {
        match self {
            ModelFile::Gguf(g) => Ok(g.hparams()?),
            ModelFile::Safetensors(s) => {
                s.config().map(|c| c.hparams.clone()).ok_or_else(|| ModelError::Missing(format!("no config.json in {}", s.dir().display())))
            }
        }
    }

    /// The tokenizer: the GGUF metadata's, or `tokenizer.json` next to the safetensors.
    pub fn tokenizer(&self) -> Result<Tokenizer, ModelError> {
        match self {
            ModelFile::Gguf(g) => Ok(Tokenizer::from_gguf(g)?),
            ModelFile::Safetensors(s) => {
                let p = s.dir().join("tokenizer.json");
                if !p.is_file() {
                    return Err(ModelError::Missing(format!("no tokenizer.json in {}", s.dir().display())));
                }
                Ok(Tokenizer::from_hf_file(p)?)
            }
        }
    }

    /// Whether the file carries its own chat template.
    pub fn has_chat_template(&self, tok: &Tokenizer) -> bool {
        match self {
            ModelFile::Gguf(g) => g.metadata().contains("tokenizer.chat_template"),
            ModelFile::Safetensors(_) => tok.hf().and_then(|h| h.chat_template()).is_some(),
        }
    }

    /// The chat template: the file's own, or the built-in one for the architecture.
    pub fn chat_template(&self, tok: &Tokenizer) -> Result<ChatTemplate, ModelError> {
        match self {
            ModelFile::Gguf(g) => Ok(ChatTemplate::from_gguf(g, tok)?),
            ModelFile::Safetensors(s) => match tok.hf().and_then(|h| h.chat_template().map(|src| (h, src))) {
                Some((h, src)) => Ok(ChatTemplate::new(src, h.bos_text().unwrap_or(""), h.eos_text().unwrap_or(""))?),
                None => {
                    let arch = s.config().map(|c| c.architecture.as_str()).unwrap_or("");
                    Ok(ChatTemplate::builtin(BuiltinTemplate::for_architecture(arch)))
                }
            },
        }
    }
}

impl TensorSource for ModelFile {
    fn tensor_names(&self) -> Vec<&str> {
        self.source().tensor_names()
    }
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta> {
        self.source().tensor_meta(name)
    }
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError> {
        self.source().tensor_data(name)
    }
}

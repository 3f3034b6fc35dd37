//! Hugging Face models: `config.json` plus one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`, memory-mapped, with tensor names mapped to the internal
//! (GGUF) names.
//!
//! ```no_run
//! use cera::safetensors::SafetensorsModel;
//! let m = SafetensorsModel::open("path/to/hf-model")?;
//! let q: &[u8] = m.tensor_data("blk.0.attn_q.weight")?;
//! # Ok::<(), cera::safetensors::SafetensorsError>(())
//! ```

mod config;
mod diagnose;
mod error;
mod header;
mod names;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub use config::{HfConfig, QuantConfig, QuantMethod, architecture_of};
pub use error::SafetensorsError;
pub use header::{MAX_HEADER, SafeDType, SafeTensorInfo, SafetensorsFile, write_safetensors};
pub use names::hf_to_internal;

/// Where a tensor lives.
#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    file_name: String,
}

/// A Hugging Face safetensors model (one file or several shards).
#[derive(Debug)]
pub struct SafetensorsModel {
    dir: PathBuf,
    shards: Vec<(PathBuf, SafetensorsFile)>,
    /// Internal name -> entry, in load order.
    tensors: Vec<(String, Entry)>,
    by_name: HashMap<String, usize>,
    config: Option<HfConfig>,
}

/// The tensors of one AWQ/GPTQ linear layer, with its shape checked.
#[derive(Debug, Clone, Copy)]
pub struct QuantLinear<'a> {
    /// The checkpoint's quantization settings.
    pub config: &'a QuantConfig,
    /// Input features.
    pub in_features: u64,
    /// Output features.
    pub out_features: u64,
    /// Packed weights (I32).
    pub qweight: &'a [u8],
    /// Packed zero points (I32).
    pub qzeros: &'a [u8],
    /// Scales (F16, BF16 or F32).
    pub scales: &'a [u8],
    /// Scale dtype.
    pub scales_dtype: SafeDType,
    /// GPTQ group index per input row (I32), if present.
    pub g_idx: Option<&'a [u8]>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SafetensorsError + '_ {
    move |source| SafetensorsError::Io { path: path.to_path_buf(), source }
}

impl SafetensorsModel {
    /// Opens a model folder (with `config.json`, and `model.safetensors` or
    /// `model.safetensors.index.json`) or a single `.safetensors` file (its folder's
    /// `config.json` is used if present).
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsModel, SafetensorsError> {
        let path = path.as_ref();
        let (dir, index) = if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            let single = path.join("model.safetensors");
            if index.is_file() {
                (path.to_path_buf(), Some(index))
            } else if single.is_file() {
                (path.to_path_buf(), None)
            } else {
                return Err(SafetensorsError::NoModel(path.to_path_buf()));
            }
        } else {
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.ends_with(".json") { (dir, Some(path.to_path_buf())) } else { (dir, None) }
        };
        let (files, weight_map) = match &index {
            Some(index) => read_index(index)?,
            None => {
                let name =
                    if path.is_dir() { "model.safetensors".to_string() } else { path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string() };
                (vec![name], Vec::new())
            }
        };
        let cfg_path = dir.join("config.json");
        let config = match std::fs::read(&cfg_path) {
            Ok(b) => Some(HfConfig::parse(&b)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&cfg_path)(e)),
        };
        let mut shards = Vec::with_capacity(files.len());
        for f in &files {
            let p = dir.join(f);
            shards.push((p.clone(), SafetensorsFile::open(&p)?));
        }
        // Every tensor the index lists must be in the shard it names.
        for (tensor, k) in weight_map {
            if shards[k].1.tensor(&tensor).is_none() {
                return Err(SafetensorsError::InvalidIndex { path: index.clone().unwrap_or_default(), reason: format!("`{tensor}` is not in {}", files[k]) });
            }
        }
        Self::assemble(dir, shards, config)
    }

    /// A model from one in-memory safetensors file and an optional `config.json`.
    pub fn from_bytes(bytes: Vec<u8>, config_json: Option<&[u8]>) -> Result<SafetensorsModel, SafetensorsError> {
        let config = config_json.map(HfConfig::parse).transpose()?;
        let file = SafetensorsFile::from_bytes(bytes)?;
        Self::assemble(PathBuf::new(), vec![(PathBuf::from("<memory>"), file)], config)
    }

    fn assemble(dir: PathBuf, shards: Vec<(PathBuf, SafetensorsFile)>, config: Option<HfConfig>) -> Result<SafetensorsModel, SafetensorsError> {
        let arch = config.as_ref().map(|c| c.architecture.clone()).unwrap_or_default();
        let mut tensors = Vec::new();
        let mut by_name = HashMap::new();
        for (i, (_, f)) in shards.iter().enumerate() {
            for t in f.tensors() {
                let internal = hf_to_internal(&t.name, &arch).unwrap_or_else(|| t.name.clone());
                if by_name.insert(internal.clone(), tensors.len()).is_some() {
                    return Err(SafetensorsError::DuplicateTensor { name: t.name.clone() });
                }
                tensors.push((internal, Entry { shard: i, file_name: t.name.clone() }));
            }
        }
        Ok(SafetensorsModel { dir, shards, tensors, by_name, config })
    }

    /// The model folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `config.json`, if there is one.
    pub fn config(&self) -> Option<&HfConfig> {
        self.config.as_ref()
    }

    /// The shard files.
    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|(p, _)| p.as_path())
    }

    /// Internal tensor names, in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|(n, _)| n.as_str())
    }

    /// The internal name `name` as this model stores it (a `&str` that lives as long as the
    /// model), or `None` when no tensor has it.
    pub fn internal_name(&self, name: &str) -> Option<&str> {
        self.by_name.get(name).map(|&i| self.tensors[i].0.as_str())
    }

    /// A tensor's entry (with its name as stored in the file) by internal name.
    pub fn tensor(&self, name: &str) -> Option<&SafeTensorInfo> {
        let e = &self.tensors[*self.by_name.get(name)?].1;
        self.shards[e.shard].1.tensor(&e.file_name)
    }

    fn locate(&self, name: &str) -> Result<(&SafetensorsFile, &str), SafetensorsError> {
        let i = self.by_name.get(name).ok_or_else(|| SafetensorsError::TensorNotFound { name: name.to_string() })?;
        let e = &self.tensors[*i].1;
        Ok((&self.shards[e.shard].1, &e.file_name))
    }

    /// A tensor's bytes by internal name (F32/F16/BF16/I32 only).
    pub fn tensor_data(&self, name: &str) -> Result<&[u8], SafetensorsError> {
        let (f, n) = self.locate(name)?;
        f.tensor_data(n)
    }

    /// A tensor's bytes by internal name, whatever its dtype.
    pub fn tensor_data_raw(&self, name: &str) -> Result<&[u8], SafetensorsError> {
        let (f, n) = self.locate(name)?;
        f.tensor_data_raw(n)
    }

    /// The AWQ/GPTQ tensors of a linear layer (`base` like `blk.0.attn_q`), with dtypes and
    /// shapes checked against each other and the quantization config.
    pub fn quant_linear(&self, base: &str) -> Result<QuantLinear<'_>, SafetensorsError> {
        let invalid = |reason: String| SafetensorsError::InvalidQuantization { name: base.to_string(), reason };
        let config =
            self.config.as_ref().and_then(|c| c.quantization.as_ref()).ok_or_else(|| invalid("config.json has no AWQ/GPTQ quantization_config".into()))?;
        let get = |suffix: &str| -> Result<&SafeTensorInfo, SafetensorsError> {
            self.tensor(&format!("{base}.{suffix}")).ok_or_else(|| invalid(format!("missing `{suffix}`")))
        };
        let (qw, qz, sc) = (get("qweight")?, get("qzeros")?, get("scales")?);
        let gi = self.tensor(&format!("{base}.g_idx"));
        for (t, what) in [(qw, "qweight"), (qz, "qzeros")].into_iter().chain(gi.map(|g| (g, "g_idx"))) {
            if t.dtype != SafeDType::I32 {
                return Err(invalid(format!("{what} is {}, expected I32", t.dtype)));
            }
        }
        if !matches!(sc.dtype, SafeDType::F16 | SafeDType::BF16 | SafeDType::F32) {
            return Err(invalid(format!("scales is {}, expected F16", sc.dtype)));
        }
        let dims2 = |t: &SafeTensorInfo, what: &str| -> Result<(u64, u64), SafetensorsError> {
            match t.shape[..] {
                [a, b] => Ok((a, b)),
                _ => Err(invalid(format!("{what} has shape {:?}, expected 2 dimensions", t.shape))),
            }
        };
        let pack = config.pack_factor() as u64;
        let (a, b) = dims2(qw, "qweight")?;
        let (in_f, out_f) = match config.method {
            QuantMethod::Awq => (a, b.checked_mul(pack)),
            QuantMethod::Gptq => (a.saturating_mul(pack), Some(b)),
        };
        let out_f = out_f.ok_or_else(|| invalid("qweight shape overflows".into()))?;
        let group = config.group_size.map_or(in_f, u64::from);
        if group == 0 || in_f % group != 0 {
            return Err(invalid(format!("{in_f} inputs are not a multiple of group size {group}")));
        }
        let groups = in_f / group;
        let want_sc = (groups, out_f);
        let want_qz = (groups, out_f / pack);
        if dims2(sc, "scales")? != want_sc {
            return Err(invalid(format!("scales has shape {:?}, expected {want_sc:?}", sc.shape)));
        }
        if dims2(qz, "qzeros")? != want_qz {
            return Err(invalid(format!("qzeros has shape {:?}, expected {want_qz:?}", qz.shape)));
        }
        if let Some(g) = gi {
            if g.shape != [in_f] {
                return Err(invalid(format!("g_idx has shape {:?}, expected [{in_f}]", g.shape)));
            }
        }
        Ok(QuantLinear {
            config,
            in_features: in_f,
            out_features: out_f,
            qweight: self.tensor_data_raw(&format!("{base}.qweight"))?,
            qzeros: self.tensor_data_raw(&format!("{base}.qzeros"))?,
            scales: self.tensor_data_raw(&format!("{base}.scales"))?,
            scales_dtype: sc.dtype,
            g_idx: match gi {
                Some(_) => Some(self.tensor_data_raw(&format!("{base}.g_idx"))?),
                None => None,
            },
        })
    }
}

/// Reads a shard index: its shard file names in first-use order, and each listed tensor with
/// the index of its shard.
type Index = (Vec<String>, Vec<(String, usize)>);

fn read_index(path: &Path) -> Result<Index, SafetensorsError> {
    let invalid = |reason: String| SafetensorsError::InvalidIndex { path: path.to_path_buf(), reason };
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| invalid("no weight_map object".into()))?;
    let mut files: Vec<String> = Vec::new();
    let mut listed = Vec::with_capacity(map.len());
    for (tensor, f) in map {
        let f = f.as_str().ok_or_else(|| invalid(format!("`{tensor}` maps to a non-string")))?;
        let plain = !f.is_empty() && !f.contains(['/', '\\']) && f != "." && f != "..";
        if !plain {
            return Err(invalid(format!("`{tensor}` maps to `{f}`, which is not a file name in the same folder")));
        }
        let k = match files.iter().position(|x| x == f) {
            Some(k) => k,
            None => {
                files.push(f.to_string());
                files.len() - 1
            }
        };
        listed.push((tensor.clone(), k));
    }
    if files.is_empty() {
        return Err(invalid("weight_map is empty".into()));
    }
    Ok((files, listed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_file_names_and_awq() {
        let f16 = vec![0u8; 2 * 8 * 16];
        let qweight = vec![0u8; 4 * 16 * 2];
        let qzeros = vec![0u8; 4 * 2];
        let scales = vec![0u8; 2 * 16];
        let bytes = write_safetensors(&[
            ("model.embed_tokens.weight", SafeDType::F16, &[8, 16], &f16),
            ("model.layers.0.self_attn.q_proj.qweight", SafeDType::I32, &[16, 2], &qweight),
            ("model.layers.0.self_attn.q_proj.qzeros", SafeDType::I32, &[1, 2], &qzeros),
            ("model.layers.0.self_attn.q_proj.scales", SafeDType::F16, &[1, 16], &scales),
        ]);
        let cfg = br#"{"model_type":"llama","hidden_size":16,"num_hidden_layers":1,"num_attention_heads":2,
                       "quantization_config":{"quant_method":"awq","bits":4,"group_size":16}}"#;
        let m = SafetensorsModel::from_bytes(bytes, Some(cfg)).unwrap();
        assert_eq!(m.tensor_data("token_embd.weight").unwrap().len(), 256);
        let q = m.quant_linear("blk.0.attn_q").unwrap();
        assert_eq!((q.in_features, q.out_features), (16, 16));
        assert!(matches!(m.quant_linear("blk.0.attn_k"), Err(SafetensorsError::InvalidQuantization { .. })));
    }
}

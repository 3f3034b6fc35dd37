//! Hugging Face checkpoints for the engine: a folder's `config.json` and safetensors resolved
//! into the same [`ModelGraph`] a GGUF file gives, and its tensors served as a
//! [`TensorSource`] and [`WeightSource`] under llama.cpp's names (`blk.0.attn_q.weight`, see
//! [`crate::safetensors::hf_to_internal`]).
//!
//! What differs from a GGUF file of the same model, and how it is resolved here:
//! - **RoPE pairing.** llama.cpp's converter permutes llama's Q/K rows for interleaved RoPE;
//!   checkpoints keep transformers' `rotate_half` layout, so llama runs NeoX-paired RoPE.
//! - **Gemma norms.** transformers' Gemma RMSNorm scales by `1 + w`, and the converter stores
//!   `1 + w`: every Gemma norm vector gets its 1 added here.
//! - **Per-layer attention types.** Gemma 3's `layer_types` (`sliding_attention` /
//!   `full_attention`) set each layer's window and RoPE base (`rope_parameters` per type, or
//!   `rope_theta` / `rope_local_base_freq`); `query_pre_attn_scalar` sets the attention scale.
//! - **LFM2's FFN width.** transformers derives it from `intermediate_size` with
//!   `block_auto_adjust_ff_dim`; the width is read from `ffn_gate`'s rows instead.
//! - **End of generation.** `generation_config.json`'s `eos_token_id` (one or a list) joins the
//!   tokenizer's own end-of-generation ids.
//!
//! Weights: F32, F16 and BF16 matrices run as stored (the GPU's F16/BF16 GEMV and GEMM, the CPU's
//! exact widening); vectors are widened to f32. Other dtypes are [`EngineError::TensorType`]
//! naming the tensor.
//!
//! **AWQ and GPTQ int4** checkpoints (`quantization_config`): every linear stored as
//! `qweight`/`qzeros`/`scales` (GPTQ: and `g_idx`) is repacked into boostr's int4 layout and runs
//! through the int4 GEMV and GEMM; the rest (embedding, norms, an LM head kept in float) as
//! above. Q, K and V of a layer are concatenated by rows at upload like any same-format group,
//! so the fused projection is one int4 dispatch writing the packed `[q | k | v]` row. Supported:
//! 4 bits; AWQ's `gemm` layout (AutoAWQ's default); GPTQ v1 (`checkpoint_format` `gptq`, stored
//! zeros minus one) and v2 (`gptq_v2`) with a sequential `g_idx`; group sizes that are
//! multiples of 32 dividing the inputs (32, 64, 128, ...); F16 scales. Anything else is a typed
//! error naming it: other bit widths, act-order (`desc_act`, a permuted `g_idx`), AWQ's `gemv`,
//! `gemv_fast` and `exllama` layouts, GPTQ's `marlin` and other packings, non-F16 scales.

use std::path::Path;

use boostr::formats::{AwqTensors, GptqTensors, GptqZeroOffset, PackedWeights};
use serde_json::Value;

use super::EngineError;
use super::arch::{FileFacts, build};
use super::config::{Arch, LayerRope, ModelConfig};
use super::graph::{MatRef, ModelGraph, VecRef};
use super::weights::{RawMat, StoredMat, WeightSource, f32_vec};
use crate::gguf::PerLayer;
use crate::model_file::{ModelError, TensorMeta, TensorSource};
use crate::safetensors::{QuantLinear, QuantMethod, SafeDType, SafetensorsModel};

/// A Hugging Face model folder, opened for the engine.
#[derive(Debug)]
pub struct HfModel {
    st: SafetensorsModel,
    arch: Arch,
    /// The int4 scheme of a quantized checkpoint.
    int4: Option<Int4>,
}

/// A supported AWQ/GPTQ checkpoint's scheme.
#[derive(Clone, Copy, Debug)]
enum Int4 {
    Awq,
    Gptq(GptqZeroOffset),
}

fn file_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::File { reason: e.to_string() }
}

/// A float of `v` at `key`, or inside `rope_parameters` (transformers 5), or inside
/// `rope_parameters[kind]` (Gemma 3's per-layer-type parameters).
fn rope_base(v: &Value, kind: &str, legacy: &str) -> Option<f32> {
    let rp = v.get("rope_parameters");
    let from = |o: Option<&Value>| o.and_then(|o| o.get("rope_theta")).and_then(Value::as_f64);
    from(rp.and_then(|r| r.get(kind))).or_else(|| from(rp)).or_else(|| v.get(legacy).and_then(Value::as_f64)).map(|x| x as f32)
}

impl HfModel {
    /// Opens a model folder (or a safetensors file or index with `config.json` beside it).
    pub fn open(path: &Path) -> Result<HfModel, EngineError> {
        let st = SafetensorsModel::open(path).map_err(file_err)?;
        HfModel::new(st)
    }

    /// The engine's view of an open safetensors model.
    pub fn new(st: SafetensorsModel) -> Result<HfModel, EngineError> {
        let cfg = st.config().ok_or_else(|| EngineError::MissingKey { key: "config.json".into() })?;
        let arch = Arch::from_name(&cfg.architecture).map_err(|_| EngineError::UnknownArchitecture { name: cfg.model_type.clone() })?;
        let int4 = match &cfg.quantization {
            None => None,
            Some(q) => {
                let raw = cfg.raw.get("quantization_config").cloned().unwrap_or_default();
                let key = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_ascii_lowercase);
                let unsupported = |what: String| Err(EngineError::Unsupported { what: format!("quantization_config: {what}") });
                if q.bits != 4 {
                    return unsupported(format!("{}-bit {:?} weights (4-bit only)", q.bits, q.method));
                }
                Some(match q.method {
                    QuantMethod::Awq => match key("version").as_deref() {
                        None | Some("gemm") => Int4::Awq,
                        Some(v) => return unsupported(format!("AWQ version `{v}` (the `gemm` layout only)")),
                    },
                    QuantMethod::Gptq => {
                        if q.desc_act {
                            return unsupported("GPTQ act-order (desc_act = true)".into());
                        }
                        let fmt = key("checkpoint_format").or_else(|| key("format"));
                        match fmt.as_deref() {
                            None | Some("gptq") => Int4::Gptq(GptqZeroOffset::V1PlusOne),
                            Some("gptq_v2") => Int4::Gptq(GptqZeroOffset::V2AsStored),
                            Some(f) => return unsupported(format!("GPTQ checkpoint_format `{f}` (gptq or gptq_v2 only)")),
                        }
                    }
                })
            }
        };
        Ok(HfModel { st, arch, int4 })
    }

    /// The safetensors model.
    pub fn safetensors(&self) -> &SafetensorsModel {
        &self.st
    }

    /// The graph: `config.json` resolved as a GGUF file's metadata would be (see the module
    /// docs for what differs).
    pub fn graph(&self) -> Result<ModelGraph, EngineError> {
        let cfg = self.st.config().ok_or_else(|| EngineError::MissingKey { key: "config.json".into() })?;
        let raw = &cfg.raw;
        let mut hp = cfg.hparams.clone();
        hp.architecture = self.arch.name().to_string();
        if let Some(b) = rope_base(raw, "full_attention", "rope_theta") {
            hp.rope_freq_base = Some(b);
        }
        if let Some(t) = self.st.tensor("blk.0.ffn_gate.weight") {
            hp.feed_forward_length = t.shape.first().map(|&r| PerLayer::Uniform(r as u32));
        }
        // Only Mistral-style models slide every layer; Qwen's configs carry an unused window.
        if raw.get("use_sliding_window").and_then(Value::as_bool) == Some(false) || self.arch == Arch::Gemma3 {
            hp.sliding_window = None;
        }
        let rows = self.st.tensor("token_embd.weight").and_then(|t| t.shape.first()).map(|&r| r as usize);
        let mut c = ModelConfig::from_hparams(&hp, rows)?;
        if self.arch == Arch::Gemma3 {
            self.gemma3_layers(raw, &mut c)?;
        }
        let facts = FileFacts {
            has_output: self.st.tensor("output.weight").is_some(),
            has_rope_freqs: false,
            has_token_embd_norm: self.st.tensor("token_embd_norm.weight").is_some(),
            neox_rope: true,
        };
        Ok(build(&c, &facts))
    }

    /// Gemma 3's per-layer windows and RoPE bases from `layer_types`, and its attention scale.
    fn gemma3_layers(&self, raw: &Value, c: &mut ModelConfig) -> Result<(), EngineError> {
        let window = raw.get("sliding_window").and_then(Value::as_u64).map(|w| w as usize);
        let global = rope_base(raw, "full_attention", "rope_theta").unwrap_or(1_000_000.0);
        let local = rope_base(raw, "sliding_attention", "rope_local_base_freq").unwrap_or(10_000.0);
        if let Some(types) = raw.get("layer_types").and_then(Value::as_array) {
            if types.len() != c.n_layers {
                return Err(EngineError::BadConfig { reason: format!("{} layer_types for {} layers", types.len(), c.n_layers) });
            }
            for (l, t) in types.iter().enumerate() {
                let sliding = match t.as_str() {
                    Some("sliding_attention") => true,
                    Some("full_attention") => false,
                    other => return Err(EngineError::Unsupported { what: format!("layer_types[{l}] = {other:?}") }),
                };
                c.window[l] = if sliding { Some(window.unwrap_or(512)) } else { None };
                c.rope[l] = LayerRope { base: if sliding { local } else { global }, linear_factor: c.rope[l].linear_factor };
            }
        } else {
            for l in 0..c.n_layers {
                c.rope[l].base = if c.window[l].is_some() { local } else { global };
                if c.window[l].is_some() {
                    c.window[l] = window.or(c.window[l]);
                }
            }
        }
        if let Some(s) = raw.get("query_pre_attn_scalar").and_then(Value::as_f64) {
            c.attn_scale = (s as f32).powf(-0.5);
        }
        Ok(())
    }

    /// `generation_config.json`'s `eos_token_id` (none when the file or the key is absent).
    pub fn generation_eos(&self) -> Result<Vec<u32>, EngineError> {
        let p = self.st.dir().join("generation_config.json");
        let bytes = match std::fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(file_err(format!("{}: {e}", p.display()))),
        };
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| file_err(format!("{}: {e}", p.display())))?;
        let ids = match v.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
            Some(x) => x.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        };
        Ok(ids)
    }

    /// The int4 tensors of `m` (`blk.0.attn_q` + `.qweight`, ...) with the scheme and group
    /// size, when the checkpoint stores it so, checked against `m`'s shape.
    fn int4_linear(&self, m: &MatRef) -> Result<Option<(QuantLinear<'_>, Int4, usize)>, EngineError> {
        let (Some(scheme), Some(base)) = (self.int4, m.name.strip_suffix(".weight")) else { return Ok(None) };
        if self.st.tensor(&format!("{base}.qweight")).is_none() {
            return Ok(None);
        }
        let q = self.st.quant_linear(base).map_err(file_err)?;
        if (q.out_features, q.in_features) != (m.rows as u64, m.cols as u64) {
            return Err(EngineError::TensorShape {
                name: format!("{base}.qweight"),
                dims: vec![q.in_features, q.out_features],
                expected: vec![m.cols as u64, m.rows as u64],
            });
        }
        if q.scales_dtype != SafeDType::F16 {
            return Err(EngineError::TensorType { name: format!("{base}.scales"), ty: format!("{} (int4 scales must be F16)", q.scales_dtype.name()) });
        }
        let group = q.config.group_size.map_or(m.cols, |g| g as usize);
        Ok(Some((q, scheme, group)))
    }

    /// `m` repacked from its int4 tensors (see [`Self::int4_linear`]).
    fn int4_packed(&self, m: &MatRef, q: &QuantLinear<'_>, scheme: Int4, group_size: usize) -> Result<PackedWeights, EngineError> {
        let (k, n) = (m.cols, m.rows);
        match scheme {
            Int4::Awq => AwqTensors { qweight: q.qweight, qzeros: q.qzeros, scales: q.scales, in_features: k, out_features: n, group_size }.repack(),
            Int4::Gptq(zero_offset) => {
                GptqTensors { qweight: q.qweight, qzeros: q.qzeros, scales: q.scales, g_idx: q.g_idx, in_features: k, out_features: n, group_size, zero_offset }
                    .repack()
            }
        }
        .map_err(|e| EngineError::Unsupported { what: format!("tensor {}: {e}", m.name) })
    }
}

impl WeightSource for HfModel {
    fn packed(&self, m: &MatRef) -> Result<PackedWeights, EngineError> {
        match self.int4_linear(m)? {
            Some((q, scheme, group)) => self.int4_packed(m, &q, scheme, group),
            None => self.mat(m)?.packed(),
        }
    }

    fn file_rows<'a>(&'a self, m: &'a MatRef) -> Result<Option<RawMat<'a>>, EngineError> {
        match self.int4_linear(m)? {
            Some(_) => Ok(None),
            None => self.mat(m).map(Some),
        }
    }

    fn stored(&self, m: &MatRef) -> Result<StoredMat, EngineError> {
        match self.int4_linear(m)? {
            Some((q, scheme, _)) => {
                let format = match scheme {
                    Int4::Awq => "AWQ",
                    Int4::Gptq(_) => "GPTQ",
                };
                Ok(StoredMat { bytes: (q.qweight.len() + q.qzeros.len() + q.scales.len()) as u64, format: format.into() })
            }
            None => {
                let raw = self.mat(m)?;
                Ok(StoredMat { bytes: raw.bytes.len() as u64, format: raw.ty.name().to_string() })
            }
        }
    }

    fn vec(&self, v: &VecRef) -> Result<Vec<f32>, EngineError> {
        let mut x = f32_vec(self, v)?;
        if self.arch == Arch::Gemma3 && v.name.contains("norm") {
            x.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(x)
    }
}

/// The safetensors model's tensors, under their internal names.
impl TensorSource for HfModel {
    fn tensor_names(&self) -> Vec<&str> {
        TensorSource::tensor_names(&self.st)
    }
    fn tensor_meta(&self, name: &str) -> Option<TensorMeta> {
        self.st.tensor_meta(name)
    }
    fn tensor_data(&self, name: &str) -> Result<&[u8], ModelError> {
        TensorSource::tensor_data(&self.st, name)
    }
}

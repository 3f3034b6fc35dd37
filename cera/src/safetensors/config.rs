//! Hugging Face `config.json`: the architecture hyperparameters of a safetensors model, and
//! its AWQ/GPTQ `quantization_config`.

use serde_json::Value;

use super::error::SafetensorsError;
use crate::gguf::{HyperParams, PerLayer};

/// How the weights are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantMethod {
    /// AWQ: `qweight` is `[in, out/pack]` (I32), `qzeros` `[in/group, out/pack]`, `scales`
    /// `[in/group, out]`.
    Awq,
    /// GPTQ: `qweight` is `[in/pack, out]` (I32), `qzeros` `[in/group, out/pack]`, `scales`
    /// `[in/group, out]`, optional `g_idx` `[in]` (I32).
    Gptq,
}

/// `quantization_config` of an AWQ or GPTQ checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuantConfig {
    /// AWQ or GPTQ.
    pub method: QuantMethod,
    /// Bits per weight (4 is what cera runs).
    pub bits: u32,
    /// Input rows per scale/zero group (`-1` in the file becomes the whole input).
    pub group_size: Option<u32>,
    /// GPTQ act-order (`desc_act`): rows are permuted by `g_idx`.
    pub desc_act: bool,
}

impl QuantConfig {
    /// Values packed in one I32.
    pub fn pack_factor(&self) -> u32 {
        32 / self.bits.max(1)
    }
}

/// The parts of `config.json` cera uses; [`HfConfig::raw`] has the rest.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HfConfig {
    /// `model_type` (e.g. `llama`, `qwen3`, `gemma3_text`, `lfm2`).
    pub model_type: String,
    /// The internal architecture name (`gemma3_text` -> `gemma3`, ...).
    pub architecture: String,
    /// Hyperparameters in the same form a GGUF file gives.
    pub hparams: HyperParams,
    /// Whether the output projection reuses the embedding.
    pub tie_word_embeddings: bool,
    /// AWQ/GPTQ settings, if the checkpoint is quantized.
    pub quantization: Option<QuantConfig>,
    /// The whole (text) config.
    pub raw: Value,
}

fn err(msg: impl Into<String>) -> SafetensorsError {
    SafetensorsError::InvalidConfig(msg.into())
}

fn u32_field(v: &Value, key: &str) -> Result<Option<u32>, SafetensorsError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| err(format!("`{key}` is not a u32"))),
    }
}

fn f32_field(v: &Value, key: &str) -> Result<Option<f32>, SafetensorsError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(|f| Some(f as f32)).ok_or_else(|| err(format!("`{key}` is not a number"))),
    }
}

fn required(v: &Value, key: &str) -> Result<u32, SafetensorsError> {
    u32_field(v, key)?.ok_or_else(|| err(format!("`{key}` is missing")))
}

/// The internal architecture name for a `model_type`.
pub fn architecture_of(model_type: &str) -> &str {
    match model_type {
        "gemma3_text" | "gemma3" => "gemma3",
        "gemma2" => "gemma2",
        "mistral" => "llama",
        other => other,
    }
}

impl HfConfig {
    /// Parses `config.json`. Multimodal configs with a `text_config` use that part.
    pub fn parse(bytes: &[u8]) -> Result<HfConfig, SafetensorsError> {
        let root: Value = serde_json::from_slice(bytes).map_err(|e| err(e.to_string()))?;
        if !root.is_object() {
            return Err(err("not a JSON object"));
        }
        let quantization = root.get("quantization_config").map(parse_quant).transpose()?.flatten();
        let v = match root.get("text_config") {
            Some(t) if t.is_object() => t.clone(),
            _ => root.clone(),
        };
        let model_type =
            v.get("model_type").or_else(|| root.get("model_type")).and_then(Value::as_str).ok_or_else(|| err("`model_type` is missing"))?.to_string();
        let architecture = architecture_of(&model_type).to_string();
        let hidden = required(&v, "hidden_size")?;
        let layers = required(&v, "num_hidden_layers")?;
        let heads = required(&v, "num_attention_heads")?;
        let mut hp = HyperParams::new(architecture.clone(), hidden, layers, heads);
        hp.head_count_kv = PerLayer::Uniform(u32_field(&v, "num_key_value_heads")?.unwrap_or(heads));
        if let Some(d) = u32_field(&v, "head_dim")? {
            hp.key_length = d;
            hp.value_length = d;
        }
        hp.context_length = u32_field(&v, "max_position_embeddings")?.unwrap_or(0);
        hp.feed_forward_length = u32_field(&v, "intermediate_size")?.or(u32_field(&v, "block_ff_dim")?).map(PerLayer::Uniform);
        hp.rope_freq_base = f32_field(&v, "rope_theta")?;
        hp.rms_norm_eps = f32_field(&v, "rms_norm_eps")?.or(f32_field(&v, "norm_eps")?);
        hp.vocab_size = u32_field(&v, "vocab_size")?;
        hp.sliding_window = u32_field(&v, "sliding_window")?;
        hp.shortconv_l_cache = u32_field(&v, "conv_L_cache")?;
        hp.final_logit_softcapping = f32_field(&v, "final_logit_softcapping")?;
        hp.attn_logit_softcapping = f32_field(&v, "attn_logit_softcapping")?;
        // LFM2 lists which layers are attention (`layer_types`, or the older `full_attn_idxs`);
        // the others are convolutions (no KV heads).
        if architecture == "lfm2" {
            let kv = hp.head_count_kv.max();
            if let Some(types) = v.get("layer_types").and_then(Value::as_array) {
                let per = types.iter().map(|t| if t.as_str() == Some("full_attention") { kv } else { 0 }).collect();
                hp.head_count_kv = PerLayer::Layers(per);
            } else if let Some(idx) = v.get("full_attn_idxs").and_then(Value::as_array) {
                let idx: Vec<u64> = idx.iter().filter_map(Value::as_u64).collect();
                hp.head_count_kv = PerLayer::Layers((0..layers as u64).map(|l| if idx.contains(&l) { kv } else { 0 }).collect());
            }
        }
        let tie = v.get("tie_word_embeddings").or_else(|| root.get("tie_word_embeddings")).and_then(Value::as_bool).unwrap_or(false);
        Ok(HfConfig { model_type, architecture, hparams: hp, tie_word_embeddings: tie, quantization, raw: v })
    }
}

fn parse_quant(q: &Value) -> Result<Option<QuantConfig>, SafetensorsError> {
    let method = match q.get("quant_method").and_then(Value::as_str) {
        Some("awq") => QuantMethod::Awq,
        Some("gptq") => QuantMethod::Gptq,
        _ => return Ok(None),
    };
    let bits = u32_field(q, "bits")?.or(u32_field(q, "w_bit")?).unwrap_or(4);
    if !matches!(bits, 2 | 3 | 4 | 8) {
        return Err(err(format!("quantization bits {bits} is not supported")));
    }
    let group = q.get("group_size").or_else(|| q.get("q_group_size")).and_then(Value::as_i64);
    let group_size = match group {
        None | Some(-1) => None,
        Some(g) if g > 0 && g <= u32::MAX as i64 => Some(g as u32),
        Some(g) => return Err(err(format!("group_size {g} is invalid"))),
    };
    let desc_act = q.get("desc_act").and_then(Value::as_bool).unwrap_or(false);
    Ok(Some(QuantConfig { method, bits, group_size, desc_act }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_and_lfm2_configs() {
        let c = HfConfig::parse(
            br#"{"model_type":"llama","hidden_size":576,"num_hidden_layers":30,"num_attention_heads":9,
                "num_key_value_heads":3,"intermediate_size":1536,"rope_theta":100000.0,"rms_norm_eps":1e-5,
                "vocab_size":49152,"tie_word_embeddings":true,
                "quantization_config":{"quant_method":"awq","bits":4,"group_size":128}}"#,
        )
        .unwrap();
        assert_eq!(c.hparams.key_length, 64);
        assert_eq!(c.hparams.head_count_kv, PerLayer::Uniform(3));
        assert!(c.tie_word_embeddings);
        let q = c.quantization.unwrap();
        assert_eq!((q.method, q.bits, q.group_size, q.pack_factor()), (QuantMethod::Awq, 4, Some(128), 8));
        let l = HfConfig::parse(
            br#"{"model_type":"lfm2","hidden_size":1024,"num_hidden_layers":3,"num_attention_heads":16,
                "num_key_value_heads":8,"layer_types":["conv","full_attention","conv"],"conv_L_cache":3}"#,
        )
        .unwrap();
        assert_eq!(l.hparams.head_count_kv, PerLayer::Layers(vec![0, 8, 0]));
        let old = HfConfig::parse(
            br#"{"model_type":"lfm2","hidden_size":1024,"num_hidden_layers":4,"num_attention_heads":16,
                "num_key_value_heads":8,"full_attn_idxs":[1,3]}"#,
        )
        .unwrap();
        assert_eq!(old.hparams.head_count_kv, PerLayer::Layers(vec![0, 8, 0, 8]));
        assert!(HfConfig::parse(b"[1]").is_err());
        assert!(HfConfig::parse(br#"{"model_type":"llama"}"#).unwrap_err().to_string().contains("hidden_size"));
    }
}

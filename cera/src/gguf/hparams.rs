//! Architecture hyperparameters, read from the `{arch}.*` metadata keys that llama.cpp defines.

use super::error::MetadataError;
use super::metadata::{Metadata, MetadataValue};

/// A value that is either the same for every layer or given per layer (LFM2 stores
/// `attention.head_count_kv` per layer, 0 for its convolution blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerLayer<T> {
    /// One value for every layer.
    Uniform(T),
    /// One value per layer.
    Layers(Vec<T>),
}

impl<T: Copy + Ord + Default> PerLayer<T> {
    /// The value for `layer` (the default value for a layer past the end of a per-layer list).
    pub fn get(&self, layer: usize) -> T {
        match self {
            PerLayer::Uniform(v) => *v,
            PerLayer::Layers(v) => v.get(layer).copied().unwrap_or_default(),
        }
    }

    /// The largest value over all layers.
    pub fn max(&self) -> T {
        match self {
            PerLayer::Uniform(v) => *v,
            PerLayer::Layers(v) => v.iter().copied().max().unwrap_or_default(),
        }
    }
}

impl<T: std::fmt::Display> std::fmt::Display for PerLayer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PerLayer::Uniform(v) => write!(f, "{v}"),
            PerLayer::Layers(v) => {
                f.write_str("[")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// The hyperparameters shared by the transformer architectures cera runs.
///
/// Required keys are `general.architecture`, `{arch}.embedding_length`, `{arch}.block_count` and
/// `{arch}.attention.head_count`; the rest are optional or have llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HyperParams {
    /// `general.architecture`, e.g. `llama`, `qwen3`, `gemma3`, `lfm2`.
    pub architecture: String,
    /// `{arch}.embedding_length`: the hidden size.
    pub embedding_length: u32,
    /// `{arch}.block_count`: the number of layers.
    pub block_count: u32,
    /// `{arch}.context_length`: the trained context (0 if absent).
    pub context_length: u32,
    /// `{arch}.attention.head_count` (the largest, if given per layer).
    pub head_count: u32,
    /// `{arch}.attention.head_count_kv` (defaults to `head_count`).
    pub head_count_kv: PerLayer<u32>,
    /// `{arch}.feed_forward_length`.
    pub feed_forward_length: Option<PerLayer<u32>>,
    /// `{arch}.attention.key_length` (defaults to `embedding_length / head_count`).
    pub key_length: u32,
    /// `{arch}.attention.value_length` (defaults to `key_length`'s default).
    pub value_length: u32,
    /// `{arch}.rope.freq_base`.
    pub rope_freq_base: Option<f32>,
    /// `{arch}.rope.dimension_count`.
    pub rope_dimension_count: Option<u32>,
    /// `{arch}.rope.scaling.type`.
    pub rope_scaling_type: Option<String>,
    /// `{arch}.rope.scaling.factor`.
    pub rope_scaling_factor: Option<f32>,
    /// `{arch}.attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: Option<f32>,
    /// `{arch}.attention.layer_norm_epsilon`.
    pub layer_norm_eps: Option<f32>,
    /// `{arch}.attention.sliding_window`.
    pub sliding_window: Option<u32>,
    /// `{arch}.vocab_size`, or the length of `tokenizer.ggml.tokens`.
    pub vocab_size: Option<u32>,
    /// `{arch}.expert_count`.
    pub expert_count: Option<u32>,
    /// `{arch}.expert_used_count`.
    pub expert_used_count: Option<u32>,
    /// `{arch}.shortconv.l_cache` (LFM2's convolution length).
    pub shortconv_l_cache: Option<u32>,
    /// `{arch}.attn_logit_softcapping`.
    pub attn_logit_softcapping: Option<f32>,
    /// `{arch}.final_logit_softcapping`.
    pub final_logit_softcapping: Option<f32>,
}

fn per_layer(md: &Metadata, key: &str) -> Result<Option<PerLayer<u32>>, MetadataError> {
    match md.get(key) {
        None => Ok(None),
        Some(MetadataValue::Array(a)) => {
            let wrong =
                || MetadataError::WrongType { key: key.to_string(), expected: "u32 or array of u32", found: format!("array of {}", a.element_type().name()) };
            let v = a.to_i64_vec().ok_or_else(wrong)?;
            let v = v.into_iter().map(|x| u32::try_from(x).map_err(|_| wrong())).collect::<Result<_, _>>()?;
            Ok(Some(PerLayer::Layers(v)))
        }
        Some(_) => md.get_u32(key).map(|v| Some(PerLayer::Uniform(v))),
    }
}

impl HyperParams {
    /// Reads the hyperparameters of the file's `general.architecture`.
    pub fn from_metadata(md: &Metadata) -> Result<HyperParams, MetadataError> {
        let arch = md.get_str("general.architecture")?.to_string();
        let k = |suffix: &str| format!("{arch}.{suffix}");
        let embedding_length = md.get_u32(&k("embedding_length"))?;
        let block_count = md.get_u32(&k("block_count"))?;
        let head_key = k("attention.head_count");
        let head_count = per_layer(md, &head_key)?.ok_or(MetadataError::Missing { key: head_key.clone() })?.max();
        let head_count_kv = per_layer(md, &k("attention.head_count_kv"))?.unwrap_or(PerLayer::Uniform(head_count));
        let default_head_dim = embedding_length.checked_div(head_count).unwrap_or(0);
        let opt_u32 = |s: &str| md.optional(&k(s), Metadata::get_u32);
        let opt_f32 = |s: &str| md.optional(&k(s), Metadata::get_f32);
        let vocab_size = match opt_u32("vocab_size")? {
            Some(v) => Some(v),
            None => md.get_string_array("tokenizer.ggml.tokens").ok().map(|t| t.len() as u32),
        };
        Ok(HyperParams {
            embedding_length,
            block_count,
            context_length: opt_u32("context_length")?.unwrap_or(0),
            head_count,
            head_count_kv,
            feed_forward_length: per_layer(md, &k("feed_forward_length"))?,
            key_length: opt_u32("attention.key_length")?.unwrap_or(default_head_dim),
            value_length: opt_u32("attention.value_length")?.unwrap_or(default_head_dim),
            rope_freq_base: opt_f32("rope.freq_base")?,
            rope_dimension_count: opt_u32("rope.dimension_count")?,
            rope_scaling_type: md.optional(&k("rope.scaling.type"), Metadata::get_str)?.map(str::to_string),
            rope_scaling_factor: opt_f32("rope.scaling.factor")?,
            rms_norm_eps: opt_f32("attention.layer_norm_rms_epsilon")?,
            layer_norm_eps: opt_f32("attention.layer_norm_epsilon")?,
            sliding_window: opt_u32("attention.sliding_window")?,
            vocab_size,
            expert_count: opt_u32("expert_count")?,
            expert_used_count: opt_u32("expert_used_count")?,
            shortconv_l_cache: opt_u32("shortconv.l_cache")?,
            attn_logit_softcapping: opt_f32("attn_logit_softcapping")?,
            final_logit_softcapping: opt_f32("final_logit_softcapping")?,
            architecture: arch,
        })
    }

    /// Builds hyperparameters by hand (used by the safetensors `config.json` reader).
    pub fn new(architecture: String, embedding_length: u32, block_count: u32, head_count: u32) -> HyperParams {
        let head_dim = embedding_length.checked_div(head_count).unwrap_or(0);
        HyperParams {
            architecture,
            embedding_length,
            block_count,
            context_length: 0,
            head_count,
            head_count_kv: PerLayer::Uniform(head_count),
            feed_forward_length: None,
            key_length: head_dim,
            value_length: head_dim,
            rope_freq_base: None,
            rope_dimension_count: None,
            rope_scaling_type: None,
            rope_scaling_factor: None,
            rms_norm_eps: None,
            layer_norm_eps: None,
            sliding_window: None,
            vocab_size: None,
            expert_count: None,
            expert_used_count: None,
            shortconv_l_cache: None,
            attn_logit_softcapping: None,
            final_logit_softcapping: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::MetadataArray;

    #[test]
    fn defaults_and_per_layer() {
        let mut md = Metadata::default();
        md.insert("general.architecture".into(), MetadataValue::String("lfm2".into()));
        md.insert("lfm2.embedding_length".into(), MetadataValue::U32(1024));
        md.insert("lfm2.block_count".into(), MetadataValue::U32(3));
        md.insert("lfm2.attention.head_count".into(), MetadataValue::U32(16));
        md.insert("lfm2.attention.head_count_kv".into(), MetadataValue::Array(MetadataArray::U32(vec![0, 8, 0])));
        let hp = HyperParams::from_metadata(&md).unwrap();
        assert_eq!(hp.key_length, 64);
        assert_eq!(hp.head_count_kv.get(1), 8);
        assert_eq!(hp.head_count_kv.get(0), 0);
        assert_eq!(hp.head_count_kv.max(), 8);
        assert_eq!(hp.rope_freq_base, None);
        md.insert("general.x".into(), MetadataValue::U8(0));
        let mut md2 = Metadata::default();
        md2.insert("general.architecture".into(), MetadataValue::String("llama".into()));
        let e = HyperParams::from_metadata(&md2).unwrap_err();
        assert!(e.to_string().contains("llama.embedding_length"), "{e}");
    }
}

//! The resolved model configuration: every hyperparameter the assembly needs, read from the
//! file's metadata, with each architecture's published default where the metadata lacks one.
//!
//! Defaults (used only when the key is absent; each is the value the architecture's reference
//! implementation uses):
//! - RMSNorm epsilon: llama and lfm2 1e-5, gemma3, qwen2 and qwen3 1e-6.
//! - RoPE base: llama 10000, qwen2, qwen3 and lfm2 1000000, gemma3 1000000 for global layers; gemma3's
//!   sliding-window layers always use 10000 (llama.cpp and transformers hard-code it as
//!   `rope_local_base_freq`).
//! - RoPE dimensions: the head dimension.
//! - gemma3 sliding window: 512; one global layer every 6 (layers `5, 11, 17, ...` are global).
//! - Context: the file's `{arch}.context_length`, else 4096 (llama) / 32768 (gemma3, qwen2) /
//!   40960 (qwen3) / 128000 (lfm2).
//! - lfm2: a layer whose `attention.head_count_kv` entry is 0 is a short-conv block; the conv
//!   has `shortconv.l_cache` taps (default 3).

use crate::gguf::HyperParams;

use super::EngineError;

/// The architectures the assembly runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Arch {
    /// Llama, Llama 3.x, Mistral, SmolLM2 (`general.architecture = llama`).
    Llama,
    /// Gemma 3 (`gemma3`).
    Gemma3,
    /// Qwen2 and Qwen2.5 (`qwen2`): llama's block with Q/K/V biases and NeoX RoPE.
    Qwen2,
    /// Qwen3 dense models (`qwen3`): llama's block with per-head QK-norm and NeoX RoPE.
    Qwen3,
    /// Liquid LFM2 (`lfm2`): gated short-conv blocks interleaved with QK-normed GQA blocks.
    Lfm2,
}

/// What mixes the tokens in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Causal self-attention over the layer's KV cache.
    Attention,
    /// LFM2's gated short convolution over a rolling state.
    ShortConv,
}

impl Arch {
    /// Every architecture the assembly runs: the one list [`Arch::from_name`],
    /// [`EngineError::UnknownArchitecture`]'s message and xtask's `--arch` are made from.
    pub const ALL: [Arch; 5] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Lfm2];

    /// The architecture of a `general.architecture` value (a GGUF file's, a Hugging Face
    /// `model_type` mapped by [`crate::safetensors::architecture_of`], a command line's: one of
    /// [`Arch::ALL`]'s names, or `mistral` for llama), or [`EngineError::UnknownArchitecture`].
    pub fn from_name(name: &str) -> Result<Arch, EngineError> {
        if name == "mistral" {
            return Ok(Arch::Llama);
        }
        Arch::ALL.into_iter().find(|a| a.name() == name).ok_or_else(|| EngineError::UnknownArchitecture { name: name.to_string() })
    }

    /// The `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Lfm2 => "lfm2",
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// [`Arch::from_name`], for command lines.
impl std::str::FromStr for Arch {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Arch, EngineError> {
        Arch::from_name(s)
    }
}

/// The FFN's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateAct {
    /// `silu(gate) * up` (llama).
    Silu,
    /// `gelu_tanh(gate) * up` (gemma3).
    GeluTanh,
}

/// Rotary embedding of one layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerRope {
    /// The base of the inverse frequencies.
    pub base: f32,
    /// Linear position scaling factor (1 = none).
    pub linear_factor: f32,
}

/// Everything the assembly needs about the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub arch: Arch,
    /// Decoder blocks.
    pub n_layers: usize,
    /// Hidden size.
    pub dim: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// FFN hidden size.
    pub ffn_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f32,
    /// Rotated dimensions per head.
    pub rope_dim: usize,
    /// Per layer: RoPE base and scaling.
    pub rope: Vec<LayerRope>,
    /// Per layer: the sliding window (`None` for global attention).
    pub window: Vec<Option<usize>>,
    /// The model's trained context.
    pub context_length: usize,
    /// Multiplier of the embedding rows (gemma3: `sqrt(dim)`).
    pub embed_scale: f32,
    /// The FFN's gate activation.
    pub gate_act: GateAct,
    /// Per-head RMSNorm of q and k before RoPE (gemma3, qwen3).
    pub qk_norm: bool,
    /// RMSNorm after attention and after the FFN, before the residual add (gemma3).
    pub post_norms: bool,
    /// Attention scale (`1 / sqrt(head_dim)` unless the architecture says otherwise).
    pub attn_scale: f32,
    /// `cap * tanh(logit / cap)` on the final logits.
    pub final_softcap: Option<f32>,
    /// `cap * tanh(score / cap)` on attention scores.
    pub attn_softcap: Option<f32>,
    /// Per layer: attention or short conv (lfm2); attention everywhere else.
    pub kinds: Vec<LayerKind>,
    /// Taps of the short convolutions (0 without any).
    pub conv_kernel: usize,
}

fn need(v: Option<u32>, key: &str, arch: &str) -> Result<usize, EngineError> {
    v.map(|x| x as usize).ok_or_else(|| EngineError::MissingKey { key: format!("{arch}.{key}") })
}

impl ModelConfig {
    /// Resolves the configuration from the file's hyperparameters (see the module docs for the
    /// defaults). `vocab` is the token-embedding row count when the metadata has no vocab size.
    pub fn from_hparams(hp: &HyperParams, vocab_rows: Option<usize>) -> Result<ModelConfig, EngineError> {
        let arch = Arch::from_name(&hp.architecture)?;
        let a = hp.architecture.as_str();
        let n_layers = hp.block_count as usize;
        let dim = hp.embedding_length as usize;
        let n_heads = hp.head_count as usize;
        if n_layers == 0 || dim == 0 || n_heads == 0 {
            return Err(EngineError::BadConfig { reason: format!("{a}: {n_layers} layers, dim {dim}, {n_heads} heads") });
        }
        let n_kv_heads = hp.head_count_kv.max() as usize;
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(EngineError::BadConfig { reason: format!("{a}: {n_heads} heads over {n_kv_heads} KV heads") });
        }
        // LFM2's conv blocks have no KV heads; every attention layer has the same number.
        let kinds: Vec<LayerKind> =
            (0..n_layers).map(|l| if arch == Arch::Lfm2 && hp.head_count_kv.get(l) == 0 { LayerKind::ShortConv } else { LayerKind::Attention }).collect();
        if (0..n_layers).any(|l| kinds[l] == LayerKind::Attention && hp.head_count_kv.get(l) as usize != n_kv_heads) {
            return Err(EngineError::BadConfig { reason: format!("{a}: per-layer KV head counts {} (not supported for this architecture)", hp.head_count_kv) });
        }
        let conv_kernel = if kinds.contains(&LayerKind::ShortConv) { hp.shortconv_l_cache.unwrap_or(3) as usize } else { 0 };
        if conv_kernel != 0 && !(2..=boostr::conv::MAX_CONV_KERNEL as usize).contains(&conv_kernel) {
            return Err(EngineError::Unsupported { what: format!("{a}.shortconv.l_cache = {conv_kernel} (2 to {})", boostr::conv::MAX_CONV_KERNEL) });
        }
        let head_dim = hp.key_length as usize;
        if head_dim == 0 || hp.value_length != hp.key_length {
            return Err(EngineError::BadConfig { reason: format!("{a}: key length {} and value length {}", hp.key_length, hp.value_length) });
        }
        let ffn = hp.feed_forward_length.as_ref().map(|f| f.max());
        let ffn_dim = need(ffn, "feed_forward_length", a)?;
        let vocab = hp.vocab_size.map(|v| v as usize).or(vocab_rows).ok_or_else(|| EngineError::MissingKey { key: format!("{a}.vocab_size") })?;
        let rope_dim = hp.rope_dimension_count.map_or(head_dim, |d| d as usize);
        if rope_dim > head_dim || !rope_dim.is_multiple_of(2) {
            return Err(EngineError::BadConfig { reason: format!("{a}: rope dimension {rope_dim} for head dimension {head_dim}") });
        }
        let linear_factor = match hp.rope_scaling_type.as_deref() {
            None | Some("none") => 1.0,
            Some("linear") => hp.rope_scaling_factor.unwrap_or(1.0),
            Some(other) => return Err(EngineError::Unsupported { what: format!("{a}.rope.scaling.type = {other}") }),
        };
        let (eps_default, base_default, ctx_default) = match arch {
            Arch::Llama => (1e-5, 10_000.0, 4096),
            Arch::Gemma3 => (1e-6, 1_000_000.0, 32_768),
            Arch::Qwen2 => (1e-6, 1_000_000.0, 32_768),
            Arch::Qwen3 => (1e-6, 1_000_000.0, 40_960),
            Arch::Lfm2 => (1e-5, 1_000_000.0, 128_000),
        };
        let base = hp.rope_freq_base.unwrap_or(base_default);
        let mut rope = vec![LayerRope { base, linear_factor }; n_layers];
        let mut window = vec![None; n_layers];
        if arch == Arch::Gemma3 {
            let w = hp.sliding_window.unwrap_or(512) as usize;
            for l in 0..n_layers {
                if (l + 1) % 6 != 0 {
                    window[l] = Some(w);
                    rope[l] = LayerRope { base: 10_000.0, linear_factor: 1.0 };
                }
            }
        } else if let Some(w) = hp.sliding_window {
            window = vec![Some(w as usize); n_layers];
        }
        let gemma = arch == Arch::Gemma3;
        Ok(ModelConfig {
            arch,
            n_layers,
            dim,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab,
            norm_eps: hp.rms_norm_eps.unwrap_or(eps_default),
            rope_dim,
            rope,
            window,
            context_length: if hp.context_length > 0 { hp.context_length as usize } else { ctx_default },
            embed_scale: if gemma { (dim as f32).sqrt() } else { 1.0 },
            gate_act: if gemma { GateAct::GeluTanh } else { GateAct::Silu },
            qk_norm: gemma || matches!(arch, Arch::Qwen3 | Arch::Lfm2),
            post_norms: gemma,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            final_softcap: hp.final_logit_softcapping.filter(|&c| c > 0.0),
            attn_softcap: hp.attn_logit_softcapping.filter(|&c| c > 0.0),
            kinds,
            conv_kernel,
        })
    }

    /// Attention layers: the KV cache's layer count (cache index `i` is the `i`-th of them).
    pub fn kv_layers(&self) -> usize {
        self.kinds.iter().filter(|&&k| k == LayerKind::Attention).count()
    }

    /// Short-conv layers: the rolling states' count (state `i` is the `i`-th of them).
    pub fn conv_layers(&self) -> usize {
        self.kinds.iter().filter(|&&k| k == LayerKind::ShortConv).count()
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Elements of one token's q, k and v together.
    pub fn qkv_dim(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Metadata, MetadataValue};

    fn md(arch: &str, kv: &[(&str, MetadataValue)]) -> HyperParams {
        let mut m = Metadata::default();
        m.insert("general.architecture".into(), MetadataValue::String(arch.into()));
        for (k, v) in kv {
            m.insert(format!("{arch}.{k}"), v.clone());
        }
        HyperParams::from_metadata(&m).unwrap()
    }

    #[test]
    fn llama_defaults_and_metadata() {
        use MetadataValue::*;
        let hp = md(
            "llama",
            &[
                ("embedding_length", U32(576)),
                ("block_count", U32(30)),
                ("attention.head_count", U32(9)),
                ("attention.head_count_kv", U32(3)),
                ("feed_forward_length", U32(1536)),
                ("rope.freq_base", F32(100000.0)),
                ("context_length", U32(8192)),
            ],
        );
        let c = ModelConfig::from_hparams(&hp, Some(49152)).unwrap();
        assert_eq!((c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab), (30, 576, 9, 3, 64, 1536, 49152));
        assert_eq!((c.norm_eps, c.rope[0].base, c.rope_dim, c.context_length, c.group()), (1e-5, 100000.0, 64, 8192, 3));
        assert!(c.window.iter().all(Option::is_none) && !c.qk_norm && c.gate_act == GateAct::Silu && c.embed_scale == 1.0);
    }

    #[test]
    fn gemma3_sliding_window_pattern_and_local_base() {
        use MetadataValue::*;
        let hp = md(
            "gemma3",
            &[
                ("embedding_length", U32(640)),
                ("block_count", U32(18)),
                ("attention.head_count", U32(4)),
                ("attention.head_count_kv", U32(1)),
                ("attention.key_length", U32(256)),
                ("attention.value_length", U32(256)),
                ("feed_forward_length", U32(2048)),
                ("rope.freq_base", F32(1_000_000.0)),
                ("attention.sliding_window", U32(512)),
            ],
        );
        let c = ModelConfig::from_hparams(&hp, Some(262144)).unwrap();
        let global: Vec<usize> = (0..18).filter(|&l| c.window[l].is_none()).collect();
        assert_eq!(global, vec![5, 11, 17]);
        assert_eq!(c.rope[5].base, 1_000_000.0);
        assert_eq!(c.rope[0].base, 10_000.0);
        assert_eq!(c.window[0], Some(512));
        assert_eq!((c.norm_eps, c.context_length, c.head_dim), (1e-6, 32768, 256));
        assert!(c.qk_norm && c.post_norms && c.gate_act == GateAct::GeluTanh);
        assert!((c.embed_scale - 640f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn unknown_architecture_and_bad_shapes_are_typed_errors() {
        use MetadataValue::*;
        let hp = md("mamba", &[("embedding_length", U32(64)), ("block_count", U32(2)), ("attention.head_count", U32(2))]);
        assert!(matches!(ModelConfig::from_hparams(&hp, Some(10)), Err(EngineError::UnknownArchitecture { name }) if name == "mamba"));
        let hp = md("llama", &[("embedding_length", U32(64)), ("block_count", U32(2)), ("attention.head_count", U32(2))]);
        assert!(matches!(ModelConfig::from_hparams(&hp, Some(10)), Err(EngineError::MissingKey { key }) if key == "llama.feed_forward_length"));
        let hp = md(
            "llama",
            &[
                ("embedding_length", U32(64)),
                ("block_count", U32(2)),
                ("attention.head_count", U32(4)),
                ("attention.head_count_kv", U32(3)),
                ("feed_forward_length", U32(8)),
            ],
        );
        assert!(matches!(ModelConfig::from_hparams(&hp, Some(10)), Err(EngineError::BadConfig { .. })));
    }

    #[test]
    fn arch_names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_name(a.name()).unwrap(), a);
            assert_eq!(a.to_string().parse::<Arch>().unwrap(), a);
        }
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(names, ["llama", "qwen2", "qwen3", "gemma3", "lfm2"]);
        assert_eq!("mistral".parse::<Arch>().unwrap(), Arch::Llama);
        assert!(matches!("mamba".parse::<Arch>(), Err(EngineError::UnknownArchitecture { name }) if name == "mamba"));
    }
}

//! Model shapes: the published configurations the synthetic files imitate, and the
//! architecture that decides the tensor set and the metadata keys.

/// `general.architecture` of the file, which decides the tensor set, the metadata keys and the
/// tokenizer: the engine's own enum, so the two cannot disagree on names.
pub use cera::engine::Arch;

/// The shape of a model. The gemma3-only fields (window, global-layer period, local RoPE base)
/// are written only for `--arch gemma3`; `head_dim` is written as `key_length`/`value_length`
/// for both.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    /// The preset's name on the command line.
    pub name: &'static str,
    /// Hidden size.
    pub dim: u64,
    /// Decoder blocks.
    pub n_layers: u64,
    /// FFN hidden size.
    pub ffn: u64,
    /// Query heads.
    pub n_heads: u64,
    /// Key/value heads.
    pub n_kv_heads: u64,
    /// Elements per head (`dim / n_heads` for the llama presets).
    pub head_dim: u64,
    /// Vocabulary size (the tokenizer is built to exactly this many tokens).
    pub vocab: u64,
    /// RoPE base (of the global layers, for gemma3).
    pub rope_theta: f32,
    /// RoPE base of gemma3's sliding-window layers.
    pub rope_local_theta: f32,
    /// Trained context length.
    pub ctx: u64,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// The LM head is the token embedding (no `output.weight`).
    pub tied: bool,
    /// gemma3: the sliding window of the local layers.
    pub sliding_window: u64,
    /// gemma3: every `global_every`-th layer attends globally.
    pub global_every: u64,
    /// lfm2: the attention layers (the others are short-conv blocks); empty: the odd layers.
    pub attn_layers: &'static [u64],
}

/// Every preset name, for messages.
pub const NAMES: &[&str] = &["smol-135m", "llama-1b", "llama-8b", "llama-70b", "gemma3-270m", "qwen3-0.6b", "lfm2-1.2b", "tiny"];

impl Preset {
    /// The preset called `name`.
    pub fn by_name(name: &str) -> Result<Preset, String> {
        let base = Preset {
            name: "",
            dim: 0,
            n_layers: 0,
            ffn: 0,
            n_heads: 0,
            n_kv_heads: 0,
            head_dim: 0,
            vocab: 0,
            rope_theta: 10_000.0,
            rope_local_theta: 10_000.0,
            ctx: 4096,
            rms_eps: 1e-5,
            tied: true,
            sliding_window: 512,
            global_every: 6,
            attn_layers: &[],
        };
        let p = match name {
            // SmolLM2-135M.
            "smol-135m" => Preset {
                name: "smol-135m",
                dim: 576,
                n_layers: 30,
                ffn: 1536,
                n_heads: 9,
                n_kv_heads: 3,
                head_dim: 64,
                vocab: 49152,
                rope_theta: 100_000.0,
                ctx: 8192,
                ..base
            },
            // Llama-3.2-1B (Llama 3's 128256-token vocabulary).
            "llama-1b" => Preset {
                name: "llama-1b",
                dim: 2048,
                n_layers: 16,
                ffn: 8192,
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 64,
                vocab: 128_256,
                rope_theta: 500_000.0,
                ctx: 131_072,
                ..base
            },
            // Llama-3.1-8B's shapes and context (its RoPE scaling left out: llama.cpp caps a
            // slot at the file's context, and the speed tests run to 32K), untied output.
            "llama-8b" => Preset {
                name: "llama-8b",
                dim: 4096,
                n_layers: 32,
                ffn: 14336,
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 128,
                vocab: 128_256,
                rope_theta: 500_000.0,
                ctx: 131_072,
                tied: false,
                ..base
            },
            // Llama-3.1-70B's shapes (llama-8b's KV heads, head size, vocabulary, RoPE base and
            // context), untied output: about 40 GB in Q4_0, the model of the several-GPU split.
            "llama-70b" => Preset { name: "llama-70b", dim: 8192, n_layers: 80, ffn: 28672, n_heads: 64, ..Preset::by_name("llama-8b")? },
            // Gemma 3 270M.
            "gemma3-270m" => Preset {
                name: "gemma3-270m",
                dim: 640,
                n_layers: 18,
                ffn: 2048,
                n_heads: 4,
                n_kv_heads: 1,
                head_dim: 256,
                vocab: 262_144,
                rope_theta: 1_000_000.0,
                ctx: 32768,
                rms_eps: 1e-6,
                ..base
            },
            // Qwen3-0.6B: a head dimension of 128 over a hidden size of 1024, tied LM head.
            "qwen3-0.6b" => Preset {
                name: "qwen3-0.6b",
                dim: 1024,
                n_layers: 28,
                ffn: 3072,
                n_heads: 16,
                n_kv_heads: 8,
                head_dim: 128,
                vocab: 151_936,
                rope_theta: 1_000_000.0,
                ctx: 40_960,
                rms_eps: 1e-6,
                ..base
            },
            // LFM2-1.2B: 10 short-conv blocks and 6 attention blocks, a 65536-token vocabulary.
            "lfm2-1.2b" => Preset {
                name: "lfm2-1.2b",
                dim: 2048,
                n_layers: 16,
                ffn: 8192,
                n_heads: 32,
                n_kv_heads: 8,
                head_dim: 64,
                vocab: 65_536,
                rope_theta: 1_000_000.0,
                ctx: 128_000,
                attn_layers: &[2, 5, 8, 10, 12, 14],
                ..base
            },
            // For tests: every row length a multiple of 256, so each qtype applies unchanged.
            "tiny" => Preset { name: "tiny", dim: 256, n_layers: 2, ffn: 512, n_heads: 4, n_kv_heads: 2, head_dim: 64, vocab: 1024, ctx: 512, ..base },
            _ => return Err(format!("unknown preset {name:?} ({})", NAMES.join(", "))),
        };
        Ok(p)
    }

    /// Query width (`n_heads * head_dim`).
    pub fn q_dim(&self) -> u64 {
        self.n_heads * self.head_dim
    }

    /// Key/value width (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> u64 {
        self.n_kv_heads * self.head_dim
    }

    /// lfm2: whether layer `l` is an attention block ([`Self::attn_layers`], else the odd layers).
    pub fn lfm2_attention(&self, l: u64) -> bool {
        if self.attn_layers.is_empty() { l % 2 == 1 } else { self.attn_layers.contains(&l) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for n in NAMES {
            let p = Preset::by_name(n).unwrap();
            assert_eq!(p.name, *n);
            assert!(p.n_heads.is_multiple_of(p.n_kv_heads) && p.dim.is_multiple_of(32) && p.ffn.is_multiple_of(32), "{n}");
        }
        assert!(Preset::by_name("huge").is_err());
    }

    #[test]
    fn llama_presets_have_the_published_parameter_counts() {
        // Embedding (and an untied output) plus per layer Q, K, V, O and the three FFN matrices.
        let params = |p: &Preset| {
            let layer = 2 * p.dim * p.q_dim() + 2 * p.dim * p.kv_dim() + 3 * p.dim * p.ffn;
            p.vocab * p.dim * if p.tied { 1 } else { 2 } + p.n_layers * layer
        };
        let billions = |n: &str| params(&Preset::by_name(n).unwrap()) as f64 / 1e9;
        assert!((billions("llama-8b") - 8.03).abs() < 0.01, "{}", billions("llama-8b"));
        assert!((billions("llama-70b") - 70.55).abs() < 0.01, "{}", billions("llama-70b"));
    }
}

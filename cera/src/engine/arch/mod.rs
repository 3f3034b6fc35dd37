//! Each architecture's differences from the shared decoder block, one small file each. An
//! architecture turns a [`ModelConfig`] into the [`ModelGraph`] both executors run.

mod gemma3;
mod lfm2;
mod llama;
mod qwen2;
mod qwen3;

use super::EngineError;
use super::config::{Arch, ModelConfig};
use super::graph::ModelGraph;
use crate::gguf::GgufFile;

/// What the graph needs to know about the file besides the configuration.
#[derive(Clone, Debug, Default)]
pub struct FileFacts {
    /// The file has a separate `output.weight` (else the LM head is the embedding, tied).
    pub has_output: bool,
    /// The file has `rope_freqs.weight` (Llama 3.1 scaling factors).
    pub has_rope_freqs: bool,
    /// The file has `token_embd_norm.weight` (LFM2's final norm under llama.cpp's name).
    pub has_token_embd_norm: bool,
    /// Q/K rows in transformers' `rotate_half` layout (a Hugging Face checkpoint): llama's RoPE
    /// pairs dimensions NeoX's way (GGUF files hold them permuted for interleaved pairs).
    pub neox_rope: bool,
}

/// The model's graph.
pub fn build(cfg: &ModelConfig, facts: &FileFacts) -> ModelGraph {
    let ops = match cfg.arch {
        Arch::Llama => llama::ops(cfg, facts),
        Arch::Gemma3 => gemma3::ops(cfg, facts),
        Arch::Qwen2 => qwen2::ops(cfg, facts),
        Arch::Qwen3 => qwen3::ops(cfg, facts),
        Arch::Lfm2 => lfm2::ops(cfg, facts),
    };
    ModelGraph { cfg: cfg.clone(), ops }
}

impl ModelGraph {
    /// The graph of a GGUF file: its hyperparameters resolved into a [`ModelConfig`] (the
    /// vocabulary from `token_embd.weight`'s rows), and the tensors the file has. The tensors
    /// themselves are not checked here ([`super::weights::check_all`] does).
    pub fn from_gguf(file: &GgufFile) -> Result<ModelGraph, EngineError> {
        let hp = file.hparams().map_err(|e| EngineError::File { reason: e.to_string() })?;
        let rows = file.tensor("token_embd.weight").and_then(|t| t.dims.get(1)).map(|&d| d as usize);
        let cfg = ModelConfig::from_hparams(&hp, rows)?;
        let facts = FileFacts {
            has_output: file.tensor("output.weight").is_some(),
            has_rope_freqs: file.tensor("rope_freqs.weight").is_some(),
            has_token_embd_norm: file.tensor("token_embd_norm.weight").is_some(),
            neox_rope: false,
        };
        Ok(build(&cfg, &facts))
    }
}

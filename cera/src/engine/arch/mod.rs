//! Each architecture's differences from the shared decoder block, one small file each. An
//! architecture turns a [`ModelConfig`] into the [`ModelGraph`] both executors run.

mod gemma3;
mod llama;

use super::config::{Arch, ModelConfig};
use super::graph::ModelGraph;

/// What the graph needs to know about the file besides the configuration.
#[derive(Clone, Debug, Default)]
pub struct FileFacts {
    /// The file has a separate `output.weight` (else the LM head is the embedding, tied).
    pub has_output: bool,
    /// The file has `rope_freqs.weight` (Llama 3.1 scaling factors).
    pub has_rope_freqs: bool,
}

/// The model's graph.
pub fn build(cfg: &ModelConfig, facts: &FileFacts) -> ModelGraph {
    let ops = match cfg.arch {
        Arch::Llama => llama::ops(cfg, facts),
        Arch::Gemma3 => gemma3::ops(cfg, facts),
    };
    ModelGraph { cfg: cfg.clone(), ops }
}

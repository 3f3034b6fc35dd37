//! Qwen2 and Qwen2.5: llama's block with a bias on the Q, K and V projections
//! (`attn_{q,k,v}.bias`, added before RoPE), NeoX RoPE (GGUF keeps Q/K rows unpermuted); the LM
//! head is `output.weight` or the tied embedding.

use super::FileFacts;
use super::llama::ops_with;
use crate::engine::config::ModelConfig;
use crate::engine::graph::Op;

pub(super) fn ops(c: &ModelConfig, facts: &FileFacts) -> Vec<Op> {
    ops_with(c, facts, &|_| None, true, true)
}

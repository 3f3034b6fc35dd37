//! Qwen3 (dense): llama's block with a per-head RMSNorm of q and k before RoPE
//! (`attn_q_norm`, `attn_k_norm`), NeoX RoPE (GGUF keeps Q/K rows unpermuted), no biases; the
//! LM head is `output.weight` or the tied embedding (the small models tie it).

use super::FileFacts;
use super::llama::ops_with;
use crate::engine::config::ModelConfig;
use crate::engine::graph::{Op, blk_vec};

pub(super) fn ops(c: &ModelConfig, facts: &FileFacts) -> Vec<Op> {
    let hd = c.head_dim;
    ops_with(c, facts, &|l| Some((blk_vec(l, "attn_q_norm", hd), blk_vec(l, "attn_k_norm", hd))), true, false)
}

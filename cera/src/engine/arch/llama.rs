//! Llama, Llama 3.x, Mistral, SmolLM2: pre-norm blocks, fused Q/K/V, interleaved RoPE (GGUF's
//! Q/K rows are permuted for it), SwiGLU; the LM head is `output.weight` or the tied embedding.

use super::FileFacts;
use crate::engine::config::ModelConfig;
use crate::engine::graph::{GraphBuilder, MatRef, Op, Slot, VecRef, blk_mat, blk_vec};

pub(super) fn ops(c: &ModelConfig, facts: &FileFacts) -> Vec<Op> {
    ops_with(c, facts, &|_| None, facts.neox_rope, false)
}

/// Llama's graph with `qk_norm(layer)`'s per-head norms of q and k before RoPE, NeoX RoPE when
/// `neox`, and the Q/K/V biases (`attn_{q,k,v}.bias`) added after the projection when `bias`
/// (the llama-like architectures: qwen2, qwen3).
pub(super) fn ops_with(c: &ModelConfig, facts: &FileFacts, qk_norm: &dyn Fn(usize) -> Option<(VecRef, VecRef)>, neox: bool, bias: bool) -> Vec<Op> {
    let (d, hd, f) = (c.dim, c.head_dim, c.ffn_dim);
    let embd = MatRef { name: "token_embd.weight".into(), rows: c.vocab, cols: d };
    let freq_factors = facts.has_rope_freqs.then(|| VecRef { name: "rope_freqs.weight".into(), len: c.rope_dim / 2 });
    let mut g = GraphBuilder::new();
    g.push(Op::Embed { table: embd.clone(), scale: c.embed_scale });
    for l in 0..c.n_layers {
        g.norm_residual(blk_vec(l, "attn_norm", d), Slot::Normed);
        let (q, kv) = (c.n_heads * hd, c.n_kv_heads * hd);
        g.push(Op::Linear { ws: vec![blk_mat(l, "attn_q", q, d), blk_mat(l, "attn_k", kv, d), blk_mat(l, "attn_v", kv, d)], x: Slot::Normed, out: Slot::Qkv });
        if bias {
            let b = |s: &str, n: usize| VecRef { name: format!("blk.{l}.{s}.bias"), len: n };
            g.push(Op::Bias { x: Slot::Qkv, bs: vec![b("attn_q", q), b("attn_k", kv), b("attn_v", kv)] });
        }
        g.push(Op::QkvRope { layer: l, qk_norm: qk_norm(l), rope: c.rope[l], neox, freq_factors: freq_factors.clone() });
        g.push(Op::Attention { layer: l, window: c.window[l] });
        g.push(Op::Linear { ws: vec![blk_mat(l, "attn_output", d, q)], x: Slot::Attn, out: Slot::Delta });
        g.residual(Slot::Delta);
        g.swiglu_ffn(l, d, f);
    }
    g.norm_residual(VecRef { name: "output_norm.weight".into(), len: d }, Slot::Normed);
    let head = if facts.has_output { MatRef { name: "output.weight".into(), ..embd } } else { embd };
    g.push(Op::LmHead { w: head, softcap: c.final_softcap });
    g.ops
}

//! Gemma 3: the embedding scaled by `sqrt(dim)`, RMSNorm before and after both attention and the
//! FFN (GGUF's norm weights already hold gemma's `1 + w`), per-head QK-norm, NeoX RoPE with a
//! local base on sliding-window layers and the global base on every sixth, GELU-tanh GLU, tied
//! LM head unless the file has `output.weight`.

use super::FileFacts;
use crate::engine::config::{GateAct, ModelConfig};
use crate::engine::graph::{GraphBuilder, MatRef, Op, Slot, VecRef, blk_mat, blk_vec};

pub(super) fn ops(c: &ModelConfig, facts: &FileFacts) -> Vec<Op> {
    let (d, hd, f) = (c.dim, c.head_dim, c.ffn_dim);
    let embd = MatRef { name: "token_embd.weight".into(), rows: c.vocab, cols: d };
    let mut g = GraphBuilder::new();
    g.push(Op::Embed { table: embd.clone(), scale: c.embed_scale });
    for l in 0..c.n_layers {
        g.norm_residual(blk_vec(l, "attn_norm", d), Slot::Normed);
        let (q, kv) = (c.n_heads * hd, c.n_kv_heads * hd);
        g.push(Op::Linear { ws: vec![blk_mat(l, "attn_q", q, d), blk_mat(l, "attn_k", kv, d), blk_mat(l, "attn_v", kv, d)], x: Slot::Normed, out: Slot::Qkv });
        let qk_norm = Some((blk_vec(l, "attn_q_norm", hd), blk_vec(l, "attn_k_norm", hd)));
        g.push(Op::QkvRope { layer: l, qk_norm, rope: c.rope[l], neox: true, freq_factors: None });
        g.push(Op::Attention { layer: l, window: c.window[l] });
        g.push(Op::Linear { ws: vec![blk_mat(l, "attn_output", d, q)], x: Slot::Attn, out: Slot::Delta });
        g.push(Op::Norm { x: Slot::Delta, w: blk_vec(l, "post_attention_norm", d), out: Slot::DeltaNormed });
        g.residual(Slot::DeltaNormed);
        g.norm_residual(blk_vec(l, "ffn_norm", d), Slot::Normed);
        g.push(Op::Linear { ws: vec![blk_mat(l, "ffn_gate", f, d), blk_mat(l, "ffn_up", f, d)], x: Slot::Normed, out: Slot::GateUp });
        g.push(Op::Glu { act: GateAct::GeluTanh, x: Slot::GateUp, out: Slot::Glu });
        g.push(Op::Linear { ws: vec![blk_mat(l, "ffn_down", d, f)], x: Slot::Glu, out: Slot::Delta });
        g.push(Op::Norm { x: Slot::Delta, w: blk_vec(l, "post_ffw_norm", d), out: Slot::DeltaNormed });
        g.residual(Slot::DeltaNormed);
    }
    g.norm_residual(VecRef { name: "output_norm.weight".into(), len: d }, Slot::Normed);
    let head = if facts.has_output { MatRef { name: "output.weight".into(), ..embd } } else { embd };
    g.push(Op::LmHead { w: head, softcap: c.final_softcap });
    g.ops
}

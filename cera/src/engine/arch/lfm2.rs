//! Liquid LFM2: pre-norm blocks whose token mixer is either a gated short convolution
//! (`shortconv.in_proj` to `[B | C | x]`, `C * conv(B * x)` over a rolling state,
//! `shortconv.out_proj`) or GQA attention with a per-head QK-norm and NeoX RoPE; every block has
//! a SwiGLU FFN. The final norm is `token_embd_norm` (llama.cpp's name for HF's
//! `embedding_norm`, which LFM2 applies after the last block); the LM head is the tied
//! embedding unless the file has `output.weight`.

use super::FileFacts;
use crate::engine::config::{LayerKind, ModelConfig};
use crate::engine::graph::{GraphBuilder, MatRef, Op, Slot, VecRef, blk_mat, blk_vec};

pub(super) fn ops(c: &ModelConfig, facts: &FileFacts) -> Vec<Op> {
    let (d, hd, f) = (c.dim, c.head_dim, c.ffn_dim);
    let embd = MatRef { name: "token_embd.weight".into(), rows: c.vocab, cols: d };
    let mut g = GraphBuilder::new();
    g.push(Op::Embed { table: embd.clone(), scale: c.embed_scale });
    let (mut cache, mut state) = (0, 0);
    for l in 0..c.n_layers {
        g.norm_residual(blk_vec(l, "attn_norm", d), Slot::Normed);
        match c.kinds[l] {
            LayerKind::ShortConv => {
                g.push(Op::Linear { ws: vec![blk_mat(l, "shortconv.in_proj", 3 * d, d)], x: Slot::Normed, out: Slot::ConvIn });
                g.push(Op::ShortConv { state, w: blk_mat(l, "shortconv.conv", d, c.conv_kernel) });
                g.push(Op::Linear { ws: vec![blk_mat(l, "shortconv.out_proj", d, d)], x: Slot::Conv, out: Slot::Delta });
                state += 1;
            }
            LayerKind::Attention => {
                let (q, kv) = (c.n_heads * hd, c.n_kv_heads * hd);
                g.push(Op::Linear {
                    ws: vec![blk_mat(l, "attn_q", q, d), blk_mat(l, "attn_k", kv, d), blk_mat(l, "attn_v", kv, d)],
                    x: Slot::Normed,
                    out: Slot::Qkv,
                });
                let qk_norm = Some((blk_vec(l, "attn_q_norm", hd), blk_vec(l, "attn_k_norm", hd)));
                g.push(Op::QkvRope { layer: cache, qk_norm, rope: c.rope[l], neox: true, freq_factors: None });
                g.push(Op::Attention { layer: cache, window: c.window[l] });
                g.push(Op::Linear { ws: vec![blk_mat(l, "attn_output", d, q)], x: Slot::Attn, out: Slot::Delta });
                cache += 1;
            }
        }
        g.residual(Slot::Delta);
        g.swiglu_ffn(l, d, f);
    }
    let norm = if facts.has_token_embd_norm { "token_embd_norm.weight" } else { "output_norm.weight" };
    g.norm_residual(VecRef { name: norm.into(), len: d }, Slot::Normed);
    let head = if facts.has_output { MatRef { name: "output.weight".into(), ..embd } } else { embd };
    g.push(Op::LmHead { w: head, softcap: c.final_softcap });
    g.ops
}

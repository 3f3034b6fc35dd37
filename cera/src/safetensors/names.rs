//! Hugging Face tensor names mapped to the internal (GGUF/llama.cpp) names, so loaders ask for
//! `blk.3.attn_q.weight` whatever the file kind.
//!
//! | Hugging Face | internal |
//! |---|---|
//! | `model.embed_tokens` | `token_embd` |
//! | `lm_head` | `output` |
//! | `model.norm` | `output_norm` |
//! | `model.embedding_norm` (LFM2) | `token_embd_norm` |
//! | `model.layers.N.self_attn.{q,k,v,o}_proj` | `blk.N.attn_{q,k,v,output}` |
//! | `self_attn.out_proj` (LFM2) | `attn_output` |
//! | `self_attn.{q,k}_norm`, `self_attn.{q,k}_layernorm` | `attn_{q,k}_norm` |
//! | `mlp.{gate,up,down}_proj`, `feed_forward.{w1,w3,w2}` | `ffn_{gate,up,down}` |
//! | `input_layernorm`, `operator_norm` (LFM2) | `attn_norm` |
//! | `post_attention_layernorm` | `ffn_norm`; Gemma 2/3: `post_attention_norm` |
//! | `pre_feedforward_layernorm` / `post_feedforward_layernorm` (Gemma) | `ffn_norm` / `post_ffw_norm` |
//! | `ffn_norm` (LFM2) | `ffn_norm` |
//! | `conv.{conv,in_proj,out_proj}` (LFM2) | `shortconv.{conv,in_proj,out_proj}` |
//!
//! The suffix (`weight`, `bias`, and AWQ/GPTQ's `qweight`, `qzeros`, `scales`, `g_idx`) is kept.
//! Names that are not recognised are kept unchanged.

const SUFFIXES: &[&str] = &["weight", "bias", "qweight", "qzeros", "scales", "g_idx"];

fn layer_module(module: &str, arch: &str) -> Option<&'static str> {
    let gemma = arch.starts_with("gemma");
    Some(match module {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" | "self_attn.out_proj" => "attn_output",
        "self_attn.q_norm" | "self_attn.q_layernorm" => "attn_q_norm",
        "self_attn.k_norm" | "self_attn.k_layernorm" => "attn_k_norm",
        "mlp.gate_proj" | "feed_forward.w1" => "ffn_gate",
        "mlp.up_proj" | "feed_forward.w3" => "ffn_up",
        "mlp.down_proj" | "feed_forward.w2" => "ffn_down",
        "input_layernorm" | "operator_norm" => "attn_norm",
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" | "ffn_norm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "conv.conv" => "shortconv.conv",
        "conv.in_proj" => "shortconv.in_proj",
        "conv.out_proj" => "shortconv.out_proj",
        _ => return None,
    })
}

/// The internal name of a Hugging Face tensor name, or `None` if it is not recognised.
/// `arch` is the internal architecture name (`llama`, `qwen3`, `gemma3`, `lfm2`, ...).
pub fn hf_to_internal(name: &str, arch: &str) -> Option<String> {
    let (module, suffix) = name.rsplit_once('.')?;
    if !SUFFIXES.contains(&suffix) {
        return None;
    }
    if module == "lm_head" || module == "language_model.lm_head" {
        return Some(format!("output.{suffix}"));
    }
    let module = ["model.language_model.", "language_model.model.", "model."].iter().find_map(|p| module.strip_prefix(p))?;
    let top = match module {
        "embed_tokens" => Some("token_embd"),
        "norm" => Some("output_norm"),
        "embedding_norm" => Some("token_embd_norm"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(format!("{t}.{suffix}"));
    }
    let rest = module.strip_prefix("layers.")?;
    let (n, sub) = rest.split_once('.')?;
    let layer: u32 = n.parse().ok()?;
    let mapped = layer_module(sub, arch)?;
    Some(format!("blk.{layer}.{mapped}.{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_like_llama_cpp() {
        let cases = [
            ("model.layers.7.self_attn.q_proj.weight", "llama", "blk.7.attn_q.weight"),
            ("model.layers.0.self_attn.k_proj.bias", "qwen2", "blk.0.attn_k.bias"),
            ("model.layers.1.self_attn.o_proj.qweight", "llama", "blk.1.attn_output.qweight"),
            ("model.layers.1.mlp.down_proj.g_idx", "llama", "blk.1.ffn_down.g_idx"),
            ("model.embed_tokens.weight", "llama", "token_embd.weight"),
            ("lm_head.weight", "llama", "output.weight"),
            ("model.norm.weight", "llama", "output_norm.weight"),
            ("model.layers.2.input_layernorm.weight", "llama", "blk.2.attn_norm.weight"),
            ("model.layers.2.post_attention_layernorm.weight", "llama", "blk.2.ffn_norm.weight"),
            ("model.layers.2.post_attention_layernorm.weight", "gemma3", "blk.2.post_attention_norm.weight"),
            ("model.layers.2.pre_feedforward_layernorm.weight", "gemma3", "blk.2.ffn_norm.weight"),
            ("model.layers.2.post_feedforward_layernorm.weight", "gemma3", "blk.2.post_ffw_norm.weight"),
            ("model.layers.3.self_attn.q_norm.weight", "qwen3", "blk.3.attn_q_norm.weight"),
            ("model.layers.3.self_attn.k_layernorm.weight", "lfm2", "blk.3.attn_k_norm.weight"),
            ("model.layers.4.conv.conv.weight", "lfm2", "blk.4.shortconv.conv.weight"),
            ("model.layers.4.conv.in_proj.weight", "lfm2", "blk.4.shortconv.in_proj.weight"),
            ("model.layers.4.feed_forward.w1.weight", "lfm2", "blk.4.ffn_gate.weight"),
            ("model.layers.4.feed_forward.w3.weight", "lfm2", "blk.4.ffn_up.weight"),
            ("model.layers.4.operator_norm.weight", "lfm2", "blk.4.attn_norm.weight"),
            ("model.layers.4.self_attn.out_proj.weight", "lfm2", "blk.4.attn_output.weight"),
            ("model.embedding_norm.weight", "lfm2", "token_embd_norm.weight"),
            ("model.language_model.layers.0.mlp.up_proj.weight", "gemma3", "blk.0.ffn_up.weight"),
        ];
        for (hf, arch, want) in cases {
            assert_eq!(hf_to_internal(hf, arch).as_deref(), Some(want), "{hf}");
        }
        assert_eq!(hf_to_internal("model.layers.x.mlp.up_proj.weight", "llama"), None);
        assert_eq!(hf_to_internal("vision_tower.blocks.0.weight", "llama"), None);
    }
}

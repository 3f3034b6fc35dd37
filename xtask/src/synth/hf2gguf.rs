//! A Hugging Face folder written as GGUF with llama.cpp's names and conventions, for checking
//! that the same model gives the same logits through cera's GGUF path (and llama.cpp's): the
//! tiny golden checkpoints of `tests/golden/hf/` (llama, qwen2, qwen3, lfm2, gemma3;
//! F32/F16/BF16).
//!
//! What the conversion does, as llama.cpp's `convert_hf_to_gguf.py` does it:
//! - names through [`cera::safetensors::hf_to_internal`]; dims in ggml order (reversed);
//! - llama's `attn_q`/`attn_k` rows permuted for interleaved RoPE (per head, the halves of the
//!   rotated dimensions interleaved); the other architectures keep NeoX order;
//! - vectors (norms, biases) and LFM2's conv taps (`[dim, 1, k]` to ggml `[k, dim]`) as F32;
//!   matrices as stored (F32, F16, BF16);
//! - Gemma 3's norm weights stored as `1 + w` (transformers' Gemma RMSNorm scales by `1 + w`,
//!   llama.cpp's by the stored weight): `attn_norm`, `attn_q_norm`, `attn_k_norm`,
//!   `post_attention_norm`, `ffn_norm` (HF's `pre_feedforward_layernorm`), `post_ffw_norm`,
//!   `output_norm`; a tied LM head is `token_embd` alone (no `output.weight`), as llama.cpp's
//!   gemma3 expects;
//! - metadata: the `{arch}.*` hyperparameters (LFM2's `head_count_kv` per layer, 0 on conv
//!   layers; `shortconv.l_cache`; Gemma 3's `attention.sliding_window`, the global layers' RoPE
//!   base as `rope.freq_base` and the local one as `rope.freq_base_swa`, `final_logit_softcapping`
//!   when set), a `gpt2` tokenizer from `tokenizer.json` (the byte-level BPE's tokens, merges and
//!   special tokens, pre-tokenizer `gpt-2`), the EOS id, the chat template.
//!
//! Gemma 3 converts only when the checkpoint is what llama.cpp (and cera's GGUF path) assume of
//! every `gemma3` file, since no key can say otherwise: `layer_types` slide on layer `il` iff
//! `il % 6 < 5` (`tests/golden/hf/gemma3-6l-tiny`; the 2-layer `gemma3-tiny`, whose layer 1 is
//! global, is refused), the local RoPE base 10000, `query_pre_attn_scalar` the head dimension,
//! and no attention-logit softcapping. Quantized (AWQ/GPTQ) checkpoints have no GGUF form.

use std::io::BufWriter;
use std::path::Path;

use cera::engine::Arch;
use cera::gguf::{GgmlType, GgufWriter, MetadataArray, MetadataValue, TensorDesc};
use cera::safetensors::{SafeDType, SafetensorsModel};
use serde_json::Value;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn f32_of(dtype: SafeDType, bytes: &[u8]) -> Result<Vec<f32>, String> {
    let ty = match dtype {
        SafeDType::F32 => boostr::formats::GgmlType::F32,
        SafeDType::F16 => boostr::formats::GgmlType::F16,
        SafeDType::BF16 => boostr::formats::GgmlType::BF16,
        other => return Err(format!("dtype {}", other.name())),
    };
    boostr::formats::dequantize(ty, bytes, bytes.len() / dtype.size() as usize).map_err(err)
}

/// llama.cpp's `permute` of a Q or K projection `[n_head * hd, cols]` (row-major): within each
/// head, row `2i` takes HF row `i` and row `2i + 1` HF row `i + hd / 2`.
fn permute_rows(bytes: &[u8], rows: usize, n_head: usize, elem: usize) -> Vec<u8> {
    let row_bytes = bytes.len() / rows;
    let hd = rows / n_head;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for (dst, src) in [(2 * i, i), (2 * i + 1, i + hd / 2)] {
                let (d, s) = ((h * hd + dst) * row_bytes, (h * hd + src) * row_bytes);
                out[d..d + row_bytes].copy_from_slice(&bytes[s..s + row_bytes]);
            }
        }
    }
    debug_assert_eq!(row_bytes % elem, 0);
    out
}

/// The `tokenizer.ggml.*` keys of a byte-level BPE `tokenizer.json`.
fn tokenizer_metadata(dir: &Path) -> Result<Vec<(String, MetadataValue)>, String> {
    let tj: Value = serde_json::from_slice(&std::fs::read(dir.join("tokenizer.json")).map_err(err)?).map_err(err)?;
    let model = &tj["model"];
    if model["type"] != "BPE" {
        return Err(format!("tokenizer model {} (BPE only)", model["type"]));
    }
    let vocab = model["vocab"].as_object().ok_or("no vocab")?;
    let mut tokens = vec![String::new(); vocab.len()];
    for (t, id) in vocab {
        tokens[id.as_u64().ok_or("bad id")? as usize] = t.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for a in tj["added_tokens"].as_array().into_iter().flatten() {
        let id = a["id"].as_u64().ok_or("bad added id")? as usize;
        if id >= tokens.len() {
            tokens.resize(id + 1, String::new());
            types.resize(id + 1, 1);
        }
        tokens[id] = a["content"].as_str().unwrap_or_default().to_string();
        types[id] = if a["special"].as_bool() == Some(true) { 3 } else { 4 };
    }
    let merges: Vec<String> = model["merges"]
        .as_array()
        .ok_or("no merges")?
        .iter()
        .map(|m| match m {
            Value::String(s) => s.clone(),
            Value::Array(p) => format!("{} {}", p[0].as_str().unwrap_or_default(), p[1].as_str().unwrap_or_default()),
            _ => String::new(),
        })
        .collect();
    let tc: Value = serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).map_err(err)?).map_err(err)?;
    let eos = tc["eos_token"].as_str().and_then(|t| tokens.iter().position(|x| x == t)).ok_or("no eos_token")?;
    let mut kv = vec![
        ("tokenizer.ggml.model".to_string(), MetadataValue::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), MetadataValue::String("gpt-2".into())),
        ("tokenizer.ggml.tokens".to_string(), MetadataValue::Array(MetadataArray::String(tokens))),
        ("tokenizer.ggml.token_type".to_string(), MetadataValue::Array(MetadataArray::I32(types))),
        ("tokenizer.ggml.merges".to_string(), MetadataValue::Array(MetadataArray::String(merges))),
        ("tokenizer.ggml.eos_token_id".to_string(), MetadataValue::U32(eos as u32)),
        ("tokenizer.ggml.add_bos_token".to_string(), MetadataValue::Bool(false)),
    ];
    if let Some(t) = tc["chat_template"].as_str() {
        kv.push(("tokenizer.chat_template".to_string(), MetadataValue::String(t.into())));
    }
    Ok(kv)
}

/// Gemma 3's own keys, once the checkpoint is checked to be what every llama.cpp `gemma3` file
/// is (see the module docs).
fn gemma3_metadata(raw: &Value, hp: &cera::gguf::HyperParams) -> Result<Vec<(String, MetadataValue)>, String> {
    let n = hp.block_count as usize;
    let types: Vec<&str> = match raw["layer_types"].as_array() {
        Some(t) => t.iter().map(|x| x.as_str().unwrap_or_default()).collect(),
        None => (0..n).map(|l| if l % 6 < 5 { "sliding_attention" } else { "full_attention" }).collect(),
    };
    let fixed: Vec<&str> = (0..n).map(|l| if l % 6 < 5 { "sliding_attention" } else { "full_attention" }).collect();
    if types != fixed {
        return Err(format!("gemma3 layer_types {types:?}: llama.cpp fixes {fixed:?} (layer il slides iff il % 6 < 5)"));
    }
    let rope = &raw["rope_parameters"];
    let local = rope["sliding_attention"]["rope_theta"].as_f64().or(raw["rope_local_base_freq"].as_f64()).unwrap_or(10_000.0);
    if local != 10_000.0 {
        return Err(format!("gemma3 local RoPE base {local}: llama.cpp and cera fix 10000"));
    }
    for kind in ["sliding_attention", "full_attention"] {
        let ty = rope[kind]["rope_type"].as_str().unwrap_or("default");
        if ty != "default" {
            return Err(format!("gemma3 rope_parameters.{kind}.rope_type = {ty} (default only)"));
        }
    }
    let scalar = raw["query_pre_attn_scalar"].as_f64().unwrap_or(hp.key_length as f64);
    if scalar != hp.key_length as f64 {
        return Err(format!("gemma3 query_pre_attn_scalar {scalar}: llama.cpp scales by 1 / sqrt(head_dim = {})", hp.key_length));
    }
    if hp.attn_logit_softcapping.is_some_and(|c| c > 0.0) {
        return Err("gemma3 attn_logit_softcapping (llama.cpp's gemma3 has none)".into());
    }
    let window = hp.sliding_window.ok_or("gemma3 without sliding_window")?;
    let mut kv = vec![
        ("gemma3.attention.sliding_window".to_string(), MetadataValue::U32(window)),
        ("gemma3.rope.freq_base_swa".to_string(), MetadataValue::F32(local as f32)),
    ];
    if let Some(c) = hp.final_logit_softcapping.filter(|&c| c > 0.0) {
        kv.push(("gemma3.final_logit_softcapping".to_string(), MetadataValue::F32(c)));
    }
    Ok(kv)
}

/// Writes the folder `dir` as the GGUF file `out`.
pub fn convert(dir: &Path, out: &Path) -> Result<(), String> {
    let st = SafetensorsModel::open(dir).map_err(err)?;
    let cfg = st.config().ok_or("no config.json")?;
    let arch = Arch::from_name(&cfg.architecture).map_err(err)?;
    if cfg.quantization.is_some() {
        return Err("a quantized checkpoint".into());
    }
    let hp = &cfg.hparams;
    let raw = &cfg.raw;
    let k = |s: &str| format!("{}.{s}", arch.name());
    let u = MetadataValue::U32;
    let ffn = st.tensor("blk.0.ffn_gate.weight").and_then(|t| t.shape.first().copied()).ok_or("no ffn_gate")? as u32;
    // transformers 5 keeps the RoPE base in `rope_parameters` (Gemma 3: one per layer type).
    let rope = &raw["rope_parameters"];
    let theta = rope["full_attention"]["rope_theta"].as_f64().or(rope["rope_theta"].as_f64()).or(raw["rope_theta"].as_f64()).unwrap_or(10_000.0) as f32;
    let kv_heads = match &hp.head_count_kv {
        cera::gguf::PerLayer::Uniform(n) => u(*n),
        cera::gguf::PerLayer::Layers(v) => MetadataValue::Array(MetadataArray::U32(v.clone())),
    };
    let mut kvs = vec![
        ("general.architecture".to_string(), MetadataValue::String(arch.name().into())),
        ("general.name".to_string(), MetadataValue::String(dir.file_name().and_then(|n| n.to_str()).unwrap_or("hf").into())),
        (k("context_length"), u(hp.context_length)),
        (k("embedding_length"), u(hp.embedding_length)),
        (k("block_count"), u(hp.block_count)),
        (k("feed_forward_length"), u(ffn)),
        (k("attention.head_count"), u(hp.head_count)),
        (k("attention.head_count_kv"), kv_heads),
        (k("attention.key_length"), u(hp.key_length)),
        (k("attention.value_length"), u(hp.value_length)),
        (k("rope.freq_base"), MetadataValue::F32(theta)),
        (k("attention.layer_norm_rms_epsilon"), MetadataValue::F32(hp.rms_norm_eps.unwrap_or(1e-6))),
        (k("vocab_size"), u(hp.vocab_size.ok_or("no vocab_size")?)),
    ];
    if arch == Arch::Lfm2 {
        kvs.push((k("shortconv.l_cache"), u(hp.shortconv_l_cache.unwrap_or(3))));
    }
    if arch == Arch::Gemma3 {
        kvs.extend(gemma3_metadata(raw, hp)?);
    }
    kvs.extend(tokenizer_metadata(dir)?);
    // Tensors: (internal name, ggml dims, type, bytes).
    let mut tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = Vec::new();
    for name in st.tensor_names() {
        let info = st.tensor(name).ok_or(name)?;
        let bytes = st.tensor_data(name).map_err(err)?;
        let vector = info.shape.iter().filter(|&&d| d != 1).count() <= 1 || name.contains("shortconv.conv");
        let (dims, ty, data) = if vector {
            let mut v = f32_of(info.dtype, bytes)?;
            if arch == Arch::Gemma3 && name.ends_with("norm.weight") {
                v.iter_mut().for_each(|w| *w += 1.0);
            }
            let dims = if name.contains("shortconv.conv") { vec![info.shape[2], info.shape[0]] } else { vec![v.len() as u64] };
            (dims, GgmlType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
        } else {
            let ty = match info.dtype {
                SafeDType::F32 => GgmlType::F32,
                SafeDType::F16 => GgmlType::F16,
                SafeDType::BF16 => GgmlType::BF16,
                other => return Err(format!("{name}: dtype {}", other.name())),
            };
            let rows = info.shape[0] as usize;
            let heads = if name.ends_with("attn_q.weight") {
                Some(hp.head_count)
            } else if name.ends_with("attn_k.weight") {
                Some(hp.head_count_kv.max())
            } else {
                None
            };
            let data = match heads {
                Some(h) if arch == Arch::Llama => permute_rows(bytes, rows, h as usize, info.dtype.size() as usize),
                _ => bytes.to_vec(),
            };
            (info.shape.iter().rev().copied().collect(), ty, data)
        };
        tensors.push((name.to_string(), dims, ty, data));
    }
    let descs: Vec<TensorDesc> = tensors.iter().map(|(n, d, t, _)| TensorDesc::new(n.clone(), d, *t)).collect();
    let file = BufWriter::new(std::fs::File::create(out).map_err(err)?);
    let mut w = GgufWriter::new(file, 3, &kvs, &descs).map_err(err)?;
    for (_, _, _, data) in &tensors {
        w.write_tensor_data(data).map_err(err)?;
    }
    w.finish().map_err(err)?;
    Ok(())
}

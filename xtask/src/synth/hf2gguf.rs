//! A Hugging Face folder written as GGUF with llama.cpp's names and conventions, for checking
//! that the same model gives the same logits through cera's GGUF path (and llama.cpp's): the
//! tiny golden checkpoints of `tests/golden/hf/` (llama, qwen2, qwen3, lfm2; F32/F16/BF16).
//!
//! What the conversion does, as llama.cpp's `convert_hf_to_gguf.py` does it:
//! - names through [`cera::safetensors::hf_to_internal`]; dims in ggml order (reversed);
//! - llama's `attn_q`/`attn_k` rows permuted for interleaved RoPE (per head, the halves of the
//!   rotated dimensions interleaved); the other architectures keep NeoX order;
//! - vectors (norms, biases) and LFM2's conv taps (`[dim, 1, k]` to ggml `[k, dim]`) as F32;
//!   matrices as stored (F32, F16, BF16);
//! - metadata: the `{arch}.*` hyperparameters (LFM2's `head_count_kv` per layer, 0 on conv
//!   layers; `shortconv.l_cache`), a `gpt2` tokenizer from `tokenizer.json` (the byte-level BPE's
//!   tokens, merges and special tokens, pre-tokenizer `gpt-2`), the EOS id, the chat template.
//!
//! Gemma 3 is left out: llama.cpp fixes its sliding-window pattern (every sixth layer global),
//! which a 2-layer checkpoint with its own `layer_types` does not follow. Quantized (AWQ/GPTQ)
//! checkpoints have no GGUF form.

use std::io::BufWriter;
use std::path::Path;

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

/// Writes the folder `dir` as the GGUF file `out`.
pub fn convert(dir: &Path, out: &Path) -> Result<(), String> {
    let st = SafetensorsModel::open(dir).map_err(err)?;
    let cfg = st.config().ok_or("no config.json")?;
    let arch = cfg.architecture.as_str();
    if !matches!(arch, "llama" | "qwen2" | "qwen3" | "lfm2") {
        return Err(format!("architecture {arch} (llama, qwen2, qwen3, lfm2)"));
    }
    if cfg.quantization.is_some() {
        return Err("a quantized checkpoint".into());
    }
    let hp = &cfg.hparams;
    let raw = &cfg.raw;
    let k = |s: &str| format!("{arch}.{s}");
    let u = MetadataValue::U32;
    let ffn = st.tensor("blk.0.ffn_gate.weight").and_then(|t| t.shape.first().copied()).ok_or("no ffn_gate")? as u32;
    let theta = raw["rope_parameters"]["rope_theta"].as_f64().or(raw["rope_theta"].as_f64()).unwrap_or(10_000.0) as f32;
    let kv_heads = match &hp.head_count_kv {
        cera::gguf::PerLayer::Uniform(n) => u(*n),
        cera::gguf::PerLayer::Layers(v) => MetadataValue::Array(MetadataArray::U32(v.clone())),
    };
    let mut kvs = vec![
        ("general.architecture".to_string(), MetadataValue::String(arch.into())),
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
    if arch == "lfm2" {
        kvs.push((k("shortconv.l_cache"), u(hp.shortconv_l_cache.unwrap_or(3))));
    }
    kvs.extend(tokenizer_metadata(dir)?);
    // Tensors: (internal name, ggml dims, type, bytes).
    let mut tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = Vec::new();
    for name in st.tensor_names() {
        let info = st.tensor(name).ok_or(name)?;
        let bytes = st.tensor_data(name).map_err(err)?;
        let vector = info.shape.iter().filter(|&&d| d != 1).count() <= 1 || name.contains("shortconv.conv");
        let (dims, ty, data) = if vector {
            let v = f32_of(info.dtype, bytes)?;
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
                Some(h) if arch == "llama" => permute_rows(bytes, rows, h as usize, info.dtype.size() as usize),
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

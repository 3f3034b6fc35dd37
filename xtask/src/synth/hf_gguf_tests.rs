//! The tiny Hugging Face golden checkpoints (`tests/golden/hf/`) written as GGUF
//! ([`super::hf2gguf`], llama.cpp's names and conventions) give transformers' logits through
//! cera's GGUF path: the GGUF tokenizer (converted vocabulary and merges, the `gpt-2`
//! pre-tokenizer) gives transformers' token ids, and the CPU executor with an exact f32 KV cache
//! is within `TOL` of transformers' f32 logits at every position (relative to the row's largest
//! magnitude; measured below 3e-6), for llama (whose Q/K rows the conversion permutes for
//! interleaved RoPE), qwen2, qwen3, lfm2 and gemma3 (`gemma3-6l-tiny`: llama.cpp's fixed pattern
//! of five sliding-window layers and one global, norms stored as `1 + w`). The 2-layer
//! `gemma3-tiny`, whose own `layer_types` no `gemma3` GGUF file can hold, is refused.

use std::path::PathBuf;

use cera::engine::cpu::CpuBackend;
use cera::engine::{Backend, KvType, ModelGraph, StateOpts, StepInput, StepOutput, Want};
use cera::gguf::GgufFile;
use cera::tokenizer::{EncodeOptions, Tokenizer};
use serde_json::Value;

const TOL: f64 = 1e-3;

fn check(model: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf").join(model);
    let out = std::env::temp_dir().join(format!("xtask-hf2gguf-{model}-{}.gguf", std::process::id()));
    super::hf2gguf::convert(&dir, &out).unwrap();
    let g: Value = serde_json::from_slice(&std::fs::read(dir.join("golden.json")).unwrap()).unwrap();
    let blob = std::fs::read(dir.join("logits.bin")).unwrap();
    let all: Vec<f32> = blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let vocab = g["vocab"].as_u64().unwrap() as usize;
    let file = GgufFile::open(&out).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let graph = ModelGraph::from_gguf(&file).unwrap();
    let cpu = CpuBackend::load(&graph, &file, 2, None).unwrap();
    let mut worst = 0f64;
    for case in g["cases"].as_array().unwrap() {
        let ids: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let text = case["text"].as_str().unwrap();
        assert_eq!(tok.encode(text, EncodeOptions { add_special: false, parse_special: true }).unwrap(), ids, "{model}: GGUF token ids of {text:?}");
        let off = case["logits_offset"].as_u64().unwrap() as usize;
        let mut s = cpu.new_state(&StateOpts { n_ctx: 128, ubatch: 64, kv: KvType::F32 }).unwrap();
        for (t, &id) in ids.iter().enumerate() {
            let StepOutput::Logits(l) = s.step(StepInput::Tokens(&[id]), t, Want::Logits).unwrap() else { panic!("logits") };
            let want = &all[off + t * vocab..off + (t + 1) * vocab];
            let scale = want.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
            let e = l.iter().zip(want).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs())) / scale;
            assert!(e <= TOL, "{model} GGUF {text:?} position {t}: relative logit error {e:.2e}");
            worst = worst.max(e);
        }
    }
    println!("{model} through GGUF: worst relative logit error {worst:.2e}");
    drop(file);
    let _ = std::fs::remove_file(&out);
}

#[test]
fn hf_llama_through_gguf_matches_transformers() {
    check("llama-tiny");
}

#[test]
fn hf_qwen2_through_gguf_matches_transformers() {
    check("qwen2-tiny");
}

#[test]
fn hf_qwen3_through_gguf_matches_transformers() {
    check("qwen3-tiny");
}

#[test]
fn hf_lfm2_through_gguf_matches_transformers() {
    check("lfm2-tiny");
}

#[test]
fn hf_gemma3_through_gguf_matches_transformers() {
    check("gemma3-6l-tiny");
}

#[test]
fn hf_gemma3_outside_llama_cpp_pattern_is_refused() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf/gemma3-tiny");
    let out = std::env::temp_dir().join(format!("xtask-hf2gguf-refused-{}.gguf", std::process::id()));
    let e = super::hf2gguf::convert(&dir, &out).unwrap_err();
    assert!(e.contains("layer_types") && e.contains("il % 6 < 5"), "{e}");
    assert!(!out.exists());
}

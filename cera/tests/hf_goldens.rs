//! Tiny random Hugging Face checkpoints (`tests/golden/hf/<model>/`, made by
//! `scripts/make_hf_goldens.py` with transformers) through cera's safetensors path, against
//! transformers' own outputs:
//! - the prompt's token ids equal transformers' (`tokenizer.json` through cera's tokenizer);
//! - the logits at every position (one decode step per token) and after one prefill of the whole
//!   prompt: within `CPU_TOL` of transformers' f32 logits, relative to the row's largest
//!   magnitude, on the CPU executor with an exact f32 KV cache; within `GPU_TOL` on the GPU
//!   executor (lavapipe in CI), whose KV cache is f16;
//! - the greedy continuation of `Engine::load` + `Session::generate` equals transformers'
//!   `generate(do_sample=False)`, stopping where it stops (its EOS from
//!   `generation_config.json`), on both devices.
//!
//! The models are llama (F16), qwen2 (BF16, Q/K/V biases), qwen3 (F32, QK-norm), lfm2 (BF16,
//! short-conv layers 0 and 2), gemma3 (F16, a sliding window of 4 on layer 0, `1 + w` norms) and
//! its 6-layer form in llama.cpp's Gemma 3 pattern (layers 0 to 4 sliding, 5 global; the one with
//! a GGUF twin, `xtask/src/synth/hf_gguf_tests.rs`),
//! and llama with its decoder linears in AWQ int4 (group 32) and GPTQ int4 (group 128, v1 zeros,
//! sequential `g_idx`): the script packs random codes, zeros and scales as the formats define
//! them, and transformers runs the dequantized weights as a plain f32 model.
//! Tolerances: the CPU widens F16/BF16 weights exactly and accumulates in f32; with the f32 KV
//! cache it is within 2.5e-6 of transformers on every model (measured). `CPU_TOL` is the
//! issue's 1e-3. The GPU runs the same weights with f32 accumulation (F32 matrices narrowed to
//! F16 at upload), and its KV cache rounds K and V to f16: measured worst 9.0e-4 on the F16/BF16
//! and int4 models of two or three layers (the CPU executor with an f16 cache moves by as much),
//! 1.06e-3 on the six layers of gemma3-6l-tiny, and 1.27e-3 on the F32 one (qwen3-tiny, whose
//! weights the narrowing rounds), so `GPU_TOL` is 2e-3. Where the adapter has f16 cooperative
//! matrices (the H200), the prefill GEMMs round activations to f16: a whole-prompt prefill is
//! held to `GPU_TOL_F16_GEMM` (4e-3; measured 2.11e-3 on gemma3-6l-tiny), and a greedy
//! continuation may part from transformers' only at a near-tie, two logits within that tolerance
//! (llama-tiny-awq does at step 7 of 8 there), after which the rest is not compared.

use std::path::PathBuf;

use cera::engine::{Backend, DeviceChoice, Engine, GenerateOpts, HfModel, KvType, LoadOptions, StateOpts, StepInput, StepOutput, TokenEvent, Want};
use cera::engine::{cpu::CpuBackend, gpu::GpuBackend};
use serde_json::Value;

const CPU_TOL: f64 = 1e-3;
const GPU_TOL: f64 = 2e-3;
/// `GPU_TOL` where the prefill GEMMs run on f16 cooperative matrices (activations rounded to f16).
const GPU_TOL_F16_GEMM: f64 = 4e-3;
const MODELS: [&str; 8] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "lfm2-tiny", "gemma3-tiny", "gemma3-6l-tiny", "llama-tiny-awq", "llama-tiny-gptq"];

fn dir(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf").join(model)
}

struct Golden {
    cases: Vec<Case>,
    vocab: usize,
}

struct Case {
    text: String,
    ids: Vec<u32>,
    generated: Vec<u32>,
    /// `[n_tokens][vocab]`.
    logits: Vec<Vec<f32>>,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn golden(model: &str) -> Golden {
    let d = dir(model);
    let g: Value = serde_json::from_slice(&std::fs::read(d.join("golden.json")).unwrap()).unwrap();
    let blob = std::fs::read(d.join("logits.bin")).unwrap();
    let all: Vec<f32> = blob.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let vocab = g["vocab"].as_u64().unwrap() as usize;
    let cases = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let (off, n) = (c["logits_offset"].as_u64().unwrap() as usize, c["n_tokens"].as_u64().unwrap() as usize);
            Case {
                text: c["text"].as_str().unwrap().to_string(),
                ids: ids(&c["ids"]),
                generated: ids(&c["generated"]),
                logits: (0..n).map(|t| all[off + t * vocab..off + (t + 1) * vocab].to_vec()).collect(),
            }
        })
        .collect();
    Golden { cases, vocab }
}

/// `max |a - b| / max |b|`.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
    a.iter().zip(b).fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs())) / scale
}

fn logits(out: StepOutput) -> Vec<f32> {
    match out {
        StepOutput::Logits(l) => l,
        other => panic!("expected logits, got {other:?}"),
    }
}

/// The worst relative logit error over every position of every case: each token as a decode
/// step, then the whole prompt as one prefill step.
fn teacher_force(b: &dyn Backend, g: &Golden, kv: KvType, tol: f64, prefill_tol: f64, what: &str) -> f64 {
    let mut worst = 0f64;
    for case in &g.cases {
        let mut s = b.new_state(&StateOpts { n_ctx: 128, ubatch: 64, kv }).unwrap();
        for (t, &id) in case.ids.iter().enumerate() {
            let l = logits(s.step(StepInput::Tokens(&[id]), t, Want::Logits).unwrap());
            assert_eq!(l.len(), g.vocab);
            let e = rel(&l, &case.logits[t]);
            assert!(e <= tol, "{what} {:?} position {t}: relative logit error {e:.2e} > {tol:.0e}", case.text);
            worst = worst.max(e);
        }
        let l = logits(s.step(StepInput::Tokens(&case.ids), 0, Want::Logits).unwrap());
        let e = rel(&l, case.logits.last().unwrap());
        assert!(e <= prefill_tol, "{what} {:?} after one prefill: relative logit error {e:.2e} > {prefill_tol:.0e}", case.text);
        worst = worst.max(e);
    }
    worst
}

/// Greedy generation through the engine: transformers' continuation, without the EOS it ends on.
/// `near_tie`: where the engine may part from transformers, the backend and tolerance that say
/// whether the step where it does is a near-tie (its two candidates' logits within `tol` of the
/// row's largest magnitude, as the engine computes them). Otherwise every id must be equal.
fn generate(model: &str, g: &Golden, device: DeviceChoice, near_tie: Option<(&dyn Backend, f64)>) {
    let opts = LoadOptions { device, n_ctx: Some(128), threads: Some(2), ..Default::default() };
    let e = Engine::load(dir(model), &opts, None).unwrap_or_else(|err| panic!("{model}: {err}"));
    for case in &g.cases {
        let mut s = e.session().unwrap();
        s.append_tokens(&case.ids).unwrap();
        let r = s.generate(&GenerateOpts::greedy(case.generated.len()), &mut |_: &TokenEvent| {}).unwrap();
        let mut want = case.generated.clone();
        let stop = if r.stop_token.is_some() { want.pop() } else { None };
        let parted = r.ids.iter().zip(&want).position(|(a, b)| a != b);
        if let (Some(i), Some((b, tol))) = (parted, near_tie) {
            // The engine's logits after the prompt and transformers' first `i` ids, in one prefill
            // as `generate` ran the prompt, then one decode step per id.
            let mut st = b.new_state(&StateOpts { n_ctx: 128, ubatch: 64, kv: KvType::F16 }).unwrap();
            let mut l = logits(st.step(StepInput::Tokens(&case.ids), 0, Want::Logits).unwrap());
            for (t, &id) in want[..i].iter().enumerate() {
                l = logits(st.step(StepInput::Tokens(&[id]), case.ids.len() + t, Want::Logits).unwrap());
            }
            let scale = l.iter().fold(0f64, |m, &x| m.max(x.abs() as f64));
            let gap = (l[r.ids[i] as usize] as f64 - l[want[i] as usize] as f64).abs() / scale;
            println!("{model} {device:?} {:?}: parts from transformers at step {i} of {}, a near-tie of {gap:.2e}", case.text, want.len());
            assert!(
                gap <= tol,
                "{model} {device:?} {:?}: greedy continuation parts from transformers at step {i} ({} for {}), {gap:.2e} apart > {tol:.0e}",
                case.text,
                r.ids[i],
                want[i]
            );
            continue;
        }
        if r.stop_token.is_some() {
            assert_eq!(stop, r.stop_token, "{model} {device:?} {:?}: the stop token", case.text);
        }
        assert_eq!(r.ids, want, "{model} {device:?} {:?}: greedy continuation", case.text);
    }
}

fn check(model: &str) {
    let g = golden(model);
    let hf = HfModel::open(&dir(model)).unwrap();
    // Tokenization through the loaded engine's tokenizer (tokenizer.json).
    let e = Engine::load(dir(model), &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap();
    for case in &g.cases {
        assert_eq!(
            e.tokenizer().encode(&case.text, cera::tokenizer::EncodeOptions { add_special: false, parse_special: true }).unwrap(),
            case.ids,
            "{model}: token ids of {:?}",
            case.text
        );
    }
    let graph = hf.graph().unwrap();
    let cpu = CpuBackend::load(&graph, &hf, 2, None).unwrap();
    let worst_cpu = teacher_force(&cpu, &g, KvType::F32, CPU_TOL, CPU_TOL, &format!("{model} CPU"));
    println!("{model}: CPU worst relative logit error {worst_cpu:.2e}");
    generate(model, &g, DeviceChoice::Cpu, None);
    if let Some(ctx) = numr::testing::test_gpu() {
        let gpu = GpuBackend::load(std::sync::Arc::new(ctx), &graph, &hf, None).unwrap();
        assert!(gpu.new_state(&StateOpts { n_ctx: 8, ubatch: 8, kv: KvType::F32 }).is_err(), "an f32 KV cache on the GPU is refused");
        // With f16 activations in the prefill GEMMs (the H200's cooperative matrices), the
        // prefill rows move by more: measured 2.11e-3 on gemma3-6l-tiny there.
        let gpu_tol = if boostr::quant::QuantGemm::coopmat_available(gpu.context()) { GPU_TOL_F16_GEMM } else { GPU_TOL };
        let worst_gpu = teacher_force(&gpu, &g, KvType::F16, GPU_TOL, gpu_tol, &format!("{model} GPU"));
        println!("{model}: GPU worst relative logit error {worst_gpu:.2e}");
        if model.ends_with("awq") || model.ends_with("gptq") {
            // Q/K/V run as boostr's fused int4 QKV GEMV: one dispatch per layer, three outputs.
            let mut s = gpu.new_state(&StateOpts { n_ctx: 16, ubatch: 8, kv: KvType::F16 }).unwrap();
            let (_, times) = s.profile_step(StepInput::Tokens(&g.cases[0].ids[..1]), 0, Want::Argmax).unwrap();
            let qkv: Vec<_> = times.iter().filter(|t| t.label.contains("int4") && t.label.ends_with("_qkv")).collect();
            assert!(
                qkv.len() == 1 && qkv[0].count == graph.cfg.n_layers,
                "{model}: the decode step's kernels {:?}",
                times.iter().map(|t| &t.label).collect::<Vec<_>>()
            );
        }
        generate(model, &g, DeviceChoice::Gpu, Some((&gpu, gpu_tol)));
    }
}

#[test]
fn hf_llama_f16_matches_transformers() {
    check(MODELS[0]);
}

#[test]
fn hf_qwen2_bf16_matches_transformers() {
    check(MODELS[1]);
}

#[test]
fn hf_qwen3_f32_matches_transformers() {
    check(MODELS[2]);
}

#[test]
fn hf_lfm2_bf16_matches_transformers() {
    check(MODELS[3]);
}

#[test]
fn hf_gemma3_f16_matches_transformers() {
    check(MODELS[4]);
}

#[test]
fn hf_gemma3_6_layers_f16_matches_transformers() {
    check(MODELS[5]);
}

#[test]
fn hf_llama_awq_int4_matches_transformers() {
    check(MODELS[6]);
}

#[test]
fn hf_llama_gptq_int4_matches_transformers() {
    check(MODELS[7]);
}

/// A copy of a golden model folder with `config.json` edited and the safetensors tensors passed
/// through `edit` (name, dtype, shape, bytes).
fn variant(model: &str, tag: &str, config: impl Fn(&mut Value), edit: impl Fn(&str, &mut Vec<u8>)) -> PathBuf {
    use cera::safetensors::{SafetensorsFile, write_safetensors};
    let (src, dst) = (dir(model), std::env::temp_dir().join(format!("cera-hf-{tag}-{}", std::process::id())));
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        if src.join(f).is_file() {
            std::fs::copy(src.join(f), dst.join(f)).unwrap();
        }
    }
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    config(&mut cfg);
    std::fs::write(dst.join("config.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let f = SafetensorsFile::open(&src.join("model.safetensors")).unwrap();
    let owned: Vec<(String, _, Vec<u64>, Vec<u8>)> = f
        .tensors()
        .iter()
        .map(|t| {
            let mut b = f.tensor_data_raw(&t.name).unwrap().to_vec();
            edit(&t.name, &mut b);
            (t.name.clone(), t.dtype, t.shape.clone(), b)
        })
        .collect();
    let refs: Vec<_> = owned.iter().map(|(n, d, s, b)| (n.as_str(), *d, &s[..], &b[..])).collect();
    std::fs::write(dst.join("model.safetensors"), write_safetensors(&refs)).unwrap();
    dst
}

/// Each unsupported AWQ/GPTQ variant is a typed error naming it, at load.
#[test]
fn unsupported_int4_variants_are_typed_errors() {
    let q = |k: &'static str, v: Value| move |c: &mut Value| c["quantization_config"][k] = v.clone();
    let keep = |_: &str, _: &mut Vec<u8>| {};
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        ("llama-tiny-gptq", variant("llama-tiny-gptq", "bits", q("bits", 8.into()), keep), "8-bit"),
        ("llama-tiny-gptq", variant("llama-tiny-gptq", "actorder", q("desc_act", true.into()), keep), "act-order"),
        ("llama-tiny-gptq", variant("llama-tiny-gptq", "marlin", q("checkpoint_format", "marlin".into()), keep), "marlin"),
        ("llama-tiny-awq", variant("llama-tiny-awq", "gemv", q("version", "gemv".into()), keep), "`gemv`"),
        ("llama-tiny-awq", variant("llama-tiny-awq", "exllama", q("version", "exllama".into()), keep), "exllama"),
        // A permuted g_idx (what act-order stores) under a config that does not say so.
        (
            "llama-tiny-gptq",
            variant(
                "llama-tiny-gptq",
                "gidx",
                |_| {},
                |name, b| {
                    if name == "model.layers.0.self_attn.q_proj.g_idx" {
                        b.swap(0, 4);
                        b[0] = 1;
                    }
                },
            ),
            "blk.0.attn_q.weight: GPTQ act-order",
        ),
    ];
    for (model, path, want) in cases {
        let opts = LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(64), threads: Some(1), ..Default::default() };
        let err = Engine::load(&path, &opts, None).err().unwrap_or_else(|| panic!("{model} variant {want}: loaded"));
        let msg = err.to_string();
        assert!(matches!(err.inner(), cera::engine::EngineError::Unsupported { .. }), "{want}: {err:?}");
        assert!(msg.contains(want), "{want}: {msg}");
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// An unknown `model_type` is a typed error naming it.
#[test]
fn unknown_model_type_is_a_typed_error() {
    let path = variant("llama-tiny", "mamba", |c| c["model_type"] = "mamba".into(), |_, _| {});
    let opts = LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(64), threads: Some(1), ..Default::default() };
    let Err(err) = Engine::load(&path, &opts, None) else { panic!("a mamba config loaded") };
    assert!(matches!(err.inner(), cera::engine::EngineError::UnknownArchitecture { name } if name == "mamba"), "{err:?}");
    let _ = std::fs::remove_dir_all(&path);
}

//! Tiny random Hugging Face checkpoints with large activations (`initializer_range` 0.2, BF16,
//! no QK-norm: `tests/golden/hf/{llama,qwen2}-large-bf16/`, made with their float64 goldens by
//! `scripts/make_hf_large_goldens.py`) on the CPU path with an exact f32 KV cache: the greedy ids
//! equal the float64 reference's, and every step's top-5 log-probabilities are within `TOL` of
//! it. Issue 36 reported this path 0.0144 away from transformers on such a model; against the
//! float64 reference it is within 3e-6 (measured), so `TOL` is the 1e-4.
//!
//! On the GPU path (head size 16: boostr's portable paged attention kernel over the contiguous
//! cache, as the engine runs every head size other than 64, 128 and 256) with an f16 KV cache,
//! within `GPU_TOL` = 1e-2: the rounding of K and V to f16 moves these log-probabilities by up to
//! 6.2e-3. Measured on lavapipe: the GPU path's worst errors (5.15e-3 llama, 6.20e-3 qwen2) are
//! exactly the CPU path's with an f16 KV cache, so the f16 rounding of K and V is all of it. A greedy step whose top two log-probabilities lie closer than twice the tolerance
//! may choose the other; the comparison of that case ends there.

use std::path::PathBuf;

use cera::engine::{DeviceChoice, Engine, GenerateOpts, KvType, LoadOptions, TokenEvent};
use serde_json::Value;

const TOL: f64 = 1e-4;
/// The GPU path's tolerance (f16 K/V; see the module docs).
const GPU_TOL: f64 = 1e-2;

fn check(model: &str, device: DeviceChoice) {
    let (kv, tol) = match device {
        DeviceChoice::Gpu => (KvType::F16, GPU_TOL),
        _ => (KvType::F32, TOL),
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf").join(model);
    let golden: Value = serde_json::from_slice(&std::fs::read(dir.join("f64.json")).unwrap()).unwrap();
    let opts = LoadOptions { device, kv, n_ctx: Some(64), threads: Some(2), ..Default::default() };
    let e = Engine::load(&dir, &opts, None).unwrap();
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    let mut worst = 0f64;
    for case in golden["cases"].as_array().unwrap() {
        let (prompt, want) = (ids(&case["prompt_ids"]), ids(&case["generated_ids"]));
        let mut s = e.session().unwrap();
        s.append_tokens(&prompt).unwrap();
        let g = GenerateOpts { ignore_eos: true, top_logprobs: 5, ..GenerateOpts::greedy(want.len()) };
        let r = s.generate(&g, &mut |_: &TokenEvent| {}).unwrap();
        for (step, (got, ref_step)) in r.top_logprobs.iter().zip(case["steps"].as_array().unwrap()).enumerate() {
            if r.ids[step] != want[step] {
                let gap = ref_step["gap"].as_f64().unwrap();
                assert!(gap < 2.0 * tol, "{model} {prompt:?} step {step}: greedy id {} for {} (top-2 gap {gap:.2e})", r.ids[step], want[step]);
                break;
            }
            for (rank, t) in ref_step["top"].as_array().unwrap().iter().enumerate() {
                let (id, lp) = (t[0].as_u64().unwrap() as u32, t[1].as_f64().unwrap());
                let (gid, glp) = got[rank];
                // A near-tie of the reference's may swap two ranks: compare by id.
                let g = got.iter().find(|(i, _)| *i == id).map_or(glp, |(_, l)| *l);
                assert!(gid == id || (lp - glp as f64).abs() <= tol, "{model} step {step} rank {rank}: id {gid} for {id}");
                let e = (g as f64 - lp).abs();
                assert!(e <= tol, "{model} {prompt:?} step {step}: log-probability of {id} is {g}, the float64 reference's {lp} ({e:.2e} > {tol:.0e})");
                worst = worst.max(e);
            }
        }
    }
    println!("{model}: {device:?} ({kv:?} KV) worst top-5 log-probability error against float64 {worst:.2e}");
}

#[test]
fn llama_large_activations_match_float64() {
    check("llama-large-bf16", DeviceChoice::Cpu);
}

#[test]
fn qwen2_large_activations_match_float64() {
    check("qwen2-large-bf16", DeviceChoice::Cpu);
}

#[test]
fn head_size_16_runs_on_the_gpu_and_matches_float64() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    check("llama-large-bf16", DeviceChoice::Gpu);
    check("qwen2-large-bf16", DeviceChoice::Gpu);
}

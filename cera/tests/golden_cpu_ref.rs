//! The CPU reference forward pass (`cera::engine::cpu_ref`) on the real SmolLM2-135M Q4_1 file,
//! teacher-forced over llama.cpp's greedy continuation (tests/golden/generation/):
//! - against an independent float64 numpy forward over gguf-py's dequantization
//!   (`smollm2-135m-f64.json`, scripts/make_cpu_ref_goldens.py): log-probabilities of llama.cpp's
//!   top 5 within `F64_TOL` and the same argmax at every step;
//! - against llama.cpp itself (`smollm2-135m.json`): within `LLAMA_CPP_TOL`. llama.cpp's CPU run
//!   quantizes activations to 8 bits for the matmuls and accumulates flash attention in f16, so on
//!   this small model it sits 0.1-0.45 away from the float64 reference (which this pass matches
//!   to 1e-3); its argmax is required only where its top-2 margin exceeds `LLAMA_CPP_MARGIN`.

use cera::engine::cpu_ref::CpuRefModel;
use cera::fetch::{ModelId, ensure_model};
use cera::gguf::GgufFile;
use serde_json::Value;

const F64_TOL: f64 = 1e-3;
const LLAMA_CPP_TOL: f64 = 0.5;
const LLAMA_CPP_MARGIN: f64 = 0.6;

fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{}/../tests/golden/generation/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()).unwrap()
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

#[test]
fn smollm2_cpu_reference_matches_f64_and_llama_cpp() {
    let (llama, f64ref) = (json("smollm2-135m.json"), json("smollm2-135m-f64.json"));
    let file = GgufFile::open(ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2")).unwrap();
    let mut model = CpuRefModel::load(&file).unwrap();
    let (mut worst_f64, mut worst_llama) = (0.0f64, 0.0f64);
    for rc in f64ref["cases"].as_array().unwrap() {
        let name = rc["name"].as_str().unwrap();
        let case = llama["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap();
        model.reset();
        let mut logits = Vec::new();
        for t in ids(&case["prompt_ids"]) {
            logits = model.step(t).unwrap();
        }
        let generated = ids(&case["generated_ids"]);
        for (i, st) in rc["steps"].as_array().unwrap().iter().enumerate() {
            let lp = log_softmax(&logits);
            let best = (0..lp.len()).max_by(|&a, &b| lp[a].total_cmp(&lp[b]).then(b.cmp(&a))).unwrap() as u64;
            assert_eq!(best, st["argmax"].as_u64().unwrap(), "{name} step {i}: argmax vs the f64 reference");
            for (j, id) in ids(&st["ids"]).into_iter().enumerate() {
                let d64 = (lp[id as usize] - st["logprobs"][j].as_f64().unwrap()).abs();
                let dll = (lp[id as usize] - case["top_logprobs"][i][j].as_f64().unwrap()).abs();
                (worst_f64, worst_llama) = (worst_f64.max(d64), worst_llama.max(dll));
                assert!(d64 <= F64_TOL, "{name} step {i} id {id}: {} vs f64 {}", lp[id as usize], st["logprobs"][j]);
                assert!(dll <= LLAMA_CPP_TOL, "{name} step {i} id {id}: {} vs llama.cpp {}", lp[id as usize], case["top_logprobs"][i][j]);
            }
            if case["margins"][i].as_f64().unwrap() > LLAMA_CPP_MARGIN {
                assert_eq!(best as u32, generated[i], "{name} step {i}: argmax vs llama.cpp");
            }
            logits = model.step(generated[i]).unwrap();
        }
    }
    println!("largest top-5 logprob difference: {worst_f64:.5} against float64, {worst_llama:.4} against llama.cpp");
}

//! The engine's CPU executor (`cera::engine::cpu`) on the real models, against llama.cpp's CPU
//! goldens (tests/golden/generation/) and the float64 forward of SmolLM2.
//!
//! Each golden case is prefilled in ubatch-512 chunks, then:
//! - teacher-forced over llama.cpp's 48 greedy ids: at every step the log-probability of each of
//!   llama.cpp's top 5 must lie within `LLAMA_TOL + LLAMA_TOL_SLOPE * |lp|` of llama.cpp's `lp`,
//!   and the argmax (with the golden's `ignore_eos` ids masked) must be llama.cpp's wherever its
//!   top-2 margin exceeds `LLAMA_MARGIN`; for the SmolLM2 cases of `smollm2-135m-f64.json`
//!   (8 steps each) the log-probabilities must lie within `F64_TOL` of the float64 forward and
//!   the argmax must be its argmax;
//! - greedy: while our masked argmax equals llama.cpp's id, the teacher-forced cache holds our
//!   own greedy continuation, so the same pass is the free-running greedy run up to its first
//!   divergence: the ids must equal llama.cpp's up to the first step whose margin is below
//!   `LLAMA_MARGIN` (the near-tie margin); how many matched in all is printed.
//!   (`greedy_argmax_on_the_backend` checks `Want::Argmax` + `StepInput::LastArgmax` and
//!   `Want::TopK` against this `Want::Logits` path.)
//!
//! Tolerances (measured on this 2-core AVX2 machine; the tests print the largest differences):
//! - `F64_TOL` 1e-2: the executor computes in f32 and rounds K/V through f16 as the GPU cache
//!   stores them; against the exact float64 forward it sits within 5e-3. (With an f32 cache its
//!   logits were within 1e-4 of the f32 `cpu_ref`'s, which is within 5e-5 of float64: the f16
//!   K/V rounding costs the rest.)
//! - `LLAMA_TOL` 0.5 + `LLAMA_TOL_SLOPE` 0.15 per unit of `|lp|`: llama.cpp's CPU run quantizes
//!   activations to 8 bits for its mat-muls and accumulates attention in f16. For the likely
//!   tokens (`lp` in [-1, 0]) it sits within 0.15 (SmolLM2) and 0.22 (Gemma 3) of this executor;
//!   the difference grows for unlikely ones: 0.41 / 0.66 for `lp` in [-3, -1), up to 0.97
//!   (SmolLM2, `chat_multi_turn` step 21, `lp` -6.42) and 0.95 (Gemma, `raw_over_512` step 42,
//!   `lp` -3.98). Where the float64 forward exists it sides with this executor: at SmolLM2's
//!   worst point the f32 `cpu_ref` gives -7.405, this executor -7.393, llama.cpp -6.420.
//! - With int8 activations (`*_int8_*`, the engine's CPU default), `LLAMA_TOL_INT8` 0.6 (and
//!   the same slope) against llama.cpp: both round activations to 8 bits, but not alike
//!   (llama.cpp's K-quant products take blocks of 256 with one scale, ours 32): Gemma 3's
//!   largest difference is 1.00 at `lp` -3.39 (0.99 of the 0.5-based tolerance, 0.91 of this
//!   one), SmolLM2's 0.32 for `lp` in [-3, -1). The float64 forward is held to the 0.5-based
//!   tolerance (SmolLM2's largest difference 0.48 at `lp` -4.9, 0.17 for `lp` in [-1, 0]); the
//!   argmax must be float64's where its top-2 margin exceeds `LLAMA_MARGIN`.
//! - `LLAMA_MARGIN` 0.6: the largest difference between our top-2 margin and llama.cpp's is
//!   0.97 (SmolLM2) / 0.96 (Gemma), both at unlikely second candidates; at every step where
//!   llama.cpp's margin exceeds 0.6 the argmax agreed, on both models.
//! - Gemma 3's float64 forward is checked in `golden_gemma_f64.rs` (a 640-token prompt past the
//!   sliding window, f32 and f16 caches); the unit tests of `cera::engine::cpu` check QK-norm +
//!   NeoX RoPE + the KV write against boostr's fused reference and attention (sliding window,
//!   soft-cap, GQA) against boostr's. The greedy continuation equals llama.cpp's for all 48
//!   tokens in 4 of the 6 Gemma cases.

use std::sync::Mutex;
use std::time::Instant;

use cera::engine::arch::{FileFacts, build};
use cera::engine::cpu::CpuBackend;
use cera::engine::weights::check_all;
use cera::engine::{Backend, BackendState, EngineError, KvType, ModelConfig, ModelGraph, Op, StateOpts, StepInput, StepOutput, Want};
use cera::fetch::{ModelId, ensure_model};
use cera::gguf::GgufFile;
use serde_json::Value;

const F64_TOL: f64 = 1e-2;
const LLAMA_TOL: f64 = 0.5;
const LLAMA_TOL_INT8: f64 = 0.6;
const LLAMA_TOL_SLOPE: f64 = 0.15;
const LLAMA_MARGIN: f64 = 0.6;
const THREADS: usize = 2;

/// The model tests use every core; run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn json(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(format!("{}/../tests/golden/generation/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn open(id: ModelId) -> (GgufFile, ModelGraph) {
    let file = GgufFile::open(ensure_model(id).expect("fetch the model")).unwrap();
    let rows = file.tensor("token_embd.weight").and_then(|t| t.dims.get(1)).map(|&r| r as usize);
    let cfg = ModelConfig::from_hparams(&file.hparams().unwrap(), rows).unwrap();
    let facts =
        FileFacts { has_output: file.tensor("output.weight").is_some(), has_rope_freqs: file.tensor("rope_freqs.weight").is_some(), ..Default::default() };
    let graph = build(&cfg, &facts);
    check_all(&graph, &file).unwrap();
    (file, graph)
}

fn load(id: ModelId) -> (CpuBackend, ModelGraph) {
    load_int8(id, false)
}

/// With `int8`, the engine's default projections (int8 activations and integer dots).
fn load_int8(id: ModelId, int8: bool) -> (CpuBackend, ModelGraph) {
    let (file, graph) = open(id);
    let t = Instant::now();
    let backend = CpuBackend::load_with_activations(&graph, &file, THREADS, int8, None).unwrap();
    println!("{}: loaded in {:.2?} on {}", id.name(), t.elapsed(), backend.device_name());
    (backend, graph)
}

fn logits(out: StepOutput) -> Vec<f32> {
    match out {
        StepOutput::Logits(l) => l,
        other => panic!("expected logits, got {other:?}"),
    }
}

/// Runs `prompt` at positions `0..` in chunks of `ubatch` and returns the last token's logits.
fn prefill(s: &mut dyn BackendState, prompt: &[u32], ubatch: usize) -> Vec<f32> {
    let mut last = None;
    for (i, chunk) in prompt.chunks(ubatch).enumerate() {
        let want = if (i + 1) * ubatch >= prompt.len() { Want::Logits } else { Want::Nothing };
        last = Some(s.step(StepInput::Tokens(chunk), i * ubatch, want).unwrap());
    }
    logits(last.unwrap())
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    x.iter().map(|&v| v as f64 - lse).collect()
}

/// The best id outside `masked`, ties to the lower id.
fn masked_argmax(l: &[f32], masked: &[u32]) -> u32 {
    (0..l.len() as u32)
        .filter(|i| !masked.contains(i))
        .fold(None, |b: Option<u32>, i| match b {
            Some(b) if l[b as usize] >= l[i as usize] => Some(b),
            _ => Some(i),
        })
        .unwrap()
}

/// The largest difference seen, and where.
#[derive(Default)]
struct Worst {
    d: f64,
    at: String,
}

impl Worst {
    fn see(&mut self, d: f64, at: impl FnOnce() -> String) {
        if d > self.d {
            (self.d, self.at) = (d, at());
        }
    }
}

/// Teacher-forced and free-running checks of every case of `golden` (see the module docs).
fn golden_cases(id: ModelId, golden: &str, f64_golden: Option<&str>, int8: bool) {
    let _g = serial();
    let t_all = Instant::now();
    let (backend, _) = load_int8(id, int8);
    let llama = json(golden);
    let f64ref = f64_golden.map(json);
    let masked = ids(&llama["ignore_eos_masked_ids"]);
    let (mut w_llama, mut w_f64, mut w_margin) = (Worst::default(), Worst::default(), Worst::default());
    let mut buckets: [Worst; 4] = Default::default();
    let mut w_ratio = Worst::default();
    for case in llama["cases"].as_array().unwrap() {
        let t_case = Instant::now();
        let name = case["name"].as_str().unwrap();
        let (prompt, generated) = (ids(&case["prompt_ids"]), ids(&case["generated_ids"]));
        let margins: Vec<f64> = case["margins"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect();
        let f64case = f64ref.as_ref().and_then(|r| r["cases"].as_array().unwrap().iter().find(|c| c["name"] == name));
        let n_ctx = prompt.len() + generated.len() + 8;
        let mut s = backend.new_state(&StateOpts { n_ctx, ubatch: 512, kv: KvType::F16 }).unwrap();
        let first = prefill(&mut *s, &prompt, 512);
        let t_prefill = t_case.elapsed();

        // Teacher-forced; while our greedy pick equals llama.cpp's token the cache holds our own
        // greedy continuation, so this is also the free-running greedy run up to its first
        // divergence (`synced`).
        let limit = margins.iter().position(|&m| m < LLAMA_MARGIN).unwrap_or(generated.len());
        let (mut l, mut matched, mut synced) = (first, 0, true);
        let (mut case_worst, mut case_top1) = (0.0f64, 0.0f64);
        for i in 0..generated.len() {
            let lp = log_softmax(&l);
            for (j, tid) in ids(&case["top_ids"][i]).into_iter().enumerate() {
                let want = case["top_logprobs"][i][j].as_f64().unwrap();
                let d = (lp[tid as usize] - want).abs();
                let at = || format!("{name} step {i} id {tid}: {:.5} vs {want}", lp[tid as usize]);
                w_llama.see(d, at);
                case_worst = case_worst.max(d);
                if j == 0 {
                    case_top1 = case_top1.max(d);
                }
                let bk = if want >= -1.0 {
                    0
                } else if want >= -3.0 {
                    1
                } else if want >= -6.0 {
                    2
                } else {
                    3
                };
                buckets[bk].see(d, at);
                let tol = if int8 { LLAMA_TOL_INT8 } else { LLAMA_TOL } + LLAMA_TOL_SLOPE * want.abs();
                w_ratio.see(d / tol, at);
                assert!(d <= tol, "{name} step {i} id {tid}: {} vs llama.cpp {want} (tolerance {tol})", lp[tid as usize]);
            }
            let best = masked_argmax(&l, &masked);
            if margins[i] > LLAMA_MARGIN {
                assert_eq!(best, generated[i], "{name} step {i}: argmax vs llama.cpp (margin {})", margins[i]);
            }
            if synced && best == generated[i] {
                matched += 1;
            } else if synced {
                assert!(i >= limit, "{name}: free-running step {i} chose {best}, llama.cpp {} (margin {})", generated[i], margins[i]);
                synced = false;
            }
            let second = masked_argmax(&l, &[masked.as_slice(), &[generated[i]]].concat());
            let ours = lp[generated[i] as usize] - lp[second as usize];
            w_margin.see((ours - margins[i]).abs(), || format!("{name} step {i}: margin {ours:.4} vs llama.cpp {}", margins[i]));
            if let Some(st) = f64case.and_then(|c| c["steps"].as_array().unwrap().get(i)) {
                let best = masked_argmax(&l, &[]);
                // int8 activations round like llama.cpp's: near-ties of the float64 forward may
                // flip, as they do against llama.cpp.
                let mut top: Vec<f64> = st["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
                top.sort_by(|a, b| b.total_cmp(a));
                let f64_margin = top[0] - top[1];
                if !int8 || f64_margin > LLAMA_MARGIN {
                    assert_eq!(best as u64, st["argmax"].as_u64().unwrap(), "{name} step {i}: argmax vs the f64 forward (margin {f64_margin})");
                }
                for (j, tid) in ids(&st["ids"]).into_iter().enumerate() {
                    let want = st["logprobs"][j].as_f64().unwrap();
                    let d = (lp[tid as usize] - want).abs();
                    w_f64.see(d, || format!("{name} step {i} id {tid}: {:.6} vs {want}", lp[tid as usize]));
                    let tol = if int8 { LLAMA_TOL + LLAMA_TOL_SLOPE * want.abs() } else { F64_TOL };
                    assert!(d <= tol, "{name} step {i} id {tid}: {} vs f64 {want} (tolerance {tol})", lp[tid as usize]);
                }
            }
            if i + 1 < generated.len() {
                l = logits(s.step(StepInput::Tokens(&[generated[i]]), prompt.len() + i, Want::Logits).unwrap());
            }
        }
        println!(
            "{name}: {} prompt tokens prefilled in {t_prefill:.2?}; greedy: {matched}/{} tokens equal llama.cpp's (required up to {limit}); vs llama.cpp: top-1 within {case_top1:.3}, top-5 within {case_worst:.3}; case {:.2?}",
            prompt.len(),
            generated.len(),
            t_case.elapsed()
        );
    }
    println!("largest top-5 logprob difference vs llama.cpp: {:.4} ({})", w_llama.d, w_llama.at);
    for (b, w) in ["[-1, 0]", "[-3, -1)", "[-6, -3)", "< -6"].iter().zip(&buckets) {
        println!("  llama.cpp logprob {b}: largest difference {:.4} ({})", w.d, w.at);
    }
    println!("  largest difference / tolerance: {:.3} ({})", w_ratio.d, w_ratio.at);
    println!("largest top-2 margin difference vs llama.cpp: {:.4} ({})", w_margin.d, w_margin.at);
    if f64ref.is_some() {
        println!("largest top-5 logprob difference vs float64: {:.6} ({})", w_f64.d, w_f64.at);
    }
    println!("{}: all cases in {:.2?}", id.name(), t_all.elapsed());
}

#[test]
fn smollm2_golden_cases_against_llama_cpp_and_float64() {
    golden_cases(ModelId::SmolLM2_135M, "smollm2-135m.json", Some("smollm2-135m-f64.json"), false);
}

#[test]
fn gemma3_golden_cases_against_llama_cpp() {
    golden_cases(ModelId::Gemma3_270M, "gemma3-270m.json", None, false);
}

/// The same cases with int8 activations (the engine's CPU default).
#[test]
fn smollm2_int8_golden_cases_against_llama_cpp_and_float64() {
    golden_cases(ModelId::SmolLM2_135M, "smollm2-135m.json", Some("smollm2-135m-f64.json"), true);
}

#[test]
fn gemma3_int8_golden_cases_against_llama_cpp() {
    golden_cases(ModelId::Gemma3_270M, "gemma3-270m.json", None, true);
}

/// `Want::Argmax` with `StepInput::LastArgmax` (the id never leaves the backend) gives the same
/// greedy ids as `Want::Logits` and an argmax here; `Want::TopK` is the top of the logits.
#[test]
fn greedy_argmax_on_the_backend() {
    let _g = serial();
    let (backend, _) = load(ModelId::SmolLM2_135M);
    let llama = json("smollm2-135m.json");
    let case = &llama["cases"][0];
    let prompt = ids(&case["prompt_ids"]);
    let opts = StateOpts { n_ctx: 64, ubatch: 16, kv: KvType::F16 };
    let (mut a, mut b) = (backend.new_state(&opts).unwrap(), backend.new_state(&opts).unwrap());
    let mut on_device = Vec::new();
    let mut out = a.step(StepInput::Tokens(&prompt), 0, Want::Argmax).unwrap();
    let mut l = logits(b.step(StepInput::Tokens(&prompt), 0, Want::Logits).unwrap());
    for i in 0..16 {
        let StepOutput::Argmax(id) = out else { panic!("expected an argmax, got {out:?}") };
        assert_eq!(id, masked_argmax(&l, &[]), "step {i}");
        on_device.push(id);
        if i == 8 {
            let StepOutput::TopK(top) = a.step(StepInput::LastArgmax, prompt.len() + i, Want::TopK(5)).unwrap() else { panic!() };
            l = logits(b.step(StepInput::Tokens(&[id]), prompt.len() + i, Want::Logits).unwrap());
            let mut want: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
            want.sort_by(|x, y| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0)));
            assert_eq!(top, want[..5].to_vec());
            // The previous step wanted no argmax: nothing to feed.
            assert!(matches!(a.step(StepInput::LastArgmax, prompt.len() + i + 1, Want::Argmax), Err(EngineError::Usage(_))));
            out = a.step(StepInput::Tokens(&[top[0].0]), prompt.len() + i + 1, Want::Argmax).unwrap();
            l = logits(b.step(StepInput::Tokens(&[top[0].0]), prompt.len() + i + 1, Want::Logits).unwrap());
            on_device.push(top[0].0);
            continue;
        }
        let pos = prompt.len() + on_device.len() - 1;
        out = a.step(StepInput::LastArgmax, pos, Want::Argmax).unwrap();
        l = logits(b.step(StepInput::Tokens(&[id]), pos, Want::Logits).unwrap());
    }
    let generated = ids(&case["generated_ids"]);
    let limit = case["margins"].as_array().unwrap().iter().position(|m| m.as_f64().unwrap() < LLAMA_MARGIN).unwrap();
    assert_eq!(on_device[..limit], generated[..limit]);
    println!("raw_short on-device greedy: {:?}", &on_device[..8]);
}

/// The last token's logits after `prompt` prefilled in chunks of each ubatch.
fn chunked(backend: &CpuBackend, prompt: &[u32], ubatches: &[usize], tol: f32) {
    let full = {
        let mut s = backend.new_state(&StateOpts { n_ctx: prompt.len(), ubatch: ubatches[0], kv: KvType::F16 }).unwrap();
        prefill(&mut *s, prompt, ubatches[0])
    };
    for &ub in &ubatches[1..] {
        let t = Instant::now();
        let mut s = backend.new_state(&StateOpts { n_ctx: prompt.len(), ubatch: ub, kv: KvType::F16 }).unwrap();
        let l = prefill(&mut *s, prompt, ub);
        let d = l.iter().zip(&full).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        println!("{} tokens in chunks of {ub} vs {}: largest logit difference {d:.2e} ({:.2?})", prompt.len(), ubatches[0], t.elapsed());
        assert!(d <= tol, "ubatch {ub}: {d}");
    }
}

/// Chunked prefill: the mat-muls of a decode step (1-2 tokens) accumulate in another order than
/// those of a longer step, so the logits agree to f32 rounding, amplified over the layers (and
/// where a K/V value lands on the other side of an f16 rounding boundary), not bit for bit.
/// Measured on SmolLM2 (logits of magnitude ~20): 4e-4 for ubatch 7, 4e-3 for ubatch 1.
const CHUNK_TOL: f32 = 1e-2;

#[test]
fn chunked_prefill_gives_the_same_logits() {
    let _g = serial();
    let (backend, _) = load(ModelId::SmolLM2_135M);
    let prompt = ids(&json("smollm2-135m.json")["cases"][2]["prompt_ids"]);
    chunked(&backend, &prompt[..100], &[512, 7, 1], CHUNK_TOL);
    drop(backend);
    let (backend, _) = load(ModelId::Gemma3_270M);
    let prompt = ids(&json("gemma3-270m.json")["cases"][1]["prompt_ids"]);
    chunked(&backend, &prompt, &[512, 4, 1], CHUNK_TOL);
}

/// The q8_0 cache (blocks of 32 quantized as llama.cpp does): SmolLM2 teacher-forced over
/// `chat_single` against the float64 forward (which keeps K/V exact), the same argmax at every
/// step and log-probabilities within `Q8_F64_TOL`. Measured 0.215 (the f16 cache: 5e-3): q8_0
/// keeps 8 bits relative to the largest value of each 32-element block, so the small values of
/// a block that holds a large one lose most of their precision.
const Q8_F64_TOL: f64 = 0.3;

#[test]
fn q8_0_kv_cache() {
    let _g = serial();
    let (backend, _) = load(ModelId::SmolLM2_135M);
    let (llama, f64ref) = (json("smollm2-135m.json"), json("smollm2-135m-f64.json"));
    let case = llama["cases"].as_array().unwrap().iter().find(|c| c["name"] == "chat_single").unwrap();
    let refc = f64ref["cases"].as_array().unwrap().iter().find(|c| c["name"] == "chat_single").unwrap();
    let (prompt, generated) = (ids(&case["prompt_ids"]), ids(&case["generated_ids"]));
    let mut s = backend.new_state(&StateOpts { n_ctx: 128, ubatch: 512, kv: KvType::Q8_0 }).unwrap();
    let mut l = prefill(&mut *s, &prompt, 512);
    let mut worst = 0.0f64;
    for (i, st) in refc["steps"].as_array().unwrap().iter().enumerate() {
        let lp = log_softmax(&l);
        for (j, tid) in ids(&st["ids"]).into_iter().enumerate() {
            worst = worst.max((lp[tid as usize] - st["logprobs"][j].as_f64().unwrap()).abs());
        }
        assert_eq!(masked_argmax(&l, &[]) as u64, st["argmax"].as_u64().unwrap(), "step {i}");
        l = logits(s.step(StepInput::Tokens(&[generated[i]]), prompt.len() + i, Want::Logits).unwrap());
    }
    println!("q8_0 KV cache: largest top-5 logprob difference vs float64 {worst:.5}");
    assert!(worst <= Q8_F64_TOL, "{worst}");
}

#[test]
fn typed_errors() {
    let _g = serial();
    let (file, graph) = open(ModelId::SmolLM2_135M);
    let mut bad = graph.clone();
    for op in &mut bad.ops {
        if let Op::Linear { ws, .. } = op {
            ws[0].name = "blk.0.attn_q.missing".into();
            break;
        }
    }
    assert!(matches!(check_all(&bad, &file), Err(EngineError::MissingTensor { name }) if name == "blk.0.attn_q.missing"));
    assert!(matches!(CpuBackend::load(&bad, &file, 1, None), Err(EngineError::MissingTensor { name }) if name == "blk.0.attn_q.missing"));

    let done = std::sync::atomic::AtomicU64::new(0);
    let progress = |p: cera::engine::LoadProgress| {
        assert!(p.done <= p.total);
        done.store(p.done, std::sync::atomic::Ordering::Relaxed);
    };
    let backend = CpuBackend::load(&graph, &file, 2, Some(&progress)).unwrap();
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    assert_eq!(done.into_inner(), total, "progress ends at the bytes of every tensor (each once)");
    assert_eq!(backend.device_name(), "CPU (2 threads)");
    assert!(!backend.is_gpu());

    let vocab = graph.cfg.vocab;
    let mut s = backend.new_state(&StateOpts { n_ctx: 8, ubatch: 4, kv: KvType::F16 }).unwrap();
    assert!(matches!(s.step(StepInput::Tokens(&[1; 5]), 0, Want::Nothing), Err(EngineError::Usage(_))), "more than the ubatch");
    assert!(matches!(s.step(StepInput::Tokens(&[]), 0, Want::Nothing), Err(EngineError::Usage(_))), "no tokens");
    assert!(matches!(s.step(StepInput::LastArgmax, 0, Want::Argmax), Err(EngineError::Usage(_))), "no argmax yet");
    assert!(matches!(s.step(StepInput::Tokens(&[1]), 2, Want::Nothing), Err(EngineError::Usage(_))), "a gap in the cache");
    assert!(matches!(s.step(StepInput::Tokens(&[1]), 0, Want::TopK(0)), Err(EngineError::Usage(_))));
    assert!(matches!(s.step(StepInput::Tokens(&[1]), 0, Want::TopK(129)), Err(EngineError::Usage(_))));
    let e = s.step(StepInput::Tokens(&[1, vocab as u32, 2]), 0, Want::Nothing);
    assert!(matches!(e, Err(EngineError::TokenOutOfRange { id, vocab: v }) if id == vocab as u32 && v == vocab), "{e:?}");
    assert!(matches!(s.step(StepInput::Tokens(&[1, 2, 3, 4]), 0, Want::Nothing), Ok(StepOutput::Nothing)));
    assert!(matches!(s.step(StepInput::Tokens(&[1, 2, 3, 4]), 4, Want::Argmax), Ok(StepOutput::Argmax(_))));
    let e = s.step(StepInput::LastArgmax, 8, Want::Argmax);
    assert!(matches!(e, Err(EngineError::ContextOverflow { tokens: 9, n_ctx: 8 })), "{e:?}");
    let e = s.step(StepInput::Tokens(&[1, 2]), 7, Want::Nothing);
    assert!(matches!(e, Err(EngineError::ContextOverflow { tokens: 9, n_ctx: 8 })), "{e:?}");
    // Truncation: stepping at an earlier position rewrites from there.
    assert!(matches!(s.step(StepInput::Tokens(&[5]), 2, Want::Logits), Ok(StepOutput::Logits(l)) if l.len() == vocab));
    assert!(matches!(s.step(StepInput::Tokens(&[5]), 4, Want::Nothing), Err(EngineError::Usage(_))), "positions after 3 are gone");
    assert!(matches!(backend.new_state(&StateOpts { n_ctx: 0, ubatch: 4, kv: KvType::F16 }), Err(EngineError::Usage(_))));
}

/// SmolLM2's CPU speed: `cargo test --release -p cera --test engine_cpu -- --ignored --nocapture cpu_speed`.
#[test]
#[ignore]
fn cpu_speed_smollm2() {
    let _g = serial();
    let threads =
        std::env::var("CERA_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let (file, graph) = open(ModelId::SmolLM2_135M);
    let backend = CpuBackend::load(&graph, &file, threads, None).unwrap();
    let prompt: Vec<u32> = ids(&json("smollm2-135m.json")["cases"][5]["prompt_ids"])[..512].to_vec();
    let mut s = backend.new_state(&StateOpts { n_ctx: 1024, ubatch: 512, kv: KvType::F16 }).unwrap();
    for _ in 0..2 {
        let t = Instant::now();
        s.step(StepInput::Tokens(&prompt), 0, Want::Argmax).unwrap();
        let pp = 512.0 / t.elapsed().as_secs_f64();
        s.step(StepInput::Tokens(&prompt[..8]), 0, Want::Argmax).unwrap();
        let t = Instant::now();
        for i in 0..64 {
            s.step(StepInput::LastArgmax, 8 + i, Want::Argmax).unwrap();
        }
        let tg = 64.0 / t.elapsed().as_secs_f64();
        println!("SmolLM2-135M Q4_1 on {}: pp512 {pp:.1} tok/s, tg64 {tg:.1} tok/s", backend.device_name());
    }
}

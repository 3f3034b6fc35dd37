//! Pipelined decoding on a real GPU (lavapipe in CI) with SmolLM2-135M, and the structure the
//! bench reports:
//! - greedy generation submitted one step ahead gives exactly the ids, text, finish reason and
//!   cache of one token at a time, through a stop token and a stop string (the step run past
//!   the stop is dropped), and a following turn is the same too;
//! - `cera::bench` reports, for SmolLM2's decode step, the dispatch, pass and submit counts
//!   pinned here (the embedding, 5 per layer, the LM head with the final norm, the
//!   end-of-generation mask and the 2-pass argmax: 155, in one compute pass and one submit).
//!   The bench is the `cli` feature's; without it only the pipelining test runs.

#[cfg(feature = "cli")]
use cera::bench::{BenchOpts, bench_model};
use cera::engine::{DeviceChoice, Engine, GenerateOpts, Generation, LoadOptions, Session, TokenEvent};
use cera::fetch::{ModelId, ensure_model};
use numr::testing::test_gpu;

fn engine() -> Option<Engine> {
    test_gpu()?;
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    // ubatch 1: every step runs the decode plan (lavapipe's tiled GEMM costs ~0.3 s a dispatch).
    Some(Engine::load(path, &LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(64), ubatch: 1, ..LoadOptions::default() }, None).unwrap())
}

const PROMPT: &str = "The three primary colours are";

fn turn(s: &mut Session, text: &str, opts: &GenerateOpts) -> (Generation, Vec<(u32, String)>) {
    s.append_text(text).unwrap();
    let mut events = Vec::new();
    let g = s.generate(opts, &mut |e: &TokenEvent| events.push((e.id, e.text.to_string()))).unwrap();
    (g, events)
}

/// Everything a caller sees of two turns, the second after the first's stop.
fn two_turns(e: &Engine, opts: &GenerateOpts) -> impl PartialEq + std::fmt::Debug + use<> {
    let mut s = e.session().unwrap();
    let (g1, ev1) = turn(&mut s, PROMPT, opts);
    let cached1 = s.cached_tokens();
    let (g2, ev2) = turn(&mut s, " and", &GenerateOpts { max_tokens: 3, ..opts.clone() });
    (g1.ids, g1.text, g1.finish, g1.stop_token, ev1, cached1, g2.ids, g2.reused, g2.prefilled, ev2, s.tokens().to_vec(), s.cached_tokens())
}

#[test]
fn pipelined_greedy_decoding_equals_one_token_at_a_time() {
    let Some(e) = engine() else { return };
    // The load's parts: a GPU load opens the device and writes the weights to it.
    let t = e.load_times();
    let writes = t.device_writes.expect("a GPU load writes to the device");
    let waited = t.host_wait.expect("a GPU load waits for the host's layout or not, but says so");
    assert!(t.device.as_nanos() > 0 && writes.as_nanos() > 0 && writes + waited <= t.weights && t.file + t.device + t.weights <= t.total, "{t:?}");
    let seq = GenerateOpts { pipeline: false, ..GenerateOpts::greedy(8) };
    let mut s = e.session().unwrap();
    let (g, _) = turn(&mut s, PROMPT, &seq);
    assert_eq!(g.ids.len(), 8, "{g:?}");
    // A stop token and a stop string inside the continuation.
    let piece = e.tokenizer().decode(&g.ids[2..3], cera::tokenizer::DecodeOptions::default()).unwrap();
    let cases = [
        ("max tokens", GenerateOpts::greedy(8)),
        ("stop token", GenerateOpts { stop_tokens: vec![g.ids[4]], ..GenerateOpts::greedy(8) }),
        ("stop string", GenerateOpts { stop: vec![piece.trim().to_string()], ..GenerateOpts::greedy(8) }),
    ];
    for (name, opts) in cases {
        let one = two_turns(&e, &GenerateOpts { pipeline: false, ..opts.clone() });
        let piped = two_turns(&e, &GenerateOpts { pipeline: true, ..opts.clone() });
        assert_eq!(one, piped, "{name}");
    }
}

#[cfg(feature = "cli")]
#[test]
fn the_bench_reports_smollm2_s_decode_structure() {
    if test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let load = LoadOptions { device: DeviceChoice::Gpu, ubatch: 1, ..LoadOptions::default() };
    let opts = BenchOpts { prompts: vec![2], gens: vec![3], reps: 1, load, ..BenchOpts::default() };
    let (_, rows, _) = bench_model(&path, &opts, None).unwrap();
    assert_eq!(rows.iter().map(|r| r.test.as_str()).collect::<Vec<_>>(), ["pp2", "tg3"]);
    assert!(rows.iter().all(|r| r.tok_s.median > 0.0 && r.quant == "Q4_1"), "{rows:?}");
    let w = rows[1].step.expect("a tg row has the step's work");
    assert_eq!((w.dispatches, w.passes, w.submits), (155, 1, 1), "{w:?}");
    // A tied model reads every tensor of the file once per token (the embedding as the LM head).
    let file = cera::gguf::GgufFile::open(&path).unwrap();
    let all: u64 = file.tensors().iter().map(|t| t.ty.bytes_for(t.n_elements as usize).unwrap() as u64).sum();
    assert_eq!(w.weight_bytes, all);
}

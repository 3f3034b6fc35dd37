//! The library API end to end on the real SmolLM2-135M-Instruct Q4_1 on the CPU path:
//! `Engine::load`, sessions, greedy generation against llama.cpp's golden
//! (`tests/golden/generation/smollm2-135m.json`), prefix reuse over a second chat turn, stop
//! strings, cancellation from another thread, a full context and a prompt over the context.
//!
//! The greedy continuation must equal llama.cpp's until the first token where they differ, and
//! that token must be a near-tie in llama.cpp's distribution (top-two log-probability margin
//! under `NEAR_TIE`): before it both ran on the same tokens, so only there may the engine's
//! numerical noise pick the other candidate. llama.cpp's CPU run sits up to ~0.46 away in
//! log-probability from an exact forward on this model (8-bit activations, f16 attention; see
//! `golden_cpu_ref.rs`), and at `raw_short` step 5 a margin of 0.36 already went the other way
//! there, hence 0.6. The top-5 log-probabilities are compared within `LOGPROB_TOL` over the
//! matching steps, the largest difference printed.

use std::sync::OnceLock;

use cera::chat_template::ChatMessage;
use cera::engine::{DeviceChoice, Engine, EngineError, FinishReason, GenerateOpts, LoadOptions, MAX_TOP_LOGPROBS, SamplerOpts, TokenEvent};
use cera::fetch::{ModelId, ensure_model};
use serde_json::Value;

const NEAR_TIE: f64 = 0.6;
const LOGPROB_TOL: f64 = 0.5;

fn load(n_ctx: Option<usize>) -> Engine {
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    Engine::load(path, &LoadOptions { device: DeviceChoice::Cpu, n_ctx, ..Default::default() }, None).expect("load SmolLM2 on the CPU")
}

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| load(None))
}

fn golden_case(name: &str) -> Value {
    let path = format!("{}/../tests/golden/generation/smollm2-135m.json", env!("CARGO_MANIFEST_DIR"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap().clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array().unwrap().iter().map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())).collect()
}

fn chat(engine: &Engine, msgs: &[ChatMessage]) -> String {
    engine.chat_template().render(msgs, true).unwrap()
}

#[test]
fn load_reports_the_model() {
    let e = engine();
    assert_eq!((e.config().n_layers, e.config().dim, e.config().vocab), (30, 576, 49152));
    assert_eq!(e.n_ctx(), 4096, "min(trained context 8192, 4096)");
    assert!(!e.is_gpu());
    assert_eq!(e.eog_ids(), &[0, 2, 4], "llama.cpp's end-of-generation set for SmolLM2");
    assert!(e.load_time().as_nanos() > 0);
    // The load's parts: the file and the weights took time, no device was opened or written.
    let t = e.load_times();
    assert_eq!(t.total, e.load_time());
    assert!(t.file.as_nanos() > 0 && t.weights.as_nanos() > 0 && t.file + t.device + t.weights <= t.total, "{t:?}");
    assert_eq!((t.device, t.device_writes, t.host_wait), (std::time::Duration::ZERO, None, None), "{t:?}");
}

#[test]
fn chat_single_greedy_matches_llama_cpp() {
    let e = engine();
    let case = golden_case("chat_single");
    let prompt = chat(e, &messages(&case["messages"]));
    assert_eq!(prompt, case["text"].as_str().unwrap(), "the file's template");
    let mut s = e.session().unwrap();
    s.append_text(&prompt).unwrap();
    assert_eq!(s.tokens(), ids(&case["prompt_ids"]).as_slice());
    // As llama.cpp's golden run: greedy, ignore_eos, top 5 log-probabilities (the whole row).
    let opts = GenerateOpts { ignore_eos: true, top_logprobs: 5, ..GenerateOpts::greedy(32) };
    let mut streamed = String::new();
    let g = s.generate(&opts, &mut |ev: &TokenEvent| streamed.push_str(ev.text)).unwrap();
    assert_eq!((g.ids.len(), g.finish), (32, FinishReason::MaxTokens));
    assert_eq!(streamed, g.text);
    assert_eq!(g.text, e.tokenizer().decode(&g.ids, cera::tokenizer::DecodeOptions { render_special: false, strip_space_prefix: false }).unwrap());
    let want = ids(&case["generated_ids"]);
    let diverge = g.ids.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(g.ids.len());
    if diverge < g.ids.len() {
        let margin = case["margins"][diverge].as_f64().unwrap();
        assert!(margin < NEAR_TIE, "step {diverge}: {} where llama.cpp chose {} with a margin of {margin}", g.ids[diverge], want[diverge]);
    }
    let mut worst = 0.0f64;
    for i in 0..diverge {
        for (j, &(id, lp)) in g.top_logprobs[i].iter().enumerate() {
            assert_eq!(g.top_logprobs[i].len(), 5);
            let gid = case["top_ids"][i][j].as_u64().unwrap() as u32;
            let glp = case["top_logprobs"][i][j].as_f64().unwrap();
            // Near-equal candidates may swap places; compare by id where llama.cpp has it.
            let theirs = (0..5).find(|&k| case["top_ids"][i][k].as_u64().unwrap() as u32 == id).map(|k| case["top_logprobs"][i][k].as_f64().unwrap());
            let d = (lp as f64 - theirs.unwrap_or(glp)).abs();
            worst = worst.max(d);
            assert!(d <= LOGPROB_TOL, "step {i} rank {j}: id {id} logprob {lp} vs llama.cpp id {gid} {glp}");
        }
    }
    println!("chat_single: {diverge} of 32 greedy tokens equal llama.cpp's; largest top-5 logprob difference {worst:.4}");
    println!("{}: prefill {:.1} tok/s, decode {:.1} tok/s", e.device_name(), g.timings.prefill_tok_s(), g.timings.decode_tok_s());
    // The argmax path (the id stays on the device) gives the same tokens as the full rows.
    let mut s = e.session().unwrap();
    s.append_text(&prompt).unwrap();
    let a = s.generate(&GenerateOpts::greedy(32), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(a.ids, g.ids[..a.ids.len()], "argmax decoding vs logits decoding");
    assert!(a.finish == FinishReason::MaxTokens || e.eog_ids().contains(&a.stop_token.unwrap()));
}

#[test]
fn a_second_chat_turn_prefills_only_the_new_tokens() {
    let e = engine();
    let mut msgs = vec![ChatMessage::new("user", "What is the capital of France?")];
    let mut s = e.session().unwrap();
    s.append_text(&chat(e, &msgs)).unwrap();
    let first = s.generate(&GenerateOpts::greedy(24), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!((first.reused, first.prefilled), (0, first.prompt_tokens));
    let before = s.tokens().to_vec();
    msgs.push(ChatMessage::new("assistant", first.text.trim()));
    msgs.push(ChatMessage::new("user", "And of Italy?"));
    let conversation = chat(e, &msgs);
    s.reset();
    s.append_text(&conversation).unwrap();
    let now = s.tokens().to_vec();
    // The cache holds every token of the first turn but the last one generated (never run).
    let cached = &before[..before.len() - 1];
    let common = cached.iter().zip(&now).take_while(|(a, b)| a == b).count();
    assert!(common >= first.prompt_tokens, "the first prompt is a prefix of the conversation ({common} < {})", first.prompt_tokens);
    let second = s.generate(&GenerateOpts::greedy(24), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!((second.prompt_tokens, second.reused, second.prefilled), (now.len(), common, now.len() - common));
    let mut fresh = e.session().unwrap();
    fresh.append_text(&conversation).unwrap();
    assert_eq!(fresh.tokens(), now.as_slice());
    let again = fresh.generate(&GenerateOpts::greedy(24), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(again.ids, second.ids, "a fresh session given the whole conversation");
    assert_eq!((again.reused, again.prefilled), (0, now.len()));
    println!("second turn: {} tokens, {} reused, {} prefilled; {:?}", now.len(), second.reused, second.prefilled, second.text);
}

#[test]
fn stop_strings_seeds_and_cancellation() {
    let e = engine();
    let case = golden_case("raw_short");
    let mut s = e.session().unwrap();
    s.append_text(case["text"].as_str().unwrap()).unwrap();
    assert_eq!(s.tokens(), ids(&case["prompt_ids"]).as_slice(), "SmolLM2 adds no BOS");
    // llama.cpp continues " Paris.\n\nThe United States ..." (top-two margins 2.5, 1.2, 1.4).
    let mut pieces = Vec::new();
    let g = s.generate(&GenerateOpts { stop: vec!["\n".into()], ..GenerateOpts::greedy(40) }, &mut |ev: &TokenEvent| pieces.push(ev.text.to_string())).unwrap();
    assert_eq!((g.text.as_str(), g.finish), (" Paris.", FinishReason::Stop));
    assert!(pieces.iter().all(|p| !p.contains('\n')), "{pieces:?}");
    // Sampling: the same seed gives the same text.
    let sample = |seed: u64| {
        let mut s = e.session().unwrap();
        s.append_text(case["text"].as_str().unwrap()).unwrap();
        s.generate(&GenerateOpts { max_tokens: 16, ..Default::default() }.with_seed(seed), &mut |_: &TokenEvent| {}).unwrap().ids
    };
    assert_eq!(sample(11), sample(11));
    // Cancelled from another thread after the first token.
    let mut s = e.session().unwrap();
    s.append_text(case["text"].as_str().unwrap()).unwrap();
    let cancel = s.cancel_token();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let canceller = std::thread::spawn(move || {
        rx.recv().unwrap();
        cancel.cancel();
    });
    let mut tx = Some(tx);
    let g = s
        .generate(&GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(500) }, &mut |_: &TokenEvent| {
            if let Some(tx) = tx.take() {
                tx.send(()).unwrap();
            }
        })
        .unwrap();
    canceller.join().unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert!(!g.ids.is_empty() && g.ids.len() < 500, "{} tokens", g.ids.len());
}

/// Out-of-range options are typed errors before anything runs: the session is left as it was.
#[test]
fn out_of_range_sampler_options_are_typed_errors() {
    let mut s = engine().session().unwrap();
    s.append_text("The capital of France is").unwrap();
    let before = s.tokens().to_vec();
    for (opts, option) in [
        (GenerateOpts::greedy(4).with_temperature(f32::NAN), "temperature"),
        (GenerateOpts::greedy(4).with_temperature(-1.0), "temperature"),
        (GenerateOpts { sampler: SamplerOpts { top_p: 0.0, ..SamplerOpts::default() }, ..GenerateOpts::greedy(4) }, "top_p"),
        (GenerateOpts { top_logprobs: MAX_TOP_LOGPROBS + 1, ..GenerateOpts::greedy(4) }, "top_logprobs"),
    ] {
        match s.generate(&opts, &mut |_: &TokenEvent| {}) {
            Err(EngineError::Sampler { option: got, .. }) => assert_eq!(got, option),
            other => panic!("{option}: {other:?}"),
        }
        assert_eq!(s.tokens(), before.as_slice());
    }
    let g = s.generate(&GenerateOpts::greedy(2), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(g.ids.len(), 2);
}

/// With `top_logprobs`, each generated token carries its own log-probability: at most the
/// top one's, equal to it where the draw took the most likely token, and the same in the events.
#[test]
fn sampled_tokens_carry_their_logprob() {
    let mut s = engine().session().unwrap();
    s.append_text("Once upon a time").unwrap();
    let opts = GenerateOpts { top_logprobs: 2, max_tokens: 16, ignore_eos: true, ..Default::default() }.with_temperature(1.5).with_seed(3);
    let mut events = Vec::new();
    let g = s.generate(&opts, &mut |ev: &TokenEvent| events.push((ev.id, ev.logprob))).unwrap();
    assert_eq!((g.logprobs.len(), g.top_logprobs.len()), (g.ids.len(), g.ids.len()));
    for ((&id, &lp), top) in g.ids.iter().zip(&g.logprobs).zip(&g.top_logprobs) {
        assert!(lp.is_finite() && lp <= top[0].1, "{id}: {lp} above the top {top:?}");
        if let Some(&(_, t)) = top.iter().find(|(t, _)| *t == id) {
            assert_eq!(lp, t, "{id}: the same log-probability in the top list");
        }
    }
    let want: Vec<(u32, Option<f32>)> = g.ids.iter().zip(&g.logprobs).map(|(&i, &l)| (i, Some(l))).collect();
    assert_eq!(events, want);
}

#[test]
fn a_small_context_fills_and_overflows() {
    let case = golden_case("chat_single");
    let prompt = case["text"].as_str().unwrap();
    let e = load(Some(40));
    let mut s = e.session().unwrap();
    s.append_text(prompt).unwrap();
    assert_eq!(s.tokens().len(), 36);
    let g = s.generate(&GenerateOpts::greedy(100), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!((g.ids.len(), g.finish), (4, FinishReason::ContextFull));
    let mut full = engine().session().unwrap();
    full.append_text(prompt).unwrap();
    let same = full.generate(&GenerateOpts::greedy(4), &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(g.ids, same.ids, "the context length does not change the tokens");
    let e = load(Some(16));
    let mut s = e.session().unwrap();
    s.append_text(prompt).unwrap();
    let err = s.generate(&GenerateOpts::greedy(8), &mut |_: &TokenEvent| {}).unwrap_err();
    assert!(matches!(err, EngineError::ContextOverflow { tokens: 36, n_ctx: 16 }), "{err}");
}

#[test]
fn bad_files_are_typed_errors_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("cera-engine-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("not-a-model.gguf");
    std::fs::write(&path, b"GGUF\x03\0\0\0garbage").unwrap();
    let err = Engine::load(&path, &LoadOptions { device: DeviceChoice::Cpu, ..Default::default() }, None).unwrap_err();
    assert!(err.to_string().contains("not-a-model.gguf"), "{err}");
    let missing = dir.join("missing.gguf");
    let err = Engine::load(&missing, &LoadOptions::default(), None).unwrap_err();
    assert!(err.to_string().contains("missing.gguf"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

//! Speculative decoding (n-gram drafts) in the batcher with the real SmolLM2-135M-Instruct Q4_1,
//! on the CPU and on the GPU (lavapipe in CI): greedy ids equal those without speculation, token
//! for token, on copy-heavy prompts where drafts are accepted (the metrics count them), across
//! max tokens and stop strings, alone and beside other sequences. Sampled with speculation
//! (speculative sampling with one-token proposals), a tiny model's tokens keep their
//! distribution: a chi-square test over many seeds against sampling without it. Drafts that need
//! a KV block that is not free are dropped for the step; they never preempt another sequence.

mod batch_support;
mod spec_support;

use batch_support::{prompts, run_staggered};
use cera::engine::{BatcherOpts, DeviceChoice, Engine, GenerateOpts, LoadOptions, Speculative};
use cera::fetch::{ModelId, ensure_model};
use spec_support::assert_same_distribution;

fn engine(device: DeviceChoice) -> Option<Engine> {
    if device == DeviceChoice::Gpu {
        numr::testing::test_gpu()?;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    Some(Engine::load(path, &LoadOptions { device, n_ctx: Some(512), ..Default::default() }, None).expect("load SmolLM2"))
}

/// A prompt whose continuation copies text it holds.
fn copy_prompt(e: &Engine) -> Vec<u32> {
    let text = "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango.\nCopy: apple, banana, cherry,";
    e.tokenizer().encode(text, Default::default()).unwrap()
}

fn spec(o: GenerateOpts) -> GenerateOpts {
    GenerateOpts { speculative: Some(Speculative { draft_max: 6, draft_min: 1, ngram: 3, adaptive: false, ..Default::default() }), ..o }
}

/// `full`: also stop strings, max tokens and other sequences (the CPU; lavapipe runs a step in
/// about a second, so the GPU checks the identity and the acceptance only).
fn greedy_identity(e: &Engine, n: usize, full: bool) {
    let b = e.batcher(BatcherOpts { max_seqs: 4, kv_budget: Some(64 << 20), ..BatcherOpts::default() }).unwrap();
    let p = copy_prompt(e);
    let plain = b.generate(p.clone(), &GenerateOpts::greedy(n)).unwrap();
    let before = b.metrics();
    let fast = b.generate(p.clone(), &spec(GenerateOpts::greedy(n))).unwrap();
    let m = b.metrics();
    assert_eq!(fast.ids, plain.ids, "speculation changed the greedy ids");
    assert_eq!((fast.text.as_str(), fast.finish), (plain.text.as_str(), plain.finish));
    let (drafted, accepted) = (m.drafted_tokens - before.drafted_tokens, m.accepted_tokens - before.accepted_tokens);
    assert!(accepted > 0 && accepted <= drafted, "{accepted} of {drafted} drafts accepted on a copy-heavy prompt");
    let verifications = m.verifications - before.verifications;
    assert!(verifications > 0 && verifications <= drafted, "{verifications} verification entries for {drafted} drafts");
    // The result's timings count the sequence's own drafts.
    assert_eq!((fast.timings.draft_tokens as u64, fast.timings.accepted_tokens as u64), (drafted, accepted));
    assert!(m.steps - before.steps < plain.ids.len() as u64, "fewer steps than tokens: {} for {}", m.steps - before.steps, plain.ids.len());
    if !full {
        return;
    }
    // A stop string inside the copied run, and max tokens falling inside a verified draft.
    let stop = GenerateOpts { stop: vec![" fig".into()], ..GenerateOpts::greedy(n) };
    assert_eq!(b.generate(p.clone(), &spec(stop.clone())).unwrap().text, b.generate(p.clone(), &stop).unwrap().text);
    for max in [1, 2, 5] {
        assert_eq!(b.generate(p.clone(), &spec(GenerateOpts::greedy(max))).unwrap().ids, plain.ids[..max.min(plain.ids.len())]);
    }
    // Beside other sequences (joining at different steps), speculation on for some.
    let mut ps = prompts(e, 2);
    ps.insert(1, p.clone());
    let opts = vec![spec(GenerateOpts::greedy(8)), spec(GenerateOpts::greedy(n)), GenerateOpts::default().with_seed(5)];
    let got = run_staggered(&b, &ps, &opts);
    assert_eq!(got[1].ids, plain.ids);
    assert_eq!(got[0].ids, b.generate(ps[0].clone(), &GenerateOpts::greedy(8)).unwrap().ids);
    assert_eq!(got[2].ids, b.generate(ps[2].clone(), &GenerateOpts::default().with_seed(5)).unwrap().ids);
}

#[test]
fn greedy_ids_equal_without_speculation_cpu() {
    greedy_identity(&engine(DeviceChoice::Cpu).unwrap(), 24, true);
}

#[test]
fn greedy_ids_equal_without_speculation_gpu() {
    let Some(e) = engine(DeviceChoice::Gpu) else { return };
    greedy_identity(&e, 10, false);
}

#[test]
fn bad_speculation_options_are_typed_errors() {
    let e = engine(DeviceChoice::Cpu).unwrap();
    let b = e.batcher(BatcherOpts::default()).unwrap();
    for s in [
        Speculative { draft_max: 0, ..Default::default() },
        Speculative { draft_max: 17, ..Default::default() },
        Speculative { draft_min: 9, ..Default::default() },
    ] {
        let o = GenerateOpts { speculative: Some(s), ..GenerateOpts::greedy(4) };
        let err = b.submit(vec![1u32, 2, 3], &o, None).unwrap_err();
        assert!(err.to_string().contains("speculative"), "{err}");
    }
}

/// When a sequence's drafts need a KV block that is not free, it decodes its one token plainly
/// that step: drafts never preempt another sequence.
#[test]
fn drafts_never_preempt_another_sequence() {
    let e = engine(DeviceChoice::Cpu).unwrap();
    // A: the copy prompt, padded so that its first decode row ends 3 positions short of a block
    // boundary (its 6 drafts would need the next block). B: 5 positions into its last block.
    let bl = 16;
    let mut a = copy_prompt(&e);
    let nl = e.tokenizer().encode("\n", Default::default()).unwrap();
    while (a.len() + 1) % bl != bl - 3 {
        a.insert(0, nl[0]);
    }
    let b_prompt: Vec<u32> = prompts(&e, 4)[3].iter().copied().cycle().take(2 * bl + 5).collect();
    let blocks = a.len().div_ceil(bl) + b_prompt.len().div_ceil(bl);
    let per_block = 2 * 30 * 3 * bl * 64 * 4;
    let b = e.batcher(BatcherOpts { max_seqs: 4, kv_budget: Some((blocks * per_block) as u64), prefix_cache: false, ..BatcherOpts::default() }).unwrap();
    assert_eq!((b.batch_opts().n_blocks, b.batch_opts().block_len), (blocks, bl));
    let want_a = b.generate(a.clone(), &GenerateOpts::greedy(12)).unwrap();
    let want_b = b.generate(b_prompt.clone(), &GenerateOpts::greedy(3)).unwrap();
    // A and B join in the same step: a one-token request holds the batcher (its sink waits)
    // until both are queued.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let hold: cera::engine::BoxSink = Box::new(move |_: &cera::engine::TokenEvent| {
        let _ = held_tx.send(());
        let _ = go_rx.lock().unwrap().recv();
    });
    let before = b.metrics();
    let c = b.submit(vec![1u32, 2, 3], &GenerateOpts::greedy(1), Some(hold)).unwrap();
    held_rx.recv().unwrap();
    let ha = b.submit(a.clone(), &spec(GenerateOpts::greedy(12)), None).unwrap();
    let hb = b.submit(b_prompt.clone(), &GenerateOpts::greedy(3), None).unwrap();
    go_tx.send(()).unwrap();
    c.wait().unwrap();
    let (got_a, got_b) = (ha.wait().unwrap(), hb.wait().unwrap());
    let m = b.metrics();
    assert_eq!((got_a.ids, got_b.ids), (want_a.ids, want_b.ids));
    assert_eq!(m.preemptions, before.preemptions, "drafts preempted a sequence");
    assert!(m.accepted_tokens > before.accepted_tokens, "drafts ran once B finished: {m:?}");
}

/// The tiny random Qwen2 checkpoint on the CPU and its longest golden prompt followed by
/// transformers' greedy continuation (so the model's likely tokens recur and n-gram drafts find
/// them).
fn tiny() -> (Engine, Vec<u32>) {
    (spec_support::tiny("qwen2-tiny", DeviceChoice::Cpu), spec_support::hf_prompt("qwen2-tiny"))
}

#[test]
fn sampled_tokens_keep_their_distribution() {
    let (e, prompt) = tiny();
    let b = e.batcher(BatcherOpts { max_seqs: 8, ..BatcherOpts::default() }).unwrap();
    const N: u64 = 600;
    // Top-3 sampling: the random model's few likely tokens recur, so one-token n-gram drafts
    // are often among them and sometimes kept.
    let sampled = |seed: u64| {
        let o = GenerateOpts { max_tokens: 3, ignore_eos: true, ..GenerateOpts::default().with_seed(seed).with_temperature(1.0) };
        GenerateOpts { sampler: cera::engine::SamplerOpts { top_k: 3, top_p: 1.0, min_p: 0.0, ..o.sampler.clone() }, ..o }
    };
    let one_token_drafts =
        |o: GenerateOpts| GenerateOpts { speculative: Some(Speculative { draft_max: 2, draft_min: 1, ngram: 1, adaptive: false, ..Default::default() }), ..o };
    let draws = |spec_on: bool, seeds: std::ops::Range<u64>| -> Vec<Vec<u32>> {
        let hs: Vec<_> = seeds.map(|s| b.submit(prompt.clone(), &if spec_on { one_token_drafts(sampled(s)) } else { sampled(s) }, None).unwrap()).collect();
        hs.into_iter().map(|h| h.wait().unwrap().ids).collect()
    };
    let plain = draws(false, 0..N);
    let before = b.metrics();
    let fast = draws(true, N..2 * N);
    let m = b.metrics();
    let (drafted, accepted) = (m.drafted_tokens - before.drafted_tokens, m.accepted_tokens - before.accepted_tokens);
    assert!(drafted > N / 2 && accepted > 0 && accepted < drafted, "{accepted} of {drafted} drafts accepted");
    // The second and third tokens (the ones drafts can give), each against the same position
    // without speculation: a two-sample chi-square over the tokens seen at least 10 times in
    // all, the rest pooled.
    for at in [1, 2] {
        assert_same_distribution(&plain, &fast, at);
    }
}

/// Adaptive pacing (the default) in the batcher: where n-gram drafts are mostly wrong (the tiny
/// random Qwen2 sampled near-uniformly from its top 100, one-token suffixes), it verifies far
/// fewer of them than drafting whatever lookup finds; where they are right (its greedy output
/// repeats), it keeps drafting, with the same ids.
#[test]
fn paced_ngram_drafts_back_off_where_they_are_wrong() {
    let (e, prompt) = tiny();
    let b = e.batcher(BatcherOpts { max_seqs: 4, ..BatcherOpts::default() }).unwrap();
    let with = |o: &GenerateOpts, adaptive: bool| GenerateOpts {
        speculative: Some(Speculative { draft_max: 8, draft_min: 1, ngram: 1, adaptive, ..Default::default() }),
        ..o.clone()
    };
    let o = GenerateOpts { max_tokens: 60, ignore_eos: true, ..GenerateOpts::default().with_seed(3).with_temperature(5.0) };
    let hot = GenerateOpts { sampler: cera::engine::SamplerOpts { top_k: 100, top_p: 1.0, min_p: 0.0, ..o.sampler.clone() }, ..o };
    let every = b.generate(prompt.clone(), &with(&hot, false)).unwrap();
    let paced = b.generate(prompt.clone(), &with(&hot, true)).unwrap();
    let rate = |g: &cera::engine::Generation| g.timings.accepted_tokens as f64 / g.timings.draft_tokens.max(1) as f64;
    println!(
        "wrong drafts: every step {} of {} kept, paced {} of {}",
        every.timings.accepted_tokens, every.timings.draft_tokens, paced.timings.accepted_tokens, paced.timings.draft_tokens
    );
    assert!(rate(&every) < 0.2, "the drafts should be mostly wrong here: {}", rate(&every));
    assert!(paced.timings.draft_tokens * 3 < every.timings.draft_tokens, "{} paced drafts, {} unpaced", paced.timings.draft_tokens, every.timings.draft_tokens);
    assert_eq!((every.ids.len(), paced.ids.len()), (60, 60));
    // Right drafts: pacing keeps nearly all of them, and greedy keeps its ids.
    let greedy = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(60) };
    let plain = b.generate(prompt.clone(), &greedy).unwrap();
    let (every, paced) = (b.generate(prompt.clone(), &with(&greedy, false)).unwrap(), b.generate(prompt.clone(), &with(&greedy, true)).unwrap());
    assert_eq!((&every.ids, &paced.ids), (&plain.ids, &plain.ids));
    println!(
        "right drafts: every step {} of {} kept, paced {} of {}",
        every.timings.accepted_tokens, every.timings.draft_tokens, paced.timings.accepted_tokens, paced.timings.draft_tokens
    );
    assert!(paced.timings.accepted_tokens * 10 >= every.timings.accepted_tokens * 8, "pacing dropped right drafts");
}

//! Speculative decoding (n-gram drafts) in the batcher with the real SmolLM2-135M-Instruct Q4_1,
//! on the CPU and on the GPU (lavapipe in CI): greedy ids equal those without speculation, token
//! for token, on copy-heavy prompts where drafts are accepted (the metrics count them), across
//! max tokens and stop strings, alone and beside other sequences; sampled requests decode as
//! before.

mod batch_support;

use batch_support::{prompts, run_staggered};
use cera::engine::{BatcherOpts, DeviceChoice, Engine, GenerateOpts, LoadOptions, Speculative};
use cera::fetch::{ModelId, ensure_model};

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
    GenerateOpts { speculative: Some(Speculative { draft_max: 6, draft_min: 1, ngram: 3 }), ..o }
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

//! Speculative decoding with a draft model in the batcher (`Engine::batcher_with_draft`,
//! `DraftSource::Model`), on the CPU and on the GPU (lavapipe in CI):
//! - SmolLM2-135M drafting for itself: greedy ids equal those without speculation, token for
//!   token, with nearly every draft kept, across stop strings and max tokens, beside n-gram,
//!   sampled and plain sequences; `p_min` only shortens the drafts;
//! - the tiny random checkpoints of every architecture, each drafted by a checkpoint of another
//!   architecture (so most drafts are rejected and the draft model's cache, LFM2's conv rows
//!   included, rolls back every step): the same greedy ids;
//! - sampled with a draft model's drafts, a tiny model's tokens keep their distribution
//!   (chi-square over 600 seeds);
//! - preemption under a tight KV budget and cancellation mid-draft change no other sequence;
//! - a vocabulary mismatch, a `p_min` out of range and a request for drafts from a batcher
//!   without a draft model are typed errors.

mod batch_support;
mod spec_support;

use batch_support::{prompts, run_staggered};
use cera::engine::{BatcherOpts, DeviceChoice, DraftSource, Engine, GenerateOpts, LoadOptions, SamplerOpts, Speculative};
use cera::fetch::{ModelId, ensure_model};
use spec_support::{hf_prompt, tiny};

fn smol(device: DeviceChoice) -> Option<Engine> {
    if device == DeviceChoice::Gpu {
        numr::testing::test_gpu()?;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    Some(Engine::load(path, &LoadOptions { device, n_ctx: Some(512), ..Default::default() }, None).expect("load SmolLM2"))
}

/// Drafts from the batcher's draft model at every step (no pacing), up to `draft_max`.
fn drafted(o: GenerateOpts, draft_max: usize) -> GenerateOpts {
    GenerateOpts { speculative: Some(Speculative { draft_max, draft_min: 1, adaptive: false, source: DraftSource::Model, ..Default::default() }), ..o }
}

fn opts(max_seqs: usize) -> BatcherOpts {
    BatcherOpts { max_seqs, kv_budget: Some(32 << 20), ..BatcherOpts::default() }
}

/// `full`: also stop strings, max tokens, `p_min` and other sequences (the CPU; lavapipe runs a
/// step in about a second, so the GPU checks the identity and the acceptance only).
fn self_drafting(e: &Engine, n: usize, full: bool) {
    let b = e.batcher_with_draft(opts(4), e, 0.0).unwrap();
    assert!(b.draft_engine().is_some());
    let p = e.tokenizer().encode("The history of the printing press began", Default::default()).unwrap();
    let plain = b.generate(p.clone(), &GenerateOpts::greedy(n)).unwrap();
    let before = b.metrics();
    let fast = b.generate(p.clone(), &drafted(GenerateOpts::greedy(n), 4)).unwrap();
    let m = b.metrics();
    assert_eq!(fast.ids, plain.ids, "drafts changed the greedy ids");
    assert_eq!((fast.text.as_str(), fast.finish), (plain.text.as_str(), plain.finish));
    let (drafted_n, accepted) = (m.drafted_tokens - before.drafted_tokens, m.accepted_tokens - before.accepted_tokens);
    // The same model proposes its own greedy choices: nearly all are kept (a row's last bits
    // may differ between the draft's decode row and the verification's).
    assert!(drafted_n > 0 && accepted * 10 >= drafted_n * 9, "{accepted} of {drafted_n} self-drafts kept");
    assert!(m.draft_steps > before.draft_steps && m.draft_errors == 0, "{m:?}");
    assert_eq!((fast.timings.draft_tokens as u64, fast.timings.accepted_tokens as u64), (drafted_n, accepted));
    let steps = m.steps - before.steps;
    assert!(steps * 2 < plain.ids.len() as u64 + 2, "{steps} target steps for {} tokens", plain.ids.len());
    if !full {
        return;
    }
    // A stop string inside a drafted run; max tokens inside a verified run.
    let word = plain.text.split(' ').nth(3).unwrap().to_string();
    let stop = GenerateOpts { stop: vec![format!(" {word}")], ..GenerateOpts::greedy(n) };
    let want = b.generate(p.clone(), &stop).unwrap();
    assert_eq!(b.generate(p.clone(), &drafted(stop.clone(), 4)).unwrap().text, want.text);
    for max in [1, 2, 5] {
        assert_eq!(b.generate(p.clone(), &drafted(GenerateOpts::greedy(max), 4)).unwrap().ids, plain.ids[..max.min(plain.ids.len())]);
    }
    // A draft model sure of fewer tokens drafts less, never differently.
    let sure = e.batcher_with_draft(opts(4), e, 0.9).unwrap();
    let g = sure.generate(p.clone(), &drafted(GenerateOpts::greedy(n), 4)).unwrap();
    assert_eq!(g.ids, plain.ids);
    assert!(g.timings.draft_tokens <= fast.timings.draft_tokens, "{} drafts with p_min 0.9, {} without", g.timings.draft_tokens, fast.timings.draft_tokens);
    // Beside other sequences joining at different steps: model drafts, n-gram drafts, sampling.
    let mut ps = prompts(e, 3);
    ps.insert(1, p.clone());
    let ngram = GenerateOpts { speculative: Some(Speculative { draft_max: 4, adaptive: false, ..Default::default() }), ..GenerateOpts::greedy(8) };
    let sampled = GenerateOpts::default().with_seed(5);
    let all = vec![drafted(GenerateOpts::greedy(8), 3), drafted(GenerateOpts::greedy(n), 4), ngram.clone(), sampled.clone()];
    let got = run_staggered(&b, &ps, &all);
    assert_eq!(got[1].ids, plain.ids);
    assert_eq!(got[0].ids, b.generate(ps[0].clone(), &GenerateOpts::greedy(8)).unwrap().ids);
    assert_eq!(got[2].ids, b.generate(ps[2].clone(), &GenerateOpts::greedy(8)).unwrap().ids);
    assert_eq!(got[3].ids, b.generate(ps[3].clone(), &sampled).unwrap().ids);
    // Adaptive pacing (the default) keeps the identity.
    let paced = GenerateOpts { speculative: Some(Speculative { source: DraftSource::Model, ..Default::default() }), ..GenerateOpts::greedy(n) };
    assert_eq!(b.generate(p.clone(), &paced).unwrap().ids, plain.ids);
}

#[test]
fn smollm2_drafting_for_itself_cpu() {
    self_drafting(&smol(DeviceChoice::Cpu).unwrap(), 24, true);
}

#[test]
fn smollm2_drafting_for_itself_gpu() {
    let Some(e) = smol(DeviceChoice::Gpu) else { return };
    self_drafting(&e, 10, false);
}

/// Six drafting sequences under a KV budget for about two at a time: preempted ones (their
/// draft blocks freed with their blocks) come back with the ids they give alone; cancelling
/// one mid-draft leaves the others unchanged and frees every block it held.
#[test]
fn preemption_and_cancellation_under_model_drafts_change_nothing() {
    let e = smol(DeviceChoice::Cpu).unwrap();
    let ps = prompts(&e, 6);
    let each: Vec<GenerateOpts> = (0..6).map(|_| drafted(GenerateOpts::greedy(40), 3)).collect();
    let large = e.batcher(opts_plain(6)).unwrap();
    let want: Vec<Vec<u32>> = ps.iter().map(|p| large.generate(p.clone(), &GenerateOpts::greedy(40)).unwrap().ids).collect();
    let longest = ps.iter().map(Vec::len).max().unwrap() + 41;
    let blocks = 2 * longest.div_ceil(16) + 1;
    let bytes_per_block = 2 * 30 * 3 * 16 * 64 * 4;
    let tiny = e.batcher_with_draft(BatcherOpts { kv_budget: Some((blocks * bytes_per_block) as u64), prefix_cache: false, ..opts(6) }, &e, 0.0).unwrap();
    let got = run_staggered(&tiny, &ps, &each);
    for i in 0..6 {
        assert_eq!(got[i].ids, want[i], "sequence {i}");
    }
    let m = tiny.metrics();
    assert!(m.preemptions > 0 && m.accepted_tokens > 0, "{m:?}");

    // Cancel the second of three drafting sequences after its third token.
    let b = e.batcher_with_draft(opts(4), &e, 0.0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for (i, p) in ps[..3].iter().enumerate() {
        let tx = tx.clone();
        let sink: cera::engine::BoxSink = Box::new(move |_: &cera::engine::TokenEvent| {
            let _ = tx.send(i);
        });
        handles.push(b.submit(p.clone(), &drafted(GenerateOpts::greedy(24), 3), Some(sink)).unwrap());
    }
    let mut seen = 0;
    while seen < 3 {
        if rx.recv().unwrap() == 1 {
            seen += 1;
        }
    }
    handles[1].cancel();
    let out: Vec<_> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
    assert_eq!(out[1].finish, cera::engine::FinishReason::Cancelled);
    for i in [0, 2] {
        assert_eq!(out[i].ids, large.generate(ps[i].clone(), &GenerateOpts::greedy(24)).unwrap().ids, "sequence {i}");
    }
    let m = b.metrics();
    assert_eq!(m.blocks_used, m.blocks_cached, "every block left is a cached one no sequence holds");
}

fn opts_plain(max_seqs: usize) -> BatcherOpts {
    BatcherOpts { max_seqs, ..BatcherOpts::default() }
}

/// Each architecture as the target, drafted by another (every checkpoint has the same 320-token
/// vocabulary); LFM2 on both sides.
const PAIRS: [(&str, &str); 6] = [
    ("llama-tiny", "qwen2-tiny"),
    ("qwen2-tiny", "lfm2-tiny"),
    ("qwen3-tiny", "gemma3-tiny"),
    ("lfm2-tiny", "llama-tiny"),
    ("gemma3-tiny", "qwen3-tiny"),
    ("llama-tiny-awq", "llama-tiny"),
];

fn tiny_pairs(device: DeviceChoice) {
    for (target, draft) in PAIRS {
        let (e, d) = (tiny(target, device), tiny(draft, device));
        let b = e.batcher_with_draft(opts(4), &d, 0.0).unwrap();
        let p = hf_prompt(target);
        let o = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(24) };
        let plain = b.generate(p.clone(), &o).unwrap();
        let fast = b.generate(p.clone(), &drafted(o.clone(), 3)).unwrap();
        assert_eq!(fast.ids, plain.ids, "{target} drafted by {draft} on {device:?}: the greedy ids changed");
        assert!(fast.timings.draft_tokens > 0, "{target} drafted by {draft}: no drafts were verified");
        // Two at once, joining at different steps.
        let ps = vec![p.clone(), p[..p.len() / 2].to_vec()];
        let got = run_staggered(&b, &ps, &[drafted(o.clone(), 3), drafted(GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(12) }, 2)]);
        assert_eq!(got[0].ids, plain.ids, "{target} drafted by {draft}, beside another sequence");
        assert_eq!(got[1].ids, b.generate(ps[1].clone(), &GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(12) }).unwrap().ids);
        let m = b.metrics();
        assert_eq!(m.draft_errors, 0);
        println!("{target} drafted by {draft} on {device:?}: {} of {} drafts kept", m.accepted_tokens, m.drafted_tokens);
    }
}

#[test]
fn tiny_models_drafted_by_other_architectures_cpu() {
    tiny_pairs(DeviceChoice::Cpu);
}

/// LFM2 (conv rings) and Gemma 3 (sliding windows) drafting for themselves: every draft the
/// draft model makes from its cache is the target's own greedy choice, so nearly all are kept;
/// a draft cache out of step with the sequence (a position off, a stale conv row) would not be.
#[test]
fn tiny_models_drafting_for_themselves_keep_their_drafts_cpu() {
    for model in ["lfm2-tiny", "gemma3-tiny", "qwen3-tiny"] {
        let e = tiny(model, DeviceChoice::Cpu);
        let b = e.batcher_with_draft(opts(4), &e, 0.0).unwrap();
        let p = hf_prompt(model);
        let o = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(40) };
        let plain = b.generate(p.clone(), &o).unwrap();
        let fast = b.generate(p.clone(), &drafted(o, 5)).unwrap();
        assert_eq!(fast.ids, plain.ids, "{model}");
        let (d, k) = (fast.timings.draft_tokens, fast.timings.accepted_tokens);
        assert!(d > 0 && k * 10 >= d * 9, "{model}: {k} of {d} self-drafts kept");
    }
}

#[test]
fn tiny_models_drafted_by_other_architectures_gpu() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    tiny_pairs(DeviceChoice::Gpu);
}

/// Top-3 sampling on the tiny Qwen2 drafted by the tiny Llama: the second and third tokens over
/// 600 seeds each, with and without the drafts, pass a two-sample chi-square test.
#[test]
fn sampled_tokens_keep_their_distribution_under_model_drafts() {
    let (e, d) = (tiny("qwen2-tiny", DeviceChoice::Cpu), tiny("llama-tiny", DeviceChoice::Cpu));
    let b = e.batcher_with_draft(BatcherOpts { max_seqs: 8, ..BatcherOpts::default() }, &d, 0.0).unwrap();
    let prompt = hf_prompt("qwen2-tiny");
    const N: u64 = 600;
    let sampled = |seed: u64| {
        let o = GenerateOpts { max_tokens: 3, ignore_eos: true, ..GenerateOpts::default().with_seed(seed).with_temperature(1.0) };
        GenerateOpts { sampler: SamplerOpts { top_k: 3, top_p: 1.0, min_p: 0.0, ..o.sampler.clone() }, ..o }
    };
    let draws = |spec_on: bool, seeds: std::ops::Range<u64>| -> Vec<Vec<u32>> {
        let hs: Vec<_> = seeds.map(|s| b.submit(prompt.clone(), &if spec_on { drafted(sampled(s), 2) } else { sampled(s) }, None).unwrap()).collect();
        hs.into_iter().map(|h| h.wait().unwrap().ids).collect()
    };
    let plain = draws(false, 0..N);
    let before = b.metrics();
    let fast = draws(true, N..2 * N);
    let m = b.metrics();
    let (drafted_n, accepted) = (m.drafted_tokens - before.drafted_tokens, m.accepted_tokens - before.accepted_tokens);
    assert!(drafted_n > N / 2 && accepted < drafted_n, "{accepted} of {drafted_n} drafts accepted");
    for at in [1, 2] {
        spec_support::assert_same_distribution(&plain, &fast, at);
    }
}

#[test]
fn draft_model_misuse_is_a_typed_error() {
    let (e, d) = (smol(DeviceChoice::Cpu).unwrap(), tiny("llama-tiny", DeviceChoice::Cpu));
    let err = e.batcher_with_draft(opts(2), &d, 0.0).unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    for p in [-0.1, 1.5, f32::NAN] {
        let err = e.batcher_with_draft(opts(2), &e, p).unwrap_err();
        assert!(err.to_string().contains("p_min"), "{err}");
    }
    let plain = e.batcher(opts(2)).unwrap();
    assert!(plain.draft_engine().is_none());
    let err = plain.submit(vec![1u32, 2, 3], &drafted(GenerateOpts::greedy(4), 4), None).unwrap_err();
    assert!(err.to_string().contains("draft model"), "{err}");
    // A session takes a draft model's drafts through generate_drafted only.
    let err = e.session().unwrap().generate(&drafted(GenerateOpts::greedy(4), 4), &mut |_: &cera::engine::TokenEvent| {}).unwrap_err();
    assert!(err.to_string().contains("generate_drafted"), "{err}");
}

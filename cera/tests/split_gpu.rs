//! A model's layers split across two devices made from the test adapter (`LoadOptions::devices`,
//! `tensor_split`; lavapipe in CI): the same logits and the same greedy ids as one device, for
//! llama (SmolLM2-135M, 30 layers) and LFM2 (the tiny checkpoint: conv and attention layers on
//! both sides of the cut), at splits 1:1 and 1:3; the batcher on a split model (requests joining
//! at different steps) gives one device's ids, in micro-batches or not; speculative decoding keeps the ids; greedy steps
//! pipelined two at a time give one device's ids; a profiled step names each device's kernels;
//! and the typed errors of a bad split.

mod batch_support;
mod spec_support;

use cera::engine::{BatcherOpts, DeviceChoice, Engine, EngineError, GenerateOpts, LoadOptions, Speculative, StateOpts, StepInput, StepOutput, Want};
use cera::fetch::{ModelId, ensure_model};
use spec_support::{hf_dir, hf_prompt};

/// The test adapter's name (a part of it picks it in `LoadOptions::devices`), or `None` when
/// GPU tests are explicitly skipped.
fn adapter() -> Option<String> {
    Some(numr::testing::test_gpu()?.capabilities().adapter_name.clone())
}

fn opts(devices: Vec<String>, split: Vec<f64>) -> LoadOptions {
    LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(256), devices, tensor_split: split, ..Default::default() }
}

fn logits(e: &Engine, prompt: &[u32]) -> Vec<f32> {
    let mut st = e.backend().new_state(&StateOpts { n_ctx: 256, ubatch: 64, kv: e.kv_type() }).unwrap();
    // A prompt chunk, then a decode step: both plans cross the cut.
    st.step(StepInput::Tokens(&prompt[..prompt.len() - 1]), 0, Want::Nothing).unwrap();
    match st.step(StepInput::Tokens(&prompt[prompt.len() - 1..]), prompt.len() - 1, Want::Logits).unwrap() {
        StepOutput::Logits(l) => l,
        o => panic!("{o:?}"),
    }
}

fn greedy(e: &Engine, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = e.session().unwrap();
    s.append_tokens(prompt).unwrap();
    s.generate(&GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(n) }, &mut |_: &cera::engine::TokenEvent| {}).unwrap().ids
}

/// Loads `path` on one device and split two ways; asserts the same logits (within `tol` of their
/// scale) and greedy ids.
fn same_as_one_device(path: &std::path::Path, prompt: &[u32], name: &str) {
    let Some(a) = adapter() else { return };
    let one = Engine::load(path, &opts(vec![], vec![]), None).unwrap();
    let want_logits = logits(&one, prompt);
    let want_ids = greedy(&one, prompt, 24);
    let scale = want_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
    for split in [vec![], vec![1.0, 3.0]] {
        let two = Engine::load(path, &opts(vec![a.clone(), a.clone()], split.clone()), None).unwrap();
        let dev = two.device_name();
        assert_eq!(dev.matches(" + ").count(), 1, "{name} {split:?}: {dev}");
        let got = logits(&two, prompt);
        let d = got.iter().zip(&want_logits).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        println!("{name} split {split:?} ({dev}): logits within {d} (scale {scale})");
        assert!(d <= 1e-4 * scale.max(1.0), "{name} split {split:?}: logits differ by {d} (scale {scale})");
        assert_eq!(greedy(&two, prompt, 24), want_ids, "{name} split {split:?}: greedy ids");
    }
}

#[test]
fn smollm2_split_two_ways_gives_one_devices_logits_and_ids() {
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let e = Engine::load(&path, &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(64), ..Default::default() }, None).unwrap();
    let prompt = e.tokenizer().encode("The three primary colours are red, yellow and", Default::default()).unwrap();
    same_as_one_device(&path, &prompt, "SmolLM2");
}

#[test]
fn lfm2_split_two_ways_gives_one_devices_logits_and_ids() {
    same_as_one_device(&hf_dir("lfm2-tiny"), &hf_prompt("lfm2-tiny"), "lfm2-tiny");
}

#[test]
fn a_bad_split_is_a_typed_error() {
    let Some(a) = adapter() else { return };
    let path = hf_dir("lfm2-tiny");
    let usage = |o: LoadOptions, what: &str| match Engine::load(&path, &o, None) {
        Err(EngineError::Usage(m)) => assert!(m.contains(what), "{m}"),
        Err(e) => panic!("{what}: {e:?}"),
        Ok(_) => panic!("{what}: loaded"),
    };
    // A device with no layers (the model has 3), more devices than layers, ratios that do not
    // fit the devices, a split without devices, and GPUs with the CPU executor.
    usage(opts(vec![a.clone(), a.clone()], vec![0.0, 1.0]), "leaves device 0 with no layers");
    usage(opts(vec![a.clone(); 4], vec![]), "with no layers");
    usage(opts(vec![a.clone(), a.clone()], vec![1.0, 2.0, 3.0]), "3 ratios for 2 devices");
    usage(opts(vec![], vec![1.0, 1.0]), "needs --devices");
    usage(LoadOptions { device: DeviceChoice::Cpu, ..opts(vec![a.clone(), a.clone()], vec![]) }, "not with --device cpu");
    // An adapter that does not exist.
    match Engine::load(&path, &opts(vec![a.clone(), "no such adapter 7".into()], vec![]), None) {
        Err(EngineError::Device { device, reason }) => assert!(device.contains("no such adapter 7") && !reason.is_empty(), "{device}: {reason}"),
        Err(e) => panic!("{e:?}"),
        Ok(_) => panic!("loaded on an adapter that does not exist"),
    }
}

/// Speculative decoding on a split model: each device runs its verification plan, and the greedy
/// ids equal plain decoding's on one device, with drafts verified.
#[test]
fn speculative_decoding_on_a_split_model_keeps_the_ids() {
    let Some(a) = adapter() else { return };
    for model in ["lfm2-tiny", "llama-tiny"] {
        let path = hf_dir(model);
        let prompt = hf_prompt(model);
        let one = Engine::load(&path, &opts(vec![], vec![]), None).unwrap();
        let two = Engine::load(&path, &opts(vec![a.clone(), a.clone()], vec![]), None).unwrap();
        let plain = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(24) };
        let spec = GenerateOpts { speculative: Some(Speculative { draft_max: 4, adaptive: false, ..Default::default() }), ..plain.clone() };
        let run = |e: &Engine, o: &GenerateOpts| {
            let mut s = e.session().unwrap();
            s.append_tokens(&prompt).unwrap();
            s.generate(o, &mut |_: &cera::engine::TokenEvent| {}).unwrap()
        };
        let want = run(&one, &plain).ids;
        let g = run(&two, &spec);
        assert_eq!(g.ids, want, "{model}: speculative decoding on two devices");
        assert!(g.timings.draft_tokens > 0, "{model}: no drafts verified ({:?})", g.timings);
    }
}

/// Five requests joining a batcher at different steps, on one device and split two ways: the
/// same greedy ids (the paged caches of both devices share the block tables, and LFM2's conv
/// rings are per sequence on each device).
fn batched_same_as_one_device(path: &std::path::Path, name: &str) {
    let Some(a) = adapter() else { return };
    let one = Engine::load(path, &opts(vec![], vec![]), None).unwrap();
    let prompts = batch_support::prompts(&one, 5);
    let o = vec![GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(10) }; prompts.len()];
    let bo = BatcherOpts { max_seqs: 4, max_step_tokens: 64, ..BatcherOpts::default() };
    let ids = |e: &Engine| batch_support::run_staggered(&e.batcher(bo).unwrap(), &prompts, &o).into_iter().map(|g| g.ids).collect::<Vec<_>>();
    let want = ids(&one);
    // The default micro-batches (of 256 tokens: none in steps of at most 64), then micro-batches
    // of at least 2 tokens (every step of two entries or more runs as two).
    for (split, micro) in [(vec![], None), (vec![1.0, 3.0], None), (vec![], Some(2)), (vec![1.0, 3.0], Some(2))] {
        let mut o = opts(vec![a.clone(), a.clone()], split.clone());
        if let Some(t) = micro {
            o.tuning.set_pair(&format!("split_micro_tokens={t}")).unwrap();
        }
        let two = Engine::load(path, &o, None).unwrap();
        assert_eq!(ids(&two), want, "{name} split {split:?}, micro-batches of {micro:?} tokens: the batcher's ids");
    }
}

#[test]
fn the_batcher_on_a_split_model_gives_one_devices_ids() {
    batched_same_as_one_device(&hf_dir("lfm2-tiny"), "lfm2-tiny");
    batched_same_as_one_device(&hf_dir("qwen3-tiny"), "qwen3-tiny");
}

/// A profiled step of a split model gives each device's kernels under its index, and the output
/// of a plain step.
#[test]
fn a_profiled_split_step_names_each_devices_kernels() {
    let Some(a) = adapter() else { return };
    let e = Engine::load(hf_dir("lfm2-tiny"), &opts(vec![a.clone(), a], vec![]), None).unwrap();
    let so = StateOpts { n_ctx: 64, ubatch: 16, kv: e.kv_type() };
    let p = &hf_prompt("lfm2-tiny")[..8];
    let (out, times) = e.backend().new_state(&so).unwrap().profile_step(StepInput::Tokens(p), 0, Want::Argmax).unwrap();
    let plain = e.backend().new_state(&so).unwrap().step(StepInput::Tokens(p), 0, Want::Argmax).unwrap();
    assert_eq!(out, plain);
    for d in ["dev0:", "dev1:"] {
        assert!(times.iter().any(|t| t.label.starts_with(d) && t.count > 0), "{d}: {times:?}");
    }
    assert!(times.iter().all(|t| t.label.starts_with("dev0:") || t.label.starts_with("dev1:")), "{times:?}");
}

/// Greedy steps pipelined on a split model (two in flight, each fed the id the one before chose
/// on the last device) give the ids of one device stepping one at a time.
#[test]
fn a_split_state_pipelines_greedy_steps() {
    let Some(a) = adapter() else { return };
    let path = hf_dir("llama-tiny");
    let p = &hf_prompt("llama-tiny")[..8];
    let one = Engine::load(&path, &opts(vec![], vec![]), None).unwrap();
    let two = Engine::load(&path, &opts(vec![a.clone(), a], vec![]), None).unwrap();
    let so = StateOpts { n_ctx: 128, ubatch: 32, kv: one.kv_type() };
    let id = |o: StepOutput| match o {
        StepOutput::Argmax(id) => id,
        o => panic!("{o:?}"),
    };
    let mut st = one.backend().new_state(&so).unwrap();
    let mut want = vec![id(st.step(StepInput::Tokens(p), 0, Want::Argmax).unwrap())];
    for k in 0..6 {
        let last = *want.last().unwrap();
        want.push(id(st.step(StepInput::Tokens(&[last]), p.len() + k, Want::Argmax).unwrap()));
    }
    let mut sp = two.backend().new_state(&so).unwrap();
    sp.submit(StepInput::Tokens(p), 0, Want::Argmax).unwrap();
    let mut got = Vec::new();
    for k in 0..6 {
        sp.submit(StepInput::LastArgmax, p.len() + k, Want::Argmax).unwrap();
        assert_eq!(sp.in_flight(), 2);
        assert!(sp.submit(StepInput::LastArgmax, p.len() + k + 1, Want::Argmax).is_err(), "a third step in flight");
        got.push(id(sp.collect().unwrap()));
    }
    got.push(id(sp.collect().unwrap()));
    assert_eq!(got, want);
    assert!(sp.collect().is_err() && sp.in_flight() == 0);
    // A step that wants nothing leaves no id to feed the next.
    sp.submit(StepInput::Tokens(&[1]), 0, Want::Nothing).unwrap();
    assert!(matches!(sp.submit(StepInput::LastArgmax, 1, Want::Argmax), Err(EngineError::Usage(_))));
}

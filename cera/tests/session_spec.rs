//! Speculative decoding in a [`Session`] (`GenerateOpts::speculative`, n-gram drafts verified by
//! `BackendState::verify`), on the CPU and on the GPU (lavapipe in CI):
//! - the real SmolLM2-135M-Instruct Q4_1 on a copy-heavy prompt: the greedy ids equal those
//!   without speculation token for token, drafts are accepted and fewer steps run than tokens,
//!   across stop strings, max tokens, an end-of-generation token and a second turn;
//! - the tiny random checkpoints of every architecture (LFM2 included, at its most drafts):
//!   the same greedy ids with speculation as without, where drafts are mostly rejected;
//! - rollback: after a verification step whose drafts are all rejected, the next step's logits
//!   equal those of a session that never saw the drafts (KV cache and LFM2's conv rows);
//! - sampling with drafts keeps each token's distribution (chi-square over 600 seeds);
//! - draft models (`ModelDrafter`): SmolLM2 drafting for itself, tiny checkpoints drafting for
//!   another, the same greedy ids; a vocabulary mismatch is a typed error.

mod spec_support;

use cera::engine::speculative::max_drafts;
use cera::engine::{
    BackendState, DecodeGemv, DeviceChoice, Engine, GenerateOpts, LoadOptions, ModelDrafter, Speculative, StateOpts, StepInput, StepOutput, Want,
};
use cera::fetch::{ModelId, ensure_model};
use spec_support::{assert_same_distribution, hf_dir, hf_prompt};

fn smol(device: DeviceChoice) -> Option<Engine> {
    if device == DeviceChoice::Gpu {
        numr::testing::test_gpu()?;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    Some(Engine::load(path, &LoadOptions { device, n_ctx: Some(512), ..Default::default() }, None).expect("load SmolLM2"))
}

fn spec(o: GenerateOpts, draft_max: usize, ngram: usize) -> GenerateOpts {
    GenerateOpts { speculative: Some(Speculative { draft_max, draft_min: 1, ngram, adaptive: true, ..Default::default() }), ..o }
}

/// [`spec`] drafting whatever it finds at every step (no pacing).
fn spec_every_step(o: GenerateOpts, draft_max: usize, ngram: usize) -> GenerateOpts {
    GenerateOpts { speculative: Some(Speculative { draft_max, draft_min: 1, ngram, adaptive: false, ..Default::default() }), ..o }
}

/// Greedy ids of `prompt` in a fresh session, with `opts`.
fn run(e: &Engine, prompt: &[u32], opts: &GenerateOpts) -> cera::engine::Generation {
    let mut s = e.session().unwrap();
    s.append_tokens(prompt).unwrap();
    s.generate(opts, &mut |_: &cera::engine::TokenEvent| {}).unwrap()
}

fn copy_heavy(e: &Engine, n: usize, full: bool) {
    let text = "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango.\nCopy: apple, banana, cherry,";
    let p = e.tokenizer().encode(text, Default::default()).unwrap();
    let plain = run(e, &p, &GenerateOpts::greedy(n));
    let fast = run(e, &p, &spec(GenerateOpts::greedy(n), 6, 3));
    assert_eq!(fast.ids, plain.ids, "speculation changed the greedy ids");
    assert_eq!((fast.text.as_str(), fast.finish), (plain.text.as_str(), plain.finish));
    let t = fast.timings;
    assert!(t.accepted_tokens > 0 && t.accepted_tokens <= t.draft_tokens, "{t:?}");
    assert!(t.decode_steps + t.accepted_tokens == t.decode_tokens && t.decode_tokens + 1 == fast.ids.len(), "{t:?} for {} ids", fast.ids.len());
    assert_eq!((plain.timings.draft_tokens, plain.timings.decode_tokens), (0, plain.timings.decode_steps));
    if !full {
        return;
    }
    // A stop string inside a copied run; max tokens inside a verified draft.
    let stop = GenerateOpts { stop: vec![" fig".into()], ..GenerateOpts::greedy(n) };
    assert_eq!(run(e, &p, &spec(stop.clone(), 6, 3)).text, run(e, &p, &stop).text);
    for max in [1, 2, 5] {
        assert_eq!(run(e, &p, &spec(GenerateOpts::greedy(max), 6, 3)).ids, plain.ids[..max.min(plain.ids.len())]);
    }
    // A second turn in the same session (prefix reuse after speculative steps) equals the
    // same turns without speculation.
    let turns = |o: &GenerateOpts| {
        let mut s = e.session().unwrap();
        s.append_tokens(&p).unwrap();
        let a = s.generate(o, &mut |_: &cera::engine::TokenEvent| {}).unwrap();
        s.append_text(" Again: apple, banana,").unwrap();
        let b = s.generate(o, &mut |_: &cera::engine::TokenEvent| {}).unwrap();
        (a.ids, b.ids, b.reused)
    };
    assert_eq!(turns(&spec(GenerateOpts::greedy(12), 8, 2)), turns(&GenerateOpts::greedy(12)));
    // An end-of-generation token inside a run of drafts: a chat turn the model ends itself.
    let chat = e
        .tokenizer()
        .encode(
            "<|im_start|>user\nRepeat exactly: one two three<|im_end|>\n<|im_start|>assistant\n",
            cera::tokenizer::EncodeOptions { add_special: false, parse_special: true },
        )
        .unwrap();
    let plain = run(e, &chat, &GenerateOpts::greedy(40));
    let fast = run(e, &chat, &spec(GenerateOpts::greedy(40), 8, 1));
    assert_eq!((fast.ids, fast.finish, fast.stop_token), (plain.ids, plain.finish, plain.stop_token));
    assert_eq!(fast.finish, cera::engine::FinishReason::Stop, "the model ends its turn");
}

#[test]
fn smollm2_greedy_ids_equal_without_speculation_cpu() {
    copy_heavy(&smol(DeviceChoice::Cpu).unwrap(), 24, true);
}

#[test]
fn smollm2_greedy_ids_equal_without_speculation_gpu() {
    let Some(e) = smol(DeviceChoice::Gpu) else { return };
    copy_heavy(&e, 12, false);
}

const MODELS: [&str; 6] = ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "lfm2-tiny", "gemma3-tiny", "llama-tiny-awq"];

fn tiny_models(device: DeviceChoice) {
    for model in MODELS {
        let e = Engine::load(hf_dir(model), &LoadOptions { device, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap();
        let p = hf_prompt(model);
        let most = max_drafts(e.config());
        let opts = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(24) };
        let plain = run(&e, &p, &opts);
        // One-token suffixes: a random model's tokens recur, so drafts come often; at the
        // model's most drafts (LFM2: fewer than 16, so that its conv rows can roll back).
        let fast = run(&e, &p, &spec_every_step(opts.clone(), most, 1));
        assert_eq!(fast.ids, plain.ids, "{model} on {device:?}: speculation changed the greedy ids");
        assert!(fast.timings.draft_tokens > 0, "{model}: no drafts were verified");
        println!("{model} on {device:?}: {} of {} drafts kept (at most {most} a step)", fast.timings.accepted_tokens, fast.timings.draft_tokens);
        rollback(&e, &p, model, most);
    }
}

/// A verification step of `most` drafts (made up: the model rejects them), then the step of
/// the model's own choice after the first token, at the position the first draft held: the
/// same logits as a state that never saw the drafts.
fn rollback(e: &Engine, p: &[u32], model: &str, most: usize) {
    let vocab = e.config().vocab as u32;
    let so = StateOpts { n_ctx: 128, ubatch: 64, kv: e.kv_type() };
    let pos = p.len();
    let mut st = e.backend().new_state(&so).unwrap();
    let StepOutput::Argmax(next) = st.step(StepInput::Tokens(p), 0, Want::Argmax).unwrap() else { panic!() };
    let mut run: Vec<u32> = vec![next];
    run.extend((0..most as u32).map(|j| (next + 1 + 7 * j) % vocab));
    let rows = st.verify(&run, pos, Want::Argmax).unwrap();
    assert_eq!(rows.len(), run.len());
    let StepOutput::Argmax(choice) = rows[0] else { panic!("{rows:?}") };
    let logits = |st: &mut Box<dyn BackendState>| match st.step(StepInput::Tokens(&[choice]), pos + 1, Want::Logits).unwrap() {
        StepOutput::Logits(l) => l,
        o => panic!("{o:?}"),
    };
    let got = logits(&mut st);
    let mut fresh = e.backend().new_state(&so).unwrap();
    fresh.step(StepInput::Tokens(p), 0, Want::Nothing).unwrap();
    assert_eq!(fresh.step(StepInput::Tokens(&[next]), pos, Want::Argmax).unwrap(), StepOutput::Argmax(choice), "{model}: the verification step's first row");
    let want = logits(&mut fresh);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-3 * scale, "{model}: logits after a rolled-back verification differ by {diff} (scale {scale})");
}

#[test]
fn tiny_models_greedy_ids_and_rollback_cpu() {
    tiny_models(DeviceChoice::Cpu);
}

#[test]
fn tiny_models_greedy_ids_and_rollback_gpu() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    tiny_models(DeviceChoice::Gpu);
}

/// `Session::generate_drafted` with a draft model (`ModelDrafter`): SmolLM2 drafting for itself
/// keeps nearly every draft; on the tiny checkpoints, draft models of other weights (Qwen2, and
/// the AWQ-quantized Llama, both drafting for Llama; random weights, so drafts are mostly
/// rejected) give the target's own greedy ids; a draft model of another vocabulary is a typed
/// error.
fn draft_models(device: DeviceChoice) {
    let quiet = &mut |_: &cera::engine::TokenEvent| {};
    if let Some(e) = smol(device) {
        let text =
            "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango.\nCopy: apple, banana, cherry,";
        let p = e.tokenizer().encode(text, Default::default()).unwrap();
        let n = if device == DeviceChoice::Cpu { 20 } else { 8 };
        let plain = run(&e, &p, &GenerateOpts::greedy(n));
        let mut d = ModelDrafter::new(&e, &e).unwrap();
        let mut s = e.session().unwrap();
        s.append_tokens(&p).unwrap();
        let g = s.generate_drafted(&spec(GenerateOpts::greedy(n), 4, 3), quiet, &mut d).unwrap();
        assert_eq!(g.ids, plain.ids, "{device:?}: drafting with itself changed the ids");
        let t = g.timings;
        assert!(t.accepted_tokens * 10 >= t.draft_tokens * 9 && t.draft_tokens > 0, "{device:?}: {t:?}");
        assert!(d.take_error().is_none());
        // `p_min`: the drafts stop where the draft model is unsure; the ids stay the same.
        let mut sure = ModelDrafter::new(&e, &e).unwrap().with_p_min(0.99);
        let mut s = e.session().unwrap();
        s.append_tokens(&p).unwrap();
        let h = s.generate_drafted(&spec_every_step(GenerateOpts::greedy(n), 4, 3), quiet, &mut sure).unwrap();
        assert_eq!(h.ids, plain.ids, "{device:?}: p_min changed the ids");
        assert!(h.timings.draft_tokens < t.draft_tokens, "{device:?}: {:?} against {t:?}", h.timings);
        let tiny = Engine::load(hf_dir("llama-tiny"), &LoadOptions { device, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap();
        let err = ModelDrafter::new(&tiny, &e).err().expect("a vocabulary mismatch");
        assert!(err.to_string().contains("vocabulary"), "{err}");
    }
    let load = |m: &str| Engine::load(hf_dir(m), &LoadOptions { device, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap();
    let target = load("llama-tiny");
    let p = hf_prompt("llama-tiny");
    let opts = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(16) };
    let plain = run(&target, &p, &opts);
    for draft in ["qwen2-tiny", "llama-tiny-awq"] {
        let de = load(draft);
        let mut d = ModelDrafter::new(&de, &target).unwrap();
        let mut s = target.session().unwrap();
        s.append_tokens(&p).unwrap();
        let g = s.generate_drafted(&spec_every_step(opts.clone(), 4, 1), quiet, &mut d).unwrap();
        assert_eq!(g.ids, plain.ids, "llama-tiny drafted by {draft} on {device:?}");
        assert!(g.timings.draft_tokens > 0, "{draft}: {:?}", g.timings);
        println!("llama-tiny drafted by {draft} on {device:?}: {} of {} kept", g.timings.accepted_tokens, g.timings.draft_tokens);
    }
}

#[test]
fn draft_models_cpu() {
    draft_models(DeviceChoice::Cpu);
}

#[test]
fn draft_models_gpu() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    draft_models(DeviceChoice::Gpu);
}

/// Sampling with drafts in a session (speculative sampling over the top-k candidates): the
/// second and third tokens over 600 seeds each, with and without one-token drafts, pass a
/// two-sample chi-square test on the tiny Qwen2 (whose likely tokens recur, so drafts are
/// often among them and sometimes kept).
#[test]
fn sampled_tokens_keep_their_distribution() {
    let model = "qwen2-tiny";
    let e = Engine::load(hf_dir(model), &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap();
    let p = hf_prompt(model);
    const N: u64 = 600;
    let sampled = |seed: u64| {
        let o = GenerateOpts { max_tokens: 3, ignore_eos: true, ..GenerateOpts::default().with_seed(seed).with_temperature(1.0) };
        GenerateOpts { sampler: cera::engine::SamplerOpts { top_k: 3, top_p: 1.0, min_p: 0.0, ..o.sampler.clone() }, ..o }
    };
    let mut s = e.session().unwrap();
    let (mut drafted, mut kept) = (0, 0);
    let mut draws = |spec_on: bool, seeds: std::ops::Range<u64>| -> Vec<Vec<u32>> {
        seeds
            .map(|seed| {
                s.reset();
                s.append_tokens(&p).unwrap();
                let o = if spec_on { spec_every_step(sampled(seed), 2, 1) } else { sampled(seed) };
                let g = s.generate(&o, &mut |_: &cera::engine::TokenEvent| {}).unwrap();
                (drafted, kept) = (drafted + g.timings.draft_tokens, kept + g.timings.accepted_tokens);
                g.ids
            })
            .collect()
    };
    let plain = draws(false, 0..N);
    let fast = draws(true, N..2 * N);
    assert!(drafted > N as usize / 2 && kept > 0 && kept < drafted, "{kept} of {drafted} drafts kept");
    for at in [1, 2] {
        assert_same_distribution(&plain, &fast, at);
    }
}

/// A verification step's fused plan on both decode paths of SmolLM2: the norms and GLUs run
/// inside the rows' quantizers (int8 path) or the f32 GEMVs' prologues, and the residual adds
/// inside the GEMVs (10 dispatches a llama layer on the int8 path, 6 on the f32 one, where the
/// unfused plan took 14 and 10), and every row's logits agree with a decode step's at the same
/// position: within the int8 path's rounding (the decode plan quantizes in other kernels'
/// epilogues and applies the norm after the integer dot products; the same greedy choice
/// wherever the decode step's leads by a clear margin), within f32 rounding on the f32 path.
#[test]
fn verification_rows_match_decode_steps_on_both_paths_gpu() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    for (gemv, per_layer, head, top5) in [(DecodeGemv::Int8, 10, 2, 0.35f32), (DecodeGemv::F32, 6, 1, 2e-3)] {
        let opts = LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(256), decode_gemv: gemv, ..Default::default() };
        let e = Engine::load(&path, &opts, None).unwrap();
        let text = "Copy the list exactly.\nList: apple, banana, cherry, date, elderberry, fig.\nCopy: apple,";
        let p = e.tokenizer().encode(text, Default::default()).unwrap();
        let so = StateOpts { n_ctx: 256, ubatch: 64, kv: e.kv_type() };
        let logits = |o: StepOutput| match o {
            StepOutput::Logits(l) => l,
            o => panic!("{o:?}"),
        };
        // Decode steps, one token at a time, each fed the greedy choice.
        let mut st = e.backend().new_state(&so).unwrap();
        st.step(StepInput::Tokens(&p[..p.len() - 1]), 0, Want::Nothing).unwrap();
        let (mut fed, mut want) = (vec![p[p.len() - 1]], Vec::new());
        for i in 0..9 {
            let l = logits(st.step(StepInput::Tokens(&fed[i..i + 1]), p.len() - 1 + i, Want::Logits).unwrap());
            fed.push(argmax(&l));
            want.push(l);
        }
        // The same nine tokens as one verification step.
        let mut v = e.backend().new_state(&so).unwrap();
        v.step(StepInput::Tokens(&p[..p.len() - 1]), 0, Want::Nothing).unwrap();
        let rows = v.verify(&fed[..9], p.len() - 1, Want::Logits).unwrap();
        let c = v.last_step_counters();
        // The embedding, the layers, the LM head over the rows (int8: its quantizer with the
        // final norm, then the GEMV; f32: the GEMV with the norm as its prologue); the logits
        // are read whole.
        assert_eq!(c.dispatches, 1 + per_layer * e.config().n_layers + head, "{gemv:?}: {c:?}");
        for (r, (row, d)) in rows.into_iter().zip(&want).enumerate() {
            let got = logits(row);
            let (lg, ld) = (log_softmax(&got), log_softmax(d));
            let mut top: Vec<usize> = (0..ld.len()).collect();
            top.sort_by(|&a, &b| ld[b].total_cmp(&ld[a]));
            let worst = top[..5].iter().map(|&i| (lg[i] - ld[i]).abs()).fold(0f32, f32::max);
            println!("{gemv:?} row {r}: top-5 log-probabilities within {worst}");
            assert!(worst < top5, "{gemv:?} row {r}: top-5 log-probabilities differ by {worst}");
            if ld[top[0]] - ld[top[1]] > 0.5 {
                assert_eq!(argmax(&got), top[0] as u32, "{gemv:?} row {r}: another greedy choice");
            }
        }
        // The same step profiled: the dispatches of an argmax verification step, each timed,
        // and the cache as it was (the step after it gives the same logits as before it).
        let pos = p.len() - 1;
        let before = v.verify(&fed[..9], pos, Want::Logits).unwrap().pop().map(logits).unwrap();
        v.verify(&fed[..9], pos, Want::Argmax).unwrap();
        let plain = v.last_step_counters().dispatches;
        let times = v.profile_verify(&fed[..9], pos).unwrap();
        assert_eq!(times.iter().map(|t| t.count).sum::<usize>(), plain, "{gemv:?}: {times:?}");
        assert!(times.iter().all(|t| t.ns >= 0.0 && !t.label.is_empty()) && times.iter().map(|t| t.ns).sum::<f64>() > 0.0, "{times:?}");
        let after = v.verify(&fed[..9], pos, Want::Logits).unwrap().pop().map(logits).unwrap();
        let d = before.iter().zip(&after).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(d < 1e-4, "{gemv:?}: a verification step after a profiled one differs by {d}");
    }
}

fn argmax(l: &[f32]) -> u32 {
    (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b]).then(b.cmp(&a))).unwrap() as u32
}

fn log_softmax(l: &[f32]) -> Vec<f32> {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let z = l.iter().map(|&v| ((v - m) as f64).exp()).sum::<f64>().ln() as f32;
    l.iter().map(|&v| v - m - z).collect()
}

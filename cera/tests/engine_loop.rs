//! The session's generation loop on a scripted executor: a mock `Backend` whose logits are a
//! function of the tokens in its cache, with a checked cache (a step at a position past what
//! was written, over the ubatch or past the context is an error) and a log of every step. No
//! model file and no device: what is tested is the loop itself (prefix reuse, chunked prefill,
//! what each step asks for, stop conditions, streaming text, cancellation, seeds).

use std::sync::Arc;

use cera::engine::{CancelToken, Engine, EngineError, FinishReason, GenerateOpts, SamplerOpts, TokenEvent, Want, end_of_generation_ids};

mod mock_backend;

use mock_backend::*;

const HELLO_CHAIN: &[(u32, u32)] = &[(HELLO, WORLD), (WORLD, E), (E, N), (N, D), (D, BANG), (BANG, IM_END)];

#[test]
fn end_of_generation_ids_come_from_the_vocabulary() {
    let tok = tokenizer();
    assert_eq!(end_of_generation_ids(&tok), vec![EOS, IM_END]);
}

#[test]
fn greedy_runs_argmax_on_the_device_and_stops_at_end_of_turn() {
    let t = setup(chain(HELLO_CHAIN, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    assert_eq!(s.tokens(), &[1, HELLO]);
    let (g, events) = run(&mut s, &GenerateOpts::greedy(100));
    assert_eq!(g.ids, vec![WORLD, E, N, D, BANG]);
    assert_eq!(g.text, " worldEND!");
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.stop_token, Some(IM_END));
    assert_eq!(events.iter().map(|e| e.0).collect::<Vec<_>>(), g.ids);
    assert_eq!(events.iter().map(|e| e.1.as_str()).collect::<String>(), g.text);
    // The stop token is in the sequence, not in the output.
    assert_eq!(s.tokens(), &[1, HELLO, WORLD, E, N, D, BANG, IM_END]);
    let steps = t.steps();
    assert_eq!(steps[0], Step { pos: 0, tokens: vec![1, HELLO], last_argmax: false, want: Want::Argmax });
    // Every decode step feeds the previous argmax back without reading it in as input.
    assert!(steps[1..].iter().enumerate().all(|(i, st)| st.last_argmax && st.pos == 2 + i && st.want == Want::Argmax), "{steps:?}");
    // Pipelined: the step of the end-of-turn token ran before its id was seen, and was dropped.
    assert_eq!(steps.len(), 1 + 5 + 1);
    assert_eq!((g.prompt_tokens, g.reused, g.prefilled, g.timings.prefill_tokens, g.timings.decode_steps), (2, 0, 2, 2, 5));
    assert_eq!(s.cached_tokens(), 2 + 5, "the dropped step's position is not cached");
    // One token at a time: exactly the steps needed.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g2, _) = run(&mut s, &GenerateOpts { pipeline: false, ..GenerateOpts::greedy(100) });
    assert_eq!((g2.ids, g2.text, s.cached_tokens()), (g.ids, g.text, 2 + 5));
    assert_eq!(t.steps().len(), 1 + 5);
}

#[test]
fn stop_strings_across_tokens_are_never_emitted() {
    let t = setup(chain(HELLO_CHAIN, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let opts = GenerateOpts { stop: vec!["END".into()], ..GenerateOpts::greedy(100) };
    let (g, events) = run(&mut s, &opts);
    assert_eq!(g.text, " world");
    assert_eq!(g.finish, FinishReason::Stop);
    assert_eq!(g.ids, vec![WORLD, E, N, D], "the tokens of the stop string are generated ids");
    assert!(events.iter().all(|e| !e.1.contains('E') && !e.1.contains('N')), "{events:?}");
    assert_eq!(events.iter().map(|e| e.1.as_str()).collect::<String>(), " world");
    // A held prefix that does not complete is released, in order.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, events) = run(&mut s, &GenerateOpts { stop: vec!["ENX".into()], ..GenerateOpts::greedy(100) });
    assert_eq!((g.text.as_str(), g.finish), (" worldEND!", FinishReason::Stop));
    assert_eq!(events.iter().map(|e| e.0).collect::<Vec<_>>(), vec![WORLD, E, N, D, BANG]);
    assert_eq!(events.iter().map(|e| e.1.as_str()).collect::<Vec<_>>(), vec![" world", "", "", "END", "!"]);
    // Text held back when an end-of-generation token arrives is released with the last event.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, events) = run(&mut s, &GenerateOpts { stop: vec!["!?".into()], ..GenerateOpts::greedy(100) });
    assert_eq!((g.text.as_str(), g.finish), (" worldEND!", FinishReason::Stop));
    assert_eq!(events.last().unwrap(), &(BANG, "!".to_string()));
    // A stop string inside one token.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts { stop: vec!["orl".into()], ..GenerateOpts::greedy(100) });
    assert_eq!((g.text.as_str(), g.ids.as_slice()), (" w", &[WORLD][..]));
}

#[test]
fn max_tokens_and_stop_tokens() {
    const LOOP: &[(u32, u32)] = &[(HELLO, A), (A, B), (B, C), (C, A)];
    let t = setup(chain(LOOP, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(7));
    assert_eq!(g.ids, vec![A, B, C, A, B, C, A]);
    assert_eq!((g.finish, g.text.as_str(), g.timings.decode_steps), (FinishReason::MaxTokens, "abcabca", 6));
    assert_eq!(s.tokens().len(), 2 + 7);
    assert_eq!(s.cached_tokens(), 2 + 6, "the last token is not run");
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts { stop_tokens: vec![C], ..GenerateOpts::greedy(100) });
    assert_eq!((g.ids.as_slice(), g.text.as_str(), g.finish, g.stop_token), (&[A, B][..], "ab", FinishReason::Stop, Some(C)));
    // max_tokens 0 runs the prompt into the cache and generates nothing.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    t.steps();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(0));
    assert_eq!((g.ids.len(), g.finish, g.prefilled, s.cached_tokens()), (0, FinishReason::MaxTokens, 2, 2));
    assert_eq!(t.steps()[0].want, Want::Nothing);
}

#[test]
fn ignore_eos_masks_the_end_of_generation_tokens() {
    const SECOND: &[(u32, u32)] = &[(BANG, X), (X, Y)];
    const NEXT: &[(u32, u32)] = &[(HELLO, BANG), (BANG, IM_END), (X, EOS), (Y, IM_END)];
    let t = setup(chain(NEXT, SECOND), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(10));
    assert_eq!((g.ids.as_slice(), g.finish), (&[BANG][..], FinishReason::Stop));
    t.steps();
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(3) });
    assert_eq!((g.ids.as_slice(), g.finish), (&[BANG, X, Y][..], FinishReason::MaxTokens));
    assert!(g.ids.iter().all(|id| !t.engine.eog_ids().contains(id)));
    // Greedy masks the end-of-generation ids on the device and stays on the argmax path.
    let steps = t.steps();
    assert!(steps.iter().all(|st| st.want == Want::Argmax), "{steps:?}");
    assert!(steps[1..].iter().all(|st| st.last_argmax), "{steps:?}");
    // Sampling (top-k 5) with the mask: never an end-of-generation token.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let opts =
        GenerateOpts { ignore_eos: true, sampler: SamplerOpts { temperature: 1.5, top_k: 5, seed: 3, ..SamplerOpts::greedy() }, ..GenerateOpts::greedy(40) };
    let (g, _) = run(&mut s, &opts);
    assert_eq!(g.ids.len(), 40);
    assert!(g.ids.iter().all(|id| !t.engine.eog_ids().contains(id)));
    assert!(t.steps().iter().all(|st| st.want == Want::TopK(7)));
}

#[test]
fn utf8_pieces_are_never_broken() {
    const NEXT: &[(u32, u32)] = &[(HELLO, B0), (B0, B1), (B1, B2), (B2, BANG), (BANG, IM_END)];
    let t = setup(chain(NEXT, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, events) = run(&mut s, &GenerateOpts::greedy(10));
    assert_eq!(g.text, "€!");
    assert_eq!(events, vec![(B0, String::new()), (B1, String::new()), (B2, "€".to_string()), (BANG, "!".to_string())]);
    // Ending inside a character gives U+FFFD once, in the last event, never a broken string.
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g, events) = run(&mut s, &GenerateOpts::greedy(2));
    assert_eq!((g.text.as_str(), g.finish), ("\u{FFFD}", FinishReason::MaxTokens));
    assert_eq!(events.last().unwrap().1, "\u{FFFD}");
}

#[test]
fn prompt_over_the_context_is_an_error_before_anything_runs() {
    let t = setup(chain(HELLO_CHAIN, &[]), 8, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, A, B, C, A, B, C, A, B]).unwrap();
    let e = s.generate(&GenerateOpts::greedy(4), &mut |_: &TokenEvent| panic!("no token expected")).unwrap_err();
    assert!(matches!(e, EngineError::ContextOverflow { tokens: 9, n_ctx: 8 }), "{e}");
    assert!(t.steps().is_empty(), "nothing may run");
    assert!(matches!(s.append_tokens(&[VOCAB as u32]), Err(EngineError::TokenOutOfRange { id, vocab: VOCAB }) if id == VOCAB as u32));
    let mut empty = t.engine.session().unwrap();
    assert!(matches!(empty.generate(&GenerateOpts::greedy(4), &mut |_: &TokenEvent| {}), Err(EngineError::Usage(_))));
}

#[test]
fn a_full_context_ends_generation() {
    const LOOP: &[(u32, u32)] = &[(A, B), (B, C), (C, A)];
    let t = setup(chain(LOOP, &[]), 8, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, A, B, C, A]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(100));
    assert_eq!((g.ids.as_slice(), g.finish), (&[B, C, A][..], FinishReason::ContextFull));
    assert_eq!(s.tokens().len(), 8);
    // Every step fitted the 8 positions (the mock refuses others); the last token is not run.
    let steps = t.steps();
    assert!(steps.iter().all(|st| st.pos + st.tokens.len() <= 8));
    assert_eq!(steps.last().unwrap().pos, 6);
    // A full sequence generates nothing more, without running anything.
    let (g, _) = run(&mut s, &GenerateOpts::greedy(100));
    assert_eq!((g.ids.len(), g.finish), (0, FinishReason::ContextFull));
    assert!(t.steps().is_empty());
}

#[test]
fn prefill_runs_in_ubatch_chunks() {
    let t = setup(flat(), 64, 4);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, A, B, C, X, Y, Z, A, B, C]).unwrap();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(2));
    let steps = t.steps();
    let chunks: Vec<(usize, usize, Want)> = steps.iter().map(|st| (st.pos, st.tokens.len(), st.want)).collect();
    assert_eq!(chunks, vec![(0, 4, Want::Nothing), (4, 4, Want::Nothing), (8, 2, Want::Argmax), (10, 1, Want::Argmax)]);
    assert_eq!(g.prefilled, 10);
}

#[test]
fn a_second_turn_reuses_the_cached_prefix() {
    const LOOP: &[(u32, u32)] = &[(HELLO, A), (A, B), (B, C), (C, A), (WORLD, X), (X, Y), (Y, Z), (Z, X)];
    let t = setup(chain(LOOP, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let (g1, _) = run(&mut s, &GenerateOpts::greedy(5));
    assert_eq!((g1.reused, g1.prefilled), (0, 2));
    s.append_tokens(&[WORLD]).unwrap();
    t.steps();
    let (g2, _) = run(&mut s, &GenerateOpts::greedy(4));
    // The 5th generated token was never run: it and the new token are the only prefill.
    assert_eq!((g2.prompt_tokens, g2.reused, g2.prefilled), (8, 6, 2));
    assert_eq!(t.steps()[0], Step { pos: 6, tokens: vec![g1.ids[4], WORLD], last_argmax: false, want: Want::Argmax });
    // The same tokens as a fresh session given the whole conversation.
    let mut fresh = t.engine.session().unwrap();
    fresh.append_tokens(&s.tokens()[..8]).unwrap();
    let (g3, _) = run(&mut fresh, &GenerateOpts::greedy(4));
    assert_eq!(g3.ids, g2.ids);
    assert_eq!((g3.reused, g3.prefilled), (0, 8));
    // Re-rendering the whole conversation after reset() reuses everything that matches.
    let all = s.tokens().to_vec();
    s.reset();
    s.append_tokens(&all[..10]).unwrap();
    s.append_tokens(&[HELLO]).unwrap();
    let (g4, _) = run(&mut s, &GenerateOpts::greedy(1));
    assert_eq!((g4.reused, g4.prefilled, g4.ids.as_slice()), (10, 1, &[A][..]));
    // Nothing new: the last token is run again for its distribution.
    s.truncate(11);
    let (g5, _) = run(&mut s, &GenerateOpts::greedy(1));
    assert_eq!((g5.reused, g5.prefilled, g5.ids.as_slice()), (10, 1, &[A][..]));
    // A diverging history keeps only the common prefix.
    s.reset();
    s.append_tokens(&[1, HELLO, WORLD]).unwrap();
    let (g6, _) = run(&mut s, &GenerateOpts::greedy(1));
    assert_eq!((g6.reused, g6.prefilled, g6.ids.as_slice()), (2, 1, &[X][..]));
    // clear_cache forgets everything.
    s.clear_cache().unwrap();
    s.append_tokens(&[1, HELLO, WORLD]).unwrap();
    let (g7, _) = run(&mut s, &GenerateOpts::greedy(1));
    assert_eq!((g7.reused, g7.prefilled), (0, 3));
}

#[test]
fn same_seed_same_output_from_candidates_or_the_whole_row() {
    let t = setup(flat(), 256, 512);
    let sample = |opts: &GenerateOpts| {
        let mut s = t.engine.session().unwrap();
        s.append_tokens(&[1, HELLO, WORLD]).unwrap();
        run(&mut s, opts).0
    };
    let opts = GenerateOpts {
        sampler: SamplerOpts { temperature: 1.0, top_k: 12, top_p: 0.9, min_p: 0.02, seed: 42, ..SamplerOpts::greedy() },
        ignore_eos: true,
        ..GenerateOpts::greedy(60)
    };
    let a = sample(&opts);
    let b = sample(&opts);
    assert_eq!(a.ids, b.ids);
    assert_eq!(a.ids.len(), 60);
    assert!(t.steps().iter().all(|st| matches!(st.want, Want::TopK(14))));
    // top_logprobs needs the whole row; the draw is the same.
    let c = sample(&GenerateOpts { top_logprobs: 3, ..opts.clone() });
    assert!(t.steps().iter().all(|st| st.want == Want::Logits));
    assert_eq!(c.ids, a.ids);
    let d = sample(&opts.clone().with_seed(43));
    assert_ne!(d.ids, a.ids, "another seed draws other tokens");
    let distinct: std::collections::HashSet<u32> = a.ids.iter().copied().collect();
    assert!(distinct.len() > 5, "sampling, not greedy: {:?}", a.ids);
    // Penalties run on the whole row, and reproduce too.
    let p = GenerateOpts { sampler: SamplerOpts { repeat_penalty: 1.3, frequency_penalty: 0.2, ..opts.sampler.clone() }, ..opts.clone() };
    assert_eq!(sample(&p).ids, sample(&p).ids);
}

#[test]
fn top_logprobs_are_the_raw_distribution() {
    let rule = flat();
    let t = setup(rule.clone(), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let prompt = s.tokens().to_vec();
    let (g, _) = run(&mut s, &GenerateOpts { top_logprobs: 4, ..GenerateOpts::greedy(5) });
    assert_eq!(g.top_logprobs.len(), 5);
    let mut history = prompt;
    for (i, top) in g.top_logprobs.iter().enumerate() {
        let row = rule(&history);
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + row.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln();
        assert_eq!(top.len(), 4);
        assert_eq!(top[0].0, g.ids[i], "greedy picks the most likely");
        for &(id, lp) in top {
            assert!((lp as f64 - (row[id as usize] as f64 - lse)).abs() < 1e-6);
        }
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
        history.push(g.ids[i]);
    }
}

/// Cancelling from another thread, at a known point: the sink hands the fifth token to the
/// other thread and waits until that thread has cancelled, so the generation stops after exactly
/// five tokens, whatever the scheduling (no sleeps, no races).
#[test]
fn cancellation_from_another_thread() {
    const LOOP: &[(u32, u32)] = &[(HELLO, A), (A, B), (B, A)];
    const AT: usize = 5;
    let t = setup(chain(LOOP, &[]), 100_000, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let cancel: CancelToken = s.cancel_token();
    cancel.cancel();
    // A cancellation before the generation starts is cleared by it.
    let (g, _) = run(&mut s, &GenerateOpts::greedy(3));
    assert_eq!(g.finish, FinishReason::MaxTokens);
    for pipeline in [true, false] {
        let (to_canceller, at_canceller) = std::sync::mpsc::channel::<usize>();
        let (to_sink, cancelled) = std::sync::mpsc::channel::<()>();
        let token = cancel.clone();
        let canceller = std::thread::spawn(move || {
            let n = at_canceller.recv().unwrap();
            token.cancel();
            to_sink.send(()).unwrap();
            n
        });
        let mut events = Vec::new();
        let opts = GenerateOpts { pipeline, ..GenerateOpts::greedy(50_000) };
        let g = s
            .generate(&opts, &mut |ev: &TokenEvent| {
                events.push(ev.id);
                if events.len() == AT {
                    to_canceller.send(events.len()).unwrap();
                    cancelled.recv().unwrap();
                }
            })
            .unwrap();
        assert_eq!(canceller.join().unwrap(), AT);
        assert_eq!(g.finish, FinishReason::Cancelled, "pipeline {pipeline}");
        assert_eq!(g.ids.len(), AT, "pipeline {pipeline}: the tokens before the cancellation, and none after");
        assert_eq!(events, g.ids);
        s.truncate(2);
    }
}

#[test]
fn sessions_share_one_engine_across_threads() {
    let t = setup(flat(), 128, 512);
    let opts = GenerateOpts { sampler: SamplerOpts { temperature: 0.9, top_k: 8, seed: 5, ..SamplerOpts::greedy() }, ..GenerateOpts::greedy(30) };
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let engine = t.engine.clone();
            let opts = opts.clone();
            std::thread::spawn(move || {
                let mut s = engine.session().unwrap();
                s.append_tokens(&[1, HELLO, WORLD]).unwrap();
                s.generate(&opts, &mut |_: &TokenEvent| {}).unwrap().ids
            })
        })
        .collect();
    let outs: Vec<Vec<u32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(outs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn bos_is_added_once_at_the_start() {
    let t = setup(flat(), 64, 512);
    let mut s = t.engine.session().unwrap();
    assert_eq!(s.append_text("ab").unwrap(), 3);
    assert_eq!(s.tokens(), &[1, A, B]);
    assert_eq!(s.append_text("c<|im_end|>").unwrap(), 2);
    assert_eq!(s.tokens(), &[1, A, B, C, IM_END], "control tokens are parsed, BOS only at the start");
    let mut s = t.engine.session().unwrap();
    s.append_text("<s>ab").unwrap();
    assert_eq!(s.tokens(), &[1, A, B], "not twice when the text starts with it");
}

#[test]
fn bad_parts_are_typed_errors() {
    let parts = |n_ctx, ubatch, eog: Vec<u32>| parts(Mock { rule: flat(), log: Arc::default() }, n_ctx, ubatch, eog);
    assert!(matches!(Engine::from_parts(parts(0, 512, vec![])), Err(EngineError::Usage(_))));
    assert!(matches!(Engine::from_parts(parts(8, 0, vec![])), Err(EngineError::Usage(_))));
    assert!(matches!(Engine::from_parts(parts(8, 8, vec![99])), Err(EngineError::TokenOutOfRange { id: 99, .. })));
}

#[test]
fn pipelined_decoding_gives_the_same_result_as_one_token_at_a_time() {
    const SECOND: &[(u32, u32)] = &[(BANG, X), (X, Y)];
    const NEXT: &[(u32, u32)] = &[(HELLO, WORLD), (WORLD, E), (E, N), (N, D), (D, BANG), (BANG, IM_END), (X, EOS), (Y, A), (A, B), (B, C), (C, A)];
    let cases: Vec<(&str, usize, GenerateOpts)> = vec![
        ("end of turn", 64, GenerateOpts::greedy(100)),
        ("stop string", 64, GenerateOpts { stop: vec!["ND".into()], ..GenerateOpts::greedy(100) }),
        ("stop string in one token", 64, GenerateOpts { stop: vec!["orl".into()], ..GenerateOpts::greedy(100) }),
        ("stop token", 64, GenerateOpts { stop_tokens: vec![N], ..GenerateOpts::greedy(100) }),
        ("max tokens", 64, GenerateOpts::greedy(3)),
        ("one token", 64, GenerateOpts::greedy(1)),
        ("ignore eos", 64, GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(12) }),
        ("ignore eos, full context", 12, GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(100) }),
    ];
    for (name, n_ctx, opts) in cases {
        let t = setup(chain(NEXT, SECOND), n_ctx, 4);
        let mut results = Vec::new();
        for pipeline in [false, true] {
            let opts = GenerateOpts { pipeline, ..opts.clone() };
            let mut s = t.engine.session().unwrap();
            s.append_tokens(&[1, HELLO]).unwrap();
            let (g, events) = run(&mut s, &opts);
            // A second turn on top: the dropped step must not have left a stale cache behind.
            let second = if s.tokens().len() + 2 < n_ctx {
                s.append_tokens(&[X]).unwrap();
                let (g2, _) = run(&mut s, &GenerateOpts { max_tokens: 3, ..opts.clone() });
                Some((g2.ids, g2.reused, g2.prefilled))
            } else {
                None
            };
            results.push((g.ids, g.text, g.finish, g.stop_token, events, s.tokens().to_vec(), s.cached_tokens(), second));
        }
        assert_eq!(results[0], results[1], "{name}: sequential vs pipelined");
    }
}

/// Allows only the ids of a script, in order; complete after the last.
struct Script {
    ids: Vec<u32>,
    at: usize,
    mask: Vec<u32>,
}

impl cera::engine::TokenConstraint for Script {
    fn allowed(&mut self, vocab: usize) -> Result<&[u32], String> {
        self.mask = vec![0; vocab.div_ceil(32)];
        let id = *self.ids.get(self.at).ok_or("past the script")? as usize;
        self.mask[id / 32] |= 1 << (id % 32);
        Ok(&self.mask)
    }
    fn accept(&mut self, id: u32) -> Result<(), String> {
        if self.ids.get(self.at) != Some(&id) {
            return Err(format!("{id} is not the script's next id"));
        }
        self.at += 1;
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.at == self.ids.len()
    }
}

#[test]
fn a_constraint_decides_every_id_and_ends_the_generation() {
    // The model wants " world END!"; the constraint allows only A B C (greedy and sampled alike),
    // reads whole logits rows, and ends with Stop after its last id, before max_tokens.
    let t = setup(chain(HELLO_CHAIN, &[]), 64, 512);
    let script = cera::engine::Constraint::new(|| Ok(Box::new(Script { ids: vec![A, B, C], at: 0, mask: Vec::new() })));
    for sampler in [SamplerOpts::greedy(), SamplerOpts { temperature: 1.0, seed: 3, ..SamplerOpts::default() }] {
        let mut s = t.engine.session().unwrap();
        s.append_tokens(&[1, HELLO]).unwrap();
        let opts = GenerateOpts { sampler, constraint: Some(script.clone()), ..GenerateOpts::greedy(10) };
        let (g, events) = run(&mut s, &opts);
        assert_eq!(g.ids, vec![A, B, C]);
        assert_eq!(g.finish, FinishReason::Stop);
        assert_eq!(events.iter().map(|e| e.0).collect::<Vec<_>>(), g.ids);
        assert!(t.steps().iter().skip(1).all(|st| st.want == Want::Logits), "{:?}", t.steps());
        // The same options again: a fresh constraint, the same ids.
        let mut s = t.engine.session().unwrap();
        s.append_tokens(&[1, HELLO]).unwrap();
        assert_eq!(run(&mut s, &opts).0.ids, vec![A, B, C]);
    }
    // A constraint that fails is the generation's error, not a panic.
    let broken = cera::engine::Constraint::new(|| Err("no grammar".to_string()));
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let err = s.generate(&GenerateOpts { constraint: Some(broken), ..GenerateOpts::greedy(4) }, &mut |_: &TokenEvent| {}).unwrap_err();
    assert!(err.to_string().contains("no grammar"), "{err}");
}

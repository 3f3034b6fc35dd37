//! The batcher on the CPU executor with the real SmolLM2-135M-Instruct Q4_1: many sequences in
//! shared steps give exactly the ids each gives alone (greedy and seeded sampling, 1, 3 and 16
//! sequences of different prompts and lengths, joining at different steps), a shared system
//! prompt is prefilled once, cancelling one sequence leaves the others unchanged, preemption
//! under a tiny KV budget changes nothing, and bad requests get typed errors.

mod batch_support;

use std::sync::OnceLock;

use batch_support::{alone, prompts, run_staggered};
use cera::engine::{BatcherOpts, DeviceChoice, Engine, EngineError, FinishReason, GenerateOpts, LoadOptions};
use cera::fetch::{ModelId, ensure_model};

fn engine() -> &'static Engine {
    static E: OnceLock<Engine> = OnceLock::new();
    E.get_or_init(|| {
        let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
        Engine::load(path, &LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(1024), ..Default::default() }, None).expect("load SmolLM2 on the CPU")
    })
}

#[test]
fn one_sequence_equals_the_session() {
    let e = engine();
    let b = e.batcher(BatcherOpts::default()).unwrap();
    let p = &prompts(e, 1)[0];
    let opts = GenerateOpts::greedy(12);
    let got = b.generate(p.clone(), &opts).unwrap();
    let mut s = e.session().unwrap();
    s.append_tokens(p).unwrap();
    let want = s.generate(&opts, &mut |_: &cera::engine::TokenEvent| {}).unwrap();
    assert_eq!(got.ids, want.ids);
    assert_eq!(got.text, want.text);
    assert_eq!(got.finish, want.finish);
    assert_eq!(got.prefilled, p.len());
}

#[test]
fn three_and_sixteen_sequences_equal_each_alone_greedy_and_seeded() {
    let e = engine();
    for (n, max_tokens) in [(3usize, 10usize), (16, 6)] {
        let ps = prompts(e, n);
        let opts: Vec<GenerateOpts> = (0..n)
            .map(
                |i| if i % 2 == 0 { GenerateOpts::greedy(max_tokens + i % 3) } else { GenerateOpts::default().with_seed(100 + i as u64).with_temperature(0.9) },
            )
            .map(|o| GenerateOpts { max_tokens: o.max_tokens.min(max_tokens + 2), ..o })
            .collect();
        let want: Vec<_> = ps.iter().zip(&opts).map(|(p, o)| alone(e, p, o)).collect();
        let b = e.batcher(BatcherOpts { max_step_tokens: 64, ..BatcherOpts::default() }).unwrap();
        let got = run_staggered(&b, &ps, &opts);
        for i in 0..n {
            assert_eq!(got[i].ids, want[i].ids, "sequence {i} of {n}");
            assert_eq!(got[i].text, want[i].text, "sequence {i} of {n}");
        }
        let m = b.metrics();
        assert_eq!((m.active, m.queued), (0, 0));
        assert!(m.steps > 0 && m.generated_tokens > 0);
    }
}

#[test]
fn a_shared_system_prompt_is_prefilled_once() {
    let e = engine();
    let system: Vec<u32> = batch_support::long_prefix(e, 300);
    let mut a = system.clone();
    a.extend(e.tokenizer().encode(" Question one: what is two plus two?", Default::default()).unwrap());
    let mut c = system.clone();
    c.extend(e.tokenizer().encode(" Question two: name a colour.", Default::default()).unwrap());
    let opts = GenerateOpts::greedy(8);
    let b = e.batcher(BatcherOpts::default()).unwrap();
    let first = b.generate(a.clone(), &opts).unwrap();
    assert_eq!(first.reused, 0);
    // Alone, the request ran one step of its whole prompt, then a step per token but the last.
    let m = b.metrics();
    assert_eq!((m.steps, m.prompt_steps), (8, 1), "{m:?}");
    assert_eq!((m.step_rows, m.prompt_step_rows), (a.len() as u64 + 7, a.len() as u64), "{m:?}");
    assert!(m.prompt_step_seconds > 0.0 && m.prompt_step_seconds < m.step_seconds && m.step_seconds <= m.busy_seconds, "{m:?}");
    let second = b.generate(c.clone(), &opts).unwrap();
    // Every token the prompts share comes from the cache: 18 whole blocks of 16, and the
    // start of the 19th (where the prompts part) copied on write into a block of its own.
    let common = a.iter().zip(&c).take_while(|(x, y)| x == y).count();
    assert!((300..300 / 16 * 16 + 16).contains(&common), "{common}");
    assert_eq!(second.reused, common, "cached prefix");
    assert_eq!(second.prefilled, c.len() - second.reused, "only its own tokens run");
    assert_eq!(second.ids, alone(e, &c, &opts).ids);
    assert!(b.metrics().prefix_hit_tokens >= 288);
    // The same request again finds its whole prompt but the last token cached.
    let third = b.generate(c.clone(), &opts).unwrap();
    assert_eq!(third.ids, second.ids);
    assert_eq!(third.reused, (c.len() - 1) / 16 * 16);
}

#[test]
fn cancelling_one_sequence_leaves_the_others_unchanged() {
    let e = engine();
    let ps = prompts(e, 3);
    let opts = GenerateOpts::greedy(10);
    let want: Vec<_> = ps.iter().map(|p| alone(e, p, &opts)).collect();
    let b = e.batcher(BatcherOpts::default()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        let tx = tx.clone();
        let sink: cera::engine::BoxSink = Box::new(move |_: &cera::engine::TokenEvent| {
            let _ = tx.send(i);
        });
        handles.push(b.submit(p.clone(), &opts, Some(sink)).unwrap());
    }
    // Cancel the middle one after its third token.
    let mut seen = 0;
    while seen < 3 {
        if rx.recv().unwrap() == 1 {
            seen += 1;
        }
    }
    handles[1].cancel();
    let mut out: Vec<_> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
    let cancelled = out.remove(1);
    assert_eq!(cancelled.finish, FinishReason::Cancelled);
    assert!(cancelled.ids.len() >= 3 && cancelled.ids.len() < 10);
    assert_eq!(cancelled.ids[..], want[1].ids[..cancelled.ids.len()]);
    assert_eq!(out[0].ids, want[0].ids);
    assert_eq!(out[1].ids, want[2].ids);
    let m = b.metrics();
    assert_eq!(m.blocks_used, m.blocks_cached, "every block left is a cached one no sequence holds");
}

#[test]
fn preemption_under_a_tiny_kv_budget_changes_nothing() {
    let e = engine();
    let ps = prompts(e, 6);
    let opts: Vec<GenerateOpts> = (0..6).map(|i| GenerateOpts::greedy(12).with_seed(i)).collect();
    let large = e.batcher(BatcherOpts::default()).unwrap();
    let want = run_staggered(&large, &ps, &opts);
    // Room for about two of the six sequences at a time.
    let longest = ps.iter().map(Vec::len).max().unwrap() + 13;
    let blocks = 2 * longest.div_ceil(16) + 1;
    let bytes_per_block = 2 * 30 * 3 * 16 * 64 * 4;
    let tiny = e.batcher(BatcherOpts { kv_budget: Some((blocks * bytes_per_block) as u64), prefix_cache: false, ..BatcherOpts::default() }).unwrap();
    assert_eq!(tiny.batch_opts().n_blocks, blocks);
    let got = run_staggered(&tiny, &ps, &opts);
    for i in 0..6 {
        assert_eq!(got[i].ids, want[i].ids, "sequence {i}");
        assert_eq!(got[i].text, want[i].text, "sequence {i}");
    }
    assert!(tiny.metrics().preemptions > 0, "the budget must have forced preemptions: {:?}", tiny.metrics());
}

/// A sequence preempted after more generated tokens than a step takes decode rows
/// (`BatchOpts::max_decode_rows`: 2 + 16 + 64 = 82 here) recomputes them over several steps and
/// goes on with the ids it gives alone.
#[test]
fn a_long_recomputed_output_runs_over_several_steps() {
    let e = engine();
    let ps: Vec<Vec<u32>> = prompts(e, 2).into_iter().map(|p| p[..p.len().min(12)].to_vec()).collect();
    let opts = vec![GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(150) }; 2];
    let want: Vec<Vec<u32>> = ps.iter().map(|p| alone(e, p, &opts[0]).ids).collect();
    // Blocks for one sequence of 162 positions and part of another: the newer one is preempted
    // once the older one needs its blocks, late in its output.
    let bytes_per_block = 2 * 30 * 3 * 16 * 64 * 4;
    let blocks = 162usize.div_ceil(16) + 6;
    let b = e.batcher(BatcherOpts { max_seqs: 2, kv_budget: Some((blocks * bytes_per_block) as u64), prefix_cache: false, ..BatcherOpts::default() }).unwrap();
    assert_eq!(b.batch_opts().max_decode_rows(), 82);
    let hs: Vec<_> = ps.iter().map(|p| b.submit(p.clone(), &opts[0], None).unwrap()).collect();
    let got: Vec<Vec<u32>> = hs.into_iter().map(|h| h.wait().unwrap().ids).collect();
    assert_eq!(got, want);
    let m = b.metrics();
    assert!(m.preemptions > 0, "{m:?}");
    // More prompt tokens ran than the prompts hold: the recomputed output.
    let prompt_tokens: usize = ps.iter().map(Vec::len).sum();
    assert!(m.prefill_tokens as usize > prompt_tokens + 82, "{m:?}");
}

#[test]
fn an_entry_past_its_blocks_is_a_typed_error() {
    batch_support::an_entry_past_its_blocks_is_a_typed_error(engine());
}

#[test]
fn bad_requests_get_typed_errors() {
    let e = engine();
    let b = e.batcher(BatcherOpts::default()).unwrap();
    assert!(matches!(b.submit(Vec::<u32>::new(), &GenerateOpts::greedy(4), None), Err(EngineError::Usage(_))));
    assert!(matches!(b.submit(vec![1u32; 2000], &GenerateOpts::greedy(4), None), Err(EngineError::ContextOverflow { tokens: 2000, n_ctx: 1024 })));
    assert!(matches!(b.submit(vec![60_000u32], &GenerateOpts::greedy(4), None), Err(EngineError::TokenOutOfRange { id: 60_000, .. })));
    assert!(matches!(b.submit("hi", &GenerateOpts::greedy(4).with_temperature(-1.0), None), Err(EngineError::Sampler { .. })));
    assert!(e.batcher(BatcherOpts { max_seqs: 0, ..BatcherOpts::default() }).is_err());
    // A sequence that can never fit the budget ends with an error; the batcher goes on.
    let small = e.batcher(BatcherOpts { kv_budget: Some(1), ..BatcherOpts::default() }).unwrap();
    assert_eq!(small.batch_opts().n_blocks, 1);
    let err = small.generate(vec![1u32; 40], &GenerateOpts::greedy(2)).unwrap_err();
    assert!(err.to_string().contains("KV budget"), "{err}");
    let ok = small.generate(vec![1u32, 2, 3], &GenerateOpts::greedy(2)).unwrap();
    assert_eq!(ok.ids.len(), 2);
    // max_tokens 0 only runs the prompt.
    let z = b.generate(vec![1u32, 2, 3], &GenerateOpts::greedy(0)).unwrap();
    assert_eq!((z.ids.len(), z.finish, z.prefilled), (0, FinishReason::MaxTokens, 3));
}

#[test]
fn constrained_requests_mask_on_the_executor() {
    batch_support::constrained_requests_mask_on_the_device(engine(), 8);
}

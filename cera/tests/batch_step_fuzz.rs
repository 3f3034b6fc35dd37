//! `BatchState::step` under random steps, valid or with one thing broken, on the CPU executor
//! (the tiny Llama, LFM2 with its conv slots, Gemma 3 with its windows) and the GPU executor
//! (lavapipe in CI, fewer steps): slots out of range or repeated, empty token runs, ids past
//! the vocabulary, positions past the context or the table's blocks, blocks past the cache,
//! top-k out of range, output rows past the tokens, masks of the wrong size, a step over its
//! token budget. A valid step returns one well-formed output per entry, a broken one a typed
//! error; none panics, and a good step after a refused one still runs. `CERA_FUZZ_ITERS`
//! raises the count.

mod rng_support;

use std::path::PathBuf;

use boostr::paged::{BlockAllocator, BlockTable};
use cera::engine::{BatchEntry, BatchOpts, DeviceChoice, Engine, LoadOptions, StepOutput, Want};
use rng_support::Rng;

fn tiny(model: &str, device: DeviceChoice) -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf").join(model);
    Engine::load(dir, &LoadOptions { device, n_ctx: Some(160), threads: Some(2), ..Default::default() }, None).unwrap()
}

/// One random entry's parts (owned; the entry borrows them).
struct Case {
    slot: usize,
    tokens: Vec<u32>,
    pos: usize,
    table: BlockTable,
    want: Want,
    out_rows: usize,
    decode: bool,
    mask: Option<Vec<u32>>,
}

/// A valid entry (a distinct slot, tokens within the step's share and the context, a table
/// holding its positions, an output shape that fits).
/// `decode_left`: decode rows the step has room for (`BatchOpts::max_decode_rows`).
fn valid_case(rng: &mut Rng, o: &BatchOpts, vocab: usize, alloc: &mut BlockAllocator, slot: usize, share: usize, decode_left: usize) -> Option<Case> {
    let decode = rng.below(2) == 0 && decode_left > 0;
    let share = if decode { share.min(decode_left) } else { share };
    let n = 1 + rng.below(share.max(1));
    let pos = rng.below(o.n_ctx - n + 1);
    let mut table = BlockTable::new();
    table.grow(alloc, o.block_len, pos + n).ok()?;
    let tokens: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
    let want = match rng.below(4) {
        0 => Want::Nothing,
        1 => Want::Argmax,
        2 => Want::Logits,
        _ => Want::TopK(1 + rng.below(cera::engine::MAX_TOP_K)),
    };
    let out_rows = if rng.below(3) == 0 { 1 + rng.below(n.min(4)) } else { 1 };
    let mask = (out_rows == 1 && rng.below(4) == 0).then(|| (0..vocab.div_ceil(32)).map(|_| rng.next() as u32 | 1).collect());
    Some(Case { slot, tokens, pos, table, want, out_rows, decode, mask })
}

/// Breaks one thing about the step (`cases` non-empty): a slot, the tokens, an id, the
/// position, the table, the want, the output rows or the mask.
fn corrupt(rng: &mut Rng, o: &BatchOpts, vocab: usize, cases: &mut Vec<Case>) {
    let i = rng.below(cases.len());
    let what = rng.below(10);
    if what == 1 && cases.len() > 1 {
        cases[1].slot = cases[0].slot;
        return;
    }
    if what == 9 {
        if rng.below(2) == 0 {
            let tokens = vec![1; o.max_tokens + 1];
            cases.push(Case { slot: 0, tokens, pos: 0, table: BlockTable::new(), want: Want::Argmax, out_rows: 1, decode: false, mask: None });
        } else {
            // One entry of more decode rows than a step takes, in a table that holds them.
            let n = o.max_decode_rows() + 1 + rng.below(o.max_tokens - o.max_decode_rows());
            let mut table = BlockTable::new();
            table.grow(&mut BlockAllocator::new(o.n_blocks), o.block_len, n).unwrap();
            *cases = vec![Case { slot: 0, tokens: vec![1; n], pos: 0, table, want: Want::Argmax, out_rows: 1, decode: true, mask: None }];
        }
        return;
    }
    let c = &mut cases[i];
    match what {
        0 | 1 => c.slot = o.max_seqs + rng.below(3),
        2 => c.tokens.clear(),
        3 => c.tokens[0] = (vocab + rng.below(1000)) as u32,
        4 => c.pos = o.n_ctx - c.tokens.len() + 1 + rng.below(1000),
        5 => {
            // A table one block short, or naming a block past the cache.
            let mut big = BlockAllocator::new(o.n_blocks * 4);
            let end = c.pos + c.tokens.len();
            let len = if rng.below(2) == 0 {
                big.alloc(o.n_blocks).unwrap();
                end
            } else {
                (end.div_ceil(o.block_len) - 1) * o.block_len
            };
            let mut t = BlockTable::new();
            t.grow(&mut big, o.block_len, len).unwrap();
            c.table = t;
        }
        6 => c.want = Want::TopK(if rng.below(2) == 0 { 0 } else { cera::engine::MAX_TOP_K + 1 + rng.below(100) }),
        7 => c.out_rows = if rng.below(2) == 0 { 0 } else { c.tokens.len() + 1 + rng.below(3) },
        _ => c.mask = Some(vec![u32::MAX; vocab.div_ceil(32) + 1 + rng.below(3)]),
    }
}

/// A step's cases: valid ones under the step's budget, then (half the time) one thing broken.
fn random_step(rng: &mut Rng, o: &BatchOpts, vocab: usize) -> (Vec<Case>, bool) {
    let mut alloc = BlockAllocator::new(o.n_blocks);
    let mut slots: Vec<usize> = (0..o.max_seqs).collect();
    let mut budget = o.max_tokens;
    let mut cases = Vec::new();
    for _ in 0..1 + rng.below(o.max_seqs) {
        let slot = slots.swap_remove(rng.below(slots.len()));
        if budget == 0 {
            break;
        }
        let decode_left = o.max_decode_rows() - cases.iter().filter(|c: &&Case| c.decode).map(|c| c.tokens.len()).sum::<usize>();
        if let Some(c) = valid_case(rng, o, vocab, &mut alloc, slot, budget.min(o.max_tokens / 2), decode_left) {
            budget -= c.tokens.len();
            cases.push(c);
        }
    }
    let broken = !cases.is_empty() && rng.below(2) == 0;
    if broken {
        corrupt(rng, o, vocab, &mut cases);
    }
    (cases, broken)
}

fn check_output(out: &StepOutput, c: &Case, vocab: usize) {
    let one = |o: &StepOutput| match (c.want, o) {
        (Want::Argmax, StepOutput::Argmax(id)) => assert!((*id as usize) < vocab, "argmax {id}"),
        (Want::TopK(k), StepOutput::TopK(v)) => assert!(v.len() <= k && v.iter().all(|&(id, _)| (id as usize) < vocab), "top-{k}: {v:?}"),
        (Want::Logits, StepOutput::Logits(l)) => assert_eq!(l.len(), vocab),
        (w, o) => panic!("{w:?} gave {o:?}"),
    };
    match (c.want, c.out_rows, out) {
        (Want::Nothing, _, StepOutput::Nothing) => {}
        (_, 1, o) => one(o),
        (_, r, StepOutput::Rows(rows)) => {
            assert_eq!(rows.len(), r);
            rows.iter().for_each(one);
        }
        (w, r, o) => panic!("{w:?} over {r} rows gave {o:?}"),
    }
}

fn fuzz(e: &Engine, iters: usize, seed: u64) {
    // Decode rows up to `max_decode_rows` (4 + 16 + 64 = 84) of the step's 128 tokens.
    let o = BatchOpts { kv: e.kv_type(), block_len: 8, n_blocks: 64, max_tokens: 128, max_seqs: 4, n_ctx: 160 };
    let vocab = e.config().vocab;
    let mut st = e.backend().new_batch(&o).unwrap();
    let mut rng = Rng(seed);
    let (mut ran, mut refused) = (0, 0);
    for i in 0..iters {
        let (cases, broken) = random_step(&mut rng, &o, vocab);
        let entries: Vec<BatchEntry<'_>> = cases
            .iter()
            .map(|c| BatchEntry {
                slot: c.slot,
                tokens: &c.tokens,
                pos: c.pos,
                table: &c.table,
                want: c.want,
                out_rows: c.out_rows,
                decode: c.decode,
                mask: c.mask.as_deref(),
            })
            .collect();
        let what = || {
            format!(
                "step {i} (seed {seed}) of {:?}",
                cases
                    .iter()
                    .map(|c| (c.slot, c.tokens.len(), c.pos, c.table.blocks().to_vec(), c.want, c.out_rows, c.mask.as_ref().map(Vec::len)))
                    .collect::<Vec<_>>()
            )
        };
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| st.step(&entries))) {
            Err(_) => panic!("{} panicked", what()),
            Ok(Ok(outs)) => {
                assert!(!broken, "{} ran", what());
                assert_eq!(outs.len(), cases.len(), "{}", what());
                for (out, c) in outs.iter().zip(&cases) {
                    check_output(out, c, vocab);
                }
                ran += 1;
            }
            Ok(Err(e)) => {
                assert!(broken, "{} refused: {e}", what());
                refused += 1;
            }
        }
    }
    // A plain step still runs after all that.
    let mut alloc = BlockAllocator::new(o.n_blocks);
    let mut t = BlockTable::new();
    t.grow(&mut alloc, o.block_len, 4).unwrap();
    let ok = st.step(&[BatchEntry { slot: 0, tokens: &[1, 2, 3, 4], pos: 0, table: &t, want: Want::Argmax, out_rows: 1, decode: false, mask: None }]).unwrap();
    assert!(matches!(ok[0], StepOutput::Argmax(_)));
    println!("{}: {ran} steps ran, {refused} refused", e.config().arch);
    assert!(ran > iters / 4 && refused > iters / 4, "{ran} ran, {refused} refused: the cases should mix both");
}

fn iters(default: usize) -> usize {
    std::env::var("CERA_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_entries_never_panic_the_cpu_executor() {
    for (i, model) in ["llama-tiny", "lfm2-tiny", "gemma3-tiny"].into_iter().enumerate() {
        fuzz(&tiny(model, DeviceChoice::Cpu), iters(400), 0x5eed + i as u64);
    }
}

#[test]
fn random_entries_never_panic_the_gpu_executor() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    for (i, model) in ["llama-tiny", "lfm2-tiny"].into_iter().enumerate() {
        fuzz(&tiny(model, DeviceChoice::Gpu), iters(60), 0xfeed + i as u64);
    }
}

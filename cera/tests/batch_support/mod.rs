//! Helpers of the batcher tests: prompts of different lengths, a request run alone, and
//! requests joining a batcher at different steps.

#![allow(dead_code)]

use std::sync::mpsc;

use cera::engine::{Batcher, BatcherOpts, BoxSink, Engine, GenerateOpts, Generation, TokenEvent};

/// `n` different prompts (token ids) of different lengths, from 3 to about 40 tokens.
pub fn prompts(e: &Engine, n: usize) -> Vec<Vec<u32>> {
    const TEXTS: [&str; 6] = [
        "The capital of France is",
        "Once upon a time, in a small village by the sea, there lived an old fisherman who",
        "List three colours:",
        "In mathematics, a prime number is a natural number greater than one that is not a product of two smaller natural numbers. The first primes are",
        "Water boils at",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    ];
    (0..n)
        .map(|i| {
            let text = format!("{}{}", if i >= TEXTS.len() { format!("Story {i}. ") } else { String::new() }, TEXTS[i % TEXTS.len()]);
            e.tokenizer().encode(&text, Default::default()).expect("tokenize")
        })
        .collect()
}

/// The first `n` tokens of a long deterministic text.
pub fn long_prefix(e: &Engine, n: usize) -> Vec<u32> {
    let text = "You are a helpful assistant. Answer briefly and precisely, and say when you do not know. ".repeat(n / 8 + 4);
    let ids = e.tokenizer().encode(&text, Default::default()).expect("tokenize");
    assert!(ids.len() >= n);
    ids[..n].to_vec()
}

/// One request on a batcher of its own (no prefix cache, one sequence).
pub fn alone(e: &Engine, prompt: &[u32], opts: &GenerateOpts) -> Generation {
    let b = e.batcher(BatcherOpts { max_seqs: 1, prefix_cache: false, kv_budget: Some(64 << 20), ..BatcherOpts::default() }).expect("batcher");
    b.generate(prompt.to_vec(), opts).expect("alone")
}

/// Submits the first half of the requests at once, then each later one after the one before it
/// has streamed two tokens (or finished), so requests join a running batch at different steps.
/// Returns the generations in request order.
pub fn run_staggered(b: &Batcher, prompts: &[Vec<u32>], opts: &[GenerateOpts]) -> Vec<Generation> {
    let first = prompts.len().div_ceil(2);
    let (tx, rx) = mpsc::channel::<usize>();
    let mut handles = Vec::new();
    for (i, (p, o)) in prompts.iter().zip(opts).enumerate() {
        if i >= first {
            // Wait for request i - 1's second token (or its end: a closed channel counts).
            let mut seen = 0;
            while seen < 2 {
                match rx.recv_timeout(std::time::Duration::from_millis(200)) {
                    Ok(j) if j == i - 1 => seen += 1,
                    Ok(_) => {}
                    Err(_) => {
                        if handles.last().is_some_and(|h: &cera::engine::RequestHandle| b.metrics().active == 0 || h.id() + 1 < i as u64) {
                            break;
                        }
                        if b.metrics().finished as usize >= i {
                            break;
                        }
                    }
                }
            }
        }
        let tx = tx.clone();
        let sink: BoxSink = Box::new(move |_: &TokenEvent| {
            let _ = tx.send(i);
        });
        handles.push(b.submit(p.clone(), o, Some(sink)).expect("submit"));
    }
    handles.into_iter().map(|h| h.wait().expect("request")).collect()
}

/// Allows, at its `i`-th token, the ids `id % 3 == (i + phase) % 3` (a third of the vocabulary,
/// a different third each step); complete after `len` tokens.
struct Thirds {
    phase: u32,
    len: usize,
    at: usize,
    mask: Vec<u32>,
}

impl cera::engine::TokenConstraint for Thirds {
    fn allowed(&mut self, vocab: usize) -> Result<&[u32], String> {
        let r = (self.at as u32 + self.phase) % 3;
        self.mask = vec![0; vocab.div_ceil(32)];
        for id in (0..vocab as u32).filter(|id| id % 3 == r) {
            self.mask[id as usize / 32] |= 1 << (id % 32);
        }
        Ok(&self.mask)
    }
    fn accept(&mut self, id: u32) -> Result<(), String> {
        if id % 3 != (self.at as u32 + self.phase) % 3 {
            return Err(format!("{id} is not allowed at token {}", self.at));
        }
        self.at += 1;
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.at == self.len
    }
}

/// A constraint allowing, at its `i`-th token, the ids `id % 3 == (i + phase) % 3`, complete
/// after `len` tokens.
pub fn thirds(phase: u32, len: usize) -> cera::engine::Constraint {
    cera::engine::Constraint::new(move || Ok(Box::new(Thirds { phase, len, at: 0, mask: Vec::new() })))
}

/// Constrained requests through the batcher, where the executor applies each step's allowed-id
/// mask to the sequence's logits row before its argmax or top-k (no row read back), beside an
/// unconstrained one in the same steps: the ids are those of the same requests with
/// `top_logprobs` (whole rows read back, masked on the host), greedy and seeded sampling alike,
/// every id is allowed, and the constraint ends each generation.
pub fn constrained_requests_mask_on_the_device(e: &Engine, len: usize) {
    let ps = prompts(e, 3);
    let thirds = |phase: u32| thirds(phase, len);
    let opts = vec![
        GenerateOpts { constraint: Some(thirds(0)), ..GenerateOpts::greedy(len + 4) },
        GenerateOpts { constraint: Some(thirds(1)), ..GenerateOpts::default().with_seed(7).with_temperature(0.9) },
        GenerateOpts::greedy(len),
    ];
    let rows: Vec<GenerateOpts> = opts.iter().map(|o| GenerateOpts { top_logprobs: 1, ..o.clone() }).collect();
    let b = e.batcher(BatcherOpts { max_seqs: 4, kv_budget: Some(64 << 20), ..BatcherOpts::default() }).expect("batcher");
    let got = run_staggered(&b, &ps, &opts);
    let want = run_staggered(&b, &ps, &rows);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.ids, w.ids, "request {i}: masked on the device vs on the host");
    }
    for (i, g) in got.iter().enumerate().take(2) {
        assert_eq!(g.ids.len(), len, "request {i}");
        assert_eq!(g.finish, cera::engine::FinishReason::Stop, "request {i}: the constraint ends it");
        for (j, &id) in g.ids.iter().enumerate() {
            assert_eq!(id % 3, (j as u32 + i as u32) % 3, "request {i} token {j}");
        }
    }
}

/// An entry whose positions run past the blocks its table holds, or whose table names a block
/// past the cache, is a typed error before anything runs (the executors index blocks by
/// position); the same entry within its block runs.
pub fn an_entry_past_its_blocks_is_a_typed_error(e: &Engine) {
    use boostr::paged::{BlockAllocator, BlockTable};
    use cera::engine::{BatchEntry, BatchOpts, EngineError, Want};
    let o = BatchOpts { kv: e.kv_type(), block_len: 16, n_blocks: 8, max_tokens: 64, max_seqs: 2, n_ctx: 256 };
    let mut st = e.backend().new_batch(&o).unwrap();
    let mut alloc = BlockAllocator::new(o.n_blocks);
    let mut t = BlockTable::new();
    t.grow(&mut alloc, 16, 16).unwrap();
    let toks = [1u32, 2, 3, 4];
    // Positions 14..18 reach a second block the table does not hold.
    let past = BatchEntry { slot: 0, tokens: &toks, pos: 14, table: &t, want: Want::Argmax, out_rows: 1, decode: false, mask: None };
    let err = st.step(&[past]).unwrap_err();
    assert!(matches!(&err, EngineError::Usage(m) if m.contains("1 blocks of 16")), "{err}");
    let mut big = BlockAllocator::new(64);
    let mut far = BlockTable::new();
    far.grow(&mut big, 16, 16 * 9).unwrap();
    let err = st.step(&[BatchEntry { table: &far, pos: 16 * 8, ..past }]).unwrap_err();
    assert!(matches!(&err, EngineError::Usage(m) if m.contains("block 8 in a cache of 8")), "{err}");
    assert!(matches!(st.step(&[BatchEntry { pos: 0, ..past }]).unwrap()[0], cera::engine::StepOutput::Argmax(_)));
}

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

//! `cera bench --concurrency 1,8,64 --profile`: what one batched decode step costs. For each
//! count of sequences `c`, `c` sequences are prefilled to a depth (through the batched state
//! itself, in chunks of the step's token budget), then the decode step of all `c` rows (one
//! token each, greedy) is timed on the wall clock (host recording, submit, GPU, readback: what
//! the batcher's loop waits for) and once more with GPU timestamps around every dispatch.

use std::time::Instant;

use boostr::paged::{BlockAllocator, BlockTable};
use serde::Serialize;

use super::{BenchError, KernelShare, mean_profile, shares};
use crate::engine::{BatchEntry, BatchOpts, BatcherOpts, Engine, EngineError, Want};

/// One batched decode step's cost.
#[derive(Clone, Debug, Serialize)]
pub struct BatchStepProfile {
    /// Sequences in the step (one decode row each).
    pub seqs: usize,
    /// Tokens in each sequence's cache before the step.
    pub depth: usize,
    /// Median wall time of a step, milliseconds.
    pub wall_ms: f64,
    /// GPU time of the step's dispatches (timestamps), milliseconds.
    pub gpu_ms: f64,
    /// Dispatches in the step.
    pub dispatches: usize,
    /// The top kernels, per decode row (`us_per_token` is per row of the step).
    pub kernels: Vec<KernelShare>,
}

/// Times a decode step of `seqs` sequences at `depth` on `engine` (GPU only), with the block
/// length and step budget of `opts`; lists the `top` kernels.
pub fn profile_decode(engine: &Engine, seqs: usize, depth: usize, opts: &BatcherOpts, top: usize) -> Result<BatchStepProfile, BenchError> {
    if !engine.is_gpu() {
        return Err(BenchError::Usage("--profile times the GPU's kernels: it needs a GPU run (not --device cpu)".into()));
    }
    let (bl, vocab) = (opts.block_len, engine.config().vocab as u32);
    let per_seq = (depth + 1).div_ceil(bl);
    let batch = BatchOpts {
        kv: engine.kv_type(),
        block_len: bl,
        n_blocks: seqs * per_seq,
        max_tokens: opts.max_step_tokens.max(seqs),
        max_seqs: seqs,
        n_ctx: engine.n_ctx().max(depth + 1),
    };
    let mut state = engine.inner.backend.new_batch(&batch)?;
    let mut alloc = BlockAllocator::new(batch.n_blocks);
    let mut tables = Vec::with_capacity(seqs);
    for _ in 0..seqs {
        let mut t = BlockTable::new();
        t.grow(&mut alloc, bl, depth + 1).map_err(|e| EngineError::Usage(e.to_string()))?;
        tables.push(t);
    }
    for (i, table) in tables.iter().enumerate() {
        let ids = super::concurrency::prompt_ids(i, depth, vocab);
        for (c, chunk) in ids.chunks(batch.max_tokens).enumerate() {
            let e = BatchEntry { slot: i, tokens: chunk, pos: c * batch.max_tokens, table, want: Want::Nothing, decode: false, out_rows: 1, mask: None };
            state.step(&[e])?;
        }
    }
    let last: Vec<[u32; 1]> = (0..seqs).map(|i| [(i as u32 * 31 + 5) % vocab]).collect();
    let entries: Vec<BatchEntry<'_>> = tables
        .iter()
        .zip(&last)
        .enumerate()
        .map(|(i, (table, tok))| BatchEntry { slot: i, tokens: tok, pos: depth, table, want: Want::Argmax, decode: true, out_rows: 1, mask: None })
        .collect();
    for _ in 0..3 {
        state.step(&entries)?;
    }
    let mut walls: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            state.step(&entries).map(|_| t.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    walls.sort_by(f64::total_cmp);
    let dispatches = state.last_step_counters().dispatches;
    let runs = (0..3).map(|_| state.profile_step(&entries)).collect::<Result<Vec<_>, _>>()?;
    let times = mean_profile(runs);
    let gpu_ms = times.iter().map(|t| t.ns).sum::<f64>() / 1e6;
    Ok(BatchStepProfile { seqs, depth, wall_ms: walls[walls.len() / 2], gpu_ms, dispatches, kernels: shares(&times, seqs as f64, top) })
}

/// The profiles as markdown.
pub fn print(model: &str, profiles: &[BatchStepProfile]) -> String {
    use std::fmt::Write;
    let mut s = format!(
        "\n{model}: one batched decode step (every sequence one token, greedy)\n\n| sequences | depth | wall ms/step | GPU ms/step | dispatches | tok/s |\n|---|---|---|---|---|---|\n"
    );
    for p in profiles {
        let _ = writeln!(s, "| {} | {} | {:.3} | {:.3} | {} | {:.0} |", p.seqs, p.depth, p.wall_ms, p.gpu_ms, p.dispatches, p.seqs as f64 / p.wall_ms * 1e3);
    }
    for p in profiles {
        let _ = writeln!(s, "\nGPU time per decode row, {} sequences at depth {}:\n", p.seqs, p.depth);
        s.push_str("| kernel | µs/row | dispatches per step | share |\n|---|---|---|---|\n");
        for k in &p.kernels {
            let _ = writeln!(s, "| {} | {:.3} | {} | {:.1}% |", k.kernel, k.us_per_token, k.dispatches, 100.0 * k.fraction);
        }
    }
    s
}

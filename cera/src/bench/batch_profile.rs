//! `cera bench --concurrency 1,8,64 --profile`: what one batched step costs. For each count of
//! sequences `c`, `c` sequences are prefilled to a depth (through the batched state itself, in
//! chunks of the step's token budget), then the decode step of all `c` rows (one token each,
//! greedy) is timed on the wall clock (host recording, submit, GPU, readback: what the
//! batcher's loop waits for) and once more with GPU timestamps around every dispatch; then the
//! same with a prompt chunk beside the decode rows (the rest of the step's token budget, of one
//! more sequence at the same depth): the steps that carry the workload's prompts.

use std::time::Instant;

use boostr::paged::{BlockAllocator, BlockTable};
use serde::Serialize;

use super::{BenchError, KernelShare, mean_profile, shares};
use crate::engine::{BatchEntry, BatchOpts, BatcherOpts, Engine, EngineError, Want};

/// One batched step's cost.
#[derive(Clone, Debug, Serialize)]
pub struct BatchStepProfile {
    /// Decode rows in the step (one a sequence).
    pub seqs: usize,
    /// Prompt rows in the step (one more sequence's chunk at `depth`; 0: a decode step).
    pub prompt_rows: usize,
    /// Tokens in each sequence's cache before the step.
    pub depth: usize,
    /// Median wall time of a step, milliseconds.
    pub wall_ms: f64,
    /// GPU time of the step's dispatches (timestamps), milliseconds.
    pub gpu_ms: f64,
    /// Dispatches in the step.
    pub dispatches: usize,
    /// The top kernels, per row (`us_per_token` is per row of the step, decode and prompt).
    pub kernels: Vec<KernelShare>,
}

/// Times a step of `seqs` decode rows at `depth` on `engine` (GPU only), with `prompt_rows`
/// rows of one more sequence's prompt at the same depth beside them (0: none), with the block
/// length and step budget of `opts`; lists the `top` kernels.
pub fn profile_step(engine: &Engine, seqs: usize, prompt_rows: usize, depth: usize, opts: &BatcherOpts, top: usize) -> Result<BatchStepProfile, BenchError> {
    if !engine.is_gpu() {
        return Err(BenchError::Usage("--profile times the GPU's kernels: it needs a GPU run (not --device cpu)".into()));
    }
    let (bl, vocab) = (opts.block_len, engine.config().vocab as u32);
    // Positions each sequence's table holds: the decode rows', then the prompt's.
    let lens: Vec<usize> = (0..seqs).map(|_| depth + 1).chain((prompt_rows > 0).then_some(depth + prompt_rows)).collect();
    let batch = BatchOpts {
        kv: engine.kv_type(),
        block_len: bl,
        n_blocks: lens.iter().map(|l| l.div_ceil(bl)).sum(),
        max_tokens: opts.max_step_tokens.max(seqs + prompt_rows),
        max_seqs: lens.len(),
        n_ctx: engine.n_ctx().max(depth + prompt_rows.max(1)),
    };
    let mut state = engine.inner.backend.new_batch(&batch)?;
    let mut alloc = BlockAllocator::new(batch.n_blocks);
    let mut tables = Vec::with_capacity(lens.len());
    for &len in &lens {
        let mut t = BlockTable::new();
        t.grow(&mut alloc, bl, len).map_err(|e| EngineError::Usage(e.to_string()))?;
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
    let mut entries: Vec<BatchEntry<'_>> = tables
        .iter()
        .zip(&last)
        .enumerate()
        .map(|(i, (table, tok))| BatchEntry { slot: i, tokens: tok, pos: depth, table, want: Want::Argmax, decode: true, out_rows: 1, mask: None })
        .collect();
    // The prompt chunk after the decode rows (as the batcher orders a step), wanting the last
    // row's argmax as a prompt's last chunk does.
    let chunk = super::concurrency::prompt_ids(seqs + 7, prompt_rows, vocab);
    if prompt_rows > 0 {
        let table = &tables[seqs];
        entries.push(BatchEntry { slot: seqs, tokens: &chunk, pos: depth, table, want: Want::Argmax, decode: false, out_rows: 1, mask: None });
    }
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
    let rows = (seqs + prompt_rows) as f64;
    Ok(BatchStepProfile { seqs, prompt_rows, depth, wall_ms: walls[walls.len() / 2], gpu_ms, dispatches, kernels: shares(&times, rows, top) })
}

/// The profiles as markdown.
pub fn print(model: &str, profiles: &[BatchStepProfile]) -> String {
    use std::fmt::Write;
    let mut s = format!(
        "\n{model}: one batched step (every decode sequence one token, greedy; prompt rows: one more sequence's chunk at the same depth)\n\n| decode rows | prompt rows | depth | wall ms/step | GPU ms/step | dispatches | rows/s |\n|---|---|---|---|---|---|---|\n"
    );
    for p in profiles {
        let rows = (p.seqs + p.prompt_rows) as f64;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.3} | {:.3} | {} | {:.0} |",
            p.seqs,
            p.prompt_rows,
            p.depth,
            p.wall_ms,
            p.gpu_ms,
            p.dispatches,
            rows / p.wall_ms * 1e3
        );
    }
    for p in profiles {
        let _ = writeln!(s, "\nGPU time per row, {} decode rows and {} prompt rows at depth {}:\n", p.seqs, p.prompt_rows, p.depth);
        s.push_str("| kernel | µs/row | dispatches per step | share |\n|---|---|---|---|\n");
        for k in &p.kernels {
            let _ = writeln!(s, "| {} | {:.3} | {} | {:.1}% |", k.kernel, k.us_per_token, k.dispatches, 100.0 * k.fraction);
        }
    }
    s
}

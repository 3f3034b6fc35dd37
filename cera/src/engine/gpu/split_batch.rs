//! Many sequences of a model split across GPUs ([`SplitBatch`]): a batch state per device,
//! and a step run through them in micro-batches.
//!
//! A step's entries ([`decode_first`] order) are cut into micro-batches of whole entries, of at
//! least [`GpuTuning::split_micro_tokens`](super::super::tuning::GpuTuning::split_micro_tokens)
//! tokens each and no more than there are devices. The first device gets every micro-batch at
//! once, each in its own submit that also reads the rows it hands on; every later device takes
//! micro-batch `k` as soon as the device before it has finished `k`, while that device runs
//! `k + 1`. Rows cross a boundary through host memory, written into the next device's slots
//! through its queue, so a micro-batch submitted there before still reads its own.
//!
//! A row's numbers do not depend on the micro-batch it ran in: every kernel of a batched step
//! gives a row the same bits whatever the other rows are (the GEMM's block shape follows the
//! step's rows, and every shape adds up each output in the same order), so a split model gives
//! the ids of one device with micro-batches or without (tested).

use super::super::EngineError;
use super::super::backend::{StepCounters, StepOutput, Want};
use super::super::batch::{BatchEntry, BatchOpts, BatchState, check_entries};
use super::super::split::Stage;
use super::GpuBackend;
use super::batch::{GpuBatch, LaneRows, decode_first};

/// Many sequences of a split model: a batch state per device.
pub(super) struct SplitBatch {
    stages: Vec<(GpuBatch, Stage)>,
    opts: BatchOpts,
    vocab: usize,
    /// The fewest tokens of a micro-batch (0: none).
    micro_tokens: usize,
    counters: StepCounters,
}

impl SplitBatch {
    pub(super) fn new(stages: &[(GpuBackend, Stage)], opts: &BatchOpts) -> Result<SplitBatch, EngineError> {
        let micro_tokens = stages[0].0.tuning.split_micro_tokens;
        let vocab = stages[0].1.graph.cfg.vocab;
        let stages = stages.iter().map(|(b, s)| Ok((GpuBatch::new(b, opts)?, s.clone()))).collect::<Result<Vec<_>, EngineError>>()?;
        Ok(SplitBatch { stages, opts: *opts, vocab, micro_tokens, counters: StepCounters::default() })
    }
}

/// The micro-batches of a step: contiguous ranges of `entries` of about equal tokens, at most
/// `most` of them, each of at least `min_tokens` (0: one batch). A micro-batch reads the
/// device's weights again, so a part too small to be bound by arithmetic would cost more than
/// the overlap gains: then there are fewer parts, or one.
pub(super) fn micro_batches(entries: &[BatchEntry<'_>], min_tokens: usize, most: usize) -> Vec<std::ops::Range<usize>> {
    // prefix[i]: the tokens of the first i entries.
    let mut prefix = Vec::with_capacity(entries.len() + 1);
    prefix.push(0);
    for e in entries {
        prefix.push(prefix[prefix.len() - 1] + e.tokens.len());
    }
    let total = prefix[entries.len()];
    let most = total.checked_div(min_tokens).map_or(1, |n| n.min(most).min(entries.len()));
    for n in (2..=most).rev() {
        // Each cut where the tokens before it come closest to its share, leaving an entry for
        // every part still to come.
        let mut cuts = vec![0];
        for g in 1..n {
            let target = total * g / n;
            let lo = cuts[g - 1] + 1;
            let hi = entries.len() - (n - g);
            let best = (lo..=hi).min_by_key(|&i| prefix[i].abs_diff(target)).unwrap_or(lo);
            cuts.push(best);
        }
        cuts.push(entries.len());
        let v: Vec<_> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
        if v.iter().all(|r| !r.is_empty() && prefix[r.end] - prefix[r.start] >= min_tokens) {
            return v;
        }
    }
    let whole = 0..entries.len();
    vec![whole]
}

impl BatchState for SplitBatch {
    fn opts(&self) -> &BatchOpts {
        &self.opts
    }

    fn step(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<StepOutput>, EngineError> {
        check_entries(&self.opts, self.vocab, entries)?;
        let (order, sorted) = decode_first(entries);
        // The devices before the last run the layers only.
        let quiet: Vec<BatchEntry<'_>> = sorted.iter().map(|e| BatchEntry { want: Want::Nothing, mask: None, ..*e }).collect();
        let micro = micro_batches(&sorted, self.micro_tokens, self.stages.len());
        let start = std::time::Instant::now();
        let mut counters = StepCounters::default();
        let last = self.stages.len() - 1;
        // The micro-batches submitted on the device before, in order.
        let mut before = Vec::new().into_iter();
        for i in 0..=last {
            let es = if i == last { &sorted } else { &quiet };
            let mut submitted = Vec::with_capacity(micro.len());
            for r in &micro {
                // Micro-batch k's rows from the device before (which goes on with k + 1).
                let carried: Vec<LaneRows> = match before.next() {
                    Some(s) => self.stages[i - 1].0.finish(s, &quiet[r.clone()])?.1,
                    None => Vec::new(),
                };
                let (b, stage) = &mut self.stages[i];
                let part = &es[r.clone()];
                for (slot, rows) in stage.live_in.iter().zip(&carried) {
                    b.write_rows(*slot, part, rows)?;
                }
                submitted.push(b.submit_sorted(part, if i < last { &stage.live_out } else { &[] })?);
                let c = b.last_step_counters();
                (counters.dispatches, counters.passes, counters.submits) =
                    (counters.dispatches + c.dispatches, counters.passes + c.passes, counters.submits + c.submits);
            }
            before = submitted.into_iter();
        }
        let mut outs: Vec<StepOutput> = Vec::with_capacity(sorted.len());
        for (s, r) in before.zip(&micro) {
            outs.extend(self.stages[last].0.finish(s, &sorted[r.clone()])?.0);
        }
        counters.host_ns = start.elapsed().as_nanos() as u64;
        self.counters = counters;
        let mut outs: Vec<Option<StepOutput>> = outs.into_iter().map(Some).collect();
        Ok(order.iter().map(|&j| outs[j].take().expect("a permutation")).collect())
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), EngineError> {
        self.stages.iter_mut().try_for_each(|(b, _)| b.copy_blocks(pairs))
    }

    fn last_step_counters(&self) -> StepCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boostr::paged::BlockTable;

    fn entries<'a>(toks: &'a [Vec<u32>], table: &'a BlockTable) -> Vec<BatchEntry<'a>> {
        toks.iter()
            .enumerate()
            .map(|(i, t)| BatchEntry { slot: i, tokens: t, pos: 0, table, want: Want::Nothing, decode: t.len() == 1, out_rows: 1, mask: None })
            .collect()
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one micro-batch is one range
    fn micro_batches_share_the_tokens_and_keep_every_entry() {
        let table = BlockTable::new();
        let lens = |ls: &[usize]| ls.iter().map(|&n| vec![1u32; n]).collect::<Vec<_>>();
        // Off, too few tokens, too few entries: one batch.
        let t = lens(&[1, 1, 1, 300]);
        assert_eq!(micro_batches(&entries(&t, &table), 0, 2), [0..4]);
        assert_eq!(micro_batches(&entries(&t, &table), 256, 2), [0..4]);
        let t = lens(&[600]);
        assert_eq!(micro_batches(&entries(&t, &table), 256, 2), [0..1]);
        // 64 decode rows and a 448-token chunk: a part of 64 is too small, so one batch.
        let mut t = lens(&[1; 64]);
        t.push(vec![1; 448]);
        assert_eq!(micro_batches(&entries(&t, &table), 256, 2), [0..65]);
        // 300 decode rows and the chunk: two parts.
        let mut t = lens(&[1; 300]);
        t.push(vec![1; 448]);
        assert_eq!(micro_batches(&entries(&t, &table), 256, 2), [0..300, 300..301]);
        // Even entries split evenly; as many batches as devices, no more.
        let t = lens(&[100; 8]);
        assert_eq!(micro_batches(&entries(&t, &table), 200, 2), [0..4, 4..8]);
        assert_eq!(micro_batches(&entries(&t, &table), 200, 4), [0..2, 2..4, 4..6, 6..8]);
        assert_eq!(micro_batches(&entries(&t, &table), 300, 4), [0..4, 4..8]);
        // A heavy first entry leaves the rest too small for a part of their own.
        let t = lens(&[500, 1, 1]);
        assert_eq!(micro_batches(&entries(&t, &table), 100, 3), [0..3]);
        for n in 1..12 {
            for most in 1..5 {
                let t = lens(&(1..=n).collect::<Vec<_>>());
                let v = micro_batches(&entries(&t, &table), 3, most);
                let toks = |r: &std::ops::Range<usize>| t[r.clone()].iter().map(|x| x.len()).sum::<usize>();
                assert!(v.len() <= most && v.iter().all(|r| !r.is_empty()), "{n} {most}: {v:?}");
                assert!(v.len() == 1 || v.iter().all(|r| toks(r) >= 3), "{n} {most}: {v:?}");
                assert_eq!((v[0].start, v[v.len() - 1].end), (0, n), "{n} {most}: {v:?}");
                assert!(v.windows(2).all(|w| w[0].end == w[1].start), "{n} {most}: {v:?}");
            }
        }
    }
}

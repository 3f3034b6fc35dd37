//! A batched step's submit and its outputs, apart: [`GpuBatch::submit_sorted`] records and
//! submits a step with the reads it needs (the argmax ids, the top-k candidates, whole logits
//! rows, and the rows a stage of a split model hands to the next device), and
//! [`GpuBatch::finish`] waits for them. A split model's batch ([`super::super::split`]) submits
//! several micro-batches on one device before it waits for the first; a single device's step
//! does both at once ([`GpuBatch::step_sorted`]).

use numr::gpu::PendingRead;

use super::super::super::EngineError;
use super::super::super::backend::{StepCounters, StepOutput, Want};
use super::super::super::batch::BatchEntry;
use super::super::super::graph::Slot;
use super::{GpuBatch, HeadRows, Lane};

/// A submitted step's reads, for [`GpuBatch::finish`].
pub(in super::super) struct Submitted {
    head: Vec<HeadRows>,
    ids: Option<PendingRead>,
    /// The top-k candidates' ids and values.
    topk: Option<(PendingRead, PendingRead)>,
    /// Each entry's whole logits rows (`Want::Logits`).
    logits: Vec<Option<PendingRead>>,
    /// Per slot handed on, each lane's rows (decode, main).
    hand_on: Vec<[Option<PendingRead>; 2]>,
}

/// Each lane's rows (decode, main) of one slot, as f32.
pub(in super::super) type LaneRows = [Vec<f32>; 2];

impl GpuBatch {
    /// [`BatchState::step`](super::super::super::batch::BatchState::step) over entries already
    /// in [`super::decode_first`] order.
    pub(in super::super) fn step_sorted(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<StepOutput>, EngineError> {
        let s = self.submit_sorted(entries, &[])?;
        Ok(self.finish(s, entries)?.0)
    }

    /// Records and submits a step of `entries` ([`super::decode_first`] order) with the reads
    /// of its outputs and, after the step, of each lane's rows of `hand_on` (what a stage of a
    /// split model hands to the next); waits for nothing. The step's counters are this
    /// submit's.
    pub(in super::super) fn submit_sorted(&mut self, entries: &[BatchEntry<'_>], hand_on: &[Slot]) -> Result<Submitted, EngineError> {
        let start = std::time::Instant::now();
        let mut rec = self.rec.take().unwrap_or_else(|| self.ctx.recorder());
        // On an error the half-recorded step is dropped with its recorder; the next step makes
        // another.
        let (head, early) = self.record(&mut rec, entries, self.lead)?;
        let vocab = self.graph.cfg.vocab as u64;
        let m = head.iter().flatten().map(|h| h.1).sum::<usize>() as u64;
        let ids = if entries.iter().any(|e| e.want == Want::Argmax) {
            let v = self.argmax.ids();
            Some(rec.read(v.buffer(), v.byte_offset(), 4 * m).map_err(|e| self.err(e))?)
        } else {
            None
        };
        // The sampling rows' candidates: `MAX_TOP_K` ids and values per head row, read once.
        let kk = self.topk.k() as u64;
        let topk = if entries.iter().any(|e| matches!(e.want, Want::TopK(_))) {
            let (i, v) = (self.topk.ids(), self.topk.values());
            Some((
                rec.read(i.buffer(), i.byte_offset(), 4 * kk * m).map_err(|e| self.err(e))?,
                rec.read(v.buffer(), v.byte_offset(), 4 * kk * m).map_err(|e| self.err(e))?,
            ))
        } else {
            None
        };
        let mut logits = Vec::with_capacity(entries.len());
        for (e, h) in entries.iter().zip(&head) {
            logits.push(match (e.want, h) {
                (Want::Logits, Some((j, n))) => {
                    Some(rec.read(self.main.slots.buf(Slot::Logits), *j as u64 * 4 * vocab, *n as u64 * 4 * vocab).map_err(|e| self.err(e))?)
                }
                _ => None,
            });
        }
        let lanes = self.lane_rows(entries);
        let mut handed = Vec::with_capacity(hand_on.len());
        for &s in hand_on {
            let w = 4 * self.graph.width(s) as u64;
            let mut pair = [None, None];
            for (k, n) in lanes.into_iter().enumerate() {
                if n > 0 {
                    pair[k] = Some(rec.read(self.lane(k).slots.buf(s), 0, n as u64 * w).map_err(|e| self.err(e))?);
                }
            }
            handed.push(pair);
        }
        let (dispatches, passes) = (early.dispatches + rec.dispatch_count(), early.passes + rec.pass_count());
        let submitted = rec.submit_and_clear();
        self.rec = Some(rec);
        submitted.map_err(|e| self.err(e))?;
        self.counters = StepCounters { dispatches, passes, submits: early.submits + 1, host_ns: start.elapsed().as_nanos() as u64 };
        Ok(Submitted { head, ids, topk, logits, hand_on: handed })
    }

    /// Waits for a submitted step of `entries` (the same as [`Self::submit_sorted`]'s): each
    /// entry's output, and each handed-on slot's rows.
    pub(in super::super) fn finish(&mut self, s: Submitted, entries: &[BatchEntry<'_>]) -> Result<(Vec<StepOutput>, Vec<LaneRows>), EngineError> {
        let Submitted { head, ids, topk, logits, hand_on } = s;
        let vocab = self.graph.cfg.vocab;
        let kk = self.topk.k();
        let ids: Vec<u32> = match ids {
            Some(r) => r.wait_u32().map_err(|e| self.err(e))?,
            None => Vec::new(),
        };
        let (top_ids, top_vals): (Vec<u32>, Vec<f32>) = match topk {
            Some((i, v)) => (i.wait_u32().map_err(|e| self.err(e))?, bytemuck::cast_slice(&v.wait().map_err(|e| self.err(e))?).to_vec()),
            None => (Vec::new(), Vec::new()),
        };
        let mut out = Vec::with_capacity(entries.len());
        for ((e, h), read) in entries.iter().zip(&head).zip(logits) {
            let Some((j0, n)) = *h else {
                out.push(StepOutput::Nothing);
                continue;
            };
            let logits: Option<Vec<f32>> = match read {
                Some(r) => Some(bytemuck::cast_slice(&r.wait().map_err(|e| self.err(e))?).to_vec()),
                None => None,
            };
            let row = |j: usize| match e.want {
                Want::Argmax => StepOutput::Argmax(ids[j]),
                Want::TopK(k) => {
                    let at = j * kk;
                    StepOutput::TopK((at..at + k.min(kk)).map(|i| (top_ids[i], top_vals[i])).collect())
                }
                Want::Logits => StepOutput::Logits(logits.as_ref().map_or_else(Vec::new, |l| l[(j - j0) * vocab..(j - j0 + 1) * vocab].to_vec())),
                Want::Nothing => StepOutput::Nothing,
            };
            out.push(if n == 1 { row(j0) } else { StepOutput::Rows((j0..j0 + n).map(row).collect()) });
        }
        let mut rows = Vec::with_capacity(hand_on.len());
        for pair in hand_on {
            let mut lanes = [Vec::new(), Vec::new()];
            for (k, r) in pair.into_iter().enumerate() {
                if let Some(r) = r {
                    lanes[k] = bytemuck::pod_collect_to_vec(&r.wait().map_err(|e| self.err(e))?);
                }
            }
            rows.push(lanes);
        }
        Ok((out, rows))
    }

    /// The rows of each lane (decode, main) of a step of `entries` in [`super::decode_first`] order.
    fn lane_rows(&self, entries: &[BatchEntry<'_>]) -> [usize; 2] {
        let n_dec = if self.decode.is_some() { entries.iter().take_while(|e| e.decode).count() } else { 0 };
        let rows = |es: &[BatchEntry<'_>]| es.iter().map(|e| e.tokens.len()).sum::<usize>();
        [rows(&entries[..n_dec]), rows(&entries[n_dec..])]
    }

    fn lane(&self, k: usize) -> &Lane {
        if k == 0 { self.decode.as_ref().expect("rows of the decode lane") } else { &self.main }
    }

    /// Writes each lane's rows of `slot` (decode lane, main lane; `n` rows of the slot's width
    /// each) for the next step of `entries` ([`super::decode_first`] order): a stage of a split
    /// model receiving what the stage before handed on. Written through the queue, so a step
    /// submitted before still reads the rows it was given.
    pub(in super::super) fn write_rows(&self, slot: Slot, entries: &[BatchEntry<'_>], rows: &LaneRows) -> Result<(), EngineError> {
        let w = self.graph.width(slot);
        for (k, n) in self.lane_rows(entries).into_iter().enumerate() {
            if rows[k].len() != n * w {
                return Err(EngineError::Usage(format!("{} values for {n} rows of {slot:?} in lane {k}", rows[k].len())));
            }
            if n > 0 {
                self.ctx.write(self.lane(k).slots.buf(slot), 0, bytemuck::cast_slice(&rows[k])).map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }
}

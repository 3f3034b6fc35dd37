//! The batcher's draft model ([`Engine::batcher_with_draft`](super::super::super::Engine::batcher_with_draft)):
//! greedy drafts for every sequence whose speculative requests draw from it
//! ([`DraftSource::Model`]), made for all of them at once before the target's step.
//!
//! The draft model has a batched state of its own (a paged KV cache with as many blocks as
//! the target's, its own [`BlockAllocator`], no prefix cache) and each sequence a
//! [`DraftSeq`]: its blocks there and how many of its positions the draft model has computed.
//! A draft pass runs
//! 1. one step of every drafting sequence's tokens the draft model has not seen (after a
//!    verification, the target's token that replaced a rejected draft; a new sequence's prompt,
//!    in chunks under the step's token budget over as many passes as it takes, the fewest
//!    tokens first), whose last row gives the first draft;
//! 2. then one step per further draft, each sequence's last draft in, the next one out, until
//!    each has its most drafts, an end-of-generation token, or a draft the model is less sure
//!    of than `p_min`.
//!
//! The drafts' own keys and values are written past the positions the draft model has
//! computed; after the target's step, the ones whose tokens the target kept count as computed
//! ([`DraftSeq::sync`]), and the rest are written over by the next pass.

use boostr::paged::{BlockAllocator, BlockTable};

use super::super::super::backend::{StepOutput, Want};
use super::super::super::model::Engine;
use super::super::super::speculative::{DraftPacer, VerifyCost, max_drafts};
use super::super::super::{DraftSource, EngineError};
use super::super::step::{BatchEntry, BatchState, MAX_DRAFT};
use super::Loop;

/// The draft model's side of a batcher.
pub(crate) struct BatchDraft {
    pub(crate) engine: Engine,
    state: Box<dyn BatchState>,
    alloc: BlockAllocator,
    p_min: f32,
    /// The most drafts a step: what both models' recurrent state can roll back, at most
    /// [`MAX_DRAFT`].
    cap: usize,
    /// A verification entry's cost with this model's steps ([`model_draft_cost`]).
    cost: VerifyCost,
}

impl BatchDraft {
    /// The draft side of `target`'s batcher: `engine` on its own batch `state`.
    pub(crate) fn new(target: &Engine, engine: Engine, state: Box<dyn BatchState>, p_min: f32) -> BatchDraft {
        let alloc = BlockAllocator::new(state.opts().n_blocks);
        let cap = max_drafts(&target.inner.config).min(max_drafts(&engine.inner.config)).min(MAX_DRAFT);
        let cost = model_draft_cost(target, &engine, target.is_gpu());
        BatchDraft { engine, state, alloc, p_min, cap, cost }
    }

    /// Frees a sequence's blocks (it ended or was preempted): it starts over next time.
    pub(crate) fn release(&mut self, d: &mut DraftSeq) {
        // Releasing fails only on a bookkeeping bug (a block released twice).
        let released = d.table.release(&mut self.alloc);
        debug_assert!(released.is_ok(), "{released:?}");
        *d = DraftSeq::default();
    }

    /// What a step asks for: the argmax, or the whole row when `p_min` needs its probability.
    fn want(&self) -> Want {
        if self.p_min > 0.0 { Want::Logits } else { Want::Argmax }
    }

    /// The draft a step's output gives, or `None` when the model is less sure of it than
    /// `p_min`.
    fn take(&self, out: StepOutput) -> Result<Option<u32>, EngineError> {
        match out {
            StepOutput::Argmax(id) => Ok(Some(id)),
            StepOutput::Logits(row) => {
                let (best, top) = row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &x)| if x > b.1 { (i, x) } else { b });
                let sum: f64 = row.iter().map(|&x| f64::from(x - top).exp()).sum();
                Ok((1.0 / sum >= f64::from(self.p_min)).then_some(best as u32))
            }
            other => Err(EngineError::Usage(format!("the draft model's step gave {other:?}"))),
        }
    }
}

/// A sequence's side of the draft model.
#[derive(Debug, Default)]
pub(crate) struct DraftSeq {
    /// Its blocks in the draft model's cache.
    table: BlockTable,
    /// Positions `0 .. computed` hold the draft model's keys and values of the sequence's tokens.
    computed: usize,
    /// Drafts whose keys and values were written at `computed ..`, not yet confirmed.
    written: Vec<u32>,
    /// This step's drafts (empty: none).
    pub(crate) drafts: Vec<u32>,
}

impl DraftSeq {
    /// Counts the written drafts the sequence kept as computed.
    fn sync(&mut self, tokens: &[u32]) {
        let kept = self.written.iter().zip(tokens.get(self.computed..).unwrap_or_default()).take_while(|(a, b)| a == b).count();
        self.computed += kept;
        self.written.clear();
    }
}

/// One drafting sequence of a pass.
struct Work {
    seq: usize,
    /// Most drafts.
    max: usize,
    /// Still drafting.
    open: bool,
}

impl Loop<'_> {
    /// The draft pass before a step (see the [module docs](self)). An error stops this pass's
    /// drafting (the sequences decode plainly) and starts every sequence afresh in the draft
    /// model's cache.
    pub(super) fn draft_with_model(&mut self) {
        let Some(mut dm) = self.draft.take() else { return };
        for s in &mut self.running {
            s.dm.drafts.clear();
            s.dm.sync(&s.tokens);
        }
        if self.draft_pass(&mut dm).is_err() {
            self.metrics.draft_errors += 1;
            for s in &mut self.running {
                dm.release(&mut s.dm);
            }
        }
        self.draft = Some(dm);
    }

    /// The sequences that draft this step and their most drafts (their blocks grown for them).
    fn drafting(&mut self, dm: &mut BatchDraft) -> Vec<Work> {
        let (bl, n_ctx) = (self.o.block_len, dm.state.opts().n_ctx);
        let (cap, cost) = (dm.cap, dm.cost);
        let mut work = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            let Some(spec) = s.opts.speculative.filter(|sp| sp.source == DraftSource::Model) else { continue };
            if s.tokens.len() - s.computed != 1 || s.first_token.is_none() || !s.chooser.drafts() {
                continue;
            }
            let left = s.opts.max_tokens.saturating_sub(s.res.ids.len() + 1);
            let room = n_ctx.saturating_sub(s.tokens.len());
            let mut max = spec.draft_max.min(cap).min(left).min(room);
            if spec.adaptive {
                max = max.min(s.pacer.get_or_insert_with(|| DraftPacer::new(spec.draft_max.min(cap), cost)).next_drafts());
            }
            if max == 0 || max < spec.draft_min {
                continue;
            }
            // The last token's row gives the first draft, even where an unused draft wrote it.
            s.dm.computed = s.dm.computed.min(s.tokens.len() - 1);
            // The first draft comes from the last token's row; each later one from a draft's.
            if s.dm.table.grow(&mut dm.alloc, bl, s.tokens.len() + max - 1).is_err() {
                continue;
            }
            work.push(Work { seq: i, max, open: true });
        }
        work
    }

    fn draft_pass(&mut self, dm: &mut BatchDraft) -> Result<(), EngineError> {
        let mut work = self.drafting(dm);
        if work.is_empty() {
            return Ok(());
        }
        let want = dm.want();
        // 1. One step of what the draft model has not seen (the fewest tokens first; a chunk
        // may cross a prompt's end, as the draft's numbers need not equal its numbers alone);
        // the chunk ending at the last token gives the first draft. A sequence left with more
        // (a long prompt) catches up over the next passes and drafts once it has.
        let mut order: Vec<usize> = (0..work.len()).collect();
        order.sort_by_key(|&w| {
            let s = &self.running[work[w].seq];
            s.tokens.len() - s.dm.computed
        });
        let (mut budget, mut decode_left) = (self.o.max_tokens, dm.state.opts().max_decode_rows());
        let mut plan = Vec::new();
        for w in order {
            let s = &self.running[work[w].seq];
            let (from, end) = (s.dm.computed, s.tokens.len());
            // Generated tokens are decode rows, of which a step takes fewer.
            let decode = from >= s.res.prompt_tokens;
            let n = (end - from).min(budget).min(if decode { decode_left } else { usize::MAX });
            if n == 0 {
                continue;
            }
            budget -= n;
            if decode {
                decode_left -= n;
            }
            plan.push((w, from, n, if from + n == end { want } else { Want::Nothing }));
        }
        let entries: Vec<BatchEntry<'_>> = plan
            .iter()
            .map(|&(w, pos, n, want)| {
                let s = &self.running[work[w].seq];
                entry(s.slot, &s.tokens[pos..pos + n], pos, &s.dm.table, want, pos >= s.res.prompt_tokens)
            })
            .collect();
        let outs = dm.state.step(&entries)?;
        drop(entries);
        self.metrics.draft_steps += 1;
        for w in work.iter_mut() {
            w.open = false;
        }
        for (&(w, pos, n, want), out) in plan.iter().zip(outs) {
            self.running[work[w].seq].dm.computed = pos + n;
            if want != Want::Nothing {
                self.push_draft(dm, &mut work[w], out)?;
            }
        }
        // 2. One step per further draft.
        loop {
            let open: Vec<usize> = (0..work.len()).filter(|&w| work[w].open).collect();
            if open.is_empty() {
                return Ok(());
            }
            let entries: Vec<BatchEntry<'_>> = open
                .iter()
                .map(|&w| {
                    let s = &self.running[work[w].seq];
                    let (d, at) = (&s.dm.drafts, s.dm.computed + s.dm.written.len());
                    entry(s.slot, &d[d.len() - 1..], at, &s.dm.table, want, true)
                })
                .collect();
            let outs = dm.state.step(&entries)?;
            drop(entries);
            self.metrics.draft_steps += 1;
            for (&w, out) in open.iter().zip(outs) {
                let s = &mut self.running[work[w].seq];
                let last = *s.dm.drafts.last().expect("an open sequence has a draft");
                s.dm.written.push(last);
                self.push_draft(dm, &mut work[w], out)?;
            }
        }
    }

    /// Takes a draft from a step's output; closes the sequence's drafting at its most, at an
    /// end-of-generation token (the target may end there too) or where the model is unsure.
    fn push_draft(&mut self, dm: &BatchDraft, w: &mut Work, out: StepOutput) -> Result<(), EngineError> {
        let s = &mut self.running[w.seq];
        match dm.take(out)? {
            Some(id) if (id as usize) < self.engine.inner.config.vocab => {
                s.dm.drafts.push(id);
                w.open = s.dm.drafts.len() < w.max && self.engine.inner.eog.binary_search(&id).is_err();
            }
            _ => w.open = false,
        }
        Ok(())
    }
}

fn entry<'a>(slot: Option<usize>, tokens: &'a [u32], pos: usize, table: &'a BlockTable, want: Want, decode: bool) -> BatchEntry<'a> {
    BatchEntry { slot: slot.expect("running sequences hold a slot"), tokens, pos, table, want, out_rows: 1, decode, mask: None }
}

/// A verification entry's cost with a draft model's steps added: each draft costs one step of
/// the draft model, estimated from the two models' sizes (at least a twentieth of a target's
/// step: small models' steps are bound by dispatches, not weights).
fn model_draft_cost(target: &Engine, draft: &Engine, gpu: bool) -> VerifyCost {
    let size = |e: &Engine| {
        let c = e.config();
        12.0 * (c.dim as f64).powi(2) * c.n_layers as f64
    };
    let c = VerifyCost::for_batch(gpu);
    VerifyCost { per_draft: c.per_draft + (size(draft) / size(target)).max(0.05), ..c }
}

//! Speculative decoding in the batcher ([`Speculative`](super::super::Speculative)): n-gram
//! drafts (prompt lookup) and their verification in the step.
//!
//! A greedy sequence whose next step is a decode row may instead send its last token and `k`
//! drafted tokens as one entry with an output at each of its `k + 1` rows. Row `j`'s argmax is
//! the model's choice after draft `j - 1`; drafts are kept while they equal those choices, and
//! the first choice that differs (or the one after the last draft) is the step's extra token.
//! Every kept token's KV row was computed in the step from the kept tokens before it, exactly
//! as a decode row of its own would have (the rows run through the decode rows' kernels), and
//! positions past the kept ones are written over by later steps before anything reads them;
//! LFM2's conv rings are indexed by position, so the same holds for them.

use super::super::super::backend::StepOutput;
use super::super::super::speculative::{DraftPacer, VerifyCost, max_drafts, ngram_draft};
use super::super::super::{DraftSource, EngineError, FinishReason};
use super::super::step::MAX_DRAFT;
use super::{Loop, Planned, engine_err};

impl Loop<'_> {
    /// The drafts sequence `i` verifies in this step (empty: a plain decode row): none unless
    /// it decodes greedily with speculation on; at most its option's `draft_max`, the model's
    /// [`max_drafts`], the step's
    /// budget after its own token, what is left of [`MAX_DRAFT`] after the `drafted` ones
    /// already planned, its tokens still to generate and its room in the context.
    pub(super) fn draft(&mut self, i: usize, budget: usize, drafted: usize) -> Vec<u32> {
        let gpu = self.engine.is_gpu();
        let most = max_drafts(&self.engine.inner.config);
        let s = &mut self.running[i];
        let Some(spec) = s.opts.speculative else { return Vec::new() };
        if !s.chooser.drafts() {
            return Vec::new();
        }
        let left = s.opts.max_tokens.saturating_sub(s.res.ids.len() + 1);
        let room = self.o.n_ctx.saturating_sub(s.tokens.len());
        let max = spec.draft_max.min(most).min(budget.saturating_sub(1)).min(MAX_DRAFT - drafted.min(MAX_DRAFT)).min(left).min(room);
        let d = match spec.source {
            // Paced (adaptive): as many drafts as their verification rows pay for.
            DraftSource::Ngram if spec.adaptive && max > 0 => {
                let pacer = s.pacer.get_or_insert_with(|| DraftPacer::new(spec.draft_max.min(most), VerifyCost::for_batch(gpu)));
                ngram_draft(&s.tokens, spec.ngram, max.min(pacer.next_drafts()))
            }
            DraftSource::Ngram => ngram_draft(&s.tokens, spec.ngram, max),
            DraftSource::Model => s.dm.drafts[..s.dm.drafts.len().min(max)].to_vec(),
        };
        if d.len() < spec.draft_min { Vec::new() } else { d }
    }

    /// Takes a speculative step's outputs (one per row of the last token and its drafts): keeps
    /// the drafts the model's own choices agree with, then its first other choice.
    pub(super) fn after_verify(&mut self, i: usize, p: &Planned, outs: Vec<StepOutput>) -> Result<Option<FinishReason>, EngineError> {
        let drafts: Vec<u32> = self.running[i].verify[1..].to_vec();
        self.metrics.drafted_tokens += drafts.len() as u64;
        self.metrics.verifications += 1;
        self.running[i].res.timings.draft_tokens += drafts.len();
        // The last token's row is computed; each kept draft's row too.
        self.running[i].computed = p.pos + 1;
        let mut finish = None;
        for (j, out) in outs.into_iter().enumerate() {
            finish = self.take_token(i, out, drafts.get(j).copied())?;
            let s = &mut self.running[i];
            let kept = j < drafts.len() && s.tokens.last() == Some(&drafts[j]);
            if finish.is_some() || !kept {
                break;
            }
            s.computed += 1;
            s.res.timings.accepted_tokens += 1;
            self.metrics.accepted_tokens += 1;
        }
        let s = &mut self.running[i];
        if let Some(pacer) = &mut s.pacer {
            pacer.record(drafts.len(), s.computed - (p.pos + 1));
        }
        let (bl, s) = (self.o.block_len, &mut self.running[i]);
        if self.prefix && s.computed / bl > s.registered {
            self.cache.register(&s.table, &s.tokens[..s.computed]).map_err(engine_err)?;
            s.registered = s.computed / bl;
        }
        Ok(finish)
    }
}

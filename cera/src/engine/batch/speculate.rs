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
use super::super::super::{EngineError, FinishReason};
use super::super::step::MAX_DRAFT;
use super::{Loop, Planned, engine_err};

/// Up to `max` tokens that followed the latest earlier occurrence of the last `ngram` tokens
/// of `tokens` (then of shorter suffixes, down to one token); empty when none recurs.
fn ngram_draft(tokens: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let len = tokens.len();
    if max == 0 {
        return Vec::new();
    }
    for n in (1..=ngram.min(len.saturating_sub(1))).rev() {
        let key = &tokens[len - n..];
        // The latest start `i < len - n` whose n tokens equal the suffix.
        if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == key) {
            let from = i + n;
            return tokens[from..(from + max).min(len)].to_vec();
        }
    }
    Vec::new()
}

impl Loop<'_> {
    /// The drafts sequence `i` verifies in this step (empty: a plain decode row): none unless
    /// it decodes greedily with speculation on; at most its option's `draft_max`, the step's
    /// budget after its own token, what is left of [`MAX_DRAFT`] after the `drafted` ones
    /// already planned, its tokens still to generate and its room in the context.
    pub(super) fn draft(&self, i: usize, budget: usize, drafted: usize) -> Vec<u32> {
        let s = &self.running[i];
        let Some(spec) = s.opts.speculative else { return Vec::new() };
        if !s.chooser.drafts() {
            return Vec::new();
        }
        let left = s.opts.max_tokens.saturating_sub(s.res.ids.len() + 1);
        let room = self.o.n_ctx.saturating_sub(s.tokens.len());
        let max = spec.draft_max.min(budget.saturating_sub(1)).min(MAX_DRAFT - drafted.min(MAX_DRAFT)).min(left).min(room);
        let d = ngram_draft(&s.tokens, spec.ngram, max);
        if d.len() < spec.draft_min { Vec::new() } else { d }
    }

    /// Takes a speculative step's outputs (one per row of the last token and its drafts): keeps
    /// the drafts the model's own choices agree with, then its first other choice.
    pub(super) fn after_verify(&mut self, i: usize, p: &Planned, outs: Vec<StepOutput>) -> Result<Option<FinishReason>, EngineError> {
        let drafts: Vec<u32> = self.running[i].verify[1..].to_vec();
        self.metrics.drafted_tokens += drafts.len() as u64;
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
            self.metrics.accepted_tokens += 1;
        }
        let (bl, s) = (self.o.block_len, &mut self.running[i]);
        if self.prefix && s.computed / bl > s.registered {
            self.cache.register(&s.table, &s.tokens[..s.computed]).map_err(engine_err)?;
            s.registered = s.computed / bl;
        }
        Ok(finish)
    }
}

#[cfg(test)]
mod tests {
    use super::ngram_draft;

    #[test]
    fn drafts_continue_the_latest_match_of_the_longest_suffix() {
        // "a b c d a b" -> the suffix "a b" occurred at 0, followed by "c d a b".
        assert_eq!(ngram_draft(&[1, 2, 3, 4, 1, 2], 3, 8), vec![3, 4, 1, 2]);
        assert_eq!(ngram_draft(&[1, 2, 3, 4, 1, 2], 3, 2), vec![3, 4]);
        // The latest occurrence wins; a longer suffix first.
        assert_eq!(ngram_draft(&[7, 1, 5, 9, 1, 6, 2, 1], 3, 1), vec![6]);
        assert_eq!(ngram_draft(&[5, 1, 2, 9, 3, 1, 2, 8, 4, 1, 2], 2, 1), vec![8]);
        // Nothing recurs; too short; no room.
        assert!(ngram_draft(&[1, 2, 3], 3, 4).is_empty());
        assert!(ngram_draft(&[1], 3, 4).is_empty());
        assert!(ngram_draft(&[1, 1], 3, 0).is_empty());
        assert_eq!(ngram_draft(&[1, 1], 3, 4), vec![1]);
    }
}

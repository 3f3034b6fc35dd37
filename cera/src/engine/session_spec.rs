//! Speculative decoding in a [`Session`] ([`GenerateOpts::speculative`]): n-gram drafts
//! ([`super::speculative`]) verified by one [`BackendState::verify`] step each.
//!
//! After each chosen token the session looks for drafts. With none (or fewer than
//! `draft_min`), the token runs as a plain decode step. Otherwise the token and its `k` drafts
//! run as one verification step with an output after each of them. Output `j` gives the
//! model's choice at the position of draft `j`: the draft is kept when the choice equals it
//! (greedy) or when speculative sampling accepts it, and then output `j + 1` is valid too;
//! the first choice that differs ends the step's run, and the output after the last draft
//! gives one more token. Each token passes through the same stop checks as without
//! speculation, so stop strings, end-of-generation tokens and max tokens fall wherever they
//! fall inside a verified run. Rejected drafts' keys and values (and LFM2's conv rows) lie past
//! the cached prefix and are written over by the next step before anything reads them.
//!
//! Greedy output is the same, token for token, as decoding without speculation: each row of
//! a verification step runs through the kernels of a decode step at its position.
//!
//! [`GenerateOpts::speculative`]: super::GenerateOpts::speculative
//! [`BackendState::verify`]: super::backend::BackendState::verify

use std::collections::VecDeque;
use std::ops::DerefMut;

use super::EngineError;
use super::backend::{StepInput, StepOutput};
use super::generate::{Sink, Taken};
use super::options::{FinishReason, Speculative};
use super::session::Session;
use super::speculative::{DraftPacer, Drafter, VerifyCost, max_drafts};

impl Session {
    /// The decode loop with drafts: from the first token's distribution `first`, until the
    /// generation ends.
    pub(crate) fn decode_speculative<K: DerefMut<Target: Sink>>(
        &mut self,
        mut t: Taken<'_, '_, K>,
        spec: Speculative,
        drafter: &mut dyn Drafter,
        first: StepOutput,
    ) -> Result<FinishReason, EngineError> {
        let engine = self.engine.clone();
        let most = spec.draft_max.min(max_drafts(&engine.inner.config));
        let mut pacer = DraftPacer::new(most, VerifyCost::for_model(&engine.inner.config, engine.is_gpu()));
        // Outputs not yet chosen from, each with the draft it verifies (none after the last).
        let mut outs: VecDeque<(StepOutput, Option<u32>)> = VecDeque::from([(first, None)]);
        // The last verification step's drafts and how many of them were kept so far.
        let (mut pending, mut kept_run) = (None::<usize>, 0);
        loop {
            let (out, draft) = outs.pop_front().expect("an output is queued before each choice");
            let position = self.seq.len() as u64;
            let (id, top) = match draft {
                Some(d) => (t.chooser.choose_draft(out, &self.seq, position, d)?, Default::default()),
                None => t.chooser.choose(out, &self.seq, position)?,
            };
            let kept = draft == Some(id);
            if kept {
                t.res.timings.accepted_tokens += 1;
                kept_run += 1;
            } else {
                outs.clear(); // conditioned on a draft that was not kept
            }
            if !kept && let Some(n) = pending.take() {
                pacer.record(n, kept_run);
                kept_run = 0;
            }
            if let Some(f) = self.take(&mut t, id, top)? {
                return Ok(f);
            }
            if kept {
                // Its keys and values came with the verification step.
                self.cached.push(id);
                t.res.timings.decode_tokens += 1;
                continue;
            }
            // Run the new token, with drafts when the sequence suggests some.
            let pos = self.seq.len() - 1;
            let left = t.opts.max_tokens.saturating_sub(t.res.ids.len() + 1);
            let room = t.n_ctx.saturating_sub(self.seq.len());
            let allowed = if spec.adaptive { pacer.next_drafts() } else { most };
            let max = allowed.min(left).min(room);
            let mut drafts = if max == 0 { Vec::new() } else { drafter.draft(&self.seq, max) };
            drafts.truncate(max);
            let want = t.chooser.want();
            if drafts.len() < spec.draft_min.max(1) {
                outs.push_back((self.state.step(StepInput::Tokens(&self.seq[pos..]), pos, want)?, None));
            } else {
                let mut run = Vec::with_capacity(drafts.len() + 1);
                run.push(self.seq[pos]);
                run.extend_from_slice(&drafts);
                let rows = self.state.verify(&run, pos, want)?;
                t.res.timings.draft_tokens += drafts.len();
                pending = Some(drafts.len());
                outs.extend(rows.into_iter().zip(drafts.into_iter().map(Some).chain([None])));
            }
            self.cached.push(self.seq[pos]);
            t.res.timings.decode_steps += 1;
            t.res.timings.decode_tokens += 1;
        }
    }
}

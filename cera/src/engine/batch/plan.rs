//! Planning one step of the batcher's loop (a child module of the scheduler): decode rows and
//! prompt chunks of the running sequences under the token budget, preempting the newest where
//! KV blocks run out, then new sequences from the queue (each first taking its prompt's cached
//! prefix, with a copy on write where it parts inside a block).

use std::time::Instant;

use boostr::ops_common::OpsError;

use super::super::super::EngineError;
use super::super::super::backend::Want;
use super::{Loop, Planned, Seq, engine_err};

/// The tokens of `s` its next entry runs under `budget` (and, for generated tokens, under
/// `decode_left` decode rows): all it has left, within the budgets, never crossing the prompt's
/// end (prompt rows and generated rows run through different kernels, see
/// [`BatchEntry::decode`](super::super::step::BatchEntry::decode)).
fn chunk_len(s: &Seq<'_>, budget: usize, decode_left: usize) -> usize {
    let (left, prompt) = (s.tokens.len() - s.computed, s.res.prompt_tokens);
    let n = left.min(budget);
    if s.computed < prompt { n.min(prompt - s.computed) } else { n.min(decode_left) }
}

impl<'t> Loop<'t> {
    /// Decode rows (generated tokens) the step has room for beside those `plan` holds
    /// ([`BatchOpts::max_decode_rows`](super::super::step::BatchOpts::max_decode_rows)).
    fn decode_left(&self, plan: &[Planned]) -> usize {
        let used: usize = plan.iter().filter(|p| p.pos >= self.running[p.seq].res.prompt_tokens).map(|p| p.n).sum();
        self.o.max_decode_rows().saturating_sub(used)
    }

    /// Preempts the newest running sequence (other than `keep`), removing its planned entry;
    /// returns false when there is none.
    fn preempt_newest(&mut self, plan: &mut Vec<Planned>, budget: &mut usize, keep: usize) -> bool {
        let Some(victim) = (0..self.running.len()).filter(|&i| i != keep).max_by_key(|&i| self.running[i].order) else { return false };
        if let Some(at) = plan.iter().position(|p| p.seq == victim) {
            *budget += plan.remove(at).n;
        }
        let mut s = self.running.remove(victim);
        for p in plan.iter_mut() {
            if p.seq > victim {
                p.seq -= 1;
            }
        }
        self.release_blocks(&mut s);
        if let Some(slot) = s.slot.take() {
            self.free_slots.push(slot);
        }
        s.computed = 0;
        s.registered = 0;
        self.metrics.preemptions += 1;
        // Back to the queue in admission order, ahead of requests that never ran.
        let at = self.waiting.iter().position(|w| w.admitted.is_none() || w.order > s.order).unwrap_or(self.waiting.len());
        self.waiting.insert(at, s);
        true
    }

    /// Plans the running sequences' part of a step (decode rows, then prefill chunks), preempting
    /// the newest where blocks run out. Sequences that cannot fit even alone end with an error.
    pub(super) fn plan_running(&mut self, plan: &mut Vec<Planned>, budget: &mut usize) {
        // Draft tokens in this step so far (at most `MAX_DRAFT` in all).
        let mut drafted = 0;
        for decode in [true, false] {
            let mut order: Vec<u64> = self.running.iter().map(|s| s.order).collect();
            order.sort_unstable();
            for ord in order {
                let Some(i) = self.running.iter().position(|s| s.order == ord) else { continue };
                let decode_left = self.decode_left(plan);
                let s = &self.running[i];
                let left = s.tokens.len() - s.computed;
                if (left == 1) != decode || left == 0 || *budget == 0 || plan.iter().any(|p| p.seq == i) {
                    continue;
                }
                let n = chunk_len(s, *budget, decode_left);
                if n == 0 {
                    continue; // generated tokens to recompute, and no decode rows left this step
                }
                // A greedy decode row may carry drafts to verify.
                let drafts = if decode && s.first_token.is_some() { self.draft(i, (*budget).min(decode_left), drafted) } else { Vec::new() };
                let (mut n, mut out_rows) = if drafts.is_empty() { (n, 1) } else { (1 + drafts.len(), 1 + drafts.len()) };
                let s = &mut self.running[i];
                if !drafts.is_empty() {
                    drafted += drafts.len();
                    s.verify.clear();
                    s.verify.push(s.tokens[s.computed]);
                    s.verify.extend_from_slice(&drafts);
                }
                let mut end = s.computed + n;
                let mut idx = i;
                loop {
                    let s = &mut self.running[idx];
                    match self.cache.grow(&mut s.table, end) {
                        Ok(()) => {
                            let want = self.want_of(idx, end);
                            plan.push(Planned { seq: idx, pos: self.running[idx].computed, n, want, out_rows });
                            *budget -= n;
                            break;
                        }
                        Err(OpsError::KvBlocksExhausted { .. }) if out_rows > 1 => {
                            // Drafts are a bet, never worth another sequence's blocks: this
                            // step decodes the one token plainly.
                            drafted -= out_rows - 1;
                            (n, out_rows) = (1, 1);
                            end = s.computed + 1;
                            s.verify.clear();
                        }
                        Err(OpsError::KvBlocksExhausted { .. }) => {
                            let victim_is_self = (0..self.running.len()).max_by_key(|&j| self.running[j].order) == Some(idx);
                            if victim_is_self {
                                // This sequence is the newest: it waits (preempted) unless it is alone.
                                if self.running.len() == 1 {
                                    let s = self.running.remove(idx);
                                    let e = self.too_long(end);
                                    self.finish(s, Err(e));
                                    break;
                                }
                                self.preempt_newest(plan, budget, usize::MAX);
                                break;
                            }
                            let before = self.running[idx].order;
                            self.preempt_newest(plan, budget, idx);
                            match self.running.iter().position(|s| s.order == before) {
                                Some(j) => idx = j,
                                None => break,
                            }
                        }
                        Err(e) => {
                            let s = self.running.remove(idx);
                            self.finish(s, Err(engine_err(e)));
                            break;
                        }
                    }
                }
            }
        }
    }

    /// The error of a sequence of `end` positions that the whole KV budget cannot hold.
    fn too_long(&self, end: usize) -> EngineError {
        let need = end.div_ceil(self.o.block_len);
        EngineError::Usage(format!(
            "the KV budget of {} blocks of {} positions cannot hold one sequence of {end} positions ({need} blocks)",
            self.o.n_blocks, self.o.block_len
        ))
    }

    /// Puts a sequence that cannot run this step back at the queue's front (keeping its order),
    /// its blocks released: it starts over from its prompt's cached prefix.
    fn wait_at_front(&mut self, mut s: Seq<'t>) {
        self.release_blocks(&mut s);
        s.computed = 0;
        s.registered = 0;
        self.waiting.push_front(s);
    }

    /// What the step of sequence `i` ending at `end` asks for.
    fn want_of(&self, i: usize, end: usize) -> Want {
        let s = &self.running[i];
        if end < s.tokens.len() || s.opts.max_tokens == 0 { Want::Nothing } else { s.chooser.want() }
    }

    /// Admits queued sequences while slots, tokens and blocks last (never preempting for them).
    pub(super) fn admit(&mut self, plan: &mut Vec<Planned>, budget: &mut usize) {
        while *budget > 0 && !self.free_slots.is_empty() && self.running.len() < self.o.max_seqs {
            let Some(mut s) = self.waiting.pop_front() else { break };
            let first = s.admitted.is_none();
            if self.prefix && s.table.is_empty() {
                match self.cache.start_with_copy(&s.tokens) {
                    Ok((table, hit, copy)) => {
                        s.table = table;
                        s.computed = hit;
                        s.registered = hit / self.o.block_len;
                        s.copy = copy;
                    }
                    Err(e) => {
                        self.finish(s, Err(engine_err(e)));
                        continue;
                    }
                }
            }
            let n = chunk_len(&s, *budget, self.decode_left(plan));
            if n == 0 {
                // Its recomputed output waits for decode rows.
                self.wait_at_front(s);
                break;
            }
            let end = s.computed + n;
            match self.cache.grow(&mut s.table, end) {
                Ok(()) => {}
                Err(OpsError::KvBlocksExhausted { .. }) if !self.running.is_empty() => {
                    // Wait for running sequences to free blocks.
                    self.wait_at_front(s);
                    break;
                }
                Err(OpsError::KvBlocksExhausted { .. }) => {
                    let e = self.too_long(end);
                    self.finish(s, Err(e));
                    continue;
                }
                Err(e) => {
                    self.finish(s, Err(engine_err(e)));
                    continue;
                }
            }
            if first {
                s.admitted = Some(Instant::now());
                s.res.reused = s.computed;
            }
            s.slot = self.free_slots.pop();
            self.running.push(s);
            let i = self.running.len() - 1;
            let want = self.want_of(i, end);
            plan.push(Planned { seq: i, pos: self.running[i].computed, n, want, out_rows: 1 });
            *budget -= n;
        }
    }
}

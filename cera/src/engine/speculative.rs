//! Speculative decoding's drafters, pacing and limits, shared by a [`Session`](super::Session)
//! (`session_spec.rs`) and the batcher (`batch/speculate.rs`).
//!
//! A [`Drafter`] proposes tokens; the model verifies them, so what it proposes changes the
//! speed, never the greedy output. The built-in one is prompt lookup ([`NgramDrafter`]): the
//! last `ngram` tokens (then shorter suffixes) are looked up earlier in the sequence, prompt and
//! output alike, and what followed their latest occurrence is proposed. It needs no model and
//! costs a scan of the sequence per step. [`Session::generate_drafted`](super::Session::generate_drafted)
//! takes any other (a draft model, a lookup table, a benchmark's oracle).

use super::backend::CONV_RING;
use super::batch::MAX_DRAFT;
use super::config::ModelConfig;

/// Proposes draft tokens for speculative decoding.
pub trait Drafter {
    /// Up to `max` tokens likely to follow `tokens` (the whole sequence so far, prompt and
    /// generated tokens); empty for none. Tokens past `max` are ignored.
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32>;
}

/// Prompt lookup: what followed the latest earlier occurrence of the sequence's last `ngram`
/// tokens (then of shorter suffixes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramDrafter {
    /// Longest suffix matched.
    pub ngram: usize,
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        ngram_draft(tokens, self.ngram, max)
    }
}

/// How many drafts the next step of a session verifies: all that are allowed while drafts are
/// kept; after a step with none kept, half as many; after two or more such steps in a row, no
/// drafts for 2, 4, ... up to 64 steps (each of those runs as a plain decode step), then one
/// draft to probe. A verification step costs more than a decode step, so drafts that are never
/// right must not slow decoding down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DraftPacer {
    max: usize,
    k: usize,
    misses: u32,
    skip: u32,
}

impl DraftPacer {
    /// A pacer allowing up to `max` drafts a step.
    pub fn new(max: usize) -> DraftPacer {
        DraftPacer { max, k: max, misses: 0, skip: 0 }
    }

    /// The most drafts the next step may verify (0: a plain decode step).
    pub fn next(&mut self) -> usize {
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        self.k
    }

    /// Records a verification step: `drafted` drafts, `kept` of them kept.
    pub fn record(&mut self, drafted: usize, kept: usize) {
        if drafted == 0 {
            return;
        }
        if kept == 0 {
            self.misses += 1;
            self.k = (self.k / 2).max(1);
            if self.misses >= 2 {
                self.skip = 1 << (self.misses - 1).min(6);
            }
        } else {
            self.misses = 0;
            self.k = if kept == drafted { (self.k * 2).min(self.max) } else { (kept + 1).min(self.max) };
        }
    }
}

/// `max` tokens that followed the latest earlier occurrence of the last `ngram` tokens of
/// `tokens` (then of shorter suffixes, down to one token), continued through the drafts
/// themselves past the sequence's end; empty when none recurs.
pub(crate) fn ngram_draft(tokens: &[u32], ngram: usize, max: usize) -> Vec<u32> {
    let len = tokens.len();
    if max == 0 {
        return Vec::new();
    }
    for n in (1..=ngram.min(len.saturating_sub(1))).rev() {
        let key = &tokens[len - n..];
        // The latest start `i < len - n` whose n tokens equal the suffix.
        if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == key) {
            // What followed, read on through the drafts themselves where the match is recent
            // (a repeating run proposes its period again: "a b a b" drafts "a b a b ...").
            let from = i + n;
            let mut d = Vec::with_capacity(max);
            for j in 0..max {
                let at = from + j;
                d.push(if at < len { tokens[at] } else { d[at - len] });
            }
            return d;
        }
    }
    Vec::new()
}

/// The most drafts one verification step may carry for this model: [`MAX_DRAFT`], and for
/// models with short-conv layers (LFM2) few enough that a step whose drafts are all rejected
/// backs up to a position whose conv inputs the rings (of [`CONV_RING`] positions) still hold.
pub fn max_drafts(cfg: &ModelConfig) -> usize {
    if cfg.conv_kernel == 0 { MAX_DRAFT } else { MAX_DRAFT.min(CONV_RING.saturating_sub(cfg.conv_kernel.saturating_sub(1))) }
}

#[cfg(test)]
mod tests {
    use super::{DraftPacer, ngram_draft};

    #[test]
    fn the_pacer_backs_off_after_misses_and_grows_back() {
        let mut p = DraftPacer::new(8);
        assert_eq!(p.next(), 8);
        p.record(8, 8);
        assert_eq!(p.next(), 8);
        p.record(8, 3);
        assert_eq!(p.next(), 4);
        p.record(4, 0);
        assert_eq!(p.next(), 2);
        p.record(2, 0); // two misses in a row: 2 plain steps
        assert_eq!((p.next(), p.next(), p.next()), (0, 0, 1));
        p.record(1, 0); // three: 4 plain steps
        assert_eq!((0..4).map(|_| p.next()).sum::<usize>(), 0);
        assert_eq!(p.next(), 1);
        p.record(1, 1);
        assert_eq!(p.next(), 2);
        p.record(2, 2);
        p.record(4, 4);
        assert_eq!(p.next(), 8);
        // Many misses: at most 64 plain steps between probes.
        for _ in 0..20 {
            while p.next() == 0 {}
            p.record(1, 0);
        }
        assert_eq!((0..64).map(|_| p.next()).sum::<usize>(), 0);
        assert_eq!(p.next(), 1);
    }

    #[test]
    fn drafts_continue_the_latest_match_of_the_longest_suffix() {
        // "a b c d a b" -> the suffix "a b" occurred at 0, followed by "c d a b", then by
        // what those drafts imply ("c d a b" again).
        assert_eq!(ngram_draft(&[1, 2, 3, 4, 1, 2], 3, 8), vec![3, 4, 1, 2, 3, 4, 1, 2]);
        // A run of one token proposes more of it.
        assert_eq!(ngram_draft(&[5, 9, 9, 9], 3, 4), vec![9, 9, 9, 9]);
        assert_eq!(ngram_draft(&[1, 2, 3, 4, 1, 2], 3, 2), vec![3, 4]);
        // The latest occurrence wins; a longer suffix first.
        assert_eq!(ngram_draft(&[7, 1, 5, 9, 1, 6, 2, 1], 3, 1), vec![6]);
        assert_eq!(ngram_draft(&[5, 1, 2, 9, 3, 1, 2, 8, 4, 1, 2], 2, 1), vec![8]);
        // Nothing recurs; too short; no room.
        assert!(ngram_draft(&[1, 2, 3], 3, 4).is_empty());
        assert!(ngram_draft(&[1], 3, 4).is_empty());
        assert!(ngram_draft(&[1, 1], 3, 0).is_empty());
        assert_eq!(ngram_draft(&[1, 1], 3, 4), vec![1, 1, 1, 1]);
    }
}

//! Speculative decoding's drafter and limits, shared by a [`Session`](super::Session)
//! ([`super::session_spec`]) and the batcher (`batch/speculate.rs`).
//!
//! The drafter is prompt lookup: the last `ngram` tokens (then shorter suffixes) are looked up
//! earlier in the sequence, prompt and output alike, and what followed their latest occurrence
//! is proposed. It needs no model and costs a scan of the sequence per step.

use super::backend::CONV_RING;
use super::batch::MAX_DRAFT;
use super::config::ModelConfig;

/// Up to `max` tokens that followed the latest earlier occurrence of the last `ngram` tokens
/// of `tokens` (then of shorter suffixes, down to one token); empty when none recurs.
pub(crate) fn ngram_draft(tokens: &[u32], ngram: usize, max: usize) -> Vec<u32> {
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

/// The most drafts one verification step may carry for this model: [`MAX_DRAFT`], and for
/// models with short-conv layers (LFM2) few enough that a step whose drafts are all rejected
/// backs up to a position whose conv inputs the rings (of [`CONV_RING`] positions) still hold.
pub fn max_drafts(cfg: &ModelConfig) -> usize {
    if cfg.conv_kernel == 0 { MAX_DRAFT } else { MAX_DRAFT.min(CONV_RING.saturating_sub(cfg.conv_kernel.saturating_sub(1))) }
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

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

/// Drafts with a smaller model that shares the target's vocabulary (`--model-draft`): a
/// session of its own, kept in step with the target's sequence (its cached prefix is reused,
/// so each step runs only the tokens new since the last one) and decoding greedily. When the
/// draft model cannot draft (its context is full, or any other error), it proposes nothing and
/// the target decodes plainly; [`Self::take_error`] tells what went wrong.
pub struct ModelDrafter {
    session: super::Session,
    error: Option<super::EngineError>,
    p_min: f32,
}

impl ModelDrafter {
    /// A drafter running `draft` for `target`; [`super::EngineError::Usage`] when their
    /// vocabularies differ in size (the ids would mean other tokens).
    pub fn new(draft: &super::Engine, target: &super::Engine) -> Result<ModelDrafter, super::EngineError> {
        check_draft_vocab(draft, target)?;
        Ok(ModelDrafter { session: draft.session()?, error: None, p_min: 0.0 })
    }

    /// Drafts stop at the first token the draft model gives a probability below `p_min`
    /// (llama.cpp's `--draft-p-min`; 0, the default: never). Above 0 the draft model reads
    /// its whole logits rows back for the probabilities, which costs it some speed.
    pub fn with_p_min(self, p_min: f32) -> ModelDrafter {
        ModelDrafter { p_min, ..self }
    }

    /// The error that last stopped the draft model from drafting since the last call, if
    /// any (taken: the next call gives `None` unless it happened again).
    pub fn take_error(&mut self) -> Option<super::EngineError> {
        self.error.take()
    }

    fn try_draft(&mut self, tokens: &[u32], max: usize) -> Result<Vec<u32>, super::EngineError> {
        let room = self.session.engine().n_ctx().saturating_sub(tokens.len());
        if room == 0 {
            return Ok(Vec::new());
        }
        self.session.reset();
        self.session.append_tokens(tokens)?;
        let opts = super::GenerateOpts { top_logprobs: usize::from(self.p_min > 0.0), ..super::GenerateOpts::greedy(max.min(room)) };
        let g = self.session.generate(&opts, &mut |_: &super::TokenEvent| {})?;
        let mut d = g.ids;
        if self.p_min > 0.0 {
            // The first token the draft model is unsure of ends the drafts.
            let sure = g.logprobs.iter().take_while(|&&lp| lp.exp() >= self.p_min).count();
            d.truncate(sure);
            return Ok(d);
        }
        d.extend(g.stop_token); // the target may end there too
        Ok(d)
    }
}

impl Drafter for ModelDrafter {
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        match self.try_draft(tokens, max) {
            Ok(d) => d,
            Err(e) => {
                self.error = Some(e);
                Vec::new()
            }
        }
    }
}

/// [`super::EngineError::Usage`] when a draft model's vocabulary differs in size from its
/// target's (its ids would mean other tokens).
pub(crate) fn check_draft_vocab(draft: &super::Engine, target: &super::Engine) -> Result<(), super::EngineError> {
    let (d, t) = (draft.config().vocab, target.config().vocab);
    if d != t {
        return Err(super::EngineError::Usage(format!(
            "the draft model's vocabulary of {d} tokens differs from the target's {t}: drafts need the same token ids"
        )));
    }
    Ok(())
}

/// What a verification step of `k` drafts costs, in decode steps: `base + per_draft * k`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerifyCost {
    /// The cost of a verification step beside a decode step's, drafts aside.
    pub base: f64,
    /// What each draft adds.
    pub per_draft: f64,
}

impl VerifyCost {
    /// The GPU's, measured on the H100 (2026-12-06 14:30 UTC, `cera bench --spec-oracle`, the
    /// fused verification plan with early submits and rows in groups of 3): a verification step
    /// of 2 / 8 drafts took 1.9 / 2.9 decode steps on llama-8b Q4_0 and 2.2 / 2.9 on llama-1b.
    pub const GPU: VerifyCost = VerifyCost { base: 1.8, per_draft: 0.14 };
    /// The GPU's for models of fewer than 300M parameters, whose steps are bound by dispatches
    /// rather than weight reads: on smol-135m (SmolLM2-135M's shapes, the same run) 2.3 / 3.4 /
    /// 4.4 decode steps for 2 / 4 / 8 drafts.
    pub const SMALL_GPU: VerifyCost = VerifyCost { base: 1.9, per_draft: 0.32 };
    /// The CPU's, where each row adds its own matrix products.
    pub const CPU: VerifyCost = VerifyCost { base: 1.0, per_draft: 0.5 };
    /// A verification entry in the batcher's step on a GPU, against the step without it: its
    /// drafts are rows of the step's multi-row GEMV, which reads the weights once per group of
    /// up to 4 rows (estimated from that, not measured).
    pub const BATCH_GPU: VerifyCost = VerifyCost { base: 1.0, per_draft: 0.25 };

    /// The cost model of a verification entry in the batcher's step ([`Self::BATCH_GPU`], or
    /// [`Self::CPU`]).
    pub fn for_batch(gpu: bool) -> VerifyCost {
        if gpu { VerifyCost::BATCH_GPU } else { VerifyCost::CPU }
    }

    /// The cost model for a model of this configuration on a GPU or the CPU (by its size: about
    /// `12 * dim^2` weights a layer).
    pub fn for_model(cfg: &ModelConfig, gpu: bool) -> VerifyCost {
        let params = 12.0 * (cfg.dim as f64).powi(2) * cfg.n_layers as f64;
        match (gpu, params < 3e8) {
            (false, _) => VerifyCost::CPU,
            (true, true) => VerifyCost::SMALL_GPU,
            (true, false) => VerifyCost::GPU,
        }
    }

    fn of(&self, k: usize) -> f64 {
        self.base + self.per_draft * k as f64
    }
}

/// How many drafts the next step of a session verifies, from the drafts kept so far and what a
/// verification step costs ([`VerifyCost`]): with `a` the estimated chance that a draft is
/// kept (given the ones before it were), `k` drafts give `1 + a + ... + a^k` tokens for the
/// cost of `base + per_draft * k` decode steps; the pacer picks the `k` that gives the most
/// tokens per decode step's worth of time, and drafts nothing while even that is below 1
/// (decoding plainly is faster). Then, after 1, 3, 7, ... up to 63 plain steps, one
/// verification step probes whether drafts have become good. It depends only on which drafts
/// were kept, so the same generation drafts the same way every time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftPacer {
    max: usize,
    cost: VerifyCost,
    /// Kept drafts and positions tried (kept, plus one per rejection), decayed.
    kept: f64,
    tried: f64,
    misses: u32,
    skip: u32,
    probe: bool,
}

/// Each verification step's weight against the ones before it in the acceptance estimate.
const DECAY: f64 = 0.7;

impl DraftPacer {
    /// A pacer allowing up to `max` drafts a step; drafts start out presumed kept 4 times in 5.
    pub fn new(max: usize, cost: VerifyCost) -> DraftPacer {
        DraftPacer { max, cost, kept: 4.0, tried: 5.0, misses: 0, skip: 0, probe: false }
    }

    /// The estimated chance that a draft is kept, given the ones before it were.
    pub fn acceptance(&self) -> f64 {
        (self.kept / self.tried.max(1e-9)).clamp(0.0, 0.999)
    }

    /// The best number of drafts and its tokens per decode step's worth of time.
    fn best(&self) -> (usize, f64) {
        let a = self.acceptance();
        let mut best = (1, 0.0);
        let (mut tokens, mut pow) = (1.0, 1.0);
        for k in 1..=self.max.max(1) {
            pow *= a;
            tokens += pow;
            let gain = tokens / self.cost.of(k);
            if gain > best.1 + 1e-12 {
                best = (k, gain);
            }
        }
        best
    }

    /// The most drafts the next step may verify (0: a plain decode step).
    pub fn next_drafts(&mut self) -> usize {
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        let (k, gain) = self.best();
        if gain >= 1.0 || self.probe {
            self.probe = false;
            return k;
        }
        self.misses = (self.misses + 1).min(6);
        self.skip = (1 << self.misses) - 2; // this step and these plain, then a probe
        self.probe = true;
        0
    }

    /// Records a verification step: `drafted` drafts, the first `kept` of them kept.
    pub fn record(&mut self, drafted: usize, kept: usize) {
        if drafted == 0 {
            return;
        }
        let tried = kept + usize::from(kept < drafted);
        self.kept = self.kept * DECAY + kept as f64;
        self.tried = self.tried * DECAY + tried as f64;
        if self.best().1 >= 1.0 {
            self.misses = 0;
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
    use super::{DraftPacer, VerifyCost, ngram_draft};

    #[test]
    fn the_pacer_drafts_while_it_pays_and_probes_after_backing_off() {
        let mut p = DraftPacer::new(8, VerifyCost::GPU);
        // Presumed 0.8: the best k is the one with the most tokens per cost.
        let k = p.next_drafts();
        assert!((4..=8).contains(&k), "{k}");
        // Every draft kept: the estimate rises and k stays high.
        for _ in 0..5 {
            let k = p.next_drafts();
            p.record(k, k);
        }
        assert!(p.acceptance() > 0.95 && p.next_drafts() == 8, "{}", p.acceptance());
        // Nothing kept: the estimate falls until drafting does not pay, then plain steps,
        // 0, 2, 6, 14, ... of them between single probes.
        let mut plain_runs = Vec::new();
        let mut run = 0;
        for _ in 0..200 {
            match p.next_drafts() {
                0 => run += 1,
                k => {
                    if run > 0 {
                        plain_runs.push(run);
                    }
                    run = 0;
                    p.record(k, 0);
                }
            }
        }
        assert_eq!(&plain_runs[..4], &[1, 3, 7, 15], "{plain_runs:?}");
        assert!(plain_runs.iter().all(|&r| r <= 63));
        // A probe that keeps everything brings drafting back.
        while p.next_drafts() == 0 {}
        for _ in 0..4 {
            p.record(8, 8);
        }
        assert!(p.next_drafts() > 0);
        // Deterministic: the same record gives the same schedule.
        let sched = |mut p: DraftPacer| {
            (0..50)
                .map(|i| {
                    let k = p.next_drafts();
                    p.record(k, (i % 3).min(k));
                    k
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(sched(DraftPacer::new(6, VerifyCost::CPU)), sched(DraftPacer::new(6, VerifyCost::CPU)));
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

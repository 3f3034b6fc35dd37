//! Sampling on the CPU: penalties, top-k, top-p, min-p, temperature and a seeded draw, in
//! llama.cpp's default order (penalties, top-k, top-p, min-p, temperature, then the draw), and
//! the log-probabilities of the raw distribution for `top_logprobs`.
//!
//! The GPU path reads back only what this needs (the top candidates), so every function works on
//! a candidate list as well as on a whole logits row.

use super::EngineError;

/// The most `top_logprobs` one generation may ask for (`GenerateOpts::top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 100;

/// Options of one generation's sampler. [`SamplerOpts::check`] says which values are allowed;
/// `Session::generate` refuses others with [`EngineError::Sampler`].
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerOpts {
    /// 0 means greedy; finite and at least 0.
    pub temperature: f32,
    /// Keep the `top_k` most likely candidates (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1 = all); in (0, 1].
    pub top_p: f32,
    /// Drop candidates below `min_p` times the most likely one's probability (0 = none); in
    /// [0, 1].
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recent tokens (1 = off); above 0.
    pub repeat_penalty: f32,
    /// Subtract from the logit of every token seen recently (0 = off); finite.
    pub presence_penalty: f32,
    /// Subtract `count *` this from the logit of recent tokens (0 = off); finite.
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Seed of the draw.
    pub seed: u64,
}

impl Default for SamplerOpts {
    fn default() -> Self {
        SamplerOpts {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerOpts {
    /// Greedy decoding (argmax of the raw logits).
    pub fn greedy() -> Self {
        SamplerOpts { temperature: 0.0, top_k: 1, top_p: 1.0, min_p: 0.0, ..Default::default() }
    }

    /// Whether the choice is the argmax of the raw logits (no penalties, no randomness).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 && !self.has_penalties()
    }

    /// Whether any penalty is on.
    pub fn has_penalties(&self) -> bool {
        self.repeat_last_n > 0 && (self.repeat_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0)
    }

    /// Checks every value: a NaN, an infinity or a value out of its range is
    /// [`EngineError::Sampler`], naming the option and the range it takes.
    ///
    /// ```
    /// use cera::engine::{EngineError, SamplerOpts};
    /// assert!(SamplerOpts::greedy().check().is_ok());
    /// let e = SamplerOpts { top_p: 0.0, ..SamplerOpts::default() }.check().unwrap_err();
    /// assert!(matches!(e, EngineError::Sampler { option: "top_p", .. }));
    /// assert_eq!(e.to_string(), "sampler option top_p is 0: expected a number above 0 and at most 1 (1: off)");
    /// ```
    pub fn check(&self) -> Result<(), EngineError> {
        let bad = |option: &'static str, value: f32, expected: &'static str| Err(EngineError::Sampler { option, value: value.to_string(), expected });
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", t, "a finite number of at least 0 (0: greedy)");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "a number above 0 and at most 1 (1: off)");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "a number from 0 to 1 (0: off)");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", self.repeat_penalty, "a finite number above 0 (1: off)");
        }
        for (option, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !v.is_finite() {
                return bad(option, v, "a finite number (0: off)");
            }
        }
        Ok(())
    }
}

/// A counter-based generator (SplitMix64): the draw for a position depends only on the seed and
/// the position, so a seed reproduces the output whatever was generated before.
pub fn uniform(seed: u64, position: u64) -> f64 {
    let mut z = seed ^ position.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// `(id, logprob)` of the `n` most likely candidates under the raw distribution (a log-softmax
/// over `cands`), most likely first; ties go to the lower id.
pub fn top_logprobs(cands: &[(u32, f32)], n: usize) -> Vec<(u32, f32)> {
    let m = cands.iter().fold(f32::NEG_INFINITY, |a, c| a.max(c.1));
    let lse = m as f64 + cands.iter().map(|c| ((c.1 - m) as f64).exp()).sum::<f64>().ln();
    let mut v: Vec<(u32, f32)> = cands.iter().map(|&(i, l)| (i, (l as f64 - lse) as f32)).collect();
    sort_desc(&mut v);
    v.truncate(n);
    v
}

fn sort_desc(v: &mut [(u32, f32)]) {
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
}

/// Applies the penalties to `cands` in place, over the last `repeat_last_n` ids of `history`.
pub fn apply_penalties(cands: &mut [(u32, f32)], history: &[u32], o: &SamplerOpts) {
    if !o.has_penalties() {
        return;
    }
    let recent = &history[history.len().saturating_sub(o.repeat_last_n)..];
    let mut counts: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for &id in recent {
        *counts.entry(id).or_default() += 1;
    }
    for c in cands.iter_mut() {
        if let Some(&n) = counts.get(&c.0) {
            c.1 = if c.1 > 0.0 { c.1 / o.repeat_penalty } else { c.1 * o.repeat_penalty };
            c.1 -= n as f32 * o.frequency_penalty + o.presence_penalty;
        }
    }
}

/// Chooses the next id from `cands` (the whole row, or the top candidates read back from the
/// GPU) for the token at `position`.
pub fn sample(cands: &[(u32, f32)], history: &[u32], position: u64, o: &SamplerOpts) -> Option<u32> {
    let (v, w) = distribution(cands, history, o)?;
    let total: f64 = w.iter().sum();
    let mut r = uniform(o.seed, position) * total;
    for (c, wi) in v.iter().zip(&w) {
        if r < *wi {
            return Some(c.0);
        }
        r -= wi;
    }
    v.last().map(|c| c.0)
}

/// The draw of [`sample`] for a speculative draft `draft` (a deterministic proposal): `draft`
/// with its probability under the sampler's distribution, else a draw from that distribution
/// without it (renormalized), which leaves every token's overall probability unchanged
/// (speculative sampling with a one-token proposal). The acceptance draw uses a stream of its
/// own, so the residual draw is the one [`sample`] makes when there is no draft.
pub fn sample_with_draft(cands: &[(u32, f32)], history: &[u32], position: u64, o: &SamplerOpts, draft: u32) -> Option<u32> {
    let (v, w) = distribution(cands, history, o)?;
    let total: f64 = w.iter().sum();
    let p_draft = v.iter().zip(&w).find(|(c, _)| c.0 == draft).map_or(0.0, |(_, wi)| wi / total);
    if uniform(o.seed ^ DRAFT_STREAM, position) < p_draft {
        return Some(draft);
    }
    let rest: f64 = total - p_draft * total;
    if rest <= 0.0 {
        return Some(draft);
    }
    let mut r = uniform(o.seed, position) * rest;
    for (c, wi) in v.iter().zip(&w).filter(|(c, _)| c.0 != draft) {
        if r < *wi {
            return Some(c.0);
        }
        r -= wi;
    }
    v.iter().rev().find(|c| c.0 != draft).map(|c| c.0)
}

/// Seeds the acceptance draws of [`sample_with_draft`] apart from the token draws.
const DRAFT_STREAM: u64 = 0x5bd1_e995_d6e8_feb8;

/// Candidates `(id, logit)` with their unnormalized weights.
type Weighted = (Vec<(u32, f32)>, Vec<f64>);

/// The candidates the sampler keeps (penalties, top-k, top-p, min-p applied; largest first)
/// with their unnormalized weights after the temperature (greedy: the best alone).
fn distribution(cands: &[(u32, f32)], history: &[u32], o: &SamplerOpts) -> Option<Weighted> {
    let mut v = cands.to_vec();
    apply_penalties(&mut v, history, o);
    sort_desc(&mut v);
    if v.is_empty() {
        return None;
    }
    if o.temperature <= 0.0 {
        v.truncate(1);
        return Some((v, vec![1.0]));
    }
    if o.top_k > 0 {
        v.truncate(o.top_k);
    }
    let m = v[0].1 as f64;
    let mut p: Vec<f64> = v.iter().map(|c| (c.1 as f64 - m).exp()).collect();
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    if o.top_p < 1.0 {
        let mut acc = 0.0;
        let keep = p.iter().position(|&x| {
            acc += x;
            acc >= o.top_p as f64
        });
        let keep = keep.map_or(p.len(), |k| k + 1);
        v.truncate(keep);
        p.truncate(keep);
    }
    if o.min_p > 0.0 {
        let floor = p[0] * o.min_p as f64;
        let keep = p.iter().take_while(|&&x| x >= floor).count().max(1);
        v.truncate(keep);
    }
    // Temperature.
    let inv_t = 1.0 / o.temperature as f64;
    let w: Vec<f64> = v.iter().map(|c| ((c.1 as f64 - m) * inv_t).exp()).collect();
    Some((v, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Vec<(u32, f32)> {
        vec![(0, 1.0), (1, 3.0), (2, 2.0), (3, -1.0), (4, 3.0)]
    }

    #[test]
    fn greedy_takes_the_argmax_lowest_id_on_ties() {
        assert_eq!(sample(&row(), &[], 0, &SamplerOpts::greedy()), Some(1));
    }

    #[test]
    fn penalties_follow_llama_cpp() {
        let mut v = row();
        let o = SamplerOpts { repeat_penalty: 2.0, presence_penalty: 0.5, frequency_penalty: 0.25, ..SamplerOpts::greedy() };
        apply_penalties(&mut v, &[1, 1, 3], &o);
        assert_eq!(v[1].1, 3.0 / 2.0 - 2.0 * 0.25 - 0.5);
        assert_eq!(v[3].1, -2.0 - 0.25 - 0.5);
        assert_eq!(v[0].1, 1.0);
        assert_eq!(sample(&row(), &[1, 4], 0, &o), Some(2));
    }

    #[test]
    fn logprobs_are_a_log_softmax() {
        let lp = top_logprobs(&row(), 5);
        let s: f64 = lp.iter().map(|x| (x.1 as f64).exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(lp[0].0, 1);
        assert_eq!(lp[1].0, 4);
    }

    #[test]
    fn seeded_draws_reproduce_and_respect_top_k() {
        let o = SamplerOpts { temperature: 1.0, top_k: 2, top_p: 1.0, min_p: 0.0, seed: 7, ..Default::default() };
        let a: Vec<_> = (0..50).map(|p| sample(&row(), &[], p, &o)).collect();
        let b: Vec<_> = (0..50).map(|p| sample(&row(), &[], p, &o)).collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|x| matches!(x, Some(1) | Some(4))));
        assert!(a.contains(&Some(1)) && a.contains(&Some(4)));
    }

    #[test]
    fn check_refuses_nan_and_out_of_range_values() {
        assert!(SamplerOpts::default().check().is_ok() && SamplerOpts::greedy().check().is_ok());
        let ok = [
            SamplerOpts { temperature: 0.0, ..Default::default() },
            SamplerOpts { top_p: 1.0, min_p: 1.0, ..Default::default() },
            SamplerOpts { min_p: 0.0, repeat_penalty: 0.01, presence_penalty: -2.0, frequency_penalty: 2.0, ..Default::default() },
        ];
        for o in ok {
            assert!(o.check().is_ok(), "{o:?}");
        }
        let d = SamplerOpts::default;
        let bad = [
            (SamplerOpts { temperature: -1.0, ..d() }, "temperature", "-1"),
            (SamplerOpts { temperature: f32::NAN, ..d() }, "temperature", "NaN"),
            (SamplerOpts { temperature: f32::INFINITY, ..d() }, "temperature", "inf"),
            (SamplerOpts { top_p: 0.0, ..d() }, "top_p", "0"),
            (SamplerOpts { top_p: 1.5, ..d() }, "top_p", "1.5"),
            (SamplerOpts { top_p: f32::NAN, ..d() }, "top_p", "NaN"),
            (SamplerOpts { min_p: -0.1, ..d() }, "min_p", "-0.1"),
            (SamplerOpts { min_p: f32::NAN, ..d() }, "min_p", "NaN"),
            (SamplerOpts { repeat_penalty: 0.0, ..d() }, "repeat_penalty", "0"),
            (SamplerOpts { repeat_penalty: f32::NAN, ..d() }, "repeat_penalty", "NaN"),
            (SamplerOpts { presence_penalty: f32::NEG_INFINITY, ..d() }, "presence_penalty", "-inf"),
            (SamplerOpts { frequency_penalty: f32::NAN, ..d() }, "frequency_penalty", "NaN"),
        ];
        for (o, option, value) in bad {
            match o.check() {
                Err(EngineError::Sampler { option: got, value: v, .. }) => assert_eq!((got, v.as_str()), (option, value), "{o:?}"),
                other => panic!("{o:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let o = SamplerOpts { temperature: 1.0, top_k: 0, top_p: 0.5, min_p: 0.0, seed: 3, ..Default::default() };
        assert!((0..100).all(|p| matches!(sample(&row(), &[], p, &o), Some(1) | Some(4))));
        let o = SamplerOpts { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.5, seed: 3, ..Default::default() };
        assert!((0..100).all(|p| matches!(sample(&row(), &[], p, &o), Some(1) | Some(4))));
    }
}

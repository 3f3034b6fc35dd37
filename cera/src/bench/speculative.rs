//! `cera bench --spec-oracle`: the ceiling of speculative decoding's mechanism on any model,
//! synthetic weights included (whose own n-gram drafts are never right).
//!
//! A first pass decodes `n` tokens greedily (the plain decode speed). A second records the
//! continuation as verification steps choose it (every draft wrong, so each token comes from a
//! verification row): on a GPU those rows run other kernels than a decode step (the multi-row
//! GEMV, the prefill attention), which can settle a near-tie between the two best logits the
//! other way, so the oracle must propose what the verification rows will choose. Then an
//! oracle drafter proposes that continuation, each proposed token replaced by a wrong one with
//! probability `1 - p`, so the drafts are kept at a chosen rate. For each `k` (drafts a step,
//! no pacing) and each `p`: the decode speed, the measured acceptance (drafts kept over drafts
//! verified), tokens per step, the speed-up over plain decoding, and whether the output equals
//! plain decoding's token for token (`same_as_plain`; it always equals the recorded one).

use serde::Serialize;

use super::{BenchError, KernelShare, Spread, TG_PROMPT, mean_profile, prompt_ids, shares};
use crate::engine::{Drafter, Engine, GenerateOpts, Speculative};

/// One (k, p) cell of the table.
#[derive(Clone, Debug, Serialize)]
pub struct OracleRow {
    /// Drafts a step.
    pub k: usize,
    /// Probability that a proposed token is the right one (0: the plain decode row).
    pub p: f64,
    /// Decode tokens per second (median over the repetitions).
    pub tok_s: Spread,
    /// Drafts kept over drafts verified.
    pub acceptance: f64,
    /// Generated tokens per decode step.
    pub tokens_per_step: f64,
    /// Over plain decoding.
    pub speedup: f64,
    /// The output equals plain decoding's, token for token.
    pub same_as_plain: bool,
    /// Milliseconds a decode step (a verification step with drafts), from the median speed
    /// and the tokens per step.
    pub step_ms: f64,
    /// A step's time over a plain decode step's: what verifying `k` drafts costs in decode
    /// steps (the pacer's `VerifyCost`).
    pub step_cost: f64,
}

/// Proposes `truth` from the sequence's length on, each token wrong with probability `1 - p`.
struct Oracle {
    truth: Vec<u32>,
    p: f64,
    vocab: u32,
    rng: u64,
}

impl Drafter for Oracle {
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        let at = tokens.len().min(self.truth.len());
        let end = (at + max).min(self.truth.len());
        self.truth[at..end]
            .iter()
            .map(|&t| {
                self.rng = self.rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
                if u < self.p { t } else { (t + 1) % self.vocab }
            })
            .collect()
    }
}

/// One draft a step, one more than the last token: rarely what the model chooses, so the
/// tokens come from verification rows (a kept draft was the model's choice there as well).
struct Wrong(u32);

impl Drafter for Wrong {
    fn draft(&mut self, tokens: &[u32], max: usize) -> Vec<u32> {
        let last = tokens.last().copied().unwrap_or(0);
        vec![(last + 1) % self.0; max.min(1)]
    }
}

/// The table for `n` generated tokens at drafts `ks` and acceptance probabilities `ps`.
pub fn oracle(engine: &Engine, n: usize, ks: &[usize], ps: &[f64], reps: usize) -> Result<Vec<OracleRow>, BenchError> {
    let vocab = engine.config().vocab;
    let ids = prompt_ids(TG_PROMPT, vocab, 7);
    let opts = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(n + 1) };
    let mut s = engine.session()?;
    let mut plain = Vec::new();
    let mut plain_ids = Vec::new();
    for rep in 0..=reps {
        s.clear_cache()?;
        s.append_tokens(&ids)?;
        let g = s.generate(&opts, &mut |_: &crate::engine::TokenEvent| {})?;
        if rep > 0 {
            plain.push(g.timings.decode_tok_s());
        }
        plain_ids = g.ids;
    }
    // The continuation as verification rows choose it: one wrong draft a step.
    s.clear_cache()?;
    s.append_tokens(&ids)?;
    let one = GenerateOpts { speculative: Some(Speculative { draft_max: 1, draft_min: 1, adaptive: false, ..Default::default() }), ..opts.clone() };
    let verified = s.generate_drafted(&one, &mut |_: &crate::engine::TokenEvent| {}, &mut Wrong(vocab as u32))?.ids;
    let truth = [ids.clone(), verified].concat();
    let base = Spread::of(plain);
    let base_ms = 1000.0 / base.median.max(f64::MIN_POSITIVE);
    let mut rows = vec![OracleRow {
        k: 0,
        p: 0.0,
        tok_s: base,
        acceptance: 0.0,
        tokens_per_step: 1.0,
        speedup: 1.0,
        same_as_plain: true,
        step_ms: base_ms,
        step_cost: 1.0,
    }];
    for &k in ks {
        for &p in ps {
            let spec = GenerateOpts { speculative: Some(Speculative { draft_max: k, draft_min: 1, adaptive: false, ..Default::default() }), ..opts.clone() };
            let (mut speeds, mut kept, mut drafted, mut steps, mut tokens) = (Vec::new(), 0, 0, 0, 0);
            let mut same = true;
            for rep in 0..=reps {
                s.clear_cache()?;
                s.append_tokens(&ids)?;
                let mut o = Oracle { truth: truth.clone(), p, vocab: vocab as u32, rng: 0x5EED ^ rep as u64 };
                let g = s.generate_drafted(&spec, &mut |_: &crate::engine::TokenEvent| {}, &mut o)?;
                if g.ids[..] != truth[ids.len()..] {
                    return Err(BenchError::Usage(format!("speculative decoding (k {k}, p {p}): the output differs from the verification rows' own")));
                }
                same &= g.ids == plain_ids;
                if rep > 0 {
                    speeds.push(g.timings.decode_tok_s());
                    let t = g.timings;
                    (kept, drafted, steps, tokens) = (kept + t.accepted_tokens, drafted + t.draft_tokens, steps + t.decode_steps, tokens + t.decode_tokens);
                }
            }
            let tok_s = Spread::of(speeds);
            let tokens_per_step = tokens as f64 / steps.max(1) as f64;
            let step_ms = 1000.0 * tokens_per_step / tok_s.median.max(f64::MIN_POSITIVE);
            rows.push(OracleRow {
                k,
                p,
                speedup: tok_s.median / base.median.max(f64::MIN_POSITIVE),
                tok_s,
                acceptance: kept as f64 / drafted.max(1) as f64,
                tokens_per_step,
                same_as_plain: same,
                step_ms,
                step_cost: step_ms / base_ms,
            });
        }
    }
    Ok(rows)
}

/// The table as markdown.
pub fn print(model: &str, device: &str, n: usize, rows: &[OracleRow]) -> String {
    let mut t = format!("{model} on {device}: tg{n} with oracle drafts (greedy; output checked equal)\n\n");
    t += "| drafts a step | p (a draft right) | decode tok/s | acceptance | tokens per step | ms a step | in decode steps | speed-up | same ids as plain |\n|---|---|---|---|---|---|---|---|---|\n";
    for r in rows {
        if r.k == 0 {
            t += &format!("| off | - | {:.1} | - | 1.00 | {:.3} | 1.00 | 1.00x | - |\n", r.tok_s.median, r.step_ms);
        } else {
            let same = if r.same_as_plain { "yes" } else { "no" };
            t += &format!(
                "| {} | {:.2} | {:.1} | {:.2} | {:.2} | {:.3} | {:.2} | {:.2}x | {same} |\n",
                r.k, r.p, r.tok_s.median, r.acceptance, r.tokens_per_step, r.step_ms, r.step_cost, r.speedup
            );
        }
    }
    t
}

/// The GPU time of one step (`--spec-oracle ... --profile`): a decode step (`rows` 1, `k` 0) or a
/// verification step of `k` drafts (`rows` = `k + 1`), after the oracle's prompt.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyProfile {
    /// Drafts (0: the decode step).
    pub k: usize,
    /// GPU time of the step's dispatches (timestamps, mean of 5), milliseconds.
    pub gpu_ms: f64,
    /// Dispatches in the step.
    pub dispatches: usize,
    /// The top kernels (`us_per_token` is per step).
    pub kernels: Vec<KernelShare>,
}

/// Profiles a decode step and a verification step of each of `ks` drafts at the oracle's
/// prompt depth, listing the `top` kernels of each.
pub fn profile(engine: &Engine, ks: &[usize], top: usize) -> Result<Vec<VerifyProfile>, BenchError> {
    if !engine.is_gpu() {
        return Err(BenchError::Usage("--profile times the GPU's kernels: it needs a GPU run (not --device cpu)".into()));
    }
    let vocab = engine.config().vocab;
    let max_k = ks.iter().copied().max().unwrap_or(0);
    let ids = prompt_ids(TG_PROMPT + max_k + 1, vocab, 7);
    let mut s = engine.session()?;
    s.append_tokens(&ids)?;
    // The prompt runs (and one token is generated), so the profiled steps rerun cached tokens.
    s.generate(&GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(1) }, &mut |_: &crate::engine::TokenEvent| {})?;
    let summarize = |k: usize, runs: Vec<Vec<crate::engine::KernelTime>>| {
        let mean = mean_profile(runs);
        let ns: f64 = mean.iter().map(|t| t.ns).sum();
        VerifyProfile { k, gpu_ms: ns / 1e6, dispatches: mean.iter().map(|t| t.count).sum(), kernels: shares(&mean, 1.0, top) }
    };
    let decode = (0..5).map(|_| s.profile_step(1)).collect::<Result<Vec<_>, _>>()?;
    let mut out = vec![summarize(0, decode)];
    for &k in ks {
        s.profile_verify(k + 1)?;
        let runs = (0..5).map(|_| s.profile_verify(k + 1)).collect::<Result<Vec<_>, _>>()?;
        out.push(summarize(k, runs));
    }
    Ok(out)
}

/// The profiles as markdown: a step's GPU time against the decode step's, then the kernels.
pub fn print_profile(profiles: &[VerifyProfile]) -> String {
    use std::fmt::Write;
    let base = profiles.first().map_or(1.0, |p| p.gpu_ms.max(f64::MIN_POSITIVE));
    let mut s =
        String::from("\nGPU time of a step (timestamps around every dispatch)\n\n| step | GPU ms | in decode steps | dispatches |\n|---|---|---|---|\n");
    let name = |k: usize| if k == 0 { "decode".to_string() } else { format!("verify {k} drafts") };
    for p in profiles {
        let _ = writeln!(s, "| {} | {:.3} | {:.2} | {} |", name(p.k), p.gpu_ms, p.gpu_ms / base, p.dispatches);
    }
    for p in profiles {
        let _ = writeln!(s, "\n{}:\n\n| kernel | µs a step | dispatches | share |\n|---|---|---|---|", name(p.k));
        for k in &p.kernels {
            let _ = writeln!(s, "| {} | {:.1} | {} | {:.1}% |", k.kernel, k.us_per_token, k.dispatches, 100.0 * k.fraction);
        }
    }
    s
}

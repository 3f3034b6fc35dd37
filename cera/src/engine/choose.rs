//! Choosing a generation's tokens from step outputs ([`Chooser`]), and what each step reads
//! back for it.
//!
//! What a step asks the executor for ([`Want`]):
//! - greedy decoding without penalties and without `top_logprobs`: [`Want::Argmax`], and the next
//!   step's input is [`StepInput::LastArgmax`](super::backend::StepInput::LastArgmax) (on the GPU the id never leaves the device; 4
//!   bytes are read back to check the stop conditions). These steps are pipelined
//!   (`GenerateOpts::pipeline`): step t+1 is submitted before step t's id is read back, so stop
//!   conditions are seen one step late; the step run past a stop is collected and dropped, and
//!   its token is not added to the cached prefix;
//! - sampling with `1 <= top_k <= 128`, no penalties, no `top_logprobs`: [`Want::TopK`], and the
//!   CPU sampler draws from those candidates (the same draw as over the whole row: top-k comes
//!   first in the sampler's order);
//! - `ignore_eos`: the end-of-generation ids are masked out, never chosen: greedy masks them on
//!   the device before the argmax ([`BackendState::set_argmax_mask`](super::backend::BackendState::set_argmax_mask)), top-k sampling reads
//!   `top_k + n_eog` candidates;
//! - a constraint (`GenerateOpts::constraint`) on an executor that applies masks
//!   ([`BackendState::applies_step_bits`](super::backend::BackendState::applies_step_bits): the CPU and the GPU): each step's allowed-id mask goes
//!   with the step ([`BackendState::set_step_bits`](super::backend::BackendState::set_step_bits)) and the step reads back as above (greedy
//!   steps then wait for the token before, never pipelined);
//! - anything else (penalties, `top_k` 0 or over 128, `top_logprobs`, `logit_bias`): the whole
//!   [`Want::Logits`] row. `top_logprobs` are a log-softmax over the raw row, before penalties,
//!   the mask and every sampling transform.

use super::EngineError;
use super::backend::{MAX_TOP_K, StepOutput, Want};
use super::constraint::TokenConstraint;
use super::options::GenerateOpts;
use super::sampler::{self, SamplerOpts};

/// What each step asks the executor for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Argmax,
    TopK(usize),
    Logits,
}

impl Mode {
    fn want(self) -> Want {
        match self {
            Mode::Argmax => Want::Argmax,
            Mode::TopK(k) => Want::TopK(k),
            Mode::Logits => Want::Logits,
        }
    }
}

fn sampler_opts(o: &GenerateOpts) -> SamplerOpts {
    o.sampler.clone()
}

/// `device_bits`: a constraint's mask is applied on the device (it then needs no whole row).
fn mode(o: &GenerateOpts, s: &SamplerOpts, n_masked: usize, device_bits: bool) -> Mode {
    if o.top_logprobs > 0 || s.has_penalties() || (o.constraint.is_some() && !device_bits) || !o.logit_bias.is_empty() {
        return Mode::Logits;
    }
    if s.temperature <= 0.0 {
        return Mode::Argmax;
    }
    let k = o.sampler.top_k;
    if k >= 1 && k + n_masked <= MAX_TOP_K { Mode::TopK(k + n_masked) } else { Mode::Logits }
}

/// Descending logit, then ascending id: the sampler's order.
fn by_logit_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// `(id, logprob)` of the `n` most likely ids of a raw logits row (log-softmax in f64), most
/// likely first, ties to the lower id: [`sampler::top_logprobs`] without sorting the whole row.
pub fn row_top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let lse = row_logsumexp(logits);
    let mut v: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
    let n = n.min(v.len());
    if n == 0 {
        return Vec::new();
    }
    if n < v.len() {
        v.select_nth_unstable_by(n - 1, by_logit_desc);
        v.truncate(n);
    }
    v.sort_by(by_logit_desc);
    v.into_iter().map(|(i, l)| (i, (l as f64 - lse) as f32)).collect()
}

/// `log(sum(exp(logits)))` of a row, in f64: a logit minus it is its log-probability.
fn row_logsumexp(logits: &[f32]) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    m as f64 + logits.iter().map(|&l| ((l - m) as f64).exp()).sum::<f64>().ln()
}

/// The raw log-probabilities of one step: the chosen token's and the most likely ones (none
/// unless `top_logprobs` was asked for).
#[derive(Clone, Debug, Default)]
pub(crate) struct StepLogprobs {
    pub(crate) chosen: Option<f32>,
    pub(crate) top: Vec<(u32, f32)>,
}

/// Chooses tokens from step outputs under one generation's options.
pub(crate) struct Chooser {
    opts: GenerateOpts,
    sampler: SamplerOpts,
    /// The same without penalties (applied before the candidates are cut).
    plain: SamplerOpts,
    pub(super) masked: Vec<u32>,
    mode: Mode,
    pub(super) device: String,
    /// The generation's constraint, started at its first step.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The constraint's mask goes to the executor with each step, which applies it before its
    /// argmax or top-k ([`BatchEntry::mask`](super::batch::BatchEntry::mask)), so no logits row
    /// comes back: a constrained generation whose mode reads no whole row, on an executor that
    /// takes masks.
    pub(super) device_bits: bool,
    /// This step's mask ([`Self::prepare_step`]), or the constraint's error, which
    /// [`Self::choose`] reports.
    bits: Option<Result<Vec<u32>, String>>,
}

impl Chooser {
    /// The chooser of a generation under `opts` (`eog`: the model's end-of-generation ids, masked
    /// with `ignore_eos`). `device_mask`: whether the executor masks argmax ids itself
    /// ([`BackendState::set_argmax_mask`](super::backend::BackendState::set_argmax_mask)); a batched step does not, so a masked greedy
    /// generation reads the top `1 + masked` candidates instead. `device_bits`: whether the
    /// executor applies a constraint's allowed-id mask itself (a batched step does: greedy and
    /// top-k sampling under a constraint then read back an id or candidates, not the row).
    pub(crate) fn new(opts: &GenerateOpts, eog: &[u32], device: String, device_mask: bool, device_bits: bool) -> Chooser {
        let sampler = sampler_opts(opts);
        let plain = SamplerOpts { repeat_penalty: 1.0, presence_penalty: 0.0, frequency_penalty: 0.0, ..sampler.clone() };
        let masked: Vec<u32> = if opts.ignore_eos { eog.to_vec() } else { Vec::new() };
        let bits_ok = device_bits && opts.constraint.is_some();
        let mut mode = mode(opts, &sampler, masked.len(), bits_ok);
        if mode == Mode::Argmax && !device_mask && !masked.is_empty() {
            mode = if masked.len() < MAX_TOP_K { Mode::TopK(1 + masked.len()) } else { Mode::Logits };
        }
        let device_bits = bits_ok && mode != Mode::Logits;
        Chooser { opts: opts.clone(), sampler, plain, masked, mode, device, constraint: None, device_bits, bits: None }
    }

    /// Before a step that chooses a token: the constraint's mask for it, kept for
    /// [`Self::step_bits`] and [`Self::choose`] (nothing without a mask on the device).
    pub(crate) fn prepare_step(&mut self, vocab: usize) {
        if self.device_bits {
            // The mask sized to the vocabulary (a mask source may cover ids past it, or fewer:
            // those are not allowed).
            let words = vocab.div_ceil(32);
            self.bits = Some(match self.constraint_mask(vocab) {
                Ok(m) => Ok(m.map_or_else(
                    || vec![u32::MAX; words],
                    |mut m| {
                        m.resize(words, 0);
                        m
                    },
                )),
                Err(e) => Err(e.to_string()),
            });
        }
    }

    /// The mask [`Self::prepare_step`] made for this step (`None`: no mask on the device, or
    /// the constraint failed, which [`Self::choose`] reports).
    pub(crate) fn step_bits(&self) -> Option<&[u32]> {
        match &self.bits {
            Some(Ok(m)) => Some(m),
            _ => None,
        }
    }

    /// Whether the generation's constraint is complete (it ends with [`FinishReason::Stop`]).
    pub(crate) fn constraint_finished(&self) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.is_finished())
    }

    /// The constraint's allowed-id mask for this step (started at the first), if there is one.
    fn constraint_mask(&mut self, vocab: usize) -> Result<Option<Vec<u32>>, EngineError> {
        let Some(factory) = &self.opts.constraint else { return Ok(None) };
        if self.constraint.is_none() {
            self.constraint = Some(factory.start().map_err(|e| EngineError::Usage(format!("the output constraint: {e}")))?);
        }
        let c = self.constraint.as_mut().map(|c| c.allowed(vocab));
        match c {
            Some(Ok(m)) => Ok(Some(m.to_vec())),
            Some(Err(e)) => Err(EngineError::Usage(format!("the output constraint: {e}"))),
            None => Ok(None),
        }
    }

    /// What each step asks the executor for.
    pub(crate) fn want(&self) -> Want {
        self.mode.want()
    }

    /// Greedy with the id left on the device (pipelining and `LastArgmax` possible).
    pub(super) fn is_argmax(&self) -> bool {
        self.mode == Mode::Argmax
    }

    fn unexpected(&self, out: &StepOutput) -> EngineError {
        let got = match out {
            StepOutput::Nothing => "nothing",
            StepOutput::Argmax(_) => "an argmax",
            StepOutput::TopK(_) => "top-k candidates",
            StepOutput::Logits(_) => "logits",
            StepOutput::Rows(_) => "several rows' outputs",
        };
        EngineError::Device { device: self.device.clone(), reason: format!("the executor returned {got} for {:?}", self.mode.want()) }
    }

    fn keep(&self, id: u32) -> bool {
        self.masked.binary_search(&id).is_err()
    }

    /// The next id and the raw log-probabilities (if asked for) for the token at `position`.
    pub(crate) fn choose(&mut self, out: StepOutput, history: &[u32], position: u64) -> Result<(u32, StepLogprobs), EngineError> {
        let chosen = self.choose_unconstrained(out, history, position)?;
        if let Some(c) = self.constraint.as_mut() {
            c.accept(chosen.0).map_err(|e| EngineError::Usage(format!("the output constraint: {e}")))?;
        }
        Ok(chosen)
    }

    /// Whether a speculative draft can be verified against this generation's steps: greedy, or
    /// sampling from top-k candidates (no constraint, no whole-row needs).
    pub(crate) fn drafts(&self) -> bool {
        matches!(self.mode, Mode::Argmax | Mode::TopK(_)) && self.constraint.is_none() && self.opts.constraint.is_none()
    }

    /// [`Self::choose`] for a row that verifies the speculative draft `draft`: greedy takes the
    /// argmax (the draft is kept when they agree); sampling keeps the draft with its probability
    /// and otherwise draws from the rest ([`sampler::sample_with_draft`]), so each token's
    /// probability is what [`Self::choose`] gives it.
    pub(crate) fn choose_draft(&mut self, out: StepOutput, history: &[u32], position: u64, draft: u32) -> Result<u32, EngineError> {
        let none = || EngineError::Usage("every token is masked: nothing can be generated".into());
        match (self.mode, out) {
            (Mode::Argmax, StepOutput::Argmax(id)) => Ok(id),
            (Mode::TopK(_), StepOutput::TopK(c)) => {
                let mut c: Vec<(u32, f32)> = c.into_iter().filter(|&(id, _)| self.keep(id)).collect();
                if self.sampler.temperature <= 0.0 {
                    return c.iter().copied().min_by(by_logit_desc).map(|x| x.0).ok_or_else(none);
                }
                c.sort_by(by_logit_desc);
                c.truncate(self.opts.sampler.top_k);
                sampler::sample_with_draft(&c, history, position, &self.plain, draft).ok_or_else(none)
            }
            (_, out) => Err(self.unexpected(&out)),
        }
    }

    fn choose_unconstrained(&mut self, out: StepOutput, history: &[u32], position: u64) -> Result<(u32, StepLogprobs), EngineError> {
        let none = || EngineError::Usage("every token is masked: nothing can be generated".into());
        // The device applied this step's mask: a masked id can still come back where the
        // constraint allows fewer ids than were asked for (at -f32::MAX), never chosen.
        let bits = match self.bits.take() {
            Some(Err(e)) => return Err(EngineError::Usage(format!("the output constraint: {e}"))),
            Some(Ok(m)) => Some(m),
            None if self.device_bits => return Err(EngineError::Usage("a constrained step without its mask".into())),
            None => None,
        };
        let allowed = |id: u32| bits.as_ref().is_none_or(|m| super::constraint::allows(m, id));
        let masked_out = || EngineError::Usage("the output constraint allows no token at this step".into());
        match (self.mode, out) {
            (Mode::Argmax, StepOutput::Argmax(id)) => {
                if !allowed(id) {
                    return Err(masked_out());
                }
                Ok((id, StepLogprobs::default()))
            }
            (Mode::TopK(_), StepOutput::TopK(c)) => {
                let mut c: Vec<(u32, f32)> = c.into_iter().filter(|&(id, _)| self.keep(id) && allowed(id)).collect();
                if c.is_empty() && bits.is_some() {
                    return Err(masked_out());
                }
                if self.sampler.temperature <= 0.0 {
                    return c.iter().copied().min_by(by_logit_desc).map(|x| (x.0, StepLogprobs::default())).ok_or_else(none);
                }
                c.sort_by(by_logit_desc);
                c.truncate(self.opts.sampler.top_k);
                sampler::sample(&c, history, position, &self.plain).map(|id| (id, StepLogprobs::default())).ok_or_else(none)
            }
            (Mode::Logits, StepOutput::Logits(row)) => {
                let mask = self.constraint_mask(row.len())?;
                let lp = |id: u32| -> StepLogprobs {
                    if self.opts.top_logprobs == 0 {
                        return StepLogprobs::default();
                    }
                    let chosen = row.get(id as usize).map(|&l| (l as f64 - row_logsumexp(&row)) as f32);
                    StepLogprobs { chosen, top: row_top_logprobs(&row, self.opts.top_logprobs) }
                };
                let allowed = |id: u32| mask.as_ref().is_none_or(|m| super::constraint::allows(m, id));
                if let Some(&(id, _)) = self.opts.logit_bias.iter().find(|&&(id, _)| id as usize >= row.len()) {
                    return Err(EngineError::TokenOutOfRange { id, vocab: row.len() });
                }
                // The biased logits choose; the raw row gives the log-probabilities.
                let biased_row;
                let choose_from: &[f32] = if self.opts.logit_bias.is_empty() {
                    &row
                } else {
                    let mut b = row.clone();
                    for &(id, v) in &self.opts.logit_bias {
                        b[id as usize] += v;
                    }
                    biased_row = b;
                    &biased_row
                };
                let mut c: Vec<(u32, f32)> =
                    choose_from.iter().enumerate().map(|(i, &l)| (i as u32, l)).filter(|&(id, _)| self.keep(id) && allowed(id)).collect();
                if c.is_empty() && mask.is_some() {
                    return Err(EngineError::Usage("the output constraint allows no token at this step".into()));
                }
                sampler::apply_penalties(&mut c, history, &self.sampler);
                if self.sampler.temperature <= 0.0 {
                    return c.iter().copied().min_by(by_logit_desc).map(|x| (x.0, lp(x.0))).ok_or_else(none);
                }
                let k = self.opts.sampler.top_k;
                if k > 0 && k < c.len() {
                    c.select_nth_unstable_by(k - 1, by_logit_desc);
                    c.truncate(k);
                }
                sampler::sample(&c, history, position, &self.plain).map(|id| (id, lp(id))).ok_or_else(none)
            }
            (_, out) => Err(self.unexpected(&out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_the_options() {
        let g = GenerateOpts::greedy(8);
        let s = sampler_opts(&g);
        assert_eq!(mode(&g, &s, 0, false), Mode::Argmax);
        assert_eq!(mode(&g, &s, 3, false), Mode::Argmax);
        let t = GenerateOpts { top_logprobs: 5, ..GenerateOpts::greedy(8) };
        assert_eq!(mode(&t, &sampler_opts(&t), 0, false), Mode::Logits);
        let d = GenerateOpts::default();
        assert_eq!(mode(&d, &sampler_opts(&d), 0, false), Mode::TopK(40));
        assert_eq!(mode(&d, &sampler_opts(&d), 3, false), Mode::TopK(43));
        let p = GenerateOpts { sampler: SamplerOpts { repeat_penalty: 1.1, ..SamplerOpts::default() }, ..GenerateOpts::default() };
        assert_eq!(mode(&p, &sampler_opts(&p), 0, false), Mode::Logits);
        let all = GenerateOpts { sampler: SamplerOpts { top_k: 0, ..SamplerOpts::default() }, ..GenerateOpts::default() };
        assert_eq!(mode(&all, &sampler_opts(&all), 0, false), Mode::Logits);
        let wide = GenerateOpts { sampler: SamplerOpts { top_k: 127, ..SamplerOpts::default() }, ..GenerateOpts::default() };
        assert_eq!(mode(&wide, &sampler_opts(&wide), 2, false), Mode::Logits);
        // A constraint reads whole rows unless the executor applies its mask.
        let c = GenerateOpts { constraint: Some(crate::engine::Constraint::new(|| Err("unused".into()))), ..GenerateOpts::greedy(8) };
        assert_eq!(mode(&c, &sampler_opts(&c), 0, false), Mode::Logits);
        assert_eq!(mode(&c, &sampler_opts(&c), 0, true), Mode::Argmax);
        let cs = GenerateOpts { constraint: c.constraint.clone(), ..GenerateOpts::default() };
        assert_eq!(mode(&cs, &sampler_opts(&cs), 0, true), Mode::TopK(40));
        let cl = GenerateOpts { top_logprobs: 2, ..cs.clone() };
        assert_eq!(mode(&cl, &sampler_opts(&cl), 0, true), Mode::Logits);
    }

    #[test]
    fn row_top_logprobs_equal_the_sampler_s() {
        let row: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1009) as f32 / 100.0 - 3.0).collect();
        let cands: Vec<(u32, f32)> = row.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        assert_eq!(row_top_logprobs(&row, 7), sampler::top_logprobs(&cands, 7));
        assert_eq!(row_top_logprobs(&row[..3], 7).len(), 3);
    }
}

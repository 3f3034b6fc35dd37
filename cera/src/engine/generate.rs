//! The generation loop of a [`Session`]: prefix reuse, chunked prefill, what each step reads
//! back, sampling, stop conditions and streaming text.
//!
//! What a step asks the executor for ([`Want`]):
//! - greedy decoding without penalties and without `top_logprobs`: [`Want::Argmax`], and the next
//!   step's input is [`StepInput::LastArgmax`] (on the GPU the id never leaves the device; 4
//!   bytes are read back to check the stop conditions). These steps are pipelined
//!   (`GenerateOpts::pipeline`): step t+1 is submitted before step t's id is read back, so stop
//!   conditions are seen one step late; the step run past a stop is collected and dropped, and
//!   its token is not added to the cached prefix;
//! - sampling with `1 <= top_k <= 128`, no penalties, no `top_logprobs`: [`Want::TopK`], and the
//!   CPU sampler draws from those candidates (the same draw as over the whole row: top-k comes
//!   first in the sampler's order);
//! - `ignore_eos`: the end-of-generation ids are masked out, never chosen: greedy masks them on
//!   the device before the argmax ([`BackendState::set_argmax_mask`]), top-k sampling reads
//!   `top_k + n_eog` candidates;
//! - a constraint (`GenerateOpts::constraint`) on an executor that applies masks
//!   ([`BackendState::applies_step_bits`]: the CPU and the GPU): each step's allowed-id mask goes
//!   with the step ([`BackendState::set_step_bits`]) and the step reads back as above (greedy
//!   steps then wait for the token before, never pipelined);
//! - anything else (penalties, `top_k` 0 or over 128, `top_logprobs`, `logit_bias`): the whole
//!   [`Want::Logits`] row. `top_logprobs` are a log-softmax over the raw row, before penalties,
//!   the mask and every sampling transform.

use std::ops::DerefMut;
use std::time::{Duration, Instant};

use crate::tokenizer::{DecodeOptions, StreamDecoder};

use super::EngineError;
use super::backend::{BackendState, MAX_TOP_K, StepInput, StepOutput, Want};
use super::constraint::TokenConstraint;
use super::options::{FinishReason, GenerateOpts};
use super::sampler::{self, SamplerOpts};
use super::session::Session;
use super::speculative::{Drafter, NgramDrafter};
use super::stop::StopMatcher;

/// One generated token, as [`Session::generate`] streams it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenEvent<'a> {
    /// The token id.
    pub id: u32,
    /// The text that became safe to show with this token: possibly empty (part of a UTF-8
    /// character, or text held back because it may start a stop string), possibly including
    /// text of earlier tokens that was held back. Never half a character, never part of a stop
    /// string.
    pub text: &'a str,
    /// The token's own log-probability under the raw distribution (`Some` when `top_logprobs`
    /// was asked for).
    pub logprob: Option<f32>,
    /// The `top_logprobs` most likely ids at this step with their log-probabilities under the
    /// raw distribution (empty unless asked for).
    pub top_logprobs: &'a [(u32, f32)],
}

/// Receives the generated tokens. Implemented for every `FnMut(&TokenEvent)` closure.
///
/// Events come in token order, one per generated token. A token whose text is held back at the
/// time (a possible start of a stop string, an unfinished UTF-8 character) is delivered when the
/// next token is chosen or when generation ends, so that the text released by the end of the
/// generation reaches the sink with the last event. To stop early from the sink (a closed
/// output), cancel through the session's [`CancelToken`](super::CancelToken).
pub trait Sink {
    /// One generated token.
    fn token(&mut self, ev: &TokenEvent<'_>);
}

impl<F: FnMut(&TokenEvent<'_>)> Sink for F {
    fn token(&mut self, ev: &TokenEvent<'_>) {
        self(ev)
    }
}

/// Where the time of one generation went (loading the model not included).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timings {
    /// Running the prompt tokens that were not cached, through the first token's distribution.
    pub prefill: Duration,
    /// Tokens run in the prefill.
    pub prefill_tokens: usize,
    /// After the first token: decode steps, sampling and streaming.
    pub decode: Duration,
    /// Decode steps run (each generated token but the last, and the first, is run once; with
    /// speculative decoding a step may give several tokens).
    pub decode_steps: usize,
    /// Generated tokens run by the decode steps (equal to `decode_steps` without speculative
    /// decoding); the decode speed counts these.
    pub decode_tokens: usize,
    /// Speculative draft tokens verified.
    pub draft_tokens: usize,
    /// Of those, the ones kept (the model's own choice agreed).
    pub accepted_tokens: usize,
}

fn rate(n: usize, d: Duration) -> f64 {
    if n == 0 || d.is_zero() { 0.0 } else { n as f64 / d.as_secs_f64() }
}

impl Timings {
    /// Prefill speed in tokens per second (0 when nothing was prefilled).
    pub fn prefill_tok_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill)
    }

    /// Decode speed in tokens per second (0 without decode steps).
    pub fn decode_tok_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode)
    }
}

/// The result of [`Session::generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated ids (without the end-of-generation or stop token that ended it; a stop
    /// string's tokens are included).
    pub ids: Vec<u32>,
    /// The generated text (stop strings and what follows them cut off).
    pub text: String,
    /// Why generation ended.
    pub finish: FinishReason,
    /// The end-of-generation or stop token that ended generation (it is in the session's
    /// sequence, not in `ids`).
    pub stop_token: Option<u32>,
    /// Per generated token: the `top_logprobs` most likely ids with their log-probabilities
    /// (empty unless asked for).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// Per generated token: its own log-probability under the raw distribution (empty unless
    /// `top_logprobs` was asked for).
    pub logprobs: Vec<f32>,
    /// Tokens of the sequence before generation (the prompt, all turns).
    pub prompt_tokens: usize,
    /// Of those, tokens whose cached keys and values were reused.
    pub reused: usize,
    /// Tokens run in the prefill (`prompt_tokens - reused`, or 1 when everything was cached: the
    /// last token is run again for its distribution).
    pub prefilled: usize,
    /// Timings.
    pub timings: Timings,
}

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
    masked: Vec<u32>,
    mode: Mode,
    device: String,
    /// The generation's constraint, started at its first step.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The constraint's mask goes to the executor with each step, which applies it before its
    /// argmax or top-k ([`BatchEntry::mask`](super::batch::BatchEntry::mask)), so no logits row
    /// comes back: a constrained generation whose mode reads no whole row, on an executor that
    /// takes masks.
    device_bits: bool,
    /// This step's mask ([`Self::prepare_step`]), or the constraint's error, which
    /// [`Self::choose`] reports.
    bits: Option<Result<Vec<u32>, String>>,
}

impl Chooser {
    /// The chooser of a generation under `opts` (`eog`: the model's end-of-generation ids, masked
    /// with `ignore_eos`). `device_mask`: whether the executor masks argmax ids itself
    /// ([`BackendState::set_argmax_mask`]); a batched step does not, so a masked greedy
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
    fn is_argmax(&self) -> bool {
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

/// Before a step that chooses a token: the constraint's mask for it, to the executor when it
/// applies masks itself ([`Chooser::prepare_step`]; nothing otherwise).
fn set_bits(state: &mut dyn BackendState, chooser: &mut Chooser, vocab: usize) -> Result<(), EngineError> {
    chooser.prepare_step(vocab);
    match chooser.step_bits() {
        Some(bits) => state.set_step_bits(bits),
        None => Ok(()),
    }
}

/// Streams text: detokenizes, holds back possible stop strings, and delivers events. Its text
/// buffers are reused from token to token (a step allocates nothing here).
pub(crate) struct Stream<'t, K: DerefMut<Target: Sink>> {
    decoder: StreamDecoder<'t>,
    matcher: StopMatcher,
    /// A token's event, held while its text (`held_text`) may still be extended by the end of
    /// the generation.
    held: Option<(u32, StepLogprobs)>,
    held_text: String,
    /// The current token's decoded piece and the text it makes safe to show.
    piece: String,
    emit: String,
    pub(crate) text: String,
    pub(crate) sink: K,
}

/// Appends an event's text to the generation's and hands the event to the sink.
fn deliver<S: Sink + ?Sized>(all: &mut String, sink: &mut S, id: u32, text: &str, lp: &StepLogprobs) {
    all.push_str(text);
    sink.token(&TokenEvent { id, text, logprob: lp.chosen, top_logprobs: &lp.top });
}

impl<'t, K: DerefMut<Target: Sink>> Stream<'t, K> {
    pub(crate) fn new(decoder: StreamDecoder<'t>, matcher: StopMatcher, text: String, sink: K) -> Self {
        Stream { decoder, matcher, held: None, held_text: String::new(), piece: String::new(), emit: String::new(), text, sink }
    }

    /// Appends the text still held back at the end to `out`: an unfinished character (as
    /// U+FFFD) and an unfinished stop-string prefix.
    fn release(decoder: &mut StreamDecoder<'_>, matcher: &mut StopMatcher, scratch: &mut String, out: &mut String) {
        scratch.clear();
        decoder.finish_into(scratch);
        if !matcher.push_into(scratch, out) {
            matcher.finish_into(out);
        }
    }

    /// A generated token; `last`: generation ends after it. Returns whether a stop string was
    /// completed (generation ends).
    pub(crate) fn token(&mut self, id: u32, top: StepLogprobs, last: bool) -> Result<bool, EngineError> {
        self.piece.clear();
        self.decoder.push_into(id, &mut self.piece)?;
        self.emit.clear();
        let stopped = self.matcher.push_into(&self.piece, &mut self.emit);
        if let Some((hid, htop)) = self.held.take() {
            deliver(&mut self.text, &mut *self.sink, hid, &self.held_text, &htop);
        }
        if stopped {
            deliver(&mut self.text, &mut *self.sink, id, &self.emit, &top);
            return Ok(true);
        }
        if last {
            Self::release(&mut self.decoder, &mut self.matcher, &mut self.piece, &mut self.emit);
            deliver(&mut self.text, &mut *self.sink, id, &self.emit, &top);
        } else if !self.matcher.held().is_empty() || !self.decoder.pending_bytes().is_empty() {
            std::mem::swap(&mut self.held_text, &mut self.emit);
            self.held = Some((id, top));
        } else {
            deliver(&mut self.text, &mut *self.sink, id, &self.emit, &top);
        }
        Ok(false)
    }

    /// Generation ended for a reason other than the last token itself.
    pub(crate) fn end(&mut self) {
        self.emit.clear();
        Self::release(&mut self.decoder, &mut self.matcher, &mut self.piece, &mut self.emit);
        if let Some((hid, htop)) = self.held.take() {
            self.held_text.push_str(&self.emit);
            deliver(&mut self.text, &mut *self.sink, hid, &self.held_text, &htop);
        }
    }
}

/// Bytes of the generation's text reserved per token it may generate (at most
/// [`TEXT_RESERVE_MAX`] in all); past that the text grows by doubling, a handful of
/// allocations in a whole generation.
pub(crate) const TEXT_RESERVE_PER_TOKEN: usize = 16;
pub(crate) const TEXT_RESERVE_MAX: usize = 64 << 10;

/// Collects and drops the outstanding steps (after an error or a stop seen one step late).
/// What a chosen token is recorded into ([`Session::take`]).
pub(crate) struct Taken<'a, 't, K: DerefMut<Target: Sink>> {
    pub(crate) opts: &'a GenerateOpts,
    pub(crate) res: &'a mut Generation,
    pub(crate) stream: &'a mut Stream<'t, K>,
    pub(crate) chooser: &'a mut Chooser,
    pub(crate) eog: &'a [u32],
    pub(crate) vocab: usize,
    pub(crate) n_ctx: usize,
}

impl Session {
    /// Records the chosen token `id`: it joins the sequence, the result and the stream. Returns
    /// why generation ends with it, if it does (an end-of-generation or stop token, a finished
    /// constraint, max tokens, a full context, a stop string, a cancellation).
    pub(crate) fn take<K: DerefMut<Target: Sink>>(
        &mut self,
        t: &mut Taken<'_, '_, K>,
        id: u32,
        top: StepLogprobs,
    ) -> Result<Option<FinishReason>, EngineError> {
        let (opts, res) = (t.opts, &mut *t.res);
        if (id as usize) >= t.vocab {
            return Err(EngineError::Device { device: t.chooser.device.clone(), reason: format!("the executor chose id {id} outside the vocabulary") });
        }
        self.seq.push(id);
        if (!opts.ignore_eos && t.eog.binary_search(&id).is_ok()) || opts.stop_tokens.contains(&id) {
            res.stop_token = Some(id);
            t.stream.end();
            return Ok(Some(FinishReason::Stop));
        }
        res.ids.push(id);
        if opts.top_logprobs > 0 {
            res.top_logprobs.push(top.top.clone());
            res.logprobs.push(top.chosen.unwrap_or(f32::NAN));
        }
        let finish = if t.chooser.constraint_finished() {
            Some(FinishReason::Stop)
        } else if res.ids.len() >= opts.max_tokens {
            Some(FinishReason::MaxTokens)
        } else if self.seq.len() >= t.n_ctx {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        if t.stream.token(id, top, finish.is_some())? {
            return Ok(Some(FinishReason::Stop));
        }
        if finish.is_some() {
            return Ok(finish);
        }
        if self.cancel.is_cancelled() {
            t.stream.end();
            return Ok(Some(FinishReason::Cancelled));
        }
        Ok(None)
    }
}

fn drain(state: &mut dyn BackendState) {
    while state.in_flight() > 0 {
        if state.collect().is_err() {
            break;
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session {
    /// Generates from the session's sequence, streaming each token to `sink`, and appends the
    /// generated tokens to the sequence.
    ///
    /// The cached positions whose tokens match the sequence are kept, the rest of the sequence
    /// is run in chunks of the engine's ubatch (when everything is cached, the last token is run
    /// again for its distribution). A sequence longer than the context is
    /// [`EngineError::ContextOverflow`] before anything runs; it is never truncated.
    ///
    /// Ends with [`FinishReason::Stop`] at an end-of-generation token (unless
    /// `opts.ignore_eos`), a stop token or a stop string; [`FinishReason::MaxTokens`] after
    /// `opts.max_tokens` tokens (0: the prompt is only run into the cache);
    /// [`FinishReason::ContextFull`] when the sequence fills the context;
    /// [`FinishReason::Cancelled`] when the [`CancelToken`](super::CancelToken) was triggered.
    /// The same options (seed included) on the same device give the same output. Options out of
    /// their ranges ([`GenerateOpts::check`]) are [`EngineError::Sampler`] before anything runs.
    pub fn generate<S: Sink + ?Sized>(&mut self, opts: &GenerateOpts, sink: &mut S) -> Result<Generation, EngineError> {
        if opts.speculative.is_some_and(|s| s.source == super::DraftSource::Model) {
            return Err(EngineError::Usage("speculative drafts from a draft model: a session takes them through generate_drafted with a ModelDrafter".into()));
        }
        let mut ngram = opts.speculative.map(|s| NgramDrafter { ngram: s.ngram });
        self.run_generation(opts, sink, ngram.as_mut().map(|d| d as &mut dyn Drafter))
    }

    /// [`Self::generate`] with speculative decoding from `drafter`'s proposals (a draft model,
    /// a lookup table of your own) instead of the n-gram lookup, under `opts.speculative`'s
    /// limits and pacing (its defaults when `None`; its `ngram` is unused). Whatever the drafter
    /// proposes, greedy output is the same as without it: every draft is verified by the model.
    /// Generations that cannot verify drafts (penalties, `top_logprobs`, constraints,
    /// `logit_bias`) decode as [`Self::generate`] does, without asking the drafter.
    pub fn generate_drafted<S: Sink + ?Sized>(&mut self, opts: &GenerateOpts, sink: &mut S, drafter: &mut dyn Drafter) -> Result<Generation, EngineError> {
        let opts = GenerateOpts { speculative: Some(opts.speculative.unwrap_or_default()), ..opts.clone() };
        self.run_generation(&opts, sink, Some(drafter))
    }

    fn run_generation<S: Sink + ?Sized>(&mut self, opts: &GenerateOpts, sink: &mut S, drafter: Option<&mut dyn Drafter>) -> Result<Generation, EngineError> {
        opts.check()?;
        let start = Instant::now();
        self.cancel.clear();
        let engine = self.engine.clone();
        let inner = &engine.inner;
        let (n_ctx, ubatch) = (inner.state.n_ctx, inner.state.ubatch);
        let prompt_tokens = self.seq.len();
        if prompt_tokens > n_ctx {
            return Err(EngineError::ContextOverflow { tokens: prompt_tokens, n_ctx });
        }
        if prompt_tokens == 0 {
            return Err(EngineError::Usage("the session has no tokens to generate from (append a prompt first)".into()));
        }
        let mut chooser = Chooser::new(opts, &inner.eog, inner.backend.device_name(), true, self.state.applies_step_bits());
        let mut res = Generation {
            ids: Vec::new(),
            text: String::new(),
            finish: FinishReason::MaxTokens,
            stop_token: None,
            top_logprobs: Vec::new(),
            logprobs: Vec::new(),
            prompt_tokens,
            reused: 0,
            prefilled: 0,
            timings: Timings::default(),
        };
        if prompt_tokens == n_ctx && opts.max_tokens > 0 {
            res.finish = FinishReason::ContextFull;
            return Ok(res);
        }

        // Prefix reuse, then the prefill.
        let mut reused = common_prefix(&self.cached, &self.seq);
        if reused == prompt_tokens && opts.max_tokens > 0 {
            reused -= 1;
        }
        // Recurrent state (LFM2's conv rings) reaches back a bounded window: further back, the
        // sequence runs again from 0.
        if reused > 0 && reused < self.state.resume_floor() {
            reused = 0;
        }
        if reused == 0 && !self.cached.is_empty() {
            self.state.reset()?;
        }
        self.cached.truncate(reused);
        res.reused = reused;
        let mut first_out = StepOutput::Nothing;
        let first_want = if opts.max_tokens == 0 { Want::Nothing } else { chooser.want() };
        self.state.set_argmax_mask(if chooser.is_argmax() { &chooser.masked } else { &[] })?;
        // Speculative decoding runs its own steps (never pipelined).
        let spec = opts.speculative.filter(|_| chooser.drafts()).zip(drafter);
        // A constraint's mask depends on the token before: a constrained step waits for it.
        let pipelined = opts.pipeline && chooser.is_argmax() && spec.is_none() && !chooser.device_bits;
        let vocab = inner.config.vocab;
        if spec.is_some() {
            // Counted in the prefill: the first token waits for it as it does for the prompt.
            self.state.prepare_verify()?;
        }
        // Whether the step running the `nth` generated token (1-based) at `pos` can be needed:
        // that token does not end the generation by the token or context limit.
        let may_run = |nth: usize, pos: usize| nth < opts.max_tokens && pos + 1 < n_ctx;
        let mut pos = reused;
        while pos < prompt_tokens {
            if self.cancel.is_cancelled() {
                res.finish = FinishReason::Cancelled;
                res.timings.prefill = start.elapsed();
                return Ok(res);
            }
            let end = (pos + ubatch).min(prompt_tokens);
            let want = if end == prompt_tokens { first_want } else { Want::Nothing };
            if want != Want::Nothing {
                set_bits(self.state.as_mut(), &mut chooser, vocab)?;
            }
            self.state.submit(StepInput::Tokens(&self.seq[pos..end]), pos, want)?;
            // The first generated token's step, submitted before the prompt's argmax is read.
            if end == prompt_tokens && pipelined && may_run(1, end) {
                if let Err(e) = self.state.submit(StepInput::LastArgmax, end, Want::Argmax) {
                    drain(self.state.as_mut());
                    return Err(e);
                }
            }
            let out = match self.state.collect() {
                Ok(o) => o,
                Err(e) => {
                    drain(self.state.as_mut());
                    return Err(e);
                }
            };
            self.cached.extend_from_slice(&self.seq[pos..end]);
            res.prefilled += end - pos;
            pos = end;
            if pos == prompt_tokens {
                first_out = out;
            }
        }
        res.timings.prefill = start.elapsed();
        res.timings.prefill_tokens = res.prefilled;
        if opts.max_tokens == 0 {
            return Ok(res);
        }

        // Decoding. What grows by a token a step is reserved for every token that can come, so
        // that a step allocates nothing.
        let decode_start = Instant::now();
        let room = opts.max_tokens.min(n_ctx - self.seq.len()) + 1;
        res.ids.reserve(room);
        self.seq.reserve(room);
        self.cached.reserve((self.seq.len() + room).saturating_sub(self.cached.len()));
        let tok = &inner.tokenizer;
        let text = String::with_capacity((room * TEXT_RESERVE_PER_TOKEN).min(TEXT_RESERVE_MAX));
        let decoder = StreamDecoder::with_options(tok, DecodeOptions { render_special: false, strip_space_prefix: false });
        let mut stream = Stream::new(decoder, StopMatcher::new(&opts.stop), text, sink);
        let mut out = first_out;
        let result = if let Some((spec, drafter)) = spec {
            let t = Taken { opts, res: &mut res, stream: &mut stream, chooser: &mut chooser, eog: &inner.eog, vocab: inner.config.vocab, n_ctx };
            self.decode_speculative(t, spec, drafter, out)
        } else {
            loop {
                let position = self.seq.len();
                let (id, top) = match chooser.choose(std::mem::replace(&mut out, StepOutput::Nothing), &self.seq, position as u64) {
                    Ok(x) => x,
                    Err(e) => break Err(e),
                };
                let mut t = Taken { opts, res: &mut res, stream: &mut stream, chooser: &mut chooser, eog: &inner.eog, vocab: inner.config.vocab, n_ctx };
                match self.take(&mut t, id, top) {
                    Ok(Some(f)) => break Ok(f),
                    Ok(None) => {}
                    Err(e) => break Err(e),
                }
                // Run the new token at its position: already submitted when pipelined; then the
                // next token's step goes in before this one's output is read.
                let pos = self.seq.len() - 1;
                if self.state.in_flight() == 0 {
                    let input = if chooser.is_argmax() { StepInput::LastArgmax } else { StepInput::Tokens(&self.seq[pos..]) };
                    if let Err(e) = set_bits(self.state.as_mut(), &mut chooser, vocab).and_then(|()| self.state.submit(input, pos, chooser.want())) {
                        break Err(e);
                    }
                }
                if pipelined && may_run(res.ids.len() + 1, pos + 1) {
                    if let Err(e) = self.state.submit(StepInput::LastArgmax, pos + 1, Want::Argmax) {
                        break Err(e);
                    }
                }
                match self.state.collect() {
                    Ok(o) => out = o,
                    Err(e) => break Err(e),
                }
                self.cached.push(id);
                res.timings.decode_steps += 1;
                res.timings.decode_tokens += 1;
            }
        };
        // A step run past the end (pipelined): its output and its cache position are dropped.
        drain(self.state.as_mut());
        res.text = std::mem::take(&mut stream.text);
        res.finish = result?;
        res.timings.decode = decode_start.elapsed();
        Ok(res)
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

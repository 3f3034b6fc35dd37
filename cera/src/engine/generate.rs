//! The generation loop of a [`Session`]: prefix reuse, chunked prefill, what each step reads
//! back, sampling, stop conditions and streaming text.

//!
//! What each step reads back and how its token is chosen: [`super::choose`].

use std::ops::DerefMut;
use std::time::{Duration, Instant};

use crate::tokenizer::{DecodeOptions, StreamDecoder};

use super::EngineError;
use super::backend::{BackendState, StepInput, StepOutput, Want};
use super::choose::{Chooser, StepLogprobs};
use super::options::{FinishReason, GenerateOpts};
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

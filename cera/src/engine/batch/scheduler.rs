//! The batcher's thread: continuous batching over one [`BatchState`].
//!
//! Each turn of the loop takes in new requests and cancellations, then plans one step under the
//! token budget ([`BatchOpts::max_tokens`]):
//! 1. one decode row for every running sequence whose last token is still to run, oldest first;
//! 2. the next prompt chunk of every running sequence still in its prefill, oldest first;
//! 3. new sequences from the queue (first come, first served) while slots, tokens and KV blocks
//!    last. A new sequence takes the cached blocks of its prompt's longest cached prefix
//!    ([`PrefixCache::start`]) and prefills only the rest.
//!
//! Blocks are taken as positions need them ([`PrefixCache::grow`], which first evicts cached
//! blocks no sequence holds, least recently used first). When none are left for a running
//! sequence, the newest running sequence is preempted: its blocks are released (its filled
//! blocks stay cached, so it may find them again), it goes back to the front of the queue with
//! its prompt and the tokens it generated so far, and later runs them again as a prefill and
//! goes on where it stopped. Its sink has seen each token once and sees nothing twice: every
//! row of a batched step gives the same numbers whatever else is in the step, so the rerun
//! recomputes exactly the cache it lost.
//!
//! After the step every sequence whose step reached its last token chooses the next one with
//! its own sampler (seed, penalties, `top_logprobs`), streams it, and checks its stop strings,
//! stop tokens, `max_tokens` and context; a finished or cancelled sequence frees its blocks and
//! its slot at once.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use boostr::ops_common::OpsError;
use boostr::paged::{BlockCopy, BlockTable, PrefixCache};

use super::super::backend::{StepOutput, Want};
use super::super::choose::Chooser;
use super::super::generate::{Generation, Stream, TEXT_RESERVE_MAX, TEXT_RESERVE_PER_TOKEN, Timings};
use super::super::model::Engine;
use super::super::options::{FinishReason, GenerateOpts};
use super::super::speculative::DraftPacer;
use super::super::stop::StopMatcher;
use super::super::{EngineError, TokenEvent};
use super::request::{BatcherMetrics, BoxSink, Reply};
use super::step::{BatchEntry, BatchOpts, BatchState};

#[path = "draft_model.rs"]
mod draft_model;
#[path = "plan.rs"]
mod plan;
#[path = "speculate.rs"]
mod speculate;
use crate::tokenizer::{DecodeOptions, StreamDecoder};
pub(crate) use draft_model::BatchDraft;
use draft_model::DraftSeq;

/// A request on its way to the batcher's thread.
pub(crate) struct Pending {
    pub(crate) tokens: Vec<u32>,
    pub(crate) opts: GenerateOpts,
    pub(crate) sink: Option<BoxSink>,
    pub(crate) reply: Reply,
}

/// What the batcher's thread receives.
pub(crate) enum Msg {
    Submit(Box<Pending>),
    Shutdown,
}

/// One request inside the loop.
struct Seq<'t> {
    /// Admission order (preemption takes the largest).
    order: u64,
    slot: Option<usize>,
    /// Prompt, then every generated token (the last one not yet run).
    tokens: Vec<u32>,
    table: BlockTable,
    /// Positions `0 .. computed` are in its blocks.
    computed: usize,
    /// Full blocks registered in the prefix cache.
    registered: usize,
    /// The prefix cache's copy on write into its last block, not yet made (the next step makes
    /// it first).
    copy: Option<BlockCopy>,
    chooser: Chooser,
    stream: Stream<'t, BoxSink>,
    opts: GenerateOpts,
    res: Generation,
    reply: Reply,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    /// The entry of a speculative step: the last token, then the drafts.
    verify: Vec<u32>,
    /// Its side of the draft model (blocks, what it has seen, this step's drafts).
    dm: DraftSeq,
    /// How many drafts pay for their verification (adaptive speculative requests).
    pacer: Option<DraftPacer>,
}

/// One sequence's part of the planned step.
struct Planned {
    seq: usize,
    pos: usize,
    n: usize,
    want: Want,
    /// Rows with an output: 1, or `n` for a speculative step (its tokens in `Seq::verify`).
    out_rows: usize,
}

fn empty_generation(prompt_tokens: usize) -> Generation {
    Generation {
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
    }
}

fn noop_sink() -> BoxSink {
    Box::new(|_: &TokenEvent<'_>| {})
}

fn engine_err(e: OpsError) -> EngineError {
    EngineError::Usage(e.to_string())
}

/// A request's result.
type Outcome = Result<Generation, EngineError>;

/// The loop's state.
struct Loop<'t> {
    engine: &'t Engine,
    o: BatchOpts,
    prefix: bool,
    cache: PrefixCache,
    waiting: VecDeque<Seq<'t>>,
    running: Vec<Seq<'t>>,
    free_slots: Vec<usize>,
    next_order: u64,
    metrics: BatcherMetrics,
    /// Generated-token counts of recent steps, for the rate.
    recent: VecDeque<(Instant, u64)>,
    /// Results of the sequences that ended this turn.
    outbox: Vec<(std::sync::mpsc::SyncSender<Outcome>, Outcome)>,
    /// The draft model, when the batcher has one.
    draft: Option<BatchDraft>,
}

impl<'t> Loop<'t> {
    fn new_seq(&mut self, p: Pending) -> Seq<'t> {
        let inner = &self.engine.inner;
        let prompt_tokens = p.tokens.len();
        let room = p.opts.max_tokens.min(self.o.n_ctx.saturating_sub(prompt_tokens)) + 1;
        let decoder = StreamDecoder::with_options(&inner.tokenizer, DecodeOptions { render_special: false, strip_space_prefix: false });
        let text = String::with_capacity((room * TEXT_RESERVE_PER_TOKEN).min(TEXT_RESERVE_MAX));
        let stream = Stream::new(decoder, StopMatcher::new(&p.opts.stop), text, p.sink.unwrap_or_else(noop_sink));
        let mut res = empty_generation(prompt_tokens);
        res.ids.reserve(room);
        let chooser = Chooser::new(&p.opts, &inner.eog, inner.backend.device_name(), false, true);
        self.next_order += 1;
        Seq {
            order: self.next_order,
            slot: None,
            tokens: p.tokens,
            table: BlockTable::new(),
            computed: 0,
            registered: 0,
            copy: None,
            chooser,
            stream,
            opts: p.opts,
            res,
            reply: p.reply,
            admitted: None,
            first_token: None,
            verify: Vec::new(),
            dm: DraftSeq::default(),
            pacer: None,
        }
    }

    /// Ends a sequence: frees its blocks and slot and sends its result.
    fn finish(&mut self, mut s: Seq<'t>, result: Result<FinishReason, EngineError>) {
        self.release_blocks(&mut s);
        if let Some(slot) = s.slot.take() {
            self.free_slots.push(slot);
        }
        let out = result.map(|f| {
            if f == FinishReason::Cancelled {
                s.stream.end();
            }
            let now = Instant::now();
            let first = s.first_token.unwrap_or(now);
            let mut g = std::mem::replace(&mut s.res, empty_generation(0));
            g.finish = f;
            g.text = std::mem::take(&mut s.stream.text);
            g.timings.prefill = s.admitted.map_or(std::time::Duration::ZERO, |a| first.saturating_duration_since(a));
            g.timings.prefill_tokens = g.prefilled;
            g.timings.decode = now.saturating_duration_since(first);
            g.timings.decode_tokens = g.ids.len().saturating_sub(1);
            g.timings.decode_steps = g.timings.decode_tokens - g.timings.accepted_tokens.min(g.timings.decode_tokens);
            g
        });
        self.metrics.finished += 1;
        // Sent after the metrics are published, so that a caller that has its result sees them.
        self.outbox.push((s.reply.done, out));
    }

    /// Releases a sequence's blocks and its pending copy's source.
    fn release_blocks(&mut self, s: &mut Seq<'t>) {
        // Releasing fails only on a bookkeeping bug (a block released twice).
        let released = self.cache.release(&mut s.table);
        debug_assert!(released.is_ok(), "{released:?}");
        if let Some(c) = s.copy.take() {
            let released = self.cache.copied(c);
            debug_assert!(released.is_ok(), "{released:?}");
        }
        if let Some(d) = &mut self.draft {
            d.release(&mut s.dm);
        }
    }

    /// Ends the cancelled sequences, queued or running.
    fn reap_cancelled(&mut self) {
        let cancelled = |s: &Seq<'_>| s.reply.cancel.load(Ordering::SeqCst);
        for list in [true, false] {
            let mut i = 0;
            loop {
                let hit = if list { self.running.get(i).map(cancelled) } else { self.waiting.get(i).map(cancelled) };
                match hit {
                    None => break,
                    Some(true) => {
                        let s = if list { self.running.remove(i) } else { self.waiting.remove(i).expect("index checked") };
                        self.finish(s, Ok(FinishReason::Cancelled));
                    }
                    Some(false) => i += 1,
                }
            }
        }
    }

    /// Takes a sequence's step output: registers its filled blocks, chooses and streams the next
    /// token. Returns the reason it ended, if it did.
    fn after_step(&mut self, i: usize, p: &Planned, out: StepOutput) -> Result<Option<FinishReason>, EngineError> {
        if let StepOutput::Rows(outs) = out {
            return self.after_verify(i, p, outs);
        }
        let (bl, prefix) = (self.o.block_len, self.prefix);
        let s = &mut self.running[i];
        // A decode row runs the token the sequence generated last; every other row is prompt
        // (or, after a preemption, recomputed) tokens.
        let decode_row = p.n == 1 && p.pos + 1 == s.tokens.len() && s.first_token.is_some();
        if !decode_row {
            s.res.prefilled += p.n;
            self.metrics.prefill_tokens += p.n as u64;
        }
        s.computed = p.pos + p.n;
        if prefix && s.computed / bl > s.registered {
            self.cache.register(&s.table, &s.tokens[..s.computed]).map_err(engine_err)?;
            s.registered = s.computed / bl;
        }
        if p.want == Want::Nothing {
            return Ok(if s.opts.max_tokens == 0 && s.computed == s.tokens.len() { Some(FinishReason::MaxTokens) } else { None });
        }
        self.take_token(i, out, None)
    }

    /// Chooses sequence `i`'s next token from `out`, records and streams it, and checks the stop
    /// conditions.
    /// `draft`: the speculative token this row verifies.
    fn take_token(&mut self, i: usize, out: StepOutput, draft: Option<u32>) -> Result<Option<FinishReason>, EngineError> {
        let n_ctx = self.o.n_ctx;
        let s = &mut self.running[i];
        let inner = &self.engine.inner;
        let position = s.tokens.len();
        let (id, top) = match draft {
            Some(d) => (s.chooser.choose_draft(out, &s.tokens, position as u64, d)?, Default::default()),
            None => s.chooser.choose(out, &s.tokens, position as u64)?,
        };
        if (id as usize) >= inner.config.vocab {
            return Err(EngineError::Device { device: inner.backend.device_name(), reason: format!("the executor chose id {id} outside the vocabulary") });
        }
        s.first_token.get_or_insert_with(Instant::now);
        s.tokens.push(id);
        self.metrics.generated_tokens += 1;
        if (!s.opts.ignore_eos && inner.eog.binary_search(&id).is_ok()) || s.opts.stop_tokens.contains(&id) {
            s.res.stop_token = Some(id);
            s.stream.end();
            return Ok(Some(FinishReason::Stop));
        }
        s.res.ids.push(id);
        if s.opts.top_logprobs > 0 {
            s.res.top_logprobs.push(top.top.clone());
            s.res.logprobs.push(top.chosen.unwrap_or(f32::NAN));
        }
        let finish = if s.chooser.constraint_finished() {
            Some(FinishReason::Stop)
        } else if s.res.ids.len() >= s.opts.max_tokens {
            Some(FinishReason::MaxTokens)
        } else if s.tokens.len() >= n_ctx {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        if s.stream.token(id, top, finish.is_some())? {
            return Ok(Some(FinishReason::Stop));
        }
        Ok(finish)
    }

    /// Runs one planned step and hands each sequence its output.
    fn run_step(&mut self, state: &mut dyn BatchState, plan: Vec<Planned>) {
        // The prefix cache's copies on write of the sequences admitted since the last step,
        // before the step writes past them; their sources go back to the cache once recorded.
        let copies: Vec<BlockCopy> = self.running.iter_mut().filter_map(|s| s.copy.take()).collect();
        let copied = if copies.is_empty() { Ok(()) } else { state.copy_blocks(&copies.iter().map(|c| (c.src, c.dst)).collect::<Vec<_>>()) };
        for c in copies {
            let released = self.cache.copied(c);
            debug_assert!(released.is_ok(), "{released:?}");
        }
        // Constrained sequences' masks for this step, applied on the device.
        let vocab = self.engine.inner.config.vocab;
        for p in plan.iter().filter(|p| p.want != Want::Nothing && p.out_rows == 1) {
            self.running[p.seq].chooser.prepare_step(vocab);
        }
        let entries: Vec<BatchEntry<'_>> = plan
            .iter()
            .map(|p| {
                let s = &self.running[p.seq];
                BatchEntry {
                    slot: s.slot.expect("running sequences hold a slot"),
                    tokens: if p.out_rows > 1 { &s.verify } else { &s.tokens[p.pos..p.pos + p.n] },
                    pos: p.pos,
                    table: &s.table,
                    want: p.want,
                    decode: p.pos >= s.res.prompt_tokens,
                    out_rows: p.out_rows,
                    mask: if p.want == Want::Nothing { None } else { s.chooser.step_bits() },
                }
            })
            .collect();
        let prompt_rows = plan.iter().any(|p| p.pos < self.running[p.seq].res.prompt_tokens || p.n > p.out_rows);
        let t0 = Instant::now();
        let outs = copied.and_then(|()| state.step(&entries));
        let step_time = t0.elapsed().as_secs_f64();
        drop(entries);
        self.metrics.steps += 1;
        let rows = plan.iter().map(|p| p.n as u64).sum::<u64>();
        self.metrics.step_rows += rows;
        self.metrics.step_seconds += step_time;
        if prompt_rows {
            self.metrics.prompt_steps += 1;
            self.metrics.prompt_step_rows += rows;
            self.metrics.prompt_step_seconds += step_time;
        }
        let generated_before = self.metrics.generated_tokens;
        let mut ended: Vec<(u64, Result<FinishReason, EngineError>)> = Vec::new();
        match outs {
            Ok(outs) => {
                for (p, out) in plan.iter().zip(outs) {
                    match self.after_step(p.seq, p, out) {
                        Ok(None) => {}
                        Ok(Some(f)) => ended.push((self.running[p.seq].order, Ok(f))),
                        Err(e) => ended.push((self.running[p.seq].order, Err(e))),
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                let device = self.engine.device_name();
                for p in &plan {
                    ended.push((self.running[p.seq].order, Err(EngineError::Device { device: device.clone(), reason: msg.clone() })));
                }
            }
        }
        for (order, r) in ended {
            if let Some(i) = self.running.iter().position(|s| s.order == order) {
                let s = self.running.remove(i);
                self.finish(s, r);
            }
        }
        let now = Instant::now();
        self.recent.push_back((now, self.metrics.generated_tokens - generated_before));
        while self.recent.front().is_some_and(|(t, _)| now.duration_since(*t).as_secs_f64() > 1.0) && self.recent.len() > 1 {
            self.recent.pop_front();
        }
        let span = self.recent.front().map_or(0.0, |(t, _)| now.duration_since(*t).as_secs_f64());
        let toks: u64 = self.recent.iter().skip(1).map(|x| x.1).sum();
        self.metrics.tokens_per_second = if span > 0.0 { toks as f64 / span } else { 0.0 };
    }

    fn publish(&mut self, shared: &Mutex<BatcherMetrics>) {
        let st = self.cache.stats();
        self.metrics.queued = self.waiting.len();
        self.metrics.active = self.running.len();
        self.metrics.blocks_used = st.used_blocks;
        self.metrics.blocks_free = st.free_blocks;
        self.metrics.blocks_cached = st.evictable_blocks;
        self.metrics.prefix_hit_tokens = st.hit_tokens;
        *shared.lock().unwrap_or_else(|p| p.into_inner()) = self.metrics;
        for (to, out) in self.outbox.drain(..) {
            let _ = to.send(out);
        }
    }
}

/// The batcher's thread: runs until [`Msg::Shutdown`] or every sender is gone, then ends the
/// requests left with [`FinishReason::Cancelled`].
pub(crate) fn run(
    engine: Engine,
    mut state: Box<dyn BatchState>,
    rx: Receiver<Msg>,
    shared: Arc<Mutex<BatcherMetrics>>,
    prefix: bool,
    draft: Option<BatchDraft>,
) {
    let o = *state.opts();
    let mut lp = Loop {
        engine: &engine,
        o,
        prefix,
        cache: PrefixCache::new(o.n_blocks, o.block_len),
        waiting: VecDeque::new(),
        running: Vec::new(),
        free_slots: (0..o.max_seqs).rev().collect(),
        next_order: 0,
        metrics: BatcherMetrics::default(),
        recent: VecDeque::new(),
        outbox: Vec::new(),
        draft,
    };
    let mut open = true;
    while open {
        // Requests in: block while there is nothing to run.
        if lp.running.is_empty() && lp.waiting.is_empty() {
            match rx.recv() {
                Ok(Msg::Submit(p)) => {
                    let s = lp.new_seq(*p);
                    lp.waiting.push_back(s);
                }
                Ok(Msg::Shutdown) | Err(_) => break,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(Msg::Submit(p)) => {
                    let s = lp.new_seq(*p);
                    lp.waiting.push_back(s);
                }
                Ok(Msg::Shutdown) | Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
        if !open {
            break;
        }
        let turn = Instant::now();
        lp.reap_cancelled();
        let mut plan = Vec::new();
        let mut budget = o.max_tokens;
        lp.draft_with_model();
        lp.plan_running(&mut plan, &mut budget);
        lp.admit(&mut plan, &mut budget);
        if !plan.is_empty() {
            lp.run_step(state.as_mut(), plan);
            lp.metrics.busy_seconds += turn.elapsed().as_secs_f64();
        }
        lp.publish(&shared);
    }
    let left: Vec<Seq<'_>> = lp.running.drain(..).chain(lp.waiting.drain(..)).collect();
    for s in left {
        lp.finish(s, Ok(FinishReason::Cancelled));
    }
    lp.publish(&shared);
}

//! Many sequences at once: [`Engine::batcher`] starts a [`Batcher`], a thread that runs every
//! submitted request in shared steps (continuous batching over a paged KV cache with a prefix
//! cache). Requests join and leave between steps; each keeps its own sampler, seed, penalties,
//! stop strings, `max_tokens` and `top_logprobs`, and gives exactly the tokens it gives alone.
//!
//! ```no_run
//! use cera::engine::{BatcherOpts, Engine, GenerateOpts, LoadOptions, TokenEvent};
//!
//! let engine = Engine::load("SmolLM2-135M-Instruct.Q4_1.gguf", &LoadOptions::default(), None)?;
//! let batcher = engine.batcher(BatcherOpts::default())?;
//! // Each request streams to its own sink, on the batcher's thread.
//! let a = batcher.submit("The capital of France is", &GenerateOpts::greedy(16), Some(Box::new(|ev: &TokenEvent| print!("{}", ev.text))))?;
//! let b = batcher.submit("Once upon a time", &GenerateOpts::default().with_seed(7), None)?;
//! b.cancel(); // b ends with FinishReason::Cancelled, its KV blocks freed; a is not affected
//! let out = a.wait()?;
//! println!("\n{} tokens ({}); {:?}", out.ids.len(), out.finish.name(), batcher.metrics());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The pieces: [`step`] is the executor's side (one step over several sequences, [`BatchState`]);
//! `scheduler.rs` the loop (sampling and streaming per sequence), with `plan.rs` (planning steps
//! under the token budget, the prefix cache, preemption), `speculate.rs` (drafts and their
//! verification) and `draft_model.rs` (a draft model's side); `request.rs` the caller's side
//! (options, handles, metrics).

mod request;
mod scheduler;
pub mod step;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

pub use request::{BatcherMetrics, BatcherOpts, BoxSink, Canceller, DEFAULT_CPU_KV_BUDGET, DEFAULT_GPU_KV_BUDGET, Prompt, RequestHandle};
pub(crate) use step::check_entries;
pub use step::{BatchEntry, BatchOpts, BatchState, MAX_DRAFT};

use super::EngineError;
use super::backend::KvType;
use super::generate::Generation;
use super::model::Engine;
use super::options::GenerateOpts;
use crate::tokenizer::EncodeOptions;
use request::Reply;
use scheduler::{BatchDraft, Msg, Pending};

/// Requests run together on one engine (see the [module docs](self)). `Send + Sync`: share it
/// (in an `Arc`) between the threads that submit. Dropping it ends the requests still running
/// with [`FinishReason::Cancelled`](super::FinishReason::Cancelled) and stops its thread.
pub struct Batcher {
    engine: Engine,
    draft: Option<Engine>,
    opts: BatcherOpts,
    batch: BatchOpts,
    tx: Mutex<mpsc::Sender<Msg>>,
    metrics: Arc<Mutex<BatcherMetrics>>,
    next_id: AtomicU64,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("opts", &self.opts).field("batch", &self.batch).finish()
    }
}

/// Bytes of one KV block of `block_len` positions in every layer, K and V, as the executors
/// store it (the CPU keeps f32 values of the cache type's rounding, so it counts 4 bytes each).
fn block_bytes(engine: &Engine, kv: KvType, block_len: usize) -> u64 {
    let c = engine.config();
    let row = match (engine.is_gpu(), kv) {
        (true, KvType::Q8_0) => boostr::kv_cache::KvDtype::Q8_0.row_words(c.head_dim) * 4,
        (true, _) => boostr::kv_cache::KvDtype::F16.row_words(c.head_dim) * 4,
        (false, _) => c.head_dim * 4,
    };
    (2 * c.kv_layers().max(1) * c.n_kv_heads * block_len * row) as u64
}

impl Engine {
    /// Starts a [`Batcher`] on this engine: its KV blocks (from `opts.kv_budget`) and step
    /// buffers are allocated here, so an adapter without the memory fails now, with a typed
    /// error. Sequences reach the engine's context length ([`Engine::n_ctx`]) at most.
    pub fn batcher(&self, opts: BatcherOpts) -> Result<Batcher, EngineError> {
        self.start_batcher(opts, None)
    }

    /// [`Self::batcher`] with a draft model for speculative requests whose drafts come from it
    /// ([`DraftSource::Model`](super::DraftSource::Model)): `draft` shares this engine's
    /// vocabulary ([`EngineError::Usage`] otherwise) and may run on any device. It keeps a paged
    /// KV cache of its own with as many blocks as this engine's (of its own, usually smaller,
    /// size), and before each step it drafts, greedily and for all such sequences at once,
    /// from their last token: a step of the tokens it has not seen yet, then one step per
    /// further draft. Drafts stop at the first token it gives a probability below `p_min`
    /// (0: never; llama.cpp's `--draft-p-min`), and with [`Speculative::adaptive`](super::Speculative::adaptive)
    /// each sequence drafts as many as pay for their cost. When the draft model cannot draft
    /// (its blocks run out, an error), sequences decode plainly; the output never depends on
    /// the drafts.
    pub fn batcher_with_draft(&self, opts: BatcherOpts, draft: &Engine, p_min: f32) -> Result<Batcher, EngineError> {
        super::speculative::check_draft_vocab(draft, self)?;
        if !(0.0..=1.0).contains(&p_min) {
            return Err(EngineError::Usage(format!("a draft model's p_min of {p_min} (0 to 1)")));
        }
        self.start_batcher(opts, Some((draft, p_min)))
    }

    fn start_batcher(&self, opts: BatcherOpts, draft: Option<(&Engine, f32)>) -> Result<Batcher, EngineError> {
        if opts.max_seqs == 0 || opts.max_step_tokens == 0 || opts.block_len == 0 {
            return Err(EngineError::Usage(format!(
                "a batcher of {} sequences, {} tokens per step and blocks of {} positions (all must be positive)",
                opts.max_seqs, opts.max_step_tokens, opts.block_len
            )));
        }
        let n_ctx = self.n_ctx();
        let per_block = block_bytes(self, self.kv_type(), opts.block_len).max(1);
        let cap = if self.is_gpu() { DEFAULT_GPU_KV_BUDGET } else { DEFAULT_CPU_KV_BUDGET };
        let full = (opts.max_seqs * n_ctx.div_ceil(opts.block_len)) as u64 * per_block;
        let budget = opts.kv_budget.unwrap_or(full.min(cap));
        let n_blocks = (budget / per_block).max(1) as usize;
        let batch = BatchOpts { kv: self.kv_type(), block_len: opts.block_len, n_blocks, max_tokens: opts.max_step_tokens, max_seqs: opts.max_seqs, n_ctx };
        let state = self.inner.backend.new_batch(&batch)?;
        let draft = match draft {
            None => None,
            Some((d, p_min)) => {
                let o = BatchOpts { kv: d.kv_type(), n_ctx: n_ctx.min(d.n_ctx()), ..batch };
                Some(BatchDraft::new(self, d.clone(), d.inner.backend.new_batch(&o)?, p_min))
            }
        };
        let draft_engine = draft.as_ref().map(|d| d.engine.clone());
        // Recurrent state (LFM2's conv rings) is not in the KV blocks: no prefix sharing there.
        let prefix = opts.prefix_cache && self.config().conv_layers() == 0;
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Mutex::new(BatcherMetrics { blocks_free: n_blocks, ..BatcherMetrics::default() }));
        let (engine, shared) = (self.clone(), metrics.clone());
        let thread = std::thread::Builder::new()
            .name("cera-batcher".into())
            .spawn(move || scheduler::run(engine, state, rx, shared, prefix, draft))
            .map_err(|e| EngineError::Usage(format!("cannot start the batcher's thread: {e}")))?;
        Ok(Batcher { engine: self.clone(), draft: draft_engine, opts, batch, tx: Mutex::new(tx), metrics, next_id: AtomicU64::new(0), thread: Some(thread) })
    }
}

impl Batcher {
    /// Queues a request; its tokens go to `sink` (on the batcher's thread) as they come, and its
    /// [`Generation`] to the handle. Typed errors before anything is queued: options out of
    /// their ranges ([`GenerateOpts::check`]), an empty prompt, an id outside the vocabulary,
    /// a prompt longer than the context.
    pub fn submit(&self, prompt: impl Into<Prompt>, opts: &GenerateOpts, sink: Option<BoxSink>) -> Result<RequestHandle, EngineError> {
        opts.check()?;
        if opts.speculative.is_some_and(|s| s.source == super::DraftSource::Model) && self.draft.is_none() {
            return Err(EngineError::Usage("speculative drafts from a draft model on a batcher without one (Engine::batcher_with_draft)".into()));
        }
        let tokens = self.prompt_tokens(prompt)?;
        let (done, rx) = mpsc::sync_channel(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let pending = Pending { tokens, opts: opts.clone(), sink, reply: Reply { done, cancel: cancel.clone() } };
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.send(Msg::Submit(Box::new(pending))).map_err(|_| EngineError::Usage("the batcher has stopped".into()))?;
        Ok(RequestHandle { id, rx, cancel })
    }

    /// The token ids [`Self::submit`] would run for `prompt` (text is tokenized as at the start of
    /// a session), with its checks: an empty prompt, an id outside the vocabulary, a prompt
    /// longer than the context are typed errors.
    pub fn prompt_tokens(&self, prompt: impl Into<Prompt>) -> Result<Vec<u32>, EngineError> {
        let tokens = match prompt.into() {
            Prompt::Tokens(t) => t,
            Prompt::Text(text) => {
                let tok = self.engine.tokenizer();
                let mut ids = tok.encode(&text, EncodeOptions { add_special: true, parse_special: true })?;
                let bos = tok.special().bos;
                if tok.special().add_bos && bos.is_some() && ids.len() >= 2 && ids[0] == ids[1] && Some(ids[0]) == bos {
                    ids.remove(0);
                }
                ids
            }
        };
        if tokens.is_empty() {
            return Err(EngineError::Usage("an empty prompt (a request needs at least one token)".into()));
        }
        let vocab = self.engine.config().vocab;
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        if tokens.len() > self.batch.n_ctx {
            return Err(EngineError::ContextOverflow { tokens: tokens.len(), n_ctx: self.batch.n_ctx });
        }
        Ok(tokens)
    }

    /// [`Self::submit`] without a sink, then waits for the result.
    pub fn generate(&self, prompt: impl Into<Prompt>, opts: &GenerateOpts) -> Result<Generation, EngineError> {
        self.submit(prompt, opts, None)?.wait()
    }

    /// The latest metrics (updated after every step).
    pub fn metrics(&self) -> BatcherMetrics {
        *self.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The options it was started with.
    pub fn opts(&self) -> &BatcherOpts {
        &self.opts
    }

    /// The sizes of its batched state (blocks, tokens per step, sequences).
    pub fn batch_opts(&self) -> &BatchOpts {
        &self.batch
    }

    /// The engine it runs on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Its draft model, if it has one.
    pub fn draft_engine(&self) -> Option<&Engine> {
        self.draft.as_ref()
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Msg::Shutdown);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

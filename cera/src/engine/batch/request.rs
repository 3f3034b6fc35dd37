//! What a caller hands the [`Batcher`](super::Batcher) and gets back: the options of the batcher,
//! a request (prompt, generation options, sink), its handle (cancel, wait) and the metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::super::EngineError;
use super::super::generate::{Generation, Sink};

/// Sizes of a [`Batcher`](super::Batcher). `Default`: 64 sequences, 512 tokens per step, blocks of
/// 16 positions, the prefix cache on, the KV budget [`BatcherOpts::kv_budget`] leaves to the
/// engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatcherOpts {
    /// Most sequences running at once (the rest wait in the queue). On the GPU it also picks the
    /// decode rows' kernel for every step (so that a sequence's numbers never depend on the
    /// others): up to 16 (`--tune batch_gemv_max_seqs`) the multi-row integer-dot GEMV, fastest
    /// when few sequences are busy; above, the GEMM, fastest when most of 32 or more are.
    pub max_seqs: usize,
    /// Most tokens one step runs, decode rows and prefill chunks together.
    pub max_step_tokens: usize,
    /// Bytes of KV cache (all layers, K and V). `None`: the KV of `max_seqs` sequences at the
    /// engine's context, capped at [`DEFAULT_GPU_KV_BUDGET`] on a GPU (wgpu does not report an
    /// adapter's memory) and [`DEFAULT_CPU_KV_BUDGET`] on the CPU.
    pub kv_budget: Option<u64>,
    /// Positions per KV block (16: measured as fast as 32 on an H100, finer sharing).
    pub block_len: usize,
    /// Share the blocks of common prompt prefixes between requests and keep finished prefixes
    /// cached while memory allows. Off for models with recurrent state (LFM2), whose conv
    /// state a cached block does not carry.
    pub prefix_cache: bool,
}

/// The default KV budget's cap on a GPU.
pub const DEFAULT_GPU_KV_BUDGET: u64 = 4 << 30;
/// The default KV budget's cap on the CPU.
pub const DEFAULT_CPU_KV_BUDGET: u64 = 1 << 30;

impl Default for BatcherOpts {
    fn default() -> Self {
        BatcherOpts { max_seqs: 64, max_step_tokens: 512, kv_budget: None, block_len: boostr::paged::DEFAULT_BLOCK_LEN, prefix_cache: true }
    }
}

/// A request's prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Text, tokenized as [`Session::append_text`](super::super::Session::append_text) does at the
    /// start of a sequence (the model's BOS first when it asks for one; control tokens parsed).
    Text(String),
    /// Token ids as they are.
    Tokens(Vec<u32>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Prompt {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Prompt {
        Prompt::Text(s)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(t: Vec<u32>) -> Prompt {
        Prompt::Tokens(t)
    }
}

/// A sink the batcher's thread calls with each token of one request.
pub type BoxSink = Box<dyn Sink + Send>;

/// Where a request's result goes, with its cancel flag.
pub(crate) struct Reply {
    pub(crate) done: mpsc::SyncSender<Result<Generation, EngineError>>,
    pub(crate) cancel: Arc<AtomicBool>,
}

/// A submitted request: cancel it, or wait for its [`Generation`].
#[derive(Debug)]
pub struct RequestHandle {
    pub(crate) id: u64,
    pub(crate) rx: mpsc::Receiver<Result<Generation, EngineError>>,
    pub(crate) cancel: Arc<AtomicBool>,
}

impl RequestHandle {
    /// The request's number (in submission order, from 0).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Stops the request before its next step: it ends with
    /// [`FinishReason::Cancelled`](super::super::FinishReason::Cancelled) and its KV blocks are
    /// freed at once. The other requests are not affected.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// A cancel flag for another thread ([`RequestHandle::cancel`] through it).
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.clone())
    }

    /// Waits for the result. [`EngineError::Usage`] when the batcher stopped without one.
    pub fn wait(self) -> Result<Generation, EngineError> {
        self.rx.recv().map_err(|_| EngineError::Usage("the batcher stopped before the request finished".into()))?
    }

    /// The result if the request has finished, else `None` (the handle stays usable).
    pub fn try_result(&self) -> Option<Result<Generation, EngineError>> {
        self.rx.try_recv().ok()
    }

    /// Waits at most `timeout` for the result.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<Generation, EngineError>> {
        self.rx.recv_timeout(timeout).ok()
    }
}

/// Cancels one request from any thread.
#[derive(Clone, Debug)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// [`RequestHandle::cancel`].
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What a server exposes about a [`Batcher`](super::Batcher), updated after every step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BatcherMetrics {
    /// Requests waiting to start (or to resume after a preemption).
    pub queued: usize,
    /// Sequences running.
    pub active: usize,
    /// KV blocks held by sequences or by the prefix cache.
    pub blocks_used: usize,
    /// KV blocks free.
    pub blocks_free: usize,
    /// Of the used blocks, cached ones no sequence holds (freed first when memory runs out).
    pub blocks_cached: usize,
    /// Prompt tokens found in the prefix cache, since the batcher started.
    pub prefix_hit_tokens: u64,
    /// Prompt (and recomputed) tokens run, since the batcher started.
    pub prefill_tokens: u64,
    /// Tokens generated, since the batcher started.
    pub generated_tokens: u64,
    /// Generated tokens per second over the last second or so of steps.
    pub tokens_per_second: f64,
    /// Steps run.
    pub steps: u64,
    /// Of those, steps with prompt (or recomputed) rows.
    pub prompt_steps: u64,
    /// Token rows run in steps (decode, prompt and verification rows), since the batcher
    /// started.
    pub step_rows: u64,
    /// Of those, the rows of steps with prompt rows.
    pub prompt_step_rows: u64,
    /// Seconds spent inside steps (recording, the device's work, reading the outputs back),
    /// since the batcher started.
    pub step_seconds: f64,
    /// Of those, the seconds of steps with prompt rows.
    pub prompt_step_seconds: f64,
    /// Seconds of the batcher's turns that ran a step, the step included: planning, the step,
    /// sampling, streaming and finishing sequences. `busy_seconds - step_seconds` is the host's
    /// time between steps, when the device idles.
    pub busy_seconds: f64,
    /// Sequences preempted (blocks freed, recomputed later) when the KV blocks ran out.
    pub preemptions: u64,
    /// Requests finished (any reason, errors included).
    pub finished: u64,
    /// Speculative draft tokens verified, since the batcher started.
    pub drafted_tokens: u64,
    /// Of those, the ones the model's own choice agreed with (kept).
    pub accepted_tokens: u64,
    /// Verification entries run (a sequence's last token and its drafts in one step); each
    /// gives `1 +` its kept drafts tokens.
    pub verifications: u64,
    /// Steps the draft model ran (a batcher with a draft model), its catch-up steps and one
    /// per further draft.
    pub draft_steps: u64,
    /// Draft passes an error stopped (the sequences decoded plainly that step and the draft
    /// model started them afresh).
    pub draft_errors: u64,
}

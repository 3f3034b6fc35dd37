//! [`Session`]: one token sequence on a shared [`Engine`], with its own KV cache.
//!
//! The session holds the sequence (what was appended and generated) apart from what the cache
//! holds: [`Session::generate`] keeps the cached positions whose tokens match the sequence and
//! runs only the rest (prefix reuse). So a chat can re-render the whole conversation each turn
//! ([`Session::reset`], then [`Session::append_text`]) and pay only for the new tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::tokenizer::EncodeOptions;

use super::EngineError;
use super::backend::{BackendState, KernelTime, StepCounters, StepInput, Want};
use super::model::Engine;

/// Stops a running [`Session::generate`] from any thread. Cloning gives another handle to the
/// same flag; the session checks it between tokens (and between prefill chunks), and clears it
/// when a generation starts, unless it was set with [`CancelToken::cancel_all`].
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicU8>);

/// The token's states.
const NOT_CANCELLED: u8 = 0;
const CANCELLED: u8 = 1;
const CANCELLED_FOR_GOOD: u8 = 2;

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> CancelToken {
        CancelToken::default()
    }

    /// Asks the generation to stop; it ends with
    /// [`FinishReason::Cancelled`](super::FinishReason::Cancelled) before its next token.
    pub fn cancel(&self) {
        self.0.fetch_max(CANCELLED, Ordering::SeqCst);
    }

    /// Stops the running generation and every later one: unlike [`CancelToken::cancel`], a
    /// generation that starts afterwards does not clear it, and ends with
    /// [`FinishReason::Cancelled`](super::FinishReason::Cancelled) before its first step (no
    /// tokens). For a Ctrl-C that may come before the generation starts.
    pub fn cancel_all(&self) {
        self.0.store(CANCELLED_FOR_GOOD, Ordering::SeqCst);
    }

    /// Whether [`CancelToken::cancel`] was called since the generation started (or
    /// [`CancelToken::cancel_all`] at any time).
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst) != NOT_CANCELLED
    }

    /// Clears a [`CancelToken::cancel`], not a [`CancelToken::cancel_all`].
    pub(crate) fn clear(&self) {
        let _ = self.0.compare_exchange(CANCELLED, NOT_CANCELLED, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// One sequence on an [`Engine`]: its tokens, its KV cache and its cancellation token.
pub struct Session {
    pub(crate) engine: Engine,
    pub(crate) state: Box<dyn BackendState>,
    /// The sequence: appended tokens and generated ones.
    pub(crate) seq: Vec<u32>,
    /// The tokens whose keys and values are in the cache, at positions `0..cached.len()`.
    pub(crate) cached: Vec<u32>,
    pub(crate) cancel: CancelToken,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("tokens", &self.seq.len()).field("cached", &self.cached.len()).finish()
    }
}

impl Session {
    pub(crate) fn new(engine: Engine) -> Result<Session, EngineError> {
        let state = engine.inner.backend.new_state(&engine.inner.state)?;
        Ok(Session { engine, state, seq: Vec::new(), cached: Vec::new(), cancel: CancelToken::new() })
    }

    /// The engine this session runs on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Tokenizes `text` and appends it; returns the number of tokens appended. Control tokens
    /// written in the text (`<|im_start|>`, `<start_of_turn>`) are parsed as such, as llama.cpp
    /// does for prompts. At the start of the sequence the model's default BOS is put first
    /// (when its metadata asks for one, and not twice when the text itself starts with it).
    pub fn append_text(&mut self, text: &str) -> Result<usize, EngineError> {
        let tok = &self.engine.inner.tokenizer;
        let first = self.seq.is_empty();
        let mut ids = tok.encode(text, EncodeOptions { add_special: first, parse_special: true })?;
        let bos = tok.special().bos;
        if first && tok.special().add_bos && bos.is_some() && ids.len() >= 2 && ids[0] == ids[1] && Some(ids[0]) == bos {
            ids.remove(0);
        }
        self.append_tokens(&ids)?;
        Ok(ids.len())
    }

    /// Appends token ids as they are ([`EngineError::TokenOutOfRange`] for an id outside the
    /// model's vocabulary; nothing is appended then).
    pub fn append_tokens(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        let vocab = self.engine.inner.config.vocab;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        self.seq.extend_from_slice(ids);
        Ok(())
    }

    /// The sequence: every appended token and every generated one (the end-of-generation or
    /// stop token that ended a generation included, so that a following turn continues after
    /// it).
    pub fn tokens(&self) -> &[u32] {
        &self.seq
    }

    /// How many leading tokens of the sequence are in the KV cache now.
    pub fn cached_tokens(&self) -> usize {
        self.cached.iter().zip(&self.seq).take_while(|(a, b)| a == b).count()
    }

    /// Empties the sequence. The cache keeps its contents, so a sequence appended afterwards
    /// reuses whatever prefix it shares with them; the output is the same as on a fresh
    /// session.
    pub fn reset(&mut self) {
        self.seq.clear();
    }

    /// Shortens the sequence to its first `len` tokens (nothing happens when it is shorter).
    pub fn truncate(&mut self, len: usize) {
        self.seq.truncate(len);
    }

    /// Empties the sequence and forgets the cache's contents: the next generation runs every
    /// token again.
    pub fn clear_cache(&mut self) -> Result<(), EngineError> {
        self.seq.clear();
        self.cached.clear();
        self.state.reset()
    }

    /// A handle that cancels this session's generations from any thread.
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Runs the last `n` tokens of the sequence again in one step (they must be cached; 1: a
    /// decode step, more: a prompt step of `n` tokens) with device timestamps around every
    /// kernel, and returns the GPU time per kernel label. The cache's contents do not change
    /// (the same tokens are written at the same positions). [`EngineError::Unsupported`] on
    /// executors without timestamps (the CPU).
    pub fn profile_step(&mut self, n: usize) -> Result<Vec<KernelTime>, EngineError> {
        let cached = self.cached_tokens();
        if n == 0 || n > cached || n > self.engine.inner.state.ubatch {
            return Err(EngineError::Usage(format!("profiling a step of {n} tokens with {cached} cached (ubatch {})", self.engine.inner.state.ubatch)));
        }
        let pos = cached - n;
        let tokens = self.seq[pos..cached].to_vec();
        let (_, times) = self.state.profile_step(StepInput::Tokens(&tokens), pos, Want::Argmax)?;
        Ok(times)
    }

    /// Runs the last `n` cached tokens again as one speculative verification step (the first as
    /// the accepted token, the rest as its drafts) with device timestamps around every kernel,
    /// and returns the GPU time per kernel label. The cache's contents do not change.
    /// [`EngineError::Unsupported`] on executors without verification or timestamps.
    pub fn profile_verify(&mut self, n: usize) -> Result<Vec<KernelTime>, EngineError> {
        let cached = self.cached_tokens();
        if n == 0 || n > cached {
            return Err(EngineError::Usage(format!("profiling a verification step of {n} tokens with {cached} cached")));
        }
        let pos = cached - n;
        let tokens = self.seq[pos..cached].to_vec();
        self.state.profile_verify(&tokens, pos)
    }

    /// The executor's counters of the last decode step.
    pub fn last_step_counters(&self) -> StepCounters {
        self.state.last_step_counters()
    }
}

#[cfg(test)]
mod tests {
    use super::CancelToken;

    #[test]
    fn a_cancel_is_cleared_and_a_cancel_all_is_not() {
        let t = CancelToken::new();
        assert!(!t.is_cancelled());
        t.cancel();
        assert!(t.clone().is_cancelled());
        t.clear();
        assert!(!t.is_cancelled());
        t.cancel_all();
        t.cancel();
        t.clear();
        assert!(t.is_cancelled(), "a later cancel does not weaken cancel_all, and the start does not clear it");
    }
}

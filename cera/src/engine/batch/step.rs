//! The interface between the scheduler ([`super::Batcher`]) and an executor running many
//! sequences in one step: a [`BatchState`] holds a paged KV cache (blocks of
//! [`BatchOpts::block_len`] positions that any sequence's [`BlockTable`] points into), and
//! [`BatchState::step`] runs the tokens of several sequences at once, each at its own positions,
//! decode rows (one token) and prefill chunks (several) mixed.
//!
//! The executor never decides which blocks a sequence holds: the scheduler allocates them
//! ([`boostr::paged::PrefixCache`]) and hands each entry its table, so blocks shared by a common
//! prefix are read by several sequences and written by none of them.
//!
//! **Batch invariance.** A sequence's rows give the same numbers whichever other sequences share
//! the step and however many tokens it carries: every kernel of a batched step computes a row
//! from that row alone in a fixed order (the projections as one matrix product over all the
//! step's rows, the attention's key chunks counted from the row's own length). So greedy and
//! seeded sampling give exactly what the sequence gives alone in a batch of one.

use boostr::paged::BlockTable;

use super::super::EngineError;
use super::super::backend::{KernelTime, KvType, StepCounters, StepOutput, Want};

/// Most draft tokens one step verifies, all sequences together (the rows past one per sequence
/// that give outputs).
pub const MAX_DRAFT: usize = 16;

/// Sizes of a batched state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOpts {
    /// KV storage type (f16 or q8_0 on the GPU; f32 too on the CPU).
    pub kv: KvType,
    /// Positions per KV block.
    pub block_len: usize,
    /// KV blocks in the pool (every layer has this many).
    pub n_blocks: usize,
    /// Most tokens one step runs, all sequences together (the step's token budget).
    pub max_tokens: usize,
    /// Most sequences one step runs (and slots of per-sequence state: LFM2's conv rings).
    pub max_seqs: usize,
    /// Most positions one sequence reaches.
    pub n_ctx: usize,
}

impl BatchOpts {
    /// Checks that every size is positive and that a step's sequences fit its tokens.
    pub fn check(&self) -> Result<(), EngineError> {
        let o = self;
        if o.block_len == 0 || o.n_blocks == 0 || o.max_tokens == 0 || o.max_seqs == 0 || o.n_ctx == 0 {
            return Err(EngineError::Usage(format!(
                "a batch of block length {}, {} blocks, {} tokens and {} sequences per step, {} positions per sequence (all must be positive)",
                o.block_len, o.n_blocks, o.max_tokens, o.max_seqs, o.n_ctx
            )));
        }
        if u32::try_from(o.n_ctx).is_err() || u32::try_from(o.max_tokens).is_err() {
            return Err(EngineError::Usage(format!("{} positions and {} tokens per step must fit 32 bits", o.n_ctx, o.max_tokens)));
        }
        Ok(())
    }

    /// Rows of a step that may give outputs: one per sequence, and [`MAX_DRAFT`] more for
    /// speculative drafts' verification ([`BatchEntry::out_rows`]).
    pub fn head_rows(&self) -> usize {
        self.max_seqs + MAX_DRAFT
    }

    /// Most decode rows (entries marked [`BatchEntry::decode`]) one step runs: every sequence's
    /// decode row, the most drafts a step verifies, and 64 rows of a preempted sequence's
    /// recomputed output (which the scheduler chunks to what is left), within the step's tokens.
    /// A GPU state's decode lane is this many rows.
    pub fn max_decode_rows(&self) -> usize {
        self.max_tokens.min(self.head_rows() + 64)
    }

    /// Blocks one sequence of `n_ctx` positions can hold.
    pub fn blocks_per_seq(&self) -> usize {
        self.n_ctx.div_ceil(self.block_len.max(1))
    }
}

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug)]
pub struct BatchEntry<'a> {
    /// The sequence's slot (`< max_seqs`; at most one entry per slot in a step): where its
    /// recurrent state lives. A sequence keeps its slot from its first step to its last.
    pub slot: usize,
    /// Its tokens in this step, at positions `pos .. pos + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of the first token.
    pub pos: usize,
    /// Its blocks; they must hold the step's positions.
    pub table: &'a BlockTable,
    /// What comes back about the distribution after its last token.
    pub want: Want,
    /// How many of its last rows give an output (each as `want` says): 1, or more to verify a
    /// speculative draft (at most its tokens); more than one comes back as
    /// [`StepOutput::Rows`].
    pub out_rows: usize,
    /// Its tokens are generated ones (positions at or past the prompt's end: decode rows, a
    /// preempted sequence's recomputed output, a speculative draft's verification), not a
    /// prompt's. A GPU step runs such rows through the multi-row GEMV of decoding and prompt
    /// rows through the GEMM, so a row's numbers depend on what it is, never on the other rows.
    pub decode: bool,
    /// An allowed-id bitmask (`ceil(vocab / 32)` words; bit `id % 32` of word `id / 32` set
    /// where `id` may be chosen) applied to the output row before `want` reads it, on the
    /// device: a structured-output constraint's mask, so that an argmax or top-k is all that
    /// comes back ([`Want::Logits`] returns the masked row). Only with `out_rows` 1.
    pub mask: Option<&'a [u32]>,
}

/// Many sequences on one device: a paged KV cache and the buffers a step runs through, made once.
pub trait BatchState: Send {
    /// The sizes it was made with.
    fn opts(&self) -> &BatchOpts;
    /// Runs one step over `entries` (their tokens together at most `max_tokens`, at most
    /// `max_seqs` entries, distinct slots) and returns one output per entry, in order. A step
    /// whose first position is 0 starts the slot's recurrent state afresh. Positions at and
    /// after an entry's `pos` are overwritten in its blocks.
    fn step(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<StepOutput>, EngineError>;
    /// Copies every layer's K and V rows of block `src` into block `dst`, for each pair, before
    /// the next step reads or writes them (the prefix cache's copy on write where a prompt parts
    /// from a cached one inside a block). Blocks past the cache are a typed error.
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<(), EngineError>;
    /// The counters of the last step (dispatches, passes, submits; zeros on the CPU).
    fn last_step_counters(&self) -> StepCounters;
    /// Runs one step like [`Self::step`] with a GPU timestamp around every dispatch, and returns
    /// the GPU time per kernel label instead of the outputs. Executors without timestamps give
    /// [`EngineError::Unsupported`].
    fn profile_step(&mut self, entries: &[BatchEntry<'_>]) -> Result<Vec<KernelTime>, EngineError> {
        let _ = entries;
        Err(EngineError::Unsupported { what: "profiling a batched step on this device".into() })
    }
}

/// Typed checks every executor makes before a step: sizes, slots, tokens, tables, wants.
pub(crate) fn check_entries(o: &BatchOpts, vocab: usize, entries: &[BatchEntry<'_>]) -> Result<usize, EngineError> {
    if entries.is_empty() {
        return Err(EngineError::Usage("a batched step of no sequences".into()));
    }
    if entries.len() > o.max_seqs {
        return Err(EngineError::Usage(format!("a step of {} sequences (at most {})", entries.len(), o.max_seqs)));
    }
    let mut seen = vec![false; o.max_seqs];
    let mut total = 0usize;
    for (i, e) in entries.iter().enumerate() {
        if e.slot >= o.max_seqs || std::mem::replace(&mut seen[e.slot], true) {
            return Err(EngineError::Usage(format!("entry {i}: slot {} (below {}, one entry per slot)", e.slot, o.max_seqs)));
        }
        if e.tokens.is_empty() {
            return Err(EngineError::Usage(format!("entry {i}: no tokens")));
        }
        let end = e.pos.saturating_add(e.tokens.len());
        if end > o.n_ctx {
            return Err(EngineError::ContextOverflow { tokens: end, n_ctx: o.n_ctx });
        }
        if end > e.table.blocks().len() * o.block_len {
            return Err(EngineError::Usage(format!(
                "entry {i}: positions {}..{end} with {} blocks of {} positions",
                e.pos,
                e.table.blocks().len(),
                o.block_len
            )));
        }
        if let Some(&b) = e.table.blocks().iter().find(|&&b| b as usize >= o.n_blocks) {
            return Err(EngineError::Usage(format!("entry {i}: block {b} in a cache of {} blocks", o.n_blocks)));
        }
        if e.out_rows == 0 || e.out_rows > e.tokens.len() {
            return Err(EngineError::Usage(format!("entry {i}: outputs of {} rows of its {}", e.out_rows, e.tokens.len())));
        }
        if let Some(&id) = e.tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab });
        }
        if let Want::TopK(k) = e.want
            && !(1..=super::super::backend::MAX_TOP_K).contains(&k)
        {
            return Err(EngineError::Usage(format!("entry {i}: Want::TopK({k}) (1 to {})", super::super::backend::MAX_TOP_K)));
        }
        if let Some(m) = e.mask
            && (m.len() != vocab.div_ceil(32) || e.out_rows != 1)
        {
            return Err(EngineError::Usage(format!(
                "entry {i}: an allowed-id mask of {} words over {} output rows (one row; {} words for a vocabulary of {vocab})",
                m.len(),
                e.out_rows,
                vocab.div_ceil(32)
            )));
        }
        total += e.tokens.len();
    }
    let decode: usize = entries.iter().filter(|e| e.decode).map(|e| e.tokens.len()).sum();
    if decode > o.max_decode_rows() {
        return Err(EngineError::Usage(format!("a step of {decode} decode rows (at most {})", o.max_decode_rows())));
    }
    let out: usize = entries.iter().filter(|e| e.want != Want::Nothing).map(|e| e.out_rows).sum();
    if out > o.head_rows() {
        return Err(EngineError::Usage(format!("a step of {out} output rows (at most {})", o.head_rows())));
    }
    if total > o.max_tokens {
        return Err(EngineError::Usage(format!("a step of {total} tokens (at most {})", o.max_tokens)));
    }
    Ok(total)
}

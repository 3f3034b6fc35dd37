//! The interface between the session (tokens, sampling, stop conditions) and an executor of the
//! [`ModelGraph`](super::graph::ModelGraph) on one device. A [`Backend`] is the loaded model
//! (weights uploaded, kernels compiled), shared by every session; a [`BackendState`] is one
//! sequence's KV cache and the activation buffers it runs through.

use super::EngineError;

/// The KV cache's storage type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvType {
    /// f16 K and V (the default).
    #[default]
    F16,
    /// q8_0 blocks (half the memory, slightly less exact).
    Q8_0,
    /// Exact f32 K and V: the CPU executor only (a reference for checking against float32
    /// implementations); the GPU refuses it with [`EngineError::Unsupported`].
    F32,
}

impl KvType {
    /// `f16` / `q8_0` / `f32`.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::F32 => "f32",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<KvType, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            "f32" => Ok(KvType::F32),
            other => Err(format!("unknown KV cache type `{other}` (f16, q8_0, f32 on the CPU)")),
        }
    }
}

/// Sizes of one sequence's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateOpts {
    /// Cache positions (the context length).
    pub n_ctx: usize,
    /// Most tokens one prefill step runs (the ubatch).
    pub ubatch: usize,
    /// KV cache type.
    pub kv: KvType,
}

/// The tokens a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepInput<'a> {
    /// These ids, at positions `pos ..`.
    Tokens(&'a [u32]),
    /// One token: the id the previous step's [`Want::Argmax`] chose, which stayed on the device.
    LastArgmax,
}

/// What a step returns about the next-token distribution after its last token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Nothing (a prefill chunk that is not the last).
    Nothing,
    /// The argmax id only (4 bytes read back on the GPU).
    Argmax,
    /// The `k` (≤ [`MAX_TOP_K`]) largest raw logits with their ids, largest first.
    TopK(usize),
    /// The whole raw logits row.
    Logits,
}

/// The most steps [`BackendState::submit`] keeps outstanding.
pub const MAX_IN_FLIGHT: usize = 2;

/// Rows of each LFM2 conv layer's ring of `Bx` rows (boostr's position-indexed conv state): a
/// step may start up to `CONV_RING - (kernel - 1)` positions before the furthest one run, so
/// discarding pipelined tokens or reusing most of a prefix never re-runs the sequence.
pub const CONV_RING: usize = 16;

/// Which positions a sequence with recurrent state (LFM2's conv rings of [`CONV_RING`] rows)
/// may resume at: position 0 always, else a position whose `kernel - 1` predecessors are still
/// in the ring.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RecurrentWindow {
    /// `kernel - 1` (0: no recurrent state, every position is fine).
    km1: usize,
    /// One past the furthest position run since the sequence last started at 0.
    end: usize,
}

impl RecurrentWindow {
    pub(crate) fn new(conv_kernel: usize) -> RecurrentWindow {
        RecurrentWindow { km1: conv_kernel.saturating_sub(1), end: 0 }
    }

    /// The smallest position other than 0 a step may start at.
    pub(crate) fn floor(&self) -> usize {
        if self.km1 == 0 { 0 } else { (self.end + self.km1).saturating_sub(CONV_RING) }
    }

    /// [`EngineError::Usage`] unless a step may start at `pos`.
    pub(crate) fn check(&self, pos: usize) -> Result<(), EngineError> {
        if pos != 0 && pos < self.floor() {
            return Err(EngineError::Usage(format!(
                "a step at position {pos}: the conv state holds positions from {} on (resume there or later, or start again at 0)",
                self.floor()
            )));
        }
        Ok(())
    }

    /// Records a step of `n` tokens at `pos`.
    pub(crate) fn ran(&mut self, pos: usize, n: usize) {
        self.end = if pos == 0 { n } else { self.end.max(pos + n) };
    }
}

/// The most tokens of one [`BackendState::verify`] step: the last accepted token and up to
/// [`MAX_DRAFT`](super::batch::MAX_DRAFT) drafts.
pub const MAX_VERIFY_ROWS: usize = super::batch::MAX_DRAFT + 1;

/// The most candidates [`Want::TopK`] returns.
pub const MAX_TOP_K: usize = 128;

/// A step's result, matching its [`Want`].
#[derive(Clone, Debug, PartialEq)]
pub enum StepOutput {
    /// For [`Want::Nothing`].
    Nothing,
    /// The argmax id.
    Argmax(u32),
    /// `(id, logit)`, largest first (ties: lower id first).
    TopK(Vec<(u32, f32)>),
    /// The raw logits.
    Logits(Vec<f32>),
    /// One output per row of a batched entry that asked for several
    /// ([`BatchEntry::out_rows`](super::batch::BatchEntry::out_rows)), in order.
    Rows(Vec<StepOutput>),
}

/// Work counted per decode step (the structural budget tests assert).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepCounters {
    /// Compute dispatches recorded.
    pub dispatches: usize,
    /// Compute passes recorded.
    pub passes: usize,
    /// Queue submits.
    pub submits: usize,
    /// Host nanoseconds spent recording and submitting the step.
    pub host_ns: u64,
}

/// GPU time of one kernel label over a profiled step.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel's label.
    pub label: String,
    /// Nanoseconds over all its dispatches.
    pub ns: f64,
    /// Dispatches.
    pub count: usize,
}

/// A loaded model on one device.
pub trait Backend: Send + Sync {
    /// A new sequence with its own cache (allocated here, never during decoding).
    fn new_state(&self, opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError>;
    /// The device, for messages and stats (`"NVIDIA H200 (Vulkan)"`, `"CPU (2 threads)"`).
    fn device_name(&self) -> String;
    /// Whether this runs on a GPU.
    fn is_gpu(&self) -> bool;
    /// The time the load spent writing weights to the device (`None`: no device writes).
    fn weight_write_time(&self) -> Option<std::time::Duration> {
        None
    }
    /// The time the load's writing thread waited for the host to lay out the next matrix
    /// (`None`: no device writes).
    fn weight_wait_time(&self) -> Option<std::time::Duration> {
        None
    }
    /// A state for many sequences at once (a paged KV cache; [`super::batch`]), allocated here.
    /// Executors without batched steps give [`EngineError::Unsupported`].
    fn new_batch(&self, opts: &super::batch::BatchOpts) -> Result<Box<dyn super::batch::BatchState>, EngineError> {
        let _ = opts;
        Err(EngineError::Unsupported { what: format!("batched steps on {}", self.device_name()) })
    }
}

/// One sequence on a device.
pub trait BackendState: Send {
    /// Runs a step at cache positions `pos .. pos + n` (`n` = the input's tokens, at most the
    /// ubatch) and returns `want` about the distribution after the last token. Positions at and
    /// after `pos` are overwritten: truncating the sequence is running at a smaller `pos`.
    fn step(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<StepOutput, EngineError> {
        if self.in_flight() > 0 {
            return Err(EngineError::Usage(format!("a step with {} submitted steps not collected", self.in_flight())));
        }
        self.submit(input, pos, want)?;
        self.collect()
    }
    /// Starts a step (as [`Self::step`] runs it) without waiting for its output, which
    /// [`Self::collect`] returns later; outputs come in submission order, and at most
    /// [`MAX_IN_FLIGHT`] steps are outstanding. A GPU records and submits the step and returns
    /// while it runs, so the CPU records the next step (input [`StepInput::LastArgmax`]) while the
    /// GPU runs this one: pipelined decoding. Executors without a queue (the CPU) run the step
    /// here and keep its output.
    fn submit(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(), EngineError>;
    /// Waits for the oldest submitted step and returns its output ([`EngineError::Usage`] when
    /// none is outstanding).
    fn collect(&mut self) -> Result<StepOutput, EngineError>;
    /// Steps submitted and not yet collected.
    fn in_flight(&self) -> usize;
    /// The ids [`Want::Argmax`] (and so [`StepInput::LastArgmax`]) never chooses, until changed
    /// (generation with `ignore_eos` masks the end-of-generation ids; empty: none). Applies to
    /// steps submitted after the call.
    fn set_argmax_mask(&mut self, ids: &[u32]) -> Result<(), EngineError>;
    /// Whether [`Self::set_step_bits`] is implemented (false: a constrained generation reads
    /// whole logits rows and masks them on the host).
    fn applies_step_bits(&self) -> bool {
        false
    }
    /// An allowed-id bitmask (`ceil(vocab / 32)` words; bit `id % 32` of word `id / 32` set where
    /// `id` may be chosen) for the next submitted step that wants an output: every id it does
    /// not allow gets `-f32::MAX` before that step's argmax, top-k or logits (a constraint's
    /// mask, applied on the device so that an id or candidates are all that comes back). Used
    /// by that one step.
    fn set_step_bits(&mut self, bits: &[u32]) -> Result<(), EngineError> {
        let _ = bits;
        Err(EngineError::Unsupported { what: "allowed-id masks on this executor".into() })
    }
    /// [`Self::step`] with device timestamps around every kernel: GPU time per kernel label.
    /// Devices without timestamps (and the CPU) give [`EngineError::Unsupported`].
    fn profile_step(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(StepOutput, Vec<KernelTime>), EngineError> {
        let _ = (input, pos, want);
        Err(EngineError::Unsupported { what: "profiling on this device".into() })
    }
    /// The smallest position other than 0 a step may start at (0: any). Models with recurrent
    /// state (LFM2's conv rings) keep a bounded window of it, so a step that backs up further
    /// than this must start the sequence again at 0.
    fn resume_floor(&self) -> usize {
        0
    }
    /// Runs `tokens` (1 to [`MAX_VERIFY_ROWS`]) at cache positions `pos ..` as [`Self::step`]
    /// does and returns `want` after each of them, in order: a speculative verification step,
    /// the last accepted token and the drafts after it, whose rows take the kernels of decoding
    /// (so each row's output equals a decode step's at its position). Waits for nothing
    /// outstanding ([`EngineError::Usage`] when a step is in flight). Executors without it give
    /// [`EngineError::Unsupported`].
    fn verify(&mut self, tokens: &[u32], pos: usize, want: Want) -> Result<Vec<StepOutput>, EngineError> {
        let _ = (tokens, pos, want);
        Err(EngineError::Unsupported { what: "speculative verification on this device".into() })
    }
    /// [`Self::verify`] of `tokens` at `pos` in one submit with device timestamps around every
    /// kernel: GPU time per kernel label (the outputs are dropped). Executors without
    /// verification or timestamps give [`EngineError::Unsupported`].
    fn profile_verify(&mut self, tokens: &[u32], pos: usize) -> Result<Vec<KernelTime>, EngineError> {
        let _ = (tokens, pos);
        Err(EngineError::Unsupported { what: "profiling a verification step on this device".into() })
    }
    /// Makes what [`Self::verify`] needs now (a GPU compiles its plan), so that the first
    /// verification step does not pay for it; a no-op where nothing is made.
    fn prepare_verify(&mut self) -> Result<(), EngineError> {
        Ok(())
    }
    /// Clears per-sequence state other than the cache (recurrent state of later architectures),
    /// after waiting for the outstanding steps, whose outputs are dropped.
    fn reset(&mut self) -> Result<(), EngineError>;
    /// The counters of the last decode step (one token).
    fn last_step_counters(&self) -> StepCounters;
}

/// Load progress: weight bytes uploaded (or prepared, on the CPU) so far, out of the total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadProgress {
    /// Bytes done.
    pub done: u64,
    /// Bytes in all.
    pub total: u64,
}

/// A load-progress callback.
pub type ProgressFn<'a> = &'a (dyn Fn(LoadProgress) + Sync);

/// [`EngineError::Usage`] unless `bits` is an allowed-id mask for a vocabulary of `vocab`
/// (`ceil(vocab / 32)` words; [`BackendState::set_step_bits`]).
pub(crate) fn check_mask_words(vocab: usize, bits: &[u32]) -> Result<(), EngineError> {
    let words = vocab.div_ceil(32);
    if bits.len() != words {
        return Err(EngineError::Usage(format!("an allowed-id mask of {} words ({words} for a vocabulary of {vocab})", bits.len())));
    }
    Ok(())
}

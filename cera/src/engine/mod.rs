//! The engine: one transformer assembly over boostr's ops.
//!
//! - [`config`]: the resolved [`ModelConfig`] of each architecture (hyperparameters from the
//!   metadata, with the documented defaults);
//! - [`graph`] and `arch/`: the model as a list of ops that both executors run, each
//!   architecture's differences in a file of its own;
//! - [`weights`]: tensors by name with typed errors;
//! - [`backend`]: the interface between a session and a device executor; [`gpu`] (boostr plans
//!   recorded per token) and [`cpu`] (boostr's CPU references, threads over rows) implement it;
//! - [`tuning`]: the GPU plan builder's measured constants as data ([`GpuTuning`], in
//!   [`LoadOptions`]) and the diagnostics for measuring ([`Diagnostics`]);
//! - [`sampler`], [`stop`]: sampling and stop strings on the CPU;
//! - [`cpu_ref`]: an independent llama forward pass, the oracle of the tests;
//! - the library API: [`Engine`] (a loaded model, shared; `load` in `load.rs`), [`Session`]
//!   (one sequence with its own KV cache and prefix reuse) and its generation loop
//!   ([`Session::generate`], streaming to a [`Sink`]).
//!
//! ```no_run
//! use cera::engine::{DeviceChoice, Engine, GenerateOpts, LoadOptions, TokenEvent};
//! let engine = Engine::load("SmolLM2-135M-Instruct.Q4_1.gguf", &LoadOptions { device: DeviceChoice::Cpu, ..Default::default() }, None)?;
//! let mut session = engine.session()?;
//! session.append_text("The capital of France is")?;
//! let out = session.generate(&GenerateOpts::greedy(16), &mut |ev: &TokenEvent| print!("{}", ev.text))?;
//! assert_eq!(out.ids.len(), 16);
//! # Ok::<(), cera::engine::EngineError>(())
//! ```

pub mod arch;
pub mod backend;
pub mod batch;
mod choose;
pub mod config;
pub mod constraint;
pub mod cpu;
pub mod cpu_ref;
mod generate;
pub mod gpu;
pub mod graph;
pub mod hf;
mod load;
mod model;
pub mod options;
pub mod sampler;
mod session;
mod session_spec;
pub mod speculative;
pub mod split;
pub mod stop;
pub mod tuning;
pub mod weights;

pub use backend::{
    Backend, BackendState, KernelTime, KvType, LoadProgress, MAX_IN_FLIGHT, MAX_TOP_K, MAX_VERIFY_ROWS, StateOpts, StepCounters, StepInput, StepOutput, Want,
};
pub use batch::{BatchEntry, BatchOpts, BatchState, Batcher, BatcherMetrics, BatcherOpts, BoxSink, Canceller, MAX_DRAFT, Prompt, RequestHandle};
pub use choose::row_top_logprobs;
pub use config::{Arch, GateAct, LayerKind, LayerRope, ModelConfig};
pub use constraint::{Constraint, TokenConstraint};
pub use generate::{Generation, Sink, Timings, TokenEvent};
pub use graph::{DecodeTraffic, ModelGraph, Op, Slot};
pub use hf::HfModel;
pub use load::{DEFAULT_MAX_CTX, is_hardware_gpu};
pub use model::{Engine, EngineParts, LoadTimes, end_of_generation_ids};
pub use options::{Chains, DecodeGemv, DeviceChoice, DraftSource, FinishReason, GenerateOpts, LoadOptions, Speculative};
pub use sampler::{MAX_TOP_LOGPROBS, SamplerOpts};
pub use session::{CancelToken, Session};
pub use speculative::{DraftPacer, Drafter, ModelDrafter, NgramDrafter, VerifyCost};
pub use stop::StopMatcher;
pub use tuning::{Diagnostics, GpuTuning, TuningError};

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// `general.architecture` names an architecture the engine does not assemble.
    #[error("unknown architecture `{name}` (supported: {})", supported_architectures())]
    UnknownArchitecture {
        /// The name found.
        name: String,
    },
    /// A metadata key the architecture needs is missing.
    #[error("missing metadata key {key}")]
    MissingKey {
        /// The full key.
        key: String,
    },
    /// Hyperparameters that do not fit together.
    #[error("bad model configuration: {reason}")]
    BadConfig {
        /// What disagrees.
        reason: String,
    },
    /// A feature of the file the engine does not support (named).
    #[error("unsupported: {what}")]
    Unsupported {
        /// The feature, with the key or tensor that carries it.
        what: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("missing tensor {name}")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor has the wrong shape.
    #[error("tensor {name} has dims {dims:?} (ggml order), expected {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// Its dims, ggml order.
        dims: Vec<u64>,
        /// The dims the configuration implies.
        expected: Vec<u64>,
    },
    /// A tensor's storage type has no kernel.
    #[error("tensor {name} has type {ty}, which the engine does not run")]
    TensorType {
        /// The tensor's name.
        name: String,
        /// Its type.
        ty: String,
    },
    /// The model file could not be read.
    #[error("model file: {reason}")]
    File {
        /// The reader's error.
        reason: String,
    },
    /// The tokens do not fit the context.
    #[error("{tokens} tokens do not fit the context of {n_ctx} positions")]
    ContextOverflow {
        /// Tokens that would be in the cache.
        tokens: usize,
        /// The context length.
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A device-side failure (validation, out of memory, a buffer over the adapter's limits).
    #[error("{device}: {reason}")]
    Device {
        /// The device.
        device: String,
        /// What failed.
        reason: String,
    },
    /// The engine was used in a way its API does not allow (named).
    #[error("{0}")]
    Usage(String),
    /// A sampler or generation option out of its range, or not a number
    /// ([`SamplerOpts::check`], [`GenerateOpts::check`]).
    #[error("sampler option {option} is {value}: expected {expected}")]
    Sampler {
        /// The option (`temperature`, `top_p`, `top_logprobs`, ...).
        option: &'static str,
        /// The value given, as text (`NaN`, `-1`).
        value: String,
        /// The values it takes.
        expected: &'static str,
    },
    /// The model's tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The model's chat template does not compile.
    #[error("{0}")]
    Template(#[from] crate::chat_template::TemplateError),
    /// An error about the content of a model file, with the file's path.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it (never `InFile` itself).
        source: Box<EngineError>,
    },
}

impl EngineError {
    /// The error without the file it came from: the inner error of [`EngineError::InFile`],
    /// else the error itself.
    pub fn inner(&self) -> &EngineError {
        match self {
            EngineError::InFile { source, .. } => source.inner(),
            e => e,
        }
    }
}

/// `llama, qwen2, ...`: the names of [`Arch::ALL`], for [`EngineError::UnknownArchitecture`].
fn supported_architectures() -> String {
    Arch::ALL.map(Arch::name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unknown_architecture_message_lists_every_architecture() {
        let msg = Arch::from_name("mamba").unwrap_err().to_string();
        assert_eq!(msg, "unknown architecture `mamba` (supported: llama, qwen2, qwen3, gemma3, lfm2)");
        // Every listed name loads, and every architecture is listed (the names are `Arch::ALL`'s).
        for arch in Arch::ALL {
            assert_eq!(Arch::from_name(arch.name()).unwrap(), arch);
            assert!(msg.contains(&format!(" {},", arch.name())) || msg.ends_with(&format!(" {})", arch.name())), "{msg}");
        }
        assert_eq!(Arch::from_name("mistral").unwrap(), Arch::Llama);
    }
}

//! The engine: model assembly over boostr's ops. This module holds the pieces that are in place
//! so far: the resolved [`ModelConfig`] of each architecture (hyperparameters from the metadata,
//! with the documented defaults), the CPU sampler, stop-string matching, and the engine's typed
//! error.

pub mod config;
pub mod cpu_ref;
pub mod sampler;
pub mod stop;

pub use config::{Arch, GateAct, LayerRope, ModelConfig};
pub use sampler::SamplerOpts;
pub use stop::StopMatcher;

/// Why a model cannot be assembled or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// `general.architecture` names an architecture the engine does not assemble.
    #[error("unknown architecture `{name}` (supported: llama, gemma3)")]
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
}

//! [`Engine`]: a loaded model (the device executor, the tokenizer, the chat template and the
//! model's end-of-generation tokens), shared by every [`Session`] made from it.
//!
//! ```no_run
//! use cera::engine::{Engine, GenerateOpts, LoadOptions, TokenEvent};
//! use cera::chat_template::ChatMessage;
//!
//! let engine = Engine::load("SmolLM2-135M-Instruct.Q4_1.gguf", &LoadOptions::default(), None)?;
//! let prompt = engine.chat_template().render(&[ChatMessage::new("user", "Why is the sky blue?")], true)?;
//! let mut session = engine.session()?;
//! session.append_text(&prompt)?;
//! let out = session.generate(&GenerateOpts::greedy(64), &mut |ev: &TokenEvent| print!("{}", ev.text))?;
//! println!("\n[{} tokens, {}]", out.ids.len(), out.finish.name());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::chat_template::ChatTemplate;
use crate::tokenizer::Tokenizer;

use super::EngineError;
use super::backend::{Backend, KvType, StateOpts};
use super::config::ModelConfig;
use super::session::Session;

/// Where a load's time went ([`Engine::load_times`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadTimes {
    /// The whole load.
    pub total: Duration,
    /// Opening the file: its metadata, tokenizer, chat template, graph and tensor checks.
    pub file: Duration,
    /// Opening the device: the GPU's adapter and context (zero on the CPU).
    pub device: Duration,
    /// Preparing the weights and writing them to the device.
    pub weights: Duration,
    /// Of `weights`, the time spent writing to the device (the rest waited for the host to
    /// repack and lay out the matrices); `None` on the CPU.
    pub device_writes: Option<Duration>,
    /// Of `weights`, the time the writing thread waited for the host to lay out the next
    /// matrix (the threads preparing matrices were behind); `None` on the CPU.
    pub host_wait: Option<Duration>,
}

/// What an [`Engine`] is made of: [`Engine::load`] builds these from a model file;
/// [`Engine::from_parts`] takes them from the caller (another executor, a test double).
pub struct EngineParts {
    /// The model on its device.
    pub backend: Arc<dyn Backend>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template.
    pub template: ChatTemplate,
    /// The model's configuration.
    pub config: ModelConfig,
    /// Ids that end generation (see [`end_of_generation_ids`]).
    pub eog: Vec<u32>,
    /// Context length of each session.
    pub n_ctx: usize,
    /// Most prompt tokens one prefill step runs.
    pub ubatch: usize,
    /// KV cache type of each session.
    pub kv: KvType,
}

impl std::fmt::Debug for EngineParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineParts").field("device", &self.backend.device_name()).field("n_ctx", &self.n_ctx).field("ubatch", &self.ubatch).finish()
    }
}

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) template: ChatTemplate,
    pub(crate) config: ModelConfig,
    pub(crate) eog: Vec<u32>,
    pub(crate) state: StateOpts,
    pub(crate) path: Option<PathBuf>,
    pub(crate) name: Option<String>,
    pub(crate) load_times: LoadTimes,
}

/// A loaded model. Cloning is cheap (the model is shared, never copied); `Engine` is `Send +
/// Sync`, and any number of [`Session`]s, each with its own KV cache, run on one engine.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("arch", &self.inner.config.arch).field("device", &self.device_name()).field("n_ctx", &self.inner.state.n_ctx).finish()
    }
}

/// The ids that end generation: the tokenizer's end-of-generation set (EOS, EOT, EOM and the end
/// markers of its vocabulary) together with `<|im_end|>`, `<end_of_turn>` and `<|eot_id|>`
/// where the vocabulary has them. Sorted, without duplicates.
pub fn end_of_generation_ids(tok: &Tokenizer) -> Vec<u32> {
    let sp = tok.special();
    let mut ids: Vec<u32> = sp.eog.iter().copied().chain([sp.eos, sp.eot, sp.eom].into_iter().flatten()).collect();
    ids.extend(["<|im_end|>", "<end_of_turn>", "<|eot_id|>"].iter().filter_map(|t| tok.token_id(t)));
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl Engine {
    /// An engine from its parts. Checks that the sizes are usable: `n_ctx` and `ubatch` at
    /// least 1, the tokenizer's vocabulary within the model's, the end-of-generation ids inside
    /// the vocabulary.
    pub fn from_parts(parts: EngineParts) -> Result<Engine, EngineError> {
        Self::assemble(parts, None, None, LoadTimes::default())
    }

    pub(crate) fn assemble(parts: EngineParts, path: Option<PathBuf>, name: Option<String>, load_times: LoadTimes) -> Result<Engine, EngineError> {
        let EngineParts { backend, tokenizer, template, config, mut eog, n_ctx, ubatch, kv } = parts;
        if n_ctx == 0 {
            return Err(EngineError::Usage("the context length must be at least 1".into()));
        }
        if ubatch == 0 {
            return Err(EngineError::Usage("the batch size (ubatch) must be at least 1".into()));
        }
        if tokenizer.vocab_size() > config.vocab {
            return Err(EngineError::BadConfig {
                reason: format!("the tokenizer has {} tokens, the model's vocabulary {}", tokenizer.vocab_size(), config.vocab),
            });
        }
        if let Some(&id) = eog.iter().find(|&&id| id as usize >= config.vocab) {
            return Err(EngineError::TokenOutOfRange { id, vocab: config.vocab });
        }
        eog.sort_unstable();
        eog.dedup();
        let state = StateOpts { n_ctx, ubatch, kv };
        Ok(Engine { inner: Arc::new(Inner { backend, tokenizer, template, config, eog, state, path, name, load_times }) })
    }

    /// A new session on this model, with its own KV cache (allocated now, `n_ctx` positions).
    pub fn session(&self) -> Result<Session, EngineError> {
        Session::new(self.clone())
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.inner.config
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The chat template: the file's own, or the built-in one for the architecture.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.inner.template
    }

    /// The ids that end generation (sorted).
    pub fn eog_ids(&self) -> &[u32] {
        &self.inner.eog
    }

    /// The device the model runs on (`"NVIDIA H200 (Vulkan)"`, `"CPU (2 threads)"`).
    pub fn device_name(&self) -> String {
        self.inner.backend.device_name()
    }

    /// Whether the model runs on a GPU.
    pub fn is_gpu(&self) -> bool {
        self.inner.backend.is_gpu()
    }

    /// The context length of each session.
    pub fn n_ctx(&self) -> usize {
        self.inner.state.n_ctx
    }

    /// Most prompt tokens one prefill step runs.
    pub fn ubatch(&self) -> usize {
        self.inner.state.ubatch
    }

    /// The KV cache type.
    pub fn kv_type(&self) -> KvType {
        self.inner.state.kv
    }

    /// How long [`Engine::load`] took (zero for [`Engine::from_parts`]).
    pub fn load_time(&self) -> Duration {
        self.inner.load_times.total
    }

    /// Where the load's time went: the file, the device, the weights.
    pub fn load_times(&self) -> LoadTimes {
        self.inner.load_times
    }

    /// The file the model was loaded from.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// The model's `general.name`, when the file has one.
    pub fn model_name(&self) -> Option<&str> {
        self.inner.name.as_deref()
    }

    /// The executor (for its counters and device details).
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_and_sessions_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<Engine>();
        send::<Session>();
        send_sync::<super::super::session::CancelToken>();
    }
}

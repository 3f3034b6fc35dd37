//! cera: the engine layer of the stack. This part holds everything between a file on disk and
//! token ids, usable without a GPU: model files ([`gguf`], [`safetensors`], [`model_file`]),
//! tokenizers ([`tokenizer`]), chat templates ([`chat_template`]), fetching the test models
//! ([`fetch`]) and the engine that runs the models ([`engine`]: [`Engine`], [`Session`]).
//!
//! ## Features
//!
//! - `cli` (default): the `cera` command line (the `cli` module and the `cera` binary) and the
//!   end-to-end bench (the `bench` module, with its llama.cpp runner). It brings clap,
//!   indicatif, ctrlc and ureq. A library that only runs models depends on
//!   `cera = { version = "0.1", default-features = false }` and gets everything above without
//!   them.
//!
//! The HTTP server of a later issue will sit behind a feature of its own (`server`), beside
//! `cli`, on top of the same engine.
//!
//! Every reader here is built to take hostile input: a malformed file gives a typed error,
//! never a panic, a hang or an unbounded allocation.

#![warn(missing_docs)]

// The README's examples, compiled (and where they need no model file, run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(feature = "cli")]
pub mod bench;
pub mod chat_template;
#[cfg(feature = "cli")]
pub mod cli;
pub mod engine;
pub mod fetch;
#[doc(hidden)]
pub mod fuzz_targets;
pub mod gguf;
pub mod model_file;
pub mod safetensors;
#[cfg(feature = "server")]
pub mod server;
pub mod storage;
pub mod tokenizer;

pub use engine::{CancelToken, DeviceChoice, Engine, EngineError, FinishReason, GenerateOpts, Generation, GpuTuning, LoadOptions, Session, Sink, TokenEvent};

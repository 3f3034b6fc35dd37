//! The `cera` command line: one file per subcommand.
//!
//! To add a subcommand (`run`, `chat`, `bench`, ...): add a file with an `Args` struct deriving
//! [`clap::Args`] and a `run(args) -> Result<(), CliError>` function, then one variant to
//! [`Command`] and one arm to [`dispatch`].

mod fetch;
mod inspect;
mod template;
mod tokenize;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// An error for the user: printed as `error: ...` with exit status 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CliError(pub String);

impl CliError {
    /// Wraps any error.
    pub fn from_err(e: impl std::fmt::Display) -> CliError {
        CliError(e.to_string())
    }
}

/// LLM inference: model files, tokenizers, chat templates.
#[derive(Debug, Parser)]
#[command(name = "cera", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a model's architecture, hyperparameters, tokenizer, chat template and tensors.
    Inspect(inspect::Args),
    /// Turn text into token ids (and pieces).
    Tokenize(tokenize::Args),
    /// Render a conversation with the model's chat template.
    Template(template::Args),
    /// Download a test model into the model cache and print its path.
    Fetch(fetch::Args),
}

/// Runs a parsed command line.
pub fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Template(a) => template::run(a),
        Command::Fetch(a) => fetch::run(a),
    }
}

/// Entry point of the `cera` binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A model argument: a path, or the name of a fetchable test model (`smollm2-135m`).
pub fn resolve_model(arg: &str) -> Result<PathBuf, CliError> {
    let p = PathBuf::from(arg);
    if p.exists() {
        return Ok(p);
    }
    match crate::fetch::ModelId::from_name(arg) {
        Ok(id) => crate::fetch::ensure_model(id).map_err(CliError::from_err),
        Err(_) => Err(CliError(format!("{arg}: no such file (and not a known model name)"))),
    }
}

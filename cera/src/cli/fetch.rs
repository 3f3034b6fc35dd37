//! `cera fetch MODEL`: download a test model into the cache.

use super::{CliError, Output};
use std::path::PathBuf;

use crate::fetch::{FetchOptions, ModelId, cache_dir, ensure_model_in};

/// Arguments of `cera fetch`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// `smollm2-135m` or `gemma3-270m` (or `all`).
    pub model: String,
}

/// Runs `cera fetch`.
pub fn run(args: Args, out: &mut Output) -> Result<(), CliError> {
    let ids: Vec<ModelId> = if args.model == "all" { ModelId::ALL.to_vec() } else { vec![ModelId::from_name(&args.model).map_err(CliError::from_err)?] };
    for id in ids {
        let path = ensure(id)?;
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}

/// The fetcher's options from the environment: `$CERA_PYTHON` names the Python interpreter
/// that downloads (`python3` when unset or empty).
pub fn options() -> FetchOptions {
    match std::env::var_os("CERA_PYTHON").filter(|p| !p.is_empty()) {
        Some(python) => FetchOptions { python },
        None => FetchOptions::default(),
    }
}

/// The path of `id` in the model cache, downloaded first if needed, with [`options`].
pub fn ensure(id: ModelId) -> Result<PathBuf, CliError> {
    let dir = cache_dir().map_err(CliError::from_err)?;
    ensure_model_in(id, &dir, &options()).map_err(CliError::from_err)
}

//! `cera fetch MODEL`: download a test model into the cache.

use super::{CliError, Output};
use crate::fetch::{ModelId, ensure_model};

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
        let path = ensure_model(id).map_err(CliError::from_err)?;
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}

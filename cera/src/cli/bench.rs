//! `cera bench [-m MODEL]... [-p N] [-n N] [-r N]`: llama-bench's table for cera (see
//! [`crate::bench`]): pp and tg tokens per second with their spread, the work of one decode step,
//! the achieved bandwidth against the roofline of the same run, and llama.cpp beside it with
//! `--vs-llama-cpp DIR`.

use std::path::PathBuf;

use super::generation::LoadArgs;
use super::{CliError, Output, resolve_model};
use crate::bench::{self, BenchOpts};

/// Arguments of `cera bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example: cera bench -m model.gguf -p 512 -n 128 -r 5 --vs-llama-cpp ~/llama.cpp/bin")]
pub struct Args {
    /// Model files (GGUF) or test model names; may be given several times.
    #[arg(short = 'm', long = "model", default_value = "smollm2-135m", value_name = "MODEL")]
    pub models: Vec<String>,
    /// Prompt lengths to test (comma-separated; 0: no pp test).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512", value_name = "N")]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test (comma-separated; 0: no tg test).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128", value_name = "N")]
    pub n_gen: Vec<usize>,
    /// Timed runs per test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_name = "N")]
    pub reps: usize,
    #[command(flatten)]
    pub load: LoadArgs,
    /// Decode one token at a time (no pipelining), to see what pipelining gives.
    #[arg(long = "no-pipeline")]
    pub no_pipeline: bool,
    /// GPU time per kernel of a decode step and of a prompt step (the top 15), from timestamps.
    #[arg(long)]
    pub profile: bool,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also run each file through the llama-server in DIR (with its lib*.so) and give the ratio.
    #[arg(long = "vs-llama-cpp", value_name = "DIR")]
    pub vs_llama_cpp: Option<PathBuf>,
    /// The port llama-server listens on.
    #[arg(long = "llama-cpp-port", default_value_t = 8097, value_name = "PORT")]
    pub llama_cpp_port: u16,
    /// Milliseconds of GPU load (streaming reads) right before every timed run of either engine,
    /// so that each starts at full clocks (0: none).
    #[arg(long = "warm-ms", default_value_t = 200, value_name = "MS")]
    pub warm_ms: u64,
}

/// Runs `cera bench`.
pub fn run(a: Args, out: &mut Output) -> Result<(), CliError> {
    let models = a.models.iter().map(|m| resolve_model(m)).collect::<Result<Vec<_>, _>>()?;
    let opts = BenchOpts {
        prompts: a.n_prompt,
        gens: a.n_gen,
        reps: a.reps,
        load: a.load.options(None)?,
        pipeline: !a.no_pipeline,
        profile: a.profile,
        llama_cpp: a.vs_llama_cpp,
        llama_cpp_port: a.llama_cpp_port,
        warm_ms: a.warm_ms,
        ..BenchOpts::default()
    };
    let report = bench::run(&models, &opts, &mut |what| super::generation::note(&format!("bench: {what}"))).map_err(CliError::from_err)?;
    let text = if a.json { bench::print_json(&report) } else { bench::print_table(&report) };
    out.write_str(&text)?;
    if !text.ends_with('\n') {
        out.write_str("\n")?;
    }
    Ok(())
}

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
    /// Tokens already in the cache before each test (comma-separated, as llama-bench's
    /// `--n-depth`): every pp and tg test runs at each depth.
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0", value_name = "D")]
    pub n_depth: Vec<usize>,
    /// The cold-start line: the first request of the process, a prompt of N tokens (830 when
    /// given without a value), right after loading, beside the load time.
    #[arg(long = "cold-start", value_name = "N", num_args = 0..=1, default_missing_value = "830")]
    pub cold_start: Option<usize>,
    /// Timed runs per test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5, value_name = "N")]
    pub reps: usize,
    #[command(flatten)]
    pub load: LoadArgs,
    /// Decode one token at a time (no pipelining), to see what pipelining gives.
    #[arg(long = "no-pipeline")]
    pub no_pipeline: bool,
    /// GPU time per kernel of a decode step and of a prompt step (the top 15), from timestamps;
    /// with `--spec-oracle`, of a decode step and a verification step of each `--spec-k`.
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
    /// Many requests through the batcher instead: these counts of requests in flight
    /// (comma-separated), each over the same workload (prompts of 128 to 2048 tokens, outputs of
    /// 128 to 512); total and per-sequence tok/s, time to first token, inter-token latency.
    #[arg(long = "concurrency", value_delimiter = ',', value_name = "N")]
    pub concurrency: Vec<usize>,
    /// With `--concurrency`: cera's side through `cera serve` (started in this process on a
    /// loopback port, `--parallel` the largest concurrency) and its clients over HTTP, streamed
    /// `/v1/completions` requests, as llama.cpp's side is driven.
    #[arg(long = "http")]
    pub http: bool,
    /// Requests in the `--concurrency` workload (default: twice the concurrency, at least 16; 0:
    /// none, for `--profile` alone).
    #[arg(long = "requests", value_name = "N")]
    pub requests: Option<usize>,
    /// The batcher's KV cache size (bytes, or with a K/M/G suffix: `8G`); default: the KV of
    /// its sequences at the context length, at most 4 GiB on a GPU.
    #[arg(long = "kv-budget", value_name = "BYTES", value_parser = super::values::parse_bytes)]
    pub kv_budget: Option<u64>,
    /// The context length of each `--concurrency` sequence (default: the model's, at most 4096).
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    /// The batcher's token budget per step.
    #[arg(long = "max-step-tokens", default_value_t = 512, value_name = "N")]
    pub max_step_tokens: usize,
    /// Milliseconds of GPU load (streaming reads) right before every timed run of either engine,
    /// so that each starts at full clocks (0: none).
    #[arg(long = "warm-ms", default_value_t = 200, value_name = "MS")]
    pub warm_ms: u64,
    /// Speculative decoding's ceiling: tg N (the first `-n`) with oracle drafts (the model's
    /// own greedy continuation, each token wrong with probability 1 - P) at these probabilities
    /// P, for each `--spec-k` (the output is checked equal to plain decoding's).
    #[arg(long = "spec-oracle", value_delimiter = ',', value_name = "P")]
    pub spec_oracle: Vec<f64>,
    /// Drafts a step for `--spec-oracle`.
    #[arg(long = "spec-k", value_delimiter = ',', default_value = "2,4,8", value_name = "K")]
    pub spec_k: Vec<usize>,
    /// With `--concurrency`: every request constrained by this Lark grammar (llguidance, as
    /// `cera serve`'s `grammar` field; its mask applied on the device each step), for what a
    /// constraint costs a token: `'start: /(.|\n)*/'` allows any text, so the outputs keep their
    /// lengths. Needs the `server` feature.
    #[arg(long = "grammar", value_name = "LARK")]
    pub grammar: Option<String>,
    /// With `--concurrency`: speculative decoding on every request (n-gram drafts, or a draft
    /// model's), paced per request as `cera serve` paces it.
    #[command(flatten)]
    pub spec: super::generation::SpecArgs,
}

/// Runs `cera bench`.
pub fn run(a: Args, out: &mut Output) -> Result<(), CliError> {
    let models = a.models.iter().map(|m| resolve_model(m)).collect::<Result<Vec<_>, _>>()?;
    if a.grammar.is_some() && a.concurrency.is_empty() {
        return Err(CliError::Message("--grammar constrains the --concurrency workload: give --concurrency too".into()));
    }
    if a.spec.speculative()?.is_some() && a.concurrency.is_empty() {
        return Err(CliError::Message("--spec-type / --model-draft apply to the --concurrency workload (for one sequence: cera run, or --spec-oracle)".into()));
    }
    if a.http && a.concurrency.is_empty() {
        return Err(CliError::Message("--http drives the --concurrency workload through cera serve: give --concurrency too".into()));
    }
    if a.http && a.profile {
        return Err(CliError::Message("--profile times the in-process batcher's step: not with --http".into()));
    }
    if !a.concurrency.is_empty() {
        return run_concurrency(&a, &models, out);
    }
    if !a.spec_oracle.is_empty() {
        return run_spec_oracle(&a, &models, out);
    }
    let opts = BenchOpts {
        prompts: a.n_prompt,
        gens: a.n_gen,
        depths: a.n_depth,
        cold_prompt: a.cold_start.unwrap_or(0),
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

/// `--spec-oracle`: speculative decoding's speed at chosen acceptance rates.
fn run_spec_oracle(a: &Args, models: &[PathBuf], out: &mut Output) -> Result<(), CliError> {
    if let Some(p) = a.spec_oracle.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(CliError::Message(format!("--spec-oracle {p}: a probability from 0 to 1")));
    }
    if let Some(k) = a.spec_k.iter().find(|&&k| !(1..=crate::engine::MAX_DRAFT).contains(&k)) {
        return Err(CliError::Message(format!("--spec-k {k}: 1 to {}", crate::engine::MAX_DRAFT)));
    }
    let n = a.n_gen.iter().copied().find(|&n| n > 0).unwrap_or(128);
    for path in models {
        let engine = crate::engine::Engine::load(path, &a.load.options(Some(bench::TG_PROMPT + n + 32))?, None).map_err(CliError::from_err)?;
        let name = path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned());
        let rows = bench::speculative::oracle(&engine, n, &a.spec_k, &a.spec_oracle, a.reps).map_err(CliError::from_err)?;
        let profiles = if a.profile { bench::speculative::profile(&engine, &a.spec_k, 12).map_err(CliError::from_err)? } else { Vec::new() };
        let text = if a.json {
            let v = serde_json::json!({"model": name, "device": engine.device_name(), "n_gen": n, "rows": rows, "step_profiles": profiles});
            serde_json::to_string_pretty(&v).map_err(|e| CliError::from_err(bench::BenchError::Usage(e.to_string())))? + "\n"
        } else {
            let mut t = bench::speculative::print(&name, &engine.device_name(), n, &rows);
            if !profiles.is_empty() {
                t += &bench::speculative::print_profile(&profiles);
            }
            t
        };
        out.write_str(&text)?;
    }
    Ok(())
}

/// The constraint of `--grammar` and a reader of its masks' count and host nanoseconds.
type GrammarCost = (crate::engine::Constraint, Box<dyn Fn() -> (u64, u64)>);

#[cfg(feature = "server")]
fn grammar_constraint(engine: &crate::engine::Engine, g: &str) -> Result<GrammarCost, CliError> {
    use std::sync::atomic::Ordering;
    let grammars = crate::server::grammar::Grammars::new(engine).map_err(|e| CliError::Message(format!("--grammar: {e}")))?;
    let c = grammars.lark(g).map_err(|e| CliError::Message(format!("--grammar: {e}")))?;
    let cost = grammars.cost.clone();
    Ok((c, Box::new(move || (cost.masks.load(Ordering::Relaxed), cost.nanos.load(Ordering::Relaxed)))))
}

#[cfg(not(feature = "server"))]
fn grammar_constraint(_: &crate::engine::Engine, _: &str) -> Result<GrammarCost, CliError> {
    Err(CliError::Message("--grammar needs cera built with the `server` feature (llguidance)".into()))
}

/// `--concurrency`: the batcher's workload at each count of requests in flight.
fn run_concurrency(a: &Args, models: &[PathBuf], out: &mut Output) -> Result<(), CliError> {
    // Each run's batcher holds as many sequences as the run keeps in flight (`concurrency::run`).
    let opts = crate::engine::BatcherOpts { kv_budget: a.kv_budget, max_step_tokens: a.max_step_tokens, ..Default::default() };
    for path in models {
        let engine = crate::engine::Engine::load(path, &a.load.options(a.ctx_size)?, None).map_err(CliError::from_err)?;
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let note = &mut |what: &str| super::generation::note(&format!("bench: {what}"));
        let draft = match &a.spec.model_draft {
            Some(d) => Some(
                crate::engine::Engine::load(resolve_model(d)?, &a.load.options(Some(engine.n_ctx()))?, None)
                    .map_err(|e| CliError::Message(format!("--model-draft {d}: {e}")))?,
            ),
            None => None,
        };
        if a.http {
            let (n_ctx, vocab, device) = (engine.n_ctx(), engine.config().vocab as u32, engine.device_name());
            let ban = bench::concurrency::not_utf8(engine.tokenizer());
            let rows = http_rows(a, engine, draft, opts, note)?;
            let name = format!("{name} through cera serve (HTTP)");
            if !a.json {
                out.write_str(&bench::concurrency::print_rows(&name, &device, &rows))?;
            }
            let llama = llama_rows(a, path, n_ctx, vocab, &ban, note)?;
            print_beside(a, &name, &device, &rows, &[], llama.as_deref(), out)?;
            continue;
        }
        let grammar = match &a.grammar {
            Some(g) => Some(grammar_constraint(&engine, g)?),
            None => None,
        };
        let each = bench::concurrency::Requests {
            constraint: grammar.as_ref().map(|g| &g.0),
            speculative: a.spec.speculative()?,
            draft: draft.as_ref().map(|d| (d, a.spec.draft_p_min)),
        };
        let rows = bench::concurrency::run(&engine, &a.concurrency, a.requests, opts, each, note).map_err(CliError::from_err)?;
        if let Some((_, cost)) = &grammar {
            let (masks, nanos) = cost();
            note(&format!("the grammar's masks: {masks}, {:.1} µs each on the host", nanos as f64 / 1e3 / masks.max(1) as f64));
        }
        // `--profile`: one batched decode step per concurrency, at the first nonzero `-d` (else
        // 1024 tokens deep), then the same with a prompt chunk filling the step's token budget.
        let mut profiles = Vec::new();
        if a.profile {
            let depth = a.n_depth.iter().copied().find(|&d| d > 0).unwrap_or(1024);
            for &c in &a.concurrency {
                let rest = opts.max_step_tokens.saturating_sub(c);
                for prompt in std::iter::once(0).chain((rest > 0).then_some(rest)) {
                    note(&format!("profiling a step of {c} decode rows and {prompt} prompt rows at depth {depth}"));
                    profiles.push(bench::batch_profile::profile_step(&engine, c, prompt, depth, &opts, 12).map_err(CliError::from_err)?);
                }
            }
        }
        // llama.cpp's server on the same file and workload, after cera's engine is gone.
        let (n_ctx, vocab, device) = (engine.n_ctx(), engine.config().vocab as u32, engine.device_name());
        let ban = bench::concurrency::not_utf8(engine.tokenizer());
        drop((engine, draft));
        if !a.json {
            // cera's rows first: llama.cpp's side may fail or take long.
            out.write_str(&bench::concurrency::print_rows(&name, &device, &rows))?;
            if !profiles.is_empty() {
                out.write_str(&bench::batch_profile::print(&name, &profiles))?;
            }
        }
        let llama = llama_rows(a, path, n_ctx, vocab, &ban, note)?;
        print_beside(a, &name, &device, &rows, &profiles, llama.as_deref(), out)?;
    }
    Ok(())
}

/// `--http`: cera's rows through `cera serve` on `engine` (and the draft model).
#[cfg(feature = "server")]
fn http_rows(
    a: &Args,
    engine: crate::engine::Engine,
    draft: Option<crate::engine::Engine>,
    opts: crate::engine::BatcherOpts,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<bench::concurrency::ConcurrencyRow>, CliError> {
    let speculative = a.spec.speculative()?.map(|s| {
        let kind = if draft.is_some() { "draft" } else { "ngram" };
        serde_json::json!({"type": kind, "draft_max": s.draft_max, "draft_min": s.draft_min, "ngram": s.ngram})
    });
    let each = bench::serve_load::HttpRequests { grammar: a.grammar.clone(), speculative, draft_p_min: a.spec.draft_p_min };
    let models = crate::server::Models { target: engine, draft };
    bench::serve_load::run(models, opts, &a.concurrency, a.requests, &each, note).map_err(CliError::from_err)
}

#[cfg(not(feature = "server"))]
fn http_rows(
    _: &Args,
    _: crate::engine::Engine,
    _: Option<crate::engine::Engine>,
    _: crate::engine::BatcherOpts,
    _: &mut dyn FnMut(&str),
) -> Result<Vec<bench::concurrency::ConcurrencyRow>, CliError> {
    Err(CliError::Message("--http needs cera built with the `server` feature".into()))
}

/// `--vs-llama-cpp`: llama.cpp's server on the same file and workload.
fn llama_rows(
    a: &Args,
    path: &std::path::Path,
    n_ctx: usize,
    vocab: u32,
    ban: &[u32],
    note: &mut dyn FnMut(&str),
) -> Result<Option<Vec<bench::concurrency::ConcurrencyRow>>, CliError> {
    let Some(dir) = &a.vs_llama_cpp else { return Ok(None) };
    bench::concurrency::run_llama_cpp(dir, path, a.llama_cpp_port, &a.concurrency, a.requests, n_ctx, vocab, ban, note).map(Some).map_err(CliError::from_err)
}

/// After cera's rows: llama.cpp's and the ratios, or (`--json`) everything.
fn print_beside(
    a: &Args,
    name: &str,
    device: &str,
    rows: &[bench::concurrency::ConcurrencyRow],
    profiles: &[bench::batch_profile::BatchStepProfile],
    llama: Option<&[bench::concurrency::ConcurrencyRow]>,
    out: &mut Output,
) -> Result<(), CliError> {
    if a.json {
        let v = serde_json::json!({"model": name, "device": device, "cera": rows, "llama_cpp": llama, "step_profiles": profiles});
        let text = serde_json::to_string_pretty(&v).map_err(|e| CliError::from_err(bench::BenchError::Usage(e.to_string())))? + "\n";
        return out.write_str(&text);
    }
    let mut t = String::new();
    if let Some(llama) = llama {
        let model = name.split(' ').next().unwrap_or(name);
        t += &format!("\n{}", bench::concurrency::print_rows(&format!("{model} through llama.cpp (-np N)"), device, llama));
        t += "\n| streams | cera total tok/s | llama.cpp total tok/s | ratio | cera TTFT p99 ms | llama.cpp TTFT p99 ms |\n|---|---|---|---|---|---|\n";
        for (c, l) in rows.iter().zip(llama) {
            t += &format!(
                "| {} | {:.0} | {:.0} | {:.2}x | {:.0} | {:.0} |\n",
                c.concurrency,
                c.total_tok_s,
                l.total_tok_s,
                c.total_tok_s / l.total_tok_s,
                c.ttft_p99_ms,
                l.ttft_p99_ms
            );
        }
    }
    out.write_str(&t)
}

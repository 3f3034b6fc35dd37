//! `cera run [-m MODEL] [PROMPT | -p PROMPT | -f FILE]`: generate text from one prompt.
//!
//! The prompt is one user turn of the model's chat template (`--system` adds a system turn);
//! `--raw` sends it as it is, with the model's default BOS, control tokens written in it parsed
//! as llama.cpp parses them. It may come from a file or standard input (`prompt.rs`). The text
//! streams to standard output, a stats line goes to standard error; `--json` prints one JSON
//! object instead of the text. Ctrl-C stops the generation and finishes the output, with exit
//! status 130 (`interrupt.rs`).

mod interrupt;
mod logprobs;
mod prompt;

use std::path::PathBuf;

use serde_json::{Value, json};

use self::interrupt::{EXIT_INTERRUPTED, Interrupt};
use self::logprobs::TextWithLogprobs;
use self::prompt::PromptSource;
use super::generation::{Generator, ModelArgs, SampleArgs, TextSink, engine_error, load, note, stats_line, warn_fallback_template};
use super::{CliError, Output};
use crate::chat_template::ChatMessage;
use crate::engine::{Engine, Generation, TokenEvent};

/// Arguments of `cera run`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Flags follow llama.cpp's names and defaults. Example: cera run -n 64 --temp 0 \"Why is the sky blue?\"\n\
                          With no prompt given, a piped standard input is the prompt (echo TEXT | cera run). \
                          Ctrl-C stops the generation and finishes the output (exit status 130).")]
pub struct Args {
    /// The prompt (`-`: read it from standard input) [default: standard input when it is not a
    /// terminal].
    #[arg(conflicts_with_all = ["prompt_flag", "file"], value_name = "PROMPT")]
    pub prompt: Option<String>,
    /// The prompt (as a flag; taken as it is).
    #[arg(short = 'p', long = "prompt", id = "prompt_flag", conflicts_with = "file", value_name = "PROMPT", allow_hyphen_values = true)]
    pub prompt_flag: Option<String>,
    /// Read the prompt from FILE (`-`: standard input), as UTF-8; one final line end is dropped.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The model and the device.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling and stopping.
    #[command(flatten)]
    pub sample: SampleArgs,
    /// A system message before the prompt (not with --raw).
    #[arg(long, value_name = "TEXT", conflicts_with = "raw", allow_hyphen_values = true)]
    pub system: Option<String>,
    /// Send the prompt as it is (no chat template), with the model's default BOS.
    #[arg(long)]
    pub raw: bool,
    /// Report the N most likely tokens with their log-probabilities at each step, 0 to 100 (in
    /// the JSON object with --json, else one line per token on standard error).
    #[arg(long = "top-logprobs", default_value_t = 0, value_name = "N", value_parser = super::values::top_logprobs, allow_hyphen_values = true)]
    pub top_logprobs: usize,
    /// Print one JSON object (prompt_ids, generated_ids, text, finish_reason, timings, logprobs
    /// and top_logprobs) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// The prompt text as the model sees it.
fn prompt_text(engine: &Engine, args: &Args, prompt: &str) -> Result<String, CliError> {
    if args.raw {
        return Ok(prompt.to_string());
    }
    let mut msgs = Vec::new();
    if let Some(s) = &args.system {
        msgs.push(ChatMessage::new("system", s.clone()));
    }
    msgs.push(ChatMessage::new("user", prompt));
    engine.chat_template().render(&msgs, true).map_err(CliError::from_err)
}

/// Milliseconds to 3 decimals, speeds to 2: what a script needs, without float noise.
fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn rate(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn json_output(engine: &Engine, prompt_ids: &[u32], g: &Generation, seed: u64, top_logprobs: bool) -> Value {
    let t = &g.timings;
    let mut v = json!({
        "prompt_ids": prompt_ids,
        "generated_ids": g.ids,
        "text": g.text,
        "finish_reason": g.finish.name(),
        "timings": {
            "load_ms": ms(engine.load_time()),
            "prompt_tokens": g.prompt_tokens,
            "prefill_tokens": g.prefilled,
            "prefill_ms": ms(t.prefill),
            "prefill_tok_s": rate(t.prefill_tok_s()),
            "generated_tokens": g.ids.len(),
            "decode_ms": ms(t.decode),
            "decode_tok_s": rate(t.decode_tok_s()),
            "decode_steps": t.decode_steps,
            "draft_tokens": t.draft_tokens,
            "accepted_tokens": t.accepted_tokens,
        },
        "seed": seed,
        "device": engine.device_name(),
    });
    if top_logprobs {
        let (chosen, tops) = logprobs::json_fields(engine.tokenizer(), g);
        v["logprobs"] = chosen;
        v["top_logprobs"] = tops;
    }
    v
}

/// Runs `cera run`.
pub fn run(args: Args, out: &mut Output) -> Result<(), CliError> {
    // Before anything slow: a Ctrl-C while the model loads still finishes the output.
    let interrupt = Interrupt::install();
    args.sample.opts()?; // bad flags before the prompt is read and the model loads
    let source = PromptSource::from_args(args.prompt.as_deref(), args.prompt_flag.as_deref(), args.file.as_deref())?;
    let prompt = interrupt.reading(source.is_terminal(), || source.read())?;
    let engine = load(&args.model)?;
    if !args.raw {
        warn_fallback_template(&engine);
    }
    let text = prompt_text(&engine, &args, &prompt)?;
    let mut session = engine.session().map_err(CliError::from_err)?;
    session.append_text(&text).map_err(CliError::from_err)?;
    let prompt_ids = session.tokens().to_vec();
    let mut opts = args.sample.opts()?;
    opts.top_logprobs = args.top_logprobs;
    interrupt.watch(session.cancel_token());
    let mut generator = Generator::new(&args.model, &args.sample.spec, &engine)?;
    let g = if args.json {
        generator.generate(&mut session, &opts, &mut |_: &TokenEvent| {}).map_err(engine_error)?
    } else if args.top_logprobs > 0 {
        let mut sink = TextWithLogprobs::new(TextSink::new(out, session.cancel_token()), engine.tokenizer());
        let g = generator.generate(&mut session, &opts, &mut sink);
        sink.text.finish()?;
        g.map_err(engine_error)?
    } else {
        let mut sink = TextSink::new(out, session.cancel_token());
        let g = generator.generate(&mut session, &opts, &mut sink);
        // A closed output ends quietly (the generation was cancelled by the sink).
        sink.finish()?;
        g.map_err(engine_error)?
    };
    if args.json {
        writeln!(out, "{}", json_output(&engine, &prompt_ids, &g, opts.sampler.seed, args.top_logprobs > 0))?;
        out.flush()?;
    }
    note(&stats_line(&engine, &g, (opts.sampler.temperature > 0.0).then_some(opts.sampler.seed), true));
    if interrupt.interrupted() {
        // The output is complete (and flushed): end as a program stopped by Ctrl-C.
        out.flush()?;
        std::process::exit(EXIT_INTERRUPTED);
    }
    Ok(())
}

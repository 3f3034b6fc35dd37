//! What `cera run` and `cera chat` share: the model and device flags, the sampling flags
//! (llama.cpp's names and defaults), loading with a progress bar, streaming text to standard
//! output, and the stats line.

use std::hash::{BuildHasher, Hasher};
use std::io::Write;

use super::progress::LoadBar;
use super::{CliError, Output, resolve_model, values};
use crate::chat_template::TemplateSource;
use crate::engine::tuning::{DIAGNOSTIC_KEYS, TUNING_KEYS};
use crate::engine::{
    CancelToken, DecodeGemv, DeviceChoice, Diagnostics, Engine, EngineError, GenerateOpts, Generation, GpuTuning, KvType, LoadOptions, SamplerOpts, Sink,
    TokenEvent,
};

/// The model and how to load it.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// Model: a GGUF file, a Hugging Face folder (config.json, safetensors, tokenizer.json), or
    /// a test model name (`smollm2-135m`, `gemma3-270m`), fetched into the cache when missing.
    #[arg(short = 'm', long, default_value = "smollm2-135m", value_name = "MODEL")]
    pub model: String,
    /// Context length [default: the model's trained context or 4096, whichever is smaller].
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    pub ctx_size: Option<usize>,
    #[command(flatten)]
    pub load: LoadArgs,
}

/// How to load a model, shared by `run`, `chat` and `bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Where to run: `auto` (a real GPU when there is one, else the CPU), `gpu` (the adapter numr
    /// picks; `NUMR_ADAPTER` chooses, lavapipe counts) or `cpu`.
    #[arg(long, default_value = "auto", value_parser = str::parse::<DeviceChoice>, value_name = "DEVICE")]
    pub device: DeviceChoice,
    /// Most prompt tokens one prefill step runs (the ubatch).
    #[arg(short = 'b', long = "batch-size", visible_alias = "ubatch-size", default_value_t = 512, value_name = "N", value_parser = values::batch_size, allow_hyphen_values = true)]
    pub batch_size: usize,
    /// KV cache type: `f16`, `q8_0`, or `f32` (exact; the CPU only).
    #[arg(long = "kv-type", default_value = "f16", value_parser = str::parse::<KvType>, value_name = "TYPE")]
    pub kv_type: KvType,
    /// CPU threads, 1 to 4 per core [default: every core].
    #[arg(short = 't', long, value_name = "N", value_parser = values::threads, allow_hyphen_values = true)]
    pub threads: Option<usize>,
    /// The GPU decode GEMVs' activations: `auto` (int8 for models of hidden size 2048 or more),
    /// `f32` or `int8`.
    #[arg(long = "decode-gemv", default_value = "auto", value_parser = str::parse::<DecodeGemv>, value_name = "KIND")]
    pub decode_gemv: DecodeGemv,
    /// Sets a field of the GPU plan builder's tuning (speed only; `cera::GpuTuning`); may be
    /// given several times, applied in order. Keys: see `--tune help`.
    #[arg(long = "tune", value_name = "KEY=VALUE", value_parser = tune_setting)]
    pub tune: Vec<String>,
    /// For measuring only: a diagnostic switch (`ablate=-NAME,+NAME` drops or doubles decode
    /// dispatches and makes the output wrong; `step_trace=1`; `chain_verbose=1`); may be given
    /// several times.
    #[arg(long = "diag", value_name = "KEY=VALUE", value_parser = diag_setting)]
    pub diag: Vec<String>,
    /// Split the model's layers across these GPUs: adapter indices as `cera devices` lists them,
    /// or parts of their names, comma-separated (`0,1`; the same adapter twice makes two devices
    /// of it). One entry: just that adapter.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub devices: Vec<String>,
    /// Each device's share of the layers with `--devices` (`1,3`: a quarter of them on the
    /// first) [default: equal shares].
    #[arg(long = "tensor-split", value_delimiter = ',', value_name = "R1,R2,...")]
    pub tensor_split: Vec<f64>,
}

/// The keys of `table` with what each takes, one a line.
fn key_list(table: &[(&str, &str)]) -> String {
    table.iter().map(|(k, v)| format!("\n  {k}: {v}")).collect()
}

/// Checks one `--tune` setting (`help`: the list of keys).
fn tune_setting(s: &str) -> Result<String, String> {
    if s.trim() == "help" {
        return Err(format!("the keys of --tune KEY=VALUE:{}", key_list(TUNING_KEYS)));
    }
    GpuTuning::default().set_pair(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

/// Checks one `--diag` setting (`help`: the list of keys).
fn diag_setting(s: &str) -> Result<String, String> {
    if s.trim() == "help" {
        return Err(format!("the keys of --diag KEY=VALUE (for measuring only):{}", key_list(DIAGNOSTIC_KEYS)));
    }
    Diagnostics::default().set_pair(s).map(|()| s.to_string()).map_err(|e| e.to_string())
}

impl LoadArgs {
    /// The load options, with context length `n_ctx` (the `--tune` and `--diag` settings
    /// applied in order).
    pub fn options(&self, n_ctx: Option<usize>) -> Result<LoadOptions, CliError> {
        let mut tuning = GpuTuning::default();
        for s in &self.tune {
            tuning.set_pair(s).map_err(|e| CliError::Message(format!("--tune {s}: {e}")))?;
        }
        let mut measuring_only = Diagnostics::default();
        for s in &self.diag {
            measuring_only.set_pair(s).map_err(|e| CliError::Message(format!("--diag {s}: {e}")))?;
        }
        Ok(LoadOptions {
            device: self.device,
            n_ctx,
            ubatch: self.batch_size,
            kv: self.kv_type,
            threads: self.threads,
            decode_gemv: self.decode_gemv,
            tuning,
            measuring_only,
            devices: self.devices.clone(),
            tensor_split: self.tensor_split.clone(),
        })
    }
}

/// Speculative decoding (llama.cpp's flag names).
#[derive(Debug, Clone, clap::Args)]
pub struct SpecArgs {
    /// Speculative decoding: `ngram` (prompt-lookup drafts: the last tokens looked up earlier in
    /// the prompt and output, what followed them proposed and verified in one step; greedy and
    /// top-k sampling) or `none`.
    #[arg(long = "spec-type", default_value = "none", value_parser = ["none", "ngram"])]
    pub spec_type: String,
    /// Most draft tokens per step (1 to 16).
    #[arg(long = "draft-max", default_value_t = 8, value_name = "N")]
    pub draft_max: usize,
    /// Fewest draft tokens worth verifying (fewer: a plain decode step).
    #[arg(long = "draft-min", default_value_t = 1, value_name = "N")]
    pub draft_min: usize,
    /// Speculative decoding with drafts from this smaller model (same vocabulary), loaded
    /// like the main one on the same device (`cera serve`: every request's default drafter,
    /// `{"speculative": {"type": "draft"}}` asks for it).
    #[arg(long = "model-draft", visible_alias = "md", value_name = "MODEL")]
    pub model_draft: Option<String>,
    /// With `--model-draft`: drafts stop at the first token the draft model gives a
    /// probability below P, 0 to 1 (0: never).
    #[arg(long = "draft-p-min", default_value_t = 0.0, value_name = "P", value_parser = values::draft_p_min, allow_hyphen_values = true)]
    pub draft_p_min: f32,
}

impl SpecArgs {
    /// The speculative options (`None` for `--spec-type none`); out-of-range drafts are a
    /// message naming the flags.
    pub fn speculative(&self) -> Result<Option<crate::engine::Speculative>, CliError> {
        if self.spec_type == "ngram" && self.model_draft.is_some() {
            return Err(CliError::Message("--spec-type ngram and --model-draft: choose one drafter".into()));
        }
        let on = self.spec_type == "ngram" || self.model_draft.is_some();
        let source = if self.model_draft.is_some() { crate::engine::DraftSource::Model } else { crate::engine::DraftSource::Ngram };
        let s = on.then_some(crate::engine::Speculative { draft_max: self.draft_max, draft_min: self.draft_min, source, ..Default::default() });
        if let Some(s) = s {
            GenerateOpts { speculative: Some(s), ..Default::default() }.check().map_err(|e| CliError::Message(format!("--draft-max / --draft-min: {e}")))?;
        }
        Ok(s)
    }
}

/// Sampling and stopping.
#[derive(Debug, Clone, clap::Args)]
pub struct SampleArgs {
    /// Tokens to generate (-1: until an end-of-generation token or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256, value_name = "N", value_parser = values::n_predict, allow_hyphen_values = true)]
    pub n_predict: i64,
    /// Temperature, finite and at least 0 (0: greedy).
    #[arg(long, default_value_t = 0.8, value_name = "T", value_parser = values::temperature, allow_hyphen_values = true)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40, value_name = "K")]
    pub top_k: usize,
    /// Nucleus sampling, above 0 and at most 1 (1: off).
    #[arg(long = "top-p", default_value_t = 0.95, value_name = "P", value_parser = values::top_p, allow_hyphen_values = true)]
    pub top_p: f32,
    /// Drop tokens below P times the most likely one's probability, 0 to 1 (0: off).
    #[arg(long = "min-p", default_value_t = 0.05, value_name = "P", value_parser = values::min_p, allow_hyphen_values = true)]
    pub min_p: f32,
    /// Penalize repeated tokens, above 0 (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0, value_name = "X", value_parser = values::repeat_penalty, allow_hyphen_values = true)]
    pub repeat_penalty: f32,
    /// Recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64, value_name = "N")]
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every recent token (0: off).
    #[arg(long = "presence-penalty", default_value_t = 0.0, value_name = "X", value_parser = values::penalty, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of recent tokens (0: off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0, value_name = "X", value_parser = values::penalty, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
    /// Seed of the sampler (-1: a random one, printed in the stats line).
    #[arg(short = 's', long, default_value_t = -1, value_name = "SEED", value_parser = values::seed, allow_hyphen_values = true)]
    pub seed: i64,
    /// Stop when the text contains STR (never printed); may be given several times.
    #[arg(long, value_name = "STR", allow_hyphen_values = true)]
    pub stop: Vec<String>,
    /// Keep generating through end-of-generation tokens (they are never chosen).
    #[arg(long = "ignore-eos")]
    pub ignore_eos: bool,
    /// Decode one token at a time: wait for each greedy id before recording the next step
    /// (pipelining is on by default; the output is the same).
    #[arg(long = "no-pipeline")]
    pub no_pipeline: bool,
    #[command(flatten)]
    pub spec: SpecArgs,
}

impl SampleArgs {
    /// The generation options (a random seed for `-s -1`); out-of-range speculative drafts
    /// are a message naming the flags.
    pub fn opts(&self) -> Result<GenerateOpts, CliError> {
        let seed = u64::try_from(self.seed).unwrap_or_else(|_| std::collections::hash_map::RandomState::new().build_hasher().finish() >> 1);
        let sampler = SamplerOpts {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_last_n: self.repeat_last_n,
            seed,
        };
        Ok(GenerateOpts {
            sampler,
            max_tokens: usize::try_from(self.n_predict).unwrap_or(usize::MAX),
            stop: self.stop.clone(),
            stop_tokens: Vec::new(),
            ignore_eos: self.ignore_eos,
            top_logprobs: 0,
            pipeline: !self.no_pipeline,
            constraint: None,
            logit_bias: Vec::new(),
            speculative: self.spec.speculative()?,
        })
    }
}

/// Generates in a session, with the draft model's drafts when `--model-draft` was given.
pub struct Generator {
    drafter: Option<crate::engine::ModelDrafter>,
}

impl Generator {
    /// Loads the draft model (as `model` says, on the same device) when `spec` names one.
    pub fn new(model: &ModelArgs, spec: &SpecArgs, target: &Engine) -> Result<Generator, CliError> {
        let Some(draft) = &spec.model_draft else { return Ok(Generator { drafter: None }) };
        let args = ModelArgs { model: draft.clone(), ctx_size: Some(target.n_ctx()), load: model.load.clone() };
        let engine = load(&args)?;
        let drafter = crate::engine::ModelDrafter::new(&engine, target)
            .map_err(|e| CliError::Message(format!("--model-draft {draft}: {e}")))?
            .with_p_min(spec.draft_p_min);
        Ok(Generator { drafter: Some(drafter) })
    }

    /// [`crate::engine::Session::generate`], or `generate_drafted` with the draft model.
    pub fn generate<S: crate::engine::Sink + ?Sized>(
        &mut self,
        session: &mut crate::engine::Session,
        opts: &GenerateOpts,
        sink: &mut S,
    ) -> Result<crate::engine::Generation, crate::engine::EngineError> {
        match &mut self.drafter {
            Some(d) => {
                let g = session.generate_drafted(opts, sink, d);
                if let Some(e) = d.take_error() {
                    note(&format!("warning: the draft model stopped drafting: {e}"));
                }
                g
            }
            None => session.generate(opts, sink),
        }
    }
}

/// Resolves (fetching if needed) and loads the model, with a progress bar on a terminal.
pub fn load(args: &ModelArgs) -> Result<Engine, CliError> {
    let path = resolve_model(&args.model)?;
    let opts = args.load.options(args.ctx_size)?;
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let bar = LoadBar::new(format!("loading {name}"));
    let engine = Engine::load(&path, &opts, Some(&|p| bar.update(p)));
    bar.finish();
    let engine = engine.map_err(CliError::from_err)?;
    let trained = engine.config().context_length;
    if let Some(n) = args.ctx_size.filter(|&n| trained > 0 && n > trained) {
        note(&format!("warning: -c {n} is past the model's trained context of {trained} positions: text past position {trained} may be poor"));
    }
    Ok(engine)
}

/// Warns once, on standard error, when the model has no chat template of its own and the
/// built-in format of its architecture is used: a base model (Gemma 3 270M) was never trained
/// on one, and `--raw` is then what it expects.
pub fn warn_fallback_template(engine: &Engine) {
    if let TemplateSource::Builtin(b) = engine.chat_template().source() {
        note(&format!("warning: the model has no chat template; using the built-in `{}` format (for a base model, --raw sends the prompt as it is)", b.name()));
    }
}

/// A generation error for the user (with the flag to change for a prompt over the context).
pub fn engine_error(e: EngineError) -> CliError {
    match e {
        EngineError::ContextOverflow { .. } => CliError::Message(format!("{e} (a longer context: -c/--ctx-size)")),
        e => CliError::from_err(e),
    }
}

/// Streams text pieces to standard output, flushing each. When the output is closed, it
/// remembers the error and cancels the generation.
pub struct TextSink<'o> {
    out: &'o mut Output,
    cancel: CancelToken,
    /// The first write error.
    pub error: Option<CliError>,
    /// Whether the last text written ended with a newline (or nothing was written).
    pub at_line_start: bool,
}

impl<'o> TextSink<'o> {
    /// A sink writing to `out`, cancelling through `cancel` on a write error.
    pub fn new(out: &'o mut Output, cancel: CancelToken) -> TextSink<'o> {
        TextSink { out, cancel, error: None, at_line_start: true }
    }

    /// Ends the reply's line; returns the first write error, if any.
    pub fn finish(mut self) -> Result<(), CliError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if !self.at_line_start {
            writeln!(self.out)?;
        }
        self.out.flush()
    }
}

impl Sink for TextSink<'_> {
    fn token(&mut self, ev: &TokenEvent<'_>) {
        if self.error.is_some() || ev.text.is_empty() {
            return;
        }
        match self.out.write_str(ev.text).and_then(|()| self.out.flush()) {
            Ok(()) => self.at_line_start = ev.text.ends_with('\n'),
            Err(e) => {
                self.error = Some(e);
                self.cancel.cancel();
            }
        }
    }
}

/// The stats line: load time, prompt tokens (reused ones) and speed, generated tokens and speed,
/// the finish reason, the seed and the device.
pub fn stats_line(engine: &Engine, g: &Generation, seed: Option<u64>, with_load: bool) -> String {
    let mut s = String::new();
    if with_load {
        s.push_str(&format!("load {:.2} s | ", engine.load_time().as_secs_f64()));
    }
    s.push_str(&format!("prompt {} tokens", g.prompt_tokens));
    if g.reused > 0 {
        s.push_str(&format!(" ({} reused)", g.reused));
    }
    s.push_str(&format!(", {} run at {:.1} tok/s | ", g.prefilled, g.timings.prefill_tok_s()));
    s.push_str(&format!("generated {} tokens at {:.1} tok/s | {}", g.ids.len(), g.timings.decode_tok_s(), g.finish.name()));
    let t = &g.timings;
    if t.draft_tokens > 0 {
        s.push_str(&format!(
            " | drafts {} of {} accepted ({:.0}%), {:.2} tokens per step",
            t.accepted_tokens,
            t.draft_tokens,
            100.0 * t.accepted_tokens as f64 / t.draft_tokens as f64,
            t.decode_tokens as f64 / t.decode_steps.max(1) as f64
        ));
    }
    if let Some(seed) = seed {
        s.push_str(&format!(" | seed {seed}"));
    }
    s.push_str(&format!(" | {}", engine.device_name()));
    s
}

/// Writes a line to standard error (nothing to do if it is closed too).
pub fn note(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

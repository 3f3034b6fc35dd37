//! End-to-end speed, as llama-bench measures it: `cera bench` and `cargo xtask bench --model`.
//!
//! For each model file and each test:
//! - `ppN`: a prompt of N tokens run into an empty cache (one generation of one token, timed
//!   through the prompt's distribution), tokens per second;
//! - `tgN`: N greedy tokens decoded after a 12-token prompt, through end-of-generation tokens
//!   (`ignore_eos`, masked on the device), with the session's pipelining; tokens per second of
//!   the decode steps.
//!
//! Each figure is the median of `reps` runs after a warm-up, with the spread (min to max). A tg
//! row also gives what one decode step does: dispatches, compute passes and submits, the host
//! time recording it, the weight bytes it reads ([`ModelGraph::decode_traffic`]), the achieved
//! GB/s, and that as a fraction of the streaming-read roofline measured in the same run
//! ([`roofline::stream_read_bps`]). `--profile` adds the GPU time per kernel of a decode step
//! and of a prompt step, from timestamps; `--vs-llama-cpp DIR` runs the same files through a
//! llama.cpp server ([`llama_cpp`]) and gives the ratio beside each row.

pub mod batch_profile;
pub mod concurrency;
pub mod llama_cpp;
mod report;
pub mod roofline;
#[cfg(feature = "server")]
pub mod serve_load;
pub mod speculative;
mod warm;

pub use warm::ClockWarmer;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use report::{print_json, print_table};

use crate::engine::{DeviceChoice, Engine, EngineError, GenerateOpts, HfModel, KernelTime, LoadOptions, ModelGraph};
use crate::gguf::GgufFile;

/// Why a bench stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// Loading or running the model.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Measuring the roofline.
    #[error("measuring the roofline: {0}")]
    Roofline(String),
    /// The llama.cpp side.
    #[error("llama.cpp: {0}")]
    LlamaCpp(String),
    /// The `cera serve` side (`--http`).
    #[error("cera serve: {0}")]
    Serve(String),
    /// Loading the GPU before a timed run.
    #[error("warming the GPU: {0}")]
    Warm(String),
    /// Bad options.
    #[error("{0}")]
    Usage(String),
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOpts {
    /// Prompt lengths (`-p`; 0 entries skip pp).
    pub prompts: Vec<usize>,
    /// Generation lengths (`-n`; 0 entries skip tg).
    pub gens: Vec<usize>,
    /// Tokens already in the cache before each pp and tg test (`-d`, as llama-bench's
    /// `--n-depth`): every test runs at each depth.
    pub depths: Vec<usize>,
    /// The cold-start line (`--cold-start N`): the first request of the process, a prompt of
    /// this many tokens, right after loading (0: none).
    pub cold_prompt: usize,
    /// Timed runs per test (`-r`), after one warm-up.
    pub reps: usize,
    /// How to load each model.
    pub load: LoadOptions,
    /// Pipelined decoding (on by default).
    pub pipeline: bool,
    /// GPU time per kernel (`--profile`).
    pub profile: bool,
    /// Kernels listed per profile.
    pub profile_top: usize,
    /// A llama.cpp server directory to compare with (`--vs-llama-cpp`).
    pub llama_cpp: Option<PathBuf>,
    /// The port llama-server listens on.
    pub llama_cpp_port: u16,
    /// Milliseconds of GPU load right before every timed run of either engine, so that each
    /// starts at full clocks ([`ClockWarmer`]; 0: none).
    pub warm_ms: u64,
}

impl Default for BenchOpts {
    fn default() -> Self {
        BenchOpts {
            prompts: vec![512],
            gens: vec![128],
            depths: vec![0],
            cold_prompt: 0,
            reps: 5,
            load: LoadOptions::default(),
            pipeline: true,
            profile: false,
            profile_top: 15,
            llama_cpp: None,
            llama_cpp_port: 8097,
            warm_ms: 200,
        }
    }
}

/// A median with its spread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// The median.
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
}

impl Spread {
    /// Of some samples (none: zeros).
    pub fn of(mut v: Vec<f64>) -> Spread {
        if v.is_empty() {
            return Spread::default();
        }
        v.sort_by(f64::total_cmp);
        Spread { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1] }
    }
}

/// One decode step's work (tg rows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepWork {
    /// Compute dispatches.
    pub dispatches: usize,
    /// Compute passes.
    pub passes: usize,
    /// Queue submits.
    pub submits: usize,
    /// Host microseconds recording and submitting it.
    pub host_us: f64,
    /// Weight bytes read.
    pub weight_bytes: u64,
    /// Achieved weight bandwidth at the median speed.
    pub gb_s: f64,
    /// `gb_s` over the roofline of the run (0 when none was measured).
    pub roofline_fraction: f64,
}

/// GPU time of one kernel per token.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelShare {
    /// The kernel's label.
    pub kernel: String,
    /// Microseconds per token.
    pub us_per_token: f64,
    /// Dispatches per step.
    pub dispatches: usize,
    /// Share of the step's GPU time.
    pub fraction: f64,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchRow {
    /// The file name.
    pub model: String,
    /// The file's quantization mix as `general.file_type` names it (`Q4_K_M`), else the format
    /// of most of the weights a decode step reads (`Q4_0`, `AWQ`).
    pub quant: String,
    /// The file's size.
    pub file_bytes: u64,
    /// `ppN` / `tgN`, with ` @ dD` at a depth of `D` tokens.
    pub test: String,
    /// Tokens in the cache before the test.
    pub depth: usize,
    /// Tokens per second.
    pub tok_s: Spread,
    /// Milliseconds per token at the median.
    pub ms_per_token: f64,
    /// tg rows.
    pub step: Option<StepWork>,
    /// llama.cpp's tokens per second on the same test.
    pub llama_cpp: Option<Spread>,
    /// GPU time per kernel (with `--profile`): per decode token on tg rows, per prompt token
    /// on pp rows.
    pub profile: Vec<KernelShare>,
}

/// Everything a run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchReport {
    /// The device cera ran on.
    pub device: String,
    /// Whether that is a GPU (the step's dispatches, host time and roofline are GPU figures).
    pub gpu: bool,
    /// The streaming-read roofline of the run in GB/s (GPU runs).
    pub roofline_gb_s: Option<f64>,
    /// llama.cpp's device line, when compared.
    pub llama_cpp_device: Option<String>,
    /// One row per model and test.
    pub rows: Vec<BenchRow>,
    /// The command's options, for the record.
    pub reps: usize,
    /// Whether decoding was pipelined.
    pub pipeline: bool,
    /// Milliseconds of GPU load before each timed run (GPU runs; 0: none).
    pub warm_ms: u64,
    /// The decode GEMVs' activations (`auto`, `f32`, `int8`).
    pub decode_gemv: String,
    /// What went wrong on the way (a llama.cpp run that failed).
    pub notes: Vec<String>,
    /// Per model: its load, and with `--cold-start` its first request.
    pub cold: Vec<ColdStart>,
}

/// A model's load and the first request after it (the process's first, for the first model).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ColdStart {
    /// The file name.
    pub model: String,
    /// Seconds `Engine::load` took.
    pub load_s: f64,
    /// The file's bytes over that time.
    pub load_gb_s: f64,
    /// Of the load: opening the file (metadata, tokenizer, template, checks), seconds.
    pub file_s: f64,
    /// Opening the device, seconds.
    pub device_s: f64,
    /// Preparing and writing the weights, seconds.
    pub weights_s: f64,
    /// Of `weights_s`, writing to the device (GPU only).
    pub device_writes_s: Option<f64>,
    /// Of `weights_s`, waiting for the host to lay out the next matrix (GPU only).
    pub host_wait_s: Option<f64>,
    /// The first request's prompt tokens (0: not measured).
    pub prompt: usize,
    /// Its time to first token (the prefill through the first token's distribution), ms.
    pub ttft_ms: f64,
    /// Its prompt tokens per second.
    pub prefill_tok_s: f64,
}

/// Deterministic prompt ids over the vocabulary (a fixed LCG; ids 0..vocab).
pub(crate) fn prompt_ids(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ salt;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

pub(crate) fn shares(times: &[KernelTime], per: f64, top: usize) -> Vec<KernelShare> {
    let total: f64 = times.iter().map(|t| t.ns).sum();
    let mut v: Vec<KernelShare> = times
        .iter()
        .map(|t| KernelShare {
            kernel: t.label.clone(),
            us_per_token: t.ns / 1e3 / per,
            dispatches: t.count,
            fraction: if total > 0.0 { t.ns / total } else { 0.0 },
        })
        .collect();
    v.sort_by(|a, b| b.us_per_token.total_cmp(&a.us_per_token));
    v.truncate(top);
    v
}

/// Sums several profiles of the same step, label by label, divided by their number.
pub(crate) fn mean_profile(runs: Vec<Vec<KernelTime>>) -> Vec<KernelTime> {
    let n = runs.len().max(1) as f64;
    let mut acc: Vec<KernelTime> = Vec::new();
    for run in runs {
        for t in run {
            match acc.iter_mut().find(|a| a.label == t.label) {
                Some(a) => a.ns += t.ns,
                None => acc.push(t),
            }
        }
    }
    acc.iter_mut().for_each(|a| a.ns /= n);
    acc
}

pub(crate) const TG_PROMPT: usize = 12;

/// A test's name: `pp512`, `tg128 @ d4096`.
fn test_name(kind: &str, n: usize, depth: usize) -> String {
    if depth == 0 { format!("{kind}{n}") } else { format!("{kind}{n} @ d{depth}") }
}

/// The `(kind, n, depth)` of a [`test_name`].
fn parse_test(name: &str) -> Option<(&str, usize, usize)> {
    let (test, depth) = match name.split_once(" @ d") {
        Some((t, d)) => (t, d.parse().ok()?),
        None => (name, 0),
    };
    let (kind, n) = test.split_at_checked(2)?;
    Some((kind, n.parse().ok()?, depth))
}

/// The context a test needs: its depth, its tokens, and the token generated after them.
fn test_ctx(kind: &str, n: usize, depth: usize) -> usize {
    if kind == "tg" { depth.max(if depth == 0 { TG_PROMPT } else { 0 }) + n + 1 } else { depth + n + 1 }
}

/// The longest context any of `opts`'s tests needs, the cold-start prompt (and its one
/// generated token) included.
pub fn longest_test(opts: &BenchOpts) -> usize {
    let mut longest = if opts.cold_prompt > 0 { opts.cold_prompt + 1 } else { 0 };
    for &d in &opts.depths {
        for &p in opts.prompts.iter().filter(|&&p| p > 0) {
            longest = longest.max(test_ctx("pp", p, d));
        }
        for &n in opts.gens.iter().filter(|&&n| n > 0) {
            longest = longest.max(test_ctx("tg", n, d));
        }
    }
    longest
}

/// Measures one model file (see the module docs). `roofline_bps`: the run's roofline, for the
/// fraction column.
pub fn bench_model(path: &Path, opts: &BenchOpts, roofline_bps: Option<f64>) -> Result<(Engine, Vec<BenchRow>, ColdStart), BenchError> {
    if opts.reps == 0 {
        return Err(BenchError::Usage("-r must be at least 1".into()));
    }
    let no_profile = || BenchError::Usage("--profile times the GPU's kernels: it needs a GPU run (not --device cpu)".into());
    if opts.profile && opts.load.device == DeviceChoice::Cpu {
        return Err(no_profile());
    }
    if opts.depths.is_empty() {
        return Err(BenchError::Usage("-d needs at least one depth (0: an empty cache)".into()));
    }
    // Room for the longest test and the token generated after it.
    let load = LoadOptions { n_ctx: Some(opts.load.n_ctx.unwrap_or(0).max(longest_test(opts) + 1)), ..opts.load.clone() };
    let t_load = std::time::Instant::now();
    let engine = Engine::load(path, &load, None)?;
    let load_s = t_load.elapsed().as_secs_f64();
    if opts.profile && !engine.is_gpu() {
        return Err(no_profile());
    }
    let (traffic, file_bytes, file_type) = if path.is_dir() {
        // A Hugging Face folder: its graph and tensors as the engine loaded them; its size is
        // that of its safetensors shards.
        let hf = HfModel::open(path)?;
        let bytes = hf.safetensors().shard_paths().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum();
        (hf.graph()?.decode_traffic(&hf)?, bytes, None)
    } else {
        let file = GgufFile::open(path).map_err(|e| EngineError::File { reason: e.to_string() })?;
        (ModelGraph::from_gguf(&file)?.decode_traffic(&file)?, std::fs::metadata(path).map(|m| m.len()).unwrap_or(0), file.file_type())
    };
    // What the file is known by (`Q4_K_M`), else what most of its weights are.
    let quant = file_type.map_or_else(|| traffic.main_format().to_string(), str::to_string);
    let model = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let vocab = engine.config().vocab;
    let row = |test: String, depth: usize, tok_s: Spread| BenchRow {
        model: model.clone(),
        quant: quant.clone(),
        file_bytes,
        test,
        depth,
        ms_per_token: if tok_s.median > 0.0 { 1e3 / tok_s.median } else { 0.0 },
        tok_s,
        step: None,
        llama_cpp: None,
        profile: Vec::new(),
    };
    let lt = engine.load_times();
    let mut cold = ColdStart {
        model: model.clone(),
        load_s,
        load_gb_s: file_bytes as f64 / load_s.max(1e-9) / 1e9,
        file_s: lt.file.as_secs_f64(),
        device_s: lt.device.as_secs_f64(),
        weights_s: lt.weights.as_secs_f64(),
        device_writes_s: lt.device_writes.map(|d| d.as_secs_f64()),
        host_wait_s: lt.host_wait.map(|d| d.as_secs_f64()),
        prompt: 0,
        ttft_ms: 0.0,
        prefill_tok_s: 0.0,
    };
    let mut s = engine.session()?;
    if opts.cold_prompt > 0 {
        // Before anything else has run: no warm-up, no clock warming.
        s.append_tokens(&prompt_ids(opts.cold_prompt, vocab, 11))?;
        let g = s.generate(&GenerateOpts { pipeline: opts.pipeline, ..GenerateOpts::greedy(1) }, &mut |_: &crate::engine::TokenEvent| {})?;
        (cold.prompt, cold.ttft_ms, cold.prefill_tok_s) = (g.prefilled, g.timings.prefill.as_secs_f64() * 1e3, g.timings.prefill_tok_s());
        s.clear_cache()?;
    }
    let warmer = if engine.is_gpu() { ClockWarmer::new(opts.warm_ms)? } else { None };
    let mut rows = Vec::new();
    for &d in &opts.depths {
        let context = prompt_ids(d, vocab, 3);
        for &p in opts.prompts.iter().filter(|&&p| p > 0) {
            let ids = prompt_ids(p, vocab, p as u64);
            let mut speeds = Vec::new();
            for rep in 0..=opts.reps {
                s.clear_cache()?;
                if d > 0 {
                    // The depth's tokens into the cache, untimed; the test's prompt then
                    // prefills only its own tokens.
                    s.append_tokens(&context)?;
                    s.generate(&GenerateOpts { pipeline: opts.pipeline, ..GenerateOpts::greedy(1) }, &mut |_: &crate::engine::TokenEvent| {})?;
                    s.truncate(d);
                }
                s.append_tokens(&ids)?;
                warm::warm(warmer.as_ref())?;
                let g = s.generate(&GenerateOpts { pipeline: opts.pipeline, ..GenerateOpts::greedy(1) }, &mut |_: &crate::engine::TokenEvent| {})?;
                if g.prefilled != p {
                    return Err(BenchError::Usage(format!("{}: {} prompt tokens ran ({:?})", test_name("pp", p, d), g.prefilled, g.finish)));
                }
                if rep > 0 {
                    speeds.push(g.timings.prefill_tok_s());
                }
            }
            let mut r = row(test_name("pp", p, d), d, Spread::of(speeds));
            if opts.profile && engine.is_gpu() {
                let n = p.min(engine.ubatch());
                let runs = (0..3).map(|_| s.profile_step(n)).collect::<Result<Vec<_>, _>>()?;
                r.profile = shares(&mean_profile(runs), n as f64, opts.profile_top);
            }
            rows.push(r);
        }
        for &n in opts.gens.iter().filter(|&&n| n > 0) {
            // At depth 0 a short prompt; else the depth's tokens are the prompt.
            let ids = if d == 0 { prompt_ids(TG_PROMPT, vocab, 7) } else { context.clone() };
            let opts_tg = GenerateOpts { ignore_eos: true, pipeline: opts.pipeline, ..GenerateOpts::greedy(n + 1) };
            let mut speeds = Vec::new();
            let mut work = StepWork::default();
            let mut host = Vec::new();
            for rep in 0..=opts.reps {
                s.clear_cache()?;
                s.append_tokens(&ids)?;
                warm::warm(warmer.as_ref())?;
                let g = s.generate(&opts_tg, &mut |_: &crate::engine::TokenEvent| {})?;
                if g.timings.decode_steps != n {
                    return Err(BenchError::Usage(format!("{}: {} decode steps ran ({:?})", test_name("tg", n, d), g.timings.decode_steps, g.finish)));
                }
                if rep > 0 {
                    speeds.push(g.timings.decode_tok_s());
                    let c = s.last_step_counters();
                    (work.dispatches, work.passes, work.submits) = (c.dispatches, c.passes, c.submits);
                    host.push(c.host_ns as f64 / 1e3);
                }
            }
            let tok_s = Spread::of(speeds);
            work.host_us = Spread::of(host).median;
            work.weight_bytes = traffic.bytes;
            work.gb_s = traffic.bytes as f64 * tok_s.median / 1e9;
            work.roofline_fraction = roofline_bps.map_or(0.0, |r| work.gb_s * 1e9 / r);
            let mut r = row(test_name("tg", n, d), d, tok_s);
            r.step = Some(work);
            if opts.profile && engine.is_gpu() {
                let runs = (0..5).map(|_| s.profile_step(1)).collect::<Result<Vec<_>, _>>()?;
                r.profile = shares(&mean_profile(runs), 1.0, opts.profile_top);
            }
            rows.push(r);
        }
    }
    Ok((engine, rows, cold))
}

/// The llama.cpp figures for `rows` of one model (the same tests, `reps` runs after a warm-up).
fn llama_cpp_rows(server: &llama_cpp::LlamaServer, rows: &mut [BenchRow], vocab: usize, reps: usize, warmer: Option<&ClockWarmer>) -> Result<(), BenchError> {
    for r in rows.iter_mut() {
        let mut v = Vec::new();
        for rep in 0..=reps {
            warm::warm(warmer)?;
            let (kind, n, d) = parse_test(&r.test).ok_or_else(|| BenchError::Usage(r.test.clone()))?;
            let context = prompt_ids(d, vocab, 3);
            let speed = if kind == "pp" {
                let ids = prompt_ids(n, vocab, n as u64);
                if d == 0 { server.prompt_speed(&ids)? } else { server.prompt_speed_at_depth(&context, &ids)? }
            } else {
                // llama-server fails a request whose random-weight output its text parser
                // refuses (HTTP 500, "does not match the expected Content-only format"): another
                // prompt gives other text. The speed does not depend on the prompt's ids.
                let mut last = None;
                let mut speed = None;
                for (i, salt) in [7u64, 8, 9, 10].into_iter().enumerate() {
                    if i > 0 {
                        warm::warm(warmer)?;
                    }
                    let prompt = if d == 0 { prompt_ids(TG_PROMPT, vocab, salt) } else { prompt_ids(d, vocab, salt) };
                    match server.generation_speed(&prompt, n) {
                        Ok(s) => {
                            speed = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                match speed {
                    Some(s) => s,
                    None => return Err(last.unwrap_or_else(|| BenchError::LlamaCpp("no attempt".into()))),
                }
            };
            if rep > 0 {
                v.push(speed);
            }
        }
        r.llama_cpp = Some(Spread::of(v));
    }
    Ok(())
}

/// Measures every model: the roofline first (on a GPU run), then each file through cera and,
/// when asked, through llama.cpp (one model on the GPU at a time). `progress` is told what runs.
pub fn run(models: &[PathBuf], opts: &BenchOpts, progress: &mut dyn FnMut(&str)) -> Result<BenchReport, BenchError> {
    if models.is_empty() {
        return Err(BenchError::Usage("no model to bench".into()));
    }
    let mut report = BenchReport {
        device: String::new(),
        gpu: false,
        roofline_gb_s: None,
        llama_cpp_device: None,
        rows: Vec::new(),
        reps: opts.reps,
        pipeline: opts.pipeline,
        warm_ms: opts.warm_ms,
        decode_gemv: opts.load.decode_gemv.name().to_string(),
        notes: Vec::new(),
        cold: Vec::new(),
    };
    let mut roofline = None;
    for (i, path) in models.iter().enumerate() {
        progress(&format!("cera: {}", path.display()));
        let (engine, mut rows, cold) = {
            let first = bench_model(path, opts, roofline)?;
            if i == 0 && first.0.is_gpu() {
                // The roofline on the device the model runs on, in the same run.
                progress("roofline: streaming read");
                let ctx = numr::gpu::GpuContext::new().map_err(|e| BenchError::Roofline(e.to_string()))?;
                let bps = roofline::stream_read_bps(&ctx, 1 << 30, 20).map_err(|e| BenchError::Roofline(e.to_string()))?;
                roofline = Some(bps);
                report.roofline_gb_s = Some(bps / 1e9);
                let mut rows = first.1;
                for r in rows.iter_mut() {
                    if let Some(w) = r.step.as_mut() {
                        w.roofline_fraction = w.gb_s * 1e9 / bps;
                    }
                }
                (first.0, rows, first.2)
            } else {
                first
            }
        };
        report.cold.push(cold);
        report.device = engine.device_name();
        report.gpu = engine.is_gpu();
        let vocab = engine.config().vocab;
        drop(engine);
        if let Some(dir) = &opts.llama_cpp {
            progress(&format!("llama.cpp: {}", path.display()));
            // A failure on the llama.cpp side is reported beside the rows, not fatal to them.
            // The same clocks before each of its runs as before cera's (a GPU run only).
            let warmer = if roofline.is_some() { ClockWarmer::new(opts.warm_ms)? } else { None };
            let n_ctx = (longest_test(opts) + 8).max(4096);
            let done = llama_cpp::LlamaServer::start(dir, path, opts.llama_cpp_port, n_ctx).and_then(|server| {
                report.llama_cpp_device = server.device().or(report.llama_cpp_device.take());
                llama_cpp_rows(&server, &mut rows, vocab, opts.reps, warmer.as_ref())
            });
            if let Err(e) = done {
                progress(&format!("llama.cpp failed on {}: {e}", path.display()));
                report.notes.push(format!("llama.cpp on {}: {e}", path.display()));
            }
        }
        report.rows.extend(rows);
    }
    Ok(report)
}

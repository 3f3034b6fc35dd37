//! `cera bench --concurrency 1,8,32,64`: many requests through one [`Batcher`](crate::engine::Batcher), as a server
//! sees them. For each concurrency `c`, a fixed workload of requests (prompts of 128 to 2048
//! tokens, outputs of 128 to 512, greedy through end-of-generation tokens so every request
//! generates its full length) runs with `c` requests in flight at all times: when one finishes
//! the next is submitted. Reported: total decode throughput (generated tokens over the wall
//! time), per-sequence decode tok/s (the median request's), time to first token and
//! inter-token latency at p50 and p99, and the prefix cache's hits (none here: every prompt is
//! different).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::BenchError;
use crate::engine::{BatcherOpts, BoxSink, Constraint, Engine, GenerateOpts, Speculative, TokenEvent};

/// One request of the workload: its prompt and output lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Prompt tokens.
    pub prompt: usize,
    /// Tokens generated.
    pub output: usize,
}

/// The fixed workload of `n` requests: prompt lengths spread over 128..=2048 and outputs over
/// 128..=512 (a deterministic scatter, the same on every run), each shortened to fit `n_ctx`.
pub fn workload(n: usize, n_ctx: usize) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let prompt = 128 + (i * 397) % 1921;
            let output = 128 + (i * 131) % 385;
            let prompt = prompt.min(n_ctx.saturating_sub(output + 1).max(1));
            Request { prompt, output: output.min(n_ctx - prompt) }
        })
        .collect()
}

/// The results at one concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyRow {
    /// Requests in flight.
    pub concurrency: usize,
    /// Requests run.
    pub requests: usize,
    /// Wall time of the whole workload, seconds.
    pub seconds: f64,
    /// Generated tokens over the wall time.
    pub total_tok_s: f64,
    /// The median request's decode speed (its tokens after the first over their time).
    pub per_seq_tok_s: f64,
    /// Time to first token (from submission), milliseconds.
    pub ttft_p50_ms: f64,
    /// Time to first token, 99th percentile.
    pub ttft_p99_ms: f64,
    /// Inter-token latency, milliseconds.
    pub itl_p50_ms: f64,
    /// Inter-token latency, 99th percentile.
    pub itl_p99_ms: f64,
    /// Prompt tokens run.
    pub prefill_tokens: u64,
    /// Sequences preempted for KV memory.
    pub preemptions: u64,
    /// Speculative draft tokens verified (0 without speculation).
    pub drafted_tokens: u64,
    /// Of those, the ones kept.
    pub accepted_tokens: u64,
    /// Where cera's batcher spent the wall time (`None` for llama.cpp's server).
    pub steps: Option<StepTimes>,
}

/// Where a batcher's wall time went over a workload: its steps, split by whether they ran prompt
/// rows, and the host's time between them ([`crate::engine::BatcherMetrics`]'s step fields).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct StepTimes {
    /// Steps with prompt (or recomputed) rows.
    pub prompt_steps: u64,
    /// Their seconds (recording, the device, the readback).
    pub prompt_step_s: f64,
    /// Steps of decode (and verification) rows only.
    pub decode_steps: u64,
    /// Their seconds.
    pub decode_step_s: f64,
    /// Rows of the decode-only steps, on average.
    pub decode_step_rows: f64,
    /// Seconds the batcher's thread spent around its steps (planning, sampling, streaming),
    /// when the device idles.
    pub host_s: f64,
}

impl StepTimes {
    /// The difference of two snapshots of a batcher's metrics (`after` minus `before`).
    pub fn between(before: &crate::engine::BatcherMetrics, after: &crate::engine::BatcherMetrics) -> StepTimes {
        let prompt_steps = after.prompt_steps - before.prompt_steps;
        let decode_steps = (after.steps - before.steps) - prompt_steps;
        let prompt_step_s = after.prompt_step_seconds - before.prompt_step_seconds;
        let step_s = after.step_seconds - before.step_seconds;
        let rows = (after.step_rows - before.step_rows) - (after.prompt_step_rows - before.prompt_step_rows);
        StepTimes {
            prompt_steps,
            prompt_step_s,
            decode_steps,
            decode_step_s: step_s - prompt_step_s,
            decode_step_rows: if decode_steps == 0 { 0.0 } else { rows as f64 / decode_steps as f64 },
            host_s: (after.busy_seconds - before.busy_seconds) - step_s,
        }
    }
}

/// What each request of the workload asks for besides its tokens.
#[derive(Clone, Copy, Default)]
pub struct Requests<'a> {
    /// A constraint on every request (structured output's cost).
    pub constraint: Option<&'a Constraint>,
    /// Speculative decoding on every request (n-gram drafts, or the draft model's).
    pub speculative: Option<Speculative>,
    /// A draft model for the batcher, with its `p_min`.
    pub draft: Option<(&'a Engine, f32)>,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Before each timed run, every server (cera's batcher, `cera serve`, llama.cpp's server) first
/// answers one request of its own: a prompt of this many tokens (at most half the context),
/// [`WARM_UP_TOKENS`] generated, untimed, so that no run pays for a server's first use
/// (pipelines built on first use, buffers grown, clocks raised).
pub const WARM_UP_PROMPT: usize = 512;
/// Tokens the warm-up request generates.
pub const WARM_UP_TOKENS: usize = 4;

/// The warm-up request's prompt ([`WARM_UP_PROMPT`]), distinct from every request of the
/// workload's.
pub(super) fn warm_up_prompt(n_ctx: usize, vocab: u32) -> Vec<u32> {
    prompt_ids(1 << 20, WARM_UP_PROMPT.min(n_ctx / 2).max(1), vocab)
}

/// The prompt of the workload's request `i`: `len` ids scattered over the vocabulary, distinct
/// per request (no prefix hits).
pub(super) fn prompt_ids(i: usize, len: usize, vocab: u32) -> Vec<u32> {
    (0..len).map(|t| ((i * 7919 + t * 104_729 + 17) as u32) % vocab).collect()
}

/// A row from each request's submission instant and token instants.
pub(super) fn row(
    concurrency: usize,
    requests: usize,
    seconds: f64,
    generated: usize,
    times: &[(Instant, Vec<Instant>)],
    prefill_tokens: u64,
    preemptions: u64,
) -> ConcurrencyRow {
    let (mut ttft, mut itl, mut per_seq) = (Vec::new(), Vec::new(), Vec::new());
    for (sub, s) in times {
        if let Some(&first) = s.first() {
            ttft.push(first.duration_since(*sub).as_secs_f64() * 1e3);
            itl.extend(s.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64() * 1e3));
            let d = s.last().map_or(Duration::ZERO, |l| l.duration_since(first)).as_secs_f64();
            if d > 0.0 {
                per_seq.push((s.len() - 1) as f64 / d);
            }
        }
    }
    ConcurrencyRow {
        concurrency,
        requests,
        seconds,
        total_tok_s: generated as f64 / seconds,
        per_seq_tok_s: pct(&mut per_seq, 0.5),
        ttft_p50_ms: pct(&mut ttft.clone(), 0.5),
        ttft_p99_ms: pct(&mut ttft, 0.99),
        itl_p50_ms: pct(&mut itl.clone(), 0.5),
        itl_p99_ms: pct(&mut itl, 0.99),
        prefill_tokens,
        preemptions,
        drafted_tokens: 0,
        accepted_tokens: 0,
        steps: None,
    }
}

/// Runs the workload at each concurrency `c` on `engine`, on a batcher of `c` sequences (`opts`
/// otherwise; llama.cpp's server gets `-np c` likewise): `requests` requests, or (`None`) twice
/// the concurrency and at least 16 (the first requests of the same fixed list), each as `each`
/// says (a constraint, speculative decoding, a draft model). The batcher's size picks its
/// decode path (`GpuTuning::batch_gemv_max_seqs`), so a run of 8 in a batcher of 64 would time
/// another path than a server of 8 runs.
pub fn run(
    engine: &Engine,
    concurrency: &[usize],
    requests: Option<usize>,
    opts: BatcherOpts,
    each: Requests<'_>,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<ConcurrencyRow>, BenchError> {
    let vocab = engine.config().vocab as u32;
    let mut rows = Vec::new();
    if requests == Some(0) {
        // `--requests 0`: no workload (with `--profile`, the step profiles alone).
        return Ok(rows);
    }
    for &c in concurrency {
        if c == 0 {
            return Err(BenchError::Usage("a concurrency of 0".into()));
        }
        let requests = requests.unwrap_or((2 * c).max(16));
        let work = workload(requests, engine.n_ctx());
        let bo = BatcherOpts { max_seqs: c, ..opts };
        let b = match each.draft {
            Some((d, p_min)) => engine.batcher_with_draft(bo, d, p_min)?,
            None => engine.batcher(bo)?,
        };
        note(&format!("concurrency {c}: {requests} requests, a batcher of {} sequences, {} KV blocks", b.batch_opts().max_seqs, b.batch_opts().n_blocks));
        // The warm-up request, untimed; the metrics below count from after it.
        b.submit(warm_up_prompt(engine.n_ctx(), vocab), &GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(WARM_UP_TOKENS) }, None)?.wait()?;
        let warm = b.metrics();
        let start = Instant::now();
        let mut in_flight = std::collections::VecDeque::new();
        let mut times: Vec<(Instant, Arc<Mutex<Vec<Instant>>>)> = Vec::new();
        let mut next = 0;
        let mut generated = 0usize;
        while next < work.len() || !in_flight.is_empty() {
            while in_flight.len() < c && next < work.len() {
                let r = work[next];
                // Distinct prompts (no prefix hits): ids scattered over the vocabulary.
                let prompt = prompt_ids(next, r.prompt, vocab);
                let stamps = Arc::new(Mutex::new(Vec::with_capacity(r.output)));
                let s2 = stamps.clone();
                let sink: BoxSink = Box::new(move |_: &TokenEvent| s2.lock().unwrap_or_else(|p| p.into_inner()).push(Instant::now()));
                let g =
                    GenerateOpts { ignore_eos: true, constraint: each.constraint.cloned(), speculative: each.speculative, ..GenerateOpts::greedy(r.output) };
                in_flight.push_back(b.submit(prompt, &g, Some(sink))?);
                times.push((Instant::now(), stamps));
                next += 1;
            }
            // Whichever request finishes first frees its place.
            loop {
                let done = in_flight.iter().enumerate().find_map(|(i, h): (usize, &crate::engine::RequestHandle)| h.try_result().map(|r| (i, r)));
                if let Some((i, r)) = done {
                    in_flight.remove(i);
                    generated += r?.ids.len();
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        let m = b.metrics();
        let times: Vec<(Instant, Vec<Instant>)> =
            times.into_iter().map(|(sub, s)| (sub, std::mem::take(&mut *s.lock().unwrap_or_else(|p| p.into_inner())))).collect();
        let mut r = row(c, requests, seconds, generated, &times, m.prefill_tokens - warm.prefill_tokens, m.preemptions - warm.preemptions);
        r.steps = Some(StepTimes::between(&warm, &m));
        (r.drafted_tokens, r.accepted_tokens) = (m.drafted_tokens - warm.drafted_tokens, m.accepted_tokens - warm.accepted_tokens);
        rows.push(r);
    }
    Ok(rows)
}

/// The same workload through llama.cpp's server: for each concurrency `c`, a `llama-server` from
/// `dir` with `c` slots of `n_ctx` tokens (`-np c`, continuous batching), and `c` clients that
/// each take the next request of the list as soon as their last one ends. Tokens are counted
/// from the server's timings; TTFT and ITL come from the streamed events. `ban`: token ids
/// llama.cpp may not generate ([`not_utf8`]; see [`LlamaServer::stream_generation`](super::llama_cpp::LlamaServer::stream_generation)).
#[allow(clippy::too_many_arguments)]
pub fn run_llama_cpp(
    dir: &std::path::Path,
    model: &std::path::Path,
    port: u16,
    concurrency: &[usize],
    requests: Option<usize>,
    n_ctx: usize,
    vocab: u32,
    ban: &[u32],
    note: &mut dyn FnMut(&str),
) -> Result<Vec<ConcurrencyRow>, BenchError> {
    let mut rows = Vec::new();
    for &c in concurrency {
        if c == 0 {
            return Err(BenchError::Usage("a concurrency of 0".into()));
        }
        let requests = requests.unwrap_or((2 * c).max(16));
        let work = workload(requests, n_ctx);
        let server = super::llama_cpp::LlamaServer::start_parallel(dir, model, port, n_ctx, c)?;
        server.stream_generation(&warm_up_prompt(n_ctx, vocab), WARM_UP_TOKENS, ban)?;
        note(&format!("llama.cpp, concurrency {c}: {requests} requests"));
        let (seconds, generated, times) = drive(c, &work, 0, vocab, |p, n| server.stream_generation(p, n, ban))?;
        let prefill = work.iter().map(|r| r.prompt as u64).sum();
        rows.push(row(c, requests, seconds, generated, &times, prefill, 0));
    }
    Ok(rows)
}

/// What one HTTP client gets from one streamed request of `n` tokens after `prompt`: the
/// instant of each streamed event that carried text, and the tokens generated.
pub type Streamed = (Vec<Instant>, usize);

/// What [`drive`] measured: the wall time, the tokens generated, and each request's submission
/// instant and event instants.
pub(super) type Driven = (f64, usize, Vec<(Instant, Vec<Instant>)>);

/// Runs `work` through `c` client threads, each taking the next request as soon as its last one
/// ended (`c` requests in flight at all times): the wall time, the tokens generated, and each
/// request's submission instant and event instants. Request `i` sends the prompt
/// [`prompt_ids`]`(first + i, ..)`: a server that keeps its prefix cache from one run to the
/// next gets distinct prompts in each when `first` moves past the last run's.
pub(super) fn drive(
    c: usize,
    work: &[Request],
    first: usize,
    vocab: u32,
    client: impl Fn(&[u32], usize) -> Result<Streamed, BenchError> + Sync,
) -> Result<Driven, BenchError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    // Per client: (submitted, event instants, tokens) of each request it ran.
    type Client = Result<Vec<(Instant, Vec<Instant>, usize)>, BenchError>;
    let results: Vec<Client> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..c)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(r) = work.get(i) else { return Ok(mine) };
                        let sub = Instant::now();
                        let (stamps, n) = client(&prompt_ids(first + i, r.prompt, vocab), r.output)?;
                        mine.push((sub, stamps, n));
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(BenchError::Usage("a client thread panicked".into())))).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut times = Vec::with_capacity(work.len());
    let mut generated = 0;
    for r in results {
        for (sub, stamps, n) in r? {
            generated += n;
            times.push((sub, stamps));
        }
    }
    Ok((seconds, generated, times))
}

/// The ids whose piece is not valid UTF-8 on its own (byte tokens of partial characters).
pub fn not_utf8(tok: &crate::tokenizer::Tokenizer) -> Vec<u32> {
    (0..tok.vocab_size() as u32).filter(|&id| tok.piece(id, false).is_ok_and(|p| std::str::from_utf8(&p).is_err())).collect()
}

/// The rows as a markdown table.
pub fn print_rows(model: &str, device: &str, rows: &[ConcurrencyRow]) -> String {
    let mut s = format!(
        "{model} on {device}\n\n| streams | requests | total tok/s | per-seq tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | preempted |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {:.0} | {:.1} | {:.0} | {:.0} | {:.1} | {:.1} | {} |\n",
            r.concurrency, r.requests, r.total_tok_s, r.per_seq_tok_s, r.ttft_p50_ms, r.ttft_p99_ms, r.itl_p50_ms, r.itl_p99_ms, r.preemptions
        );
    }
    for r in rows {
        let Some(t) = r.steps else { continue };
        let ms = |s: f64, n: u64| if n == 0 { 0.0 } else { 1e3 * s / n as f64 };
        s += &format!(
            "\n{} streams, {:.1} s: {} steps with prompt rows {:.1} s ({:.1} ms each), {} decode-only steps {:.1} s ({:.1} ms each, {:.1} rows), host between steps {:.1} s",
            r.concurrency,
            r.seconds,
            t.prompt_steps,
            t.prompt_step_s,
            ms(t.prompt_step_s, t.prompt_steps),
            t.decode_steps,
            t.decode_step_s,
            ms(t.decode_step_s, t.decode_steps),
            t.decode_step_rows,
            t.host_s
        );
    }
    if rows.iter().any(|r| r.steps.is_some()) {
        s.push('\n');
    }
    for r in rows.iter().filter(|r| r.drafted_tokens > 0) {
        s += &format!(
            "\n{} streams: {} of {} drafts kept ({:.0}%)",
            r.concurrency,
            r.accepted_tokens,
            r.drafted_tokens,
            100.0 * r.accepted_tokens as f64 / r.drafted_tokens as f64
        );
    }
    if rows.iter().any(|r| r.drafted_tokens > 0) {
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_spans_the_ranges_and_fits_the_context() {
        let w = workload(64, 4096);
        assert!(w.iter().all(|r| (128..=2048).contains(&r.prompt) && (128..=512).contains(&r.output)));
        assert!(w.iter().any(|r| r.prompt > 1900) && w.iter().any(|r| r.output > 480));
        let short = workload(16, 1024);
        assert!(short.iter().all(|r| r.prompt + r.output <= 1024 && r.prompt >= 1));
    }
}

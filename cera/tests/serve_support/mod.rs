//! What the server's end-to-end tests share: a `cera serve` process on the real SmolLM2 file
//! and an HTTP client for it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::cli_support;

/// A running `cera serve` (killed on drop).
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        let model = cli_support::smollm2();
        let mut child = Command::new(env!("CARGO_BIN_EXE_cera"))
            .args(["serve", "--device", "cpu", "-m", &model, "--port", "0", "-c", "1024"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut url = None;
        let mut line = String::new();
        while url.is_none() {
            line.clear();
            assert!(err.read_line(&mut line).unwrap() > 0, "cera serve ended before listening");
            url = line.trim().strip_prefix("listening on ").map(str::to_string);
        }
        // Keep draining standard error so the server never blocks on it.
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = err.read_to_string(&mut sink);
        });
        let s = Server { child, url: url.unwrap() };
        let start = Instant::now();
        while s.get("/health").0 != 200 {
            assert!(start.elapsed() < Duration::from_secs(120), "the model did not load");
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    pub fn agent() -> ureq::Agent {
        ureq::Agent::new_with_config(ureq::config::Config::builder().http_status_as_error(false).build())
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        match Self::agent().get(&format!("{}{path}", self.url)).call() {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    pub fn post_raw(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = Self::agent().post(&format!("{}{path}", self.url)).header("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut r = req.send(body).unwrap();
        (r.status().as_u16(), r.body_mut().with_config().limit(64 << 20).read_to_string().unwrap())
    }

    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.post_raw(path, &body.to_string(), &[]);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
    }

    /// A streamed request's events (the JSON ones) and whether it ended with `[DONE]`.
    pub fn stream(&self, path: &str, body: &Value) -> (Vec<Value>, bool) {
        let r = Self::agent().post(&format!("{}{path}", self.url)).send_json(body).unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.headers().get("content-type").unwrap().to_str().unwrap().starts_with("text/event-stream"));
        let (mut events, mut done) = (Vec::new(), false);
        for line in BufReader::new(r.into_body().into_reader()).lines() {
            let line = line.unwrap();
            if let Some(d) = line.strip_prefix("data: ") {
                assert!(!done, "an event after [DONE]");
                if d == "[DONE]" {
                    done = true;
                } else {
                    events.push(serde_json::from_str(d).unwrap());
                }
            }
        }
        (events, done)
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics");
        text.lines().find_map(|l| l.strip_prefix(&format!("{name} ")).map(|v| v.parse().unwrap())).unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn chat(content: &str, max_tokens: usize) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0})
}

pub fn streamed_text(events: &[Value], chat: bool) -> String {
    events.iter().filter_map(|e| e["choices"].get(0)).filter_map(|c| if chat { c["delta"]["content"].as_str() } else { c["text"].as_str() }).collect()
}

/// Polls `f` until it holds (at most a minute).
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

//! The chat page at `/` in headless Chromium (Debian's `chromium` and `chromium-driver`, which
//! `.ci/run` installs), driven over WebDriver: type a message, click Send, wait for the streamed
//! reply, take a screenshot and check it is not blank; then stop a reply with the Stop button
//! and see the server cancel its sequence.

#![cfg(feature = "server")]

mod cli_support;
mod serve_support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use serve_support::{Server, wait_for};

/// A chromedriver (killed on drop) and one headless Chromium session.
struct Browser {
    driver: Child,
    url: String,
    session: String,
}

impl Browser {
    fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian: apt-get install chromium chromium-driver; .ci/run installs them)");
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while ureq::get(&format!("{url}/status")).call().is_err() {
            assert!(start.elapsed() < Duration::from_secs(30), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut b = Browser { driver, url, session: String::new() };
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1000,800"]}}}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {v}")).to_string();
        b
    }

    /// One WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.url);
        let agent = ureq::Agent::new_with_config(ureq::config::Config::builder().http_status_as_error(false).build());
        let mut r = match (method, body) {
            ("GET", _) => agent.get(&url).call().unwrap(),
            ("DELETE", _) => agent.delete(&url).call().unwrap(),
            (_, b) => agent.post(&url).send_json(b.unwrap_or_else(|| json!({}))).unwrap(),
        };
        let v: Value = r.body_mut().with_config().limit(64 << 20).read_json().unwrap();
        assert_eq!(r.status().as_u16(), 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn s(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    fn element(&self, css: &str) -> String {
        let v = self.call("POST", &self.s("/element"), Some(json!({"using": "css selector", "value": css})));
        v.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).unwrap().to_string()
    }

    fn js(&self, script: &str) -> Value {
        self.call("POST", &self.s("/execute/sync"), Some(json!({"script": script, "args": []})))
    }

    /// Polls `cond` (a script returning true when it holds) for at most a minute; fails at once
    /// when the page shows an error, and on a timeout says what the page shows.
    fn wait(&self, what: &str, cond: &str) {
        let start = Instant::now();
        loop {
            if self.js(cond) == true {
                return;
            }
            let error = self.js("const e = document.querySelector('.msg.error'); return e ? e.textContent : ''");
            assert_eq!(error, "", "the page shows an error while waiting for {what}");
            if start.elapsed() > Duration::from_secs(60) {
                let shown = self.js("return Array.from(document.querySelectorAll('.msg')).map((m) => m.className + ': ' + m.textContent.slice(0, 200))");
                panic!("timed out waiting for {what}; the page shows {shown}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.call("DELETE", &self.s(""), None)));
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).map(val).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &b)| acc | (b as u32) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

/// (pixels, share of the most common colour, distinct colours) of a PNG.
fn png_stats(data: &[u8]) -> (usize, f64, usize) {
    let decoder = png::Decoder::new(std::io::Cursor::new(data));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.color_type.samples();
    let mut counts = std::collections::HashMap::new();
    for p in buf[..info.buffer_size()].chunks(px) {
        *counts.entry(p.to_vec()).or_insert(0usize) += 1;
    }
    let n = (info.width * info.height) as usize;
    let top = counts.values().copied().max().unwrap_or(0);
    (n, top as f64 / n as f64, counts.len())
}

#[test]
fn the_chat_page_streams_a_reply_and_stops_one() {
    let s = Server::start(&["--alias", "smol"]);
    let (status, page) = s.get("/");
    assert_eq!(status, 200);
    assert!(page.contains("<textarea id=\"input\""), "{page:.200}");
    let b = Browser::start();
    b.call("POST", &b.s("/url"), Some(json!({"url": s.url})));
    // The model's name comes from /v1/models.
    b.wait("the model's name", "return document.getElementById('model').textContent == 'smol'");

    // Greedy, so that the replies (and the second prompt's length) are the same on every run.
    let temp = b.element("#temp");
    b.call("POST", &b.s(&format!("/element/{temp}/value")), Some(json!({"text": "0"})));
    let input = b.element("#input");
    let question = "Write one sentence about the sea.";
    b.call("POST", &b.s(&format!("/element/{input}/value")), Some(json!({"text": question})));
    let send = b.element("#send");
    b.call("POST", &b.s(&format!("/element/{send}/click")), None);
    b.wait("the streamed reply", "return document.body.dataset.turns == '2'");
    let reply = b.js("const m = document.querySelectorAll('.msg.assistant'); return m.length ? m[m.length - 1].textContent : ''");
    assert!(reply.as_str().is_some_and(|t| !t.trim().is_empty()), "no reply: {reply}");
    // The page sent the temperature: its reply is the API's greedy one.
    let (status, api) = s.post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": question}], "temperature": 0}));
    assert_eq!(status, 200, "{api}");
    assert_eq!(b.js("return history[1].content"), api["choices"][0]["message"]["content"]);
    assert_eq!(b.js("return document.querySelectorAll('.msg.user').length"), 1);
    assert_eq!(b.js("return document.querySelectorAll('.msg.error').length"), 0);

    let shot = base64_decode(b.call("GET", &b.s("/screenshot"), None).as_str().unwrap());
    let (pixels, top, colours) = png_stats(&shot);
    assert!(pixels >= 400 * 300, "{pixels} pixels");
    assert!(top < 0.98 && colours > 16, "a blank screenshot: the most common colour covers {:.1}%, {colours} colours", top * 100.0);

    // Markdown: code is rendered as code, and the model's text never becomes markup.
    let md = b.js("return markdown('Use `x`:\\n\\n```rust\\nlet a = 1 < 2;\\n```\\n\\n<b>no</b>')");
    assert_eq!(md, "<p>Use <code>x</code>:</p><pre><code>let a = 1 &lt; 2;</code></pre><p>&lt;b&gt;no&lt;/b&gt;</p>");

    // Stop: a long reply is stopped from the page; the server cancels its sequence.
    let cancelled = s.metric("cera_requests_cancelled_total");
    b.call("POST", &b.s(&format!("/element/{input}/value")), Some(json!({"text": "Write a very long story about a lighthouse."})));
    b.call("POST", &b.s(&format!("/element/{send}/click")), None);
    b.wait("the reply to start", "const m = document.querySelectorAll('.msg.assistant'); return m.length == 2 && m[1].textContent.length > 0");
    let stop = b.element("#stop");
    b.call("POST", &b.s(&format!("/element/{stop}/click")), None);
    b.wait("the page to be idle", "return (document.body.dataset.busy || '') == ''");
    wait_for("the server to cancel the sequence", || s.metric("cera_requests_cancelled_total") > cancelled && s.metric("cera_active_sequences") == 0.0);
    // The conversation keeps both turns (the stopped reply's text included).
    assert_eq!(b.js("return document.body.dataset.turns"), "4");
}

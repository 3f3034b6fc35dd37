//! `cera serve` end to end on the CPU with the real SmolLM2 file: real HTTP clients (ureq and
//! raw TCP) against the `cera` binary. The greedy text equals `cera run --temp 0`; streams end
//! in `data: [DONE]`; concurrent streams each equal their own single-request output; a client
//! that disconnects frees its sequence; every bad input class gets its 4xx; SIGTERM lets the
//! request in flight finish.

#![cfg(feature = "server")]

mod cli_support;
mod serve_support;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use serve_support::{Server, chat, streamed_text, wait_for};

use serde_json::{Value, json};

#[test]
fn greedy_answers_equal_cera_run_streamed_or_not() {
    let s = Server::start(&[]);
    let model = cli_support::smollm2();
    let prompt = "What is the capital of France?";
    let (ok, run_text, err) = cli_support::cera(&["run", "--device", "cpu", "-m", &model, "--temp", "0", "-n", "12", prompt]);
    assert!(ok, "{err}");
    let (status, v) = s.post("/v1/chat/completions", &chat(prompt, 12));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), run_text.trim_end_matches('\n'));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"].as_u64().unwrap(), v["usage"]["prompt_tokens"].as_u64().unwrap() + 12);

    // The same streamed, with usage: the deltas concatenate to the same text, and the
    // prompt's blocks now come from the prefix cache.
    let mut body = chat(prompt, 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (events, done) = s.stream("/v1/chat/completions", &body);
    assert!(done);
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&events, true), run_text.trim_end_matches('\n'));
    let last = events.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert_eq!(last["usage"]["completion_tokens"], 12);
    assert!(last["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() >= 16, "{last}");
    assert_eq!(events[events.len() - 2]["choices"][0]["finish_reason"], "length");

    // Completions: the raw prompt, as `cera run --raw`.
    let (ok, raw_text, err) = cli_support::cera(&["run", "--device", "cpu", "-m", &model, "--temp", "0", "-n", "10", "--raw", "Once upon a time"]);
    assert!(ok, "{err}");
    let body = json!({"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0, "logprobs": 2});
    let (status, v) = s.post("/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), raw_text.trim_end_matches('\n'));
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 10);
    assert_eq!(lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect::<String>(), raw_text.trim_end_matches('\n'));
    // Greedy: each chosen token is the most likely one, and its top entries hold it.
    for (i, tl) in lp["token_logprobs"].as_array().unwrap().iter().enumerate() {
        let tops = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(tops.len(), 2);
        let best = tops.values().map(|x| x.as_f64().unwrap()).fold(f64::MIN, f64::max);
        assert!((tl.as_f64().unwrap() - best).abs() < 1e-6);
    }
    let mut body = body;
    body["stream"] = json!(true);
    let (events, done) = s.stream("/v1/completions", &body);
    assert!(done);
    assert_eq!(streamed_text(&events, false), raw_text.trim_end_matches('\n'));

    // Chat log-probabilities: one entry per token, top_logprobs of the asked length.
    let mut body = chat(prompt, 4);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (_, v) = s.post("/v1/chat/completions", &body);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    assert!(content.iter().all(|c| c["top_logprobs"].as_array().unwrap().len() == 3 && c["token"] == c["top_logprobs"][0]["token"]));

    // logit_bias: -100 on the greedy first token moves the choice to another; +100 on some
    // token makes it the choice; the text's first token comes from the tokenizer's ids.
    let (_, t) = s.post("/tokenize", &json!({"content": raw_text.trim_end_matches('\n')}));
    let first = t["tokens"][0].as_u64().unwrap();
    let biased = |bias: Value| json!({"prompt": "Once upon a time", "max_tokens": 1, "temperature": 0, "logit_bias": bias});
    let (_, v) = s.post("/v1/completions", &biased(json!({first.to_string(): -100})));
    let banned = v["choices"][0]["text"].as_str().unwrap().to_string();
    let (_, d) = s.post("/detokenize", &json!({"tokens": [first]}));
    assert_ne!(banned, d["content"].as_str().unwrap(), "the banned token was chosen");
    let (_, v) = s.post("/v1/completions", &biased(json!({"2000": 100})));
    let (_, d) = s.post("/detokenize", &json!({"tokens": [2000]}));
    assert_eq!(v["choices"][0]["text"], d["content"]);

    // Speculative decoding (n-gram drafts) on a copy-heavy prompt: the same greedy text, drafts
    // accepted (in /metrics).
    let copy = "List: red, green, blue, cyan, magenta, yellow, black, white.\nList again: red, green,";
    let plain = json!({"prompt": copy, "max_tokens": 16, "temperature": 0});
    let (_, a) = s.post("/v1/completions", &plain);
    let (status, b) = s.post("/v1/completions", &json!({"prompt": copy, "max_tokens": 16, "temperature": 0, "speculative": {"type": "ngram", "draft_max": 6}}));
    assert_eq!(status, 200, "{b}");
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert!(s.metric("cera_spec_accepted_tokens_total") > 0.0);
    // Kept drafts make a verification step give more than its one token.
    assert!(s.metric("cera_spec_tokens_per_verification") > 1.0);

    // `ignore_eos` (vLLM's and llama.cpp's extension): a reply that ends after 2 tokens runs
    // to max_tokens, starting with the same text.
    let short = chat("Say only the word yes.", 24);
    let (_, v) = s.post("/v1/chat/completions", &short);
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let ended = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() < 24, "{v}");
    let mut long = short.clone();
    long["ignore_eos"] = json!(true);
    let (_, v) = s.post("/v1/chat/completions", &long);
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 24, "{v}");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().starts_with(&ended), "{v}");
    long["ignore_eos"] = json!("yes");
    assert_eq!(s.post("/v1/chat/completions", &long).0, 400);

    // Stop strings end the text before them.
    let mut body = chat(prompt, 12);
    let cut = run_text.trim_end_matches('\n');
    let stop = &format!(" {}", cut.split(' ').nth(2).unwrap());
    body["stop"] = json!([stop]);
    let (_, v) = s.post("/v1/chat/completions", &body);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), &cut[..cut.find(stop).unwrap()]);
}

/// The official `openai` Python client (installed by `.ci/run`): chat and completions, streamed
/// and not, logprobs, usage and errors, the greedy text equal to `cera run --temp 0`.
/// `cera serve --model-draft`: SmolLM2 drafting for itself. Every request drafts from it by
/// default (paced by what drafts save), `{"type": "draft"}` asks for it, `{"type": "none"}`
/// turns it off; the greedy text is the same, and /metrics counts the draft model's steps and
/// the kept drafts.
#[test]
fn a_draft_model_drafts_for_the_requests_and_keeps_their_text() {
    let model = cli_support::smollm2();
    let s = Server::start(&["--model-draft", &model, "--draft-max", "4"]);
    let prompt = "Name the planets of the solar system in order.";
    let (status, plain) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 20, "temperature": 0, "speculative": {"type": "none"}}),
    );
    assert_eq!(status, 200, "{plain}");
    assert_eq!(s.metric("cera_spec_draft_model_steps_total"), 0.0);
    for spec in [json!({"type": "draft", "draft_max": 3}), json!({})] {
        let (status, v) = s
            .post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 20, "temperature": 0, "speculative": spec}));
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"], "{spec}");
    }
    // The server's default (no `speculative` field) drafts too, streamed.
    let (events, done) =
        s.stream("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": 20, "temperature": 0, "stream": true}));
    assert!(done);
    assert_eq!(streamed_text(&events, true), plain["choices"][0]["message"]["content"].as_str().unwrap());
    assert!(s.metric("cera_spec_draft_model_steps_total") > 0.0);
    assert!(s.metric("cera_spec_accepted_tokens_total") > 0.0);
    assert_eq!(s.metric("cera_spec_draft_model_errors_total"), 0.0);
}

#[test]
fn the_openai_python_client_gets_what_cera_run_gives() {
    let s = Server::start(&[]);
    let model = cli_support::smollm2();
    let (chat_prompt, raw_prompt) = ("Name a color.", "The best thing about mornings is");
    let run = |extra: &[&str], p: &str| {
        let mut args = vec!["run", "--device", "cpu", "-m", &model, "--temp", "0", "-n", "8"];
        args.extend_from_slice(extra);
        args.push(p);
        let (ok, out, err) = cli_support::cera(&args);
        assert!(ok, "{err}");
        out.trim_end_matches('\n').to_string()
    };
    let (chat_text, raw_text) = (run(&[], chat_prompt), run(&["--raw"], raw_prompt));
    let script = format!("{}/tests/serve_clients/openai_client.py", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3").args([&script, &s.url, chat_prompt, &chat_text, raw_prompt, &raw_text]).output().expect("python3");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}\n(the `openai` package is installed by .ci/run: python3 -m pip install openai)");
    assert!(stdout.contains("openai client: ok"), "{stdout}");
}

/// The official `anthropic` Python client against `/v1/messages` (with `x-api-key`), streamed and
/// not, and curl reading the raw server-sent events of both APIs.
#[test]
fn the_anthropic_client_and_curl_get_what_cera_run_gives() {
    let s = Server::start(&["--api-key", "sesame", "--alias", "smol"]);
    let model = cli_support::smollm2();
    let prompt = "Name a fruit.";
    let (ok, text, err) = cli_support::cera(&["run", "--device", "cpu", "-m", &model, "--temp", "0", "-n", "8", prompt]);
    assert!(ok, "{err}");
    let text = text.trim_end_matches('\n');
    let script = format!("{}/tests/serve_clients/anthropic_client.py", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3").args([&script, &s.url, prompt, text]).output().expect("python3");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}\n(the `anthropic` package is installed by .ci/run)");
    assert!(stdout.contains("anthropic client: ok"), "{stdout}");

    // curl, raw SSE: OpenAI's chunks end in `data: [DONE]`; Anthropic's events are named.
    let curl = |path: &str, body: Value| {
        let out = Command::new("curl")
            .args(["-sN", "-H", "Authorization: Bearer sesame", "-H", "Content-Type: application/json", "-d", &body.to_string(), &format!("{}{path}", s.url)])
            .output()
            .expect("curl");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut body = chat(prompt, 8);
    body["stream"] = json!(true);
    let raw = curl("/v1/chat/completions", body);
    let datas: Vec<&str> = raw.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(datas.last(), Some(&"[DONE]"), "{raw}");
    let got: String = datas[..datas.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(got, text);
    let raw = curl("/v1/messages", json!({"max_tokens": 8, "temperature": 0, "stream": true, "messages": [{"role": "user", "content": prompt}]}));
    let names: Vec<&str> = raw.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{raw}");
    assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"], "{raw}");
    // Anthropic's error shape on its route.
    let (status, v) = {
        let (st, t) = s.post_raw("/v1/messages", &json!({"messages": [{"role": "user", "content": "x"}]}).to_string(), &[("x-api-key", "sesame")]);
        (st, serde_json::from_str::<Value>(&t).unwrap())
    };
    assert_eq!(status, 400);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("max_tokens"));
}

#[test]
fn bad_requests_get_their_status_and_an_openai_error() {
    let s = Server::start(&["--max-body", "8K"]);
    let user = json!([{"role": "user", "content": "hi"}]);
    let long = "word ".repeat(2000);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/chat/completions", "{not json".into(), 400, None),
        ("/v1/chat/completions", "[1, 2]".into(), 400, None),
        ("/v1/chat/completions", json!({"messages": "hi"}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": []}).to_string(), 400, Some("messages")),
        ("/v1/chat/completions", json!({}).to_string(), 400, Some("messages")),
        ("/v1/chat/completions", json!({"messages": user, "model": "gpt-4o"}).to_string(), 404, Some("model")),
        ("/v1/chat/completions", json!({"messages": user, "temperature": 3}).to_string(), 400, Some("temperature")),
        ("/v1/chat/completions", json!({"messages": user, "temperature": "hot"}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": user, "top_p": 0}).to_string(), 400, Some("top_p")),
        ("/v1/chat/completions", json!({"messages": user, "min_p": 1.5}).to_string(), 400, Some("min_p")),
        ("/v1/chat/completions", json!({"messages": user, "presence_penalty": -3}).to_string(), 400, Some("presence_penalty")),
        ("/v1/chat/completions", json!({"messages": user, "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        ("/v1/chat/completions", json!({"messages": user, "max_tokens": -1}).to_string(), 400, None),
        ("/v1/chat/completions", json!({"messages": user, "n": 3}).to_string(), 400, Some("n")),
        ("/v1/chat/completions", json!({"messages": user, "logprobs": true, "top_logprobs": 21}).to_string(), 400, Some("top_logprobs")),
        ("/v1/chat/completions", json!({"messages": user, "top_logprobs": 2}).to_string(), 400, Some("top_logprobs")),
        ("/v1/chat/completions", json!({"messages": user, "stop": ["a", ""]}).to_string(), 400, Some("stop")),
        ("/v1/chat/completions", json!({"messages": user, "logit_bias": {"15": 500}}).to_string(), 400, Some("logit_bias")),
        ("/v1/chat/completions", json!({"messages": user, "speculative": {"type": "eagle"}}).to_string(), 400, Some("speculative")),
        ("/v1/chat/completions", json!({"messages": user, "speculative": {"draft_max": 40}}).to_string(), 400, Some("speculative")),
        ("/v1/chat/completions", json!({"messages": user, "speculative": {"type": "draft"}}).to_string(), 400, Some("speculative")),
        ("/v1/chat/completions", json!({"messages": user, "logit_bias": {"49152": 1}}).to_string(), 400, Some("logit_bias")),
        ("/v1/chat/completions", json!({"messages": user, "logit_bias": {"x": 1}}).to_string(), 400, Some("logit_bias")),
        ("/v1/chat/completions", json!({"messages": user, "logit_bias": {"15": "up"}}).to_string(), 400, Some("logit_bias")),
        (
            "/v1/chat/completions",
            json!({"messages": user, "response_format": {"type": "json_schema"}}).to_string(),
            400,
            Some("response_format.json_schema.schema"),
        ),
        ("/v1/chat/completions", json!({"messages": user, "response_format": {"type": "xml"}}).to_string(), 400, Some("response_format")),
        (
            "/v1/chat/completions",
            json!({"messages": user, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "if": {}}}}}).to_string(),
            400,
            Some("response_format"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user, "response_format": {"type": "json_schema", "json_schema": {"schema": 7}}}).to_string(),
            400,
            Some("response_format"),
        ),
        ("/v1/completions", json!({"prompt": "x", "grammar": "start: ("}).to_string(), 400, Some("grammar")),
        ("/v1/completions", json!({"prompt": "x", "grammar": "start: \"a\"", "response_format": {"type": "json_object"}}).to_string(), 400, Some("grammar")),
        ("/v1/chat/completions", json!({"messages": user, "tools": [{"type": "function"}]}).to_string(), 400, Some("tools[0]")),
        ("/v1/chat/completions", json!({"messages": user, "tools": [{"type": "retrieval"}]}).to_string(), 400, Some("tools[0]")),
        ("/v1/chat/completions", json!({"messages": user, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}).to_string(), 400, Some("tool_choice")),
        ("/v1/chat/completions", json!({"messages": user, "tool_choice": "required"}).to_string(), 400, Some("tool_choice")),
        ("/v1/completions", json!({"prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}).to_string(), 400, Some("tools")),
        ("/v1/chat/completions", json!({"messages": user, "stream_options": {"include_usage": true}}).to_string(), 400, Some("stream_options")),
        ("/v1/chat/completions", json!({"messages": [{"role": "robot", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).to_string(), 400, Some("messages[0].content")),
        ("/v1/completions", json!({"prompt": long}).to_string(), 413, None),
        ("/v1/completions", json!({"max_tokens": 4}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": [1, 2, 99999999]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": ["a", "b"]}).to_string(), 400, Some("prompt")),
        ("/v1/completions", json!({"prompt": "x", "echo": true}).to_string(), 400, Some("echo")),
        ("/tokenize", json!({"text": "x"}).to_string(), 400, Some("content")),
        ("/detokenize", json!({"tokens": [-1]}).to_string(), 400, Some("tokens")),
        ("/detokenize", json!({"tokens": [99999999]}).to_string(), 400, Some("tokens")),
        ("/v1/nothing", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let (got, text) = s.post_raw(path, &body, &[]);
        assert_eq!(got, status, "{path} {body:.80}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} {body:.80}: not JSON ({e}): {text}"));
        let err = &v["error"];
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()) && err["type"].is_string(), "{text}");
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{path} {body:.80}: {text}");
        }
    }
    // A prompt over the context (-c 1024): 400 context_length_exceeded.
    let (status, v) = s.post("/v1/completions", &json!({"prompt": (0..1100).map(|i| 100 + i).collect::<Vec<u32>>()}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    // The server still answers after all that.
    let (status, _) = s.post("/v1/chat/completions", &chat("hi", 2));
    assert_eq!(status, 200);
    assert!(s.metric("cera_request_errors_total") >= 25.0);
}

#[test]
fn an_api_key_guards_every_route_but_health_and_cors_is_opt_in() {
    let s = Server::start(&["--api-key", "sesame", "--cors", "https://example.org"]);
    let body = chat("hi", 2).to_string();
    assert_eq!(s.post_raw("/v1/chat/completions", &body, &[]).0, 401);
    assert_eq!(s.post_raw("/v1/chat/completions", &body, &[("Authorization", "Bearer open")]).0, 401);
    assert_eq!(s.post_raw("/tokenize", r#"{"content":"a"}"#, &[]).0, 401);
    assert_eq!(s.get("/v1/models").0, 401);
    assert_eq!(s.get("/metrics").0, 401);
    assert_eq!(s.get("/health").0, 200);
    let (status, text) = s.post_raw("/v1/chat/completions", &body, &[("Authorization", "Bearer sesame")]);
    assert_eq!(status, 200, "{text}");
    // CORS: the allowed origin is echoed; another is not.
    let agent = Server::agent();
    let r = agent.get(&format!("{}/health", s.url)).header("Origin", "https://example.org").call().unwrap();
    assert_eq!(r.headers().get("access-control-allow-origin").unwrap(), "https://example.org");
    let r = agent.get(&format!("{}/health", s.url)).header("Origin", "https://evil.example").call().unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    // Without --cors no CORS header at all.
    let plain = Server::start(&[]);
    let r = agent.get(&format!("{}/health", plain.url)).header("Origin", "https://example.org").call().unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[test]
fn sixteen_concurrent_streams_each_equal_their_single_request() {
    let s = Server::start(&["--parallel", "16"]);
    let prompts: Vec<String> = (0..16).map(|i| format!("Tell me fact number {i} about the sea.")).collect();
    // Greedy and seeded requests alike give, streamed together, what they give alone.
    let body = |i: usize| {
        let mut b = chat(&prompts[i], 6);
        if i % 2 == 1 {
            b["temperature"] = json!(0.9);
            b["seed"] = json!(1000 + i);
        }
        // Some constrained by a schema, some by a Lark grammar: their masks apply to their rows only.
        if i % 4 >= 2 {
            b["max_tokens"] = json!(24);
        }
        if i % 4 == 2 {
            b["response_format"] = json!({"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {"mood": {"enum": ["calm", "rough"]}}, "required": ["mood"], "additionalProperties": false}}});
        }
        if i % 4 == 3 {
            b["grammar"] = json!("start: (\"yes\" | \"no\") \".\"");
        }
        b
    };
    let alone: Vec<String> = (0..16)
        .map(|i| {
            let (status, v) = s.post("/v1/chat/completions", &body(i));
            assert_eq!(status, 200, "{v}");
            v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    let together: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..16)
            .map(|i| {
                let (s, b) = (&s, body(i));
                sc.spawn(move || {
                    let mut b = b;
                    b["stream"] = json!(true);
                    let (events, done) = s.stream("/v1/chat/completions", &b);
                    assert!(done);
                    streamed_text(&events, true)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    // The masks' cost is counted: one mask per constrained token.
    assert!(s.metric("cera_constrained_tokens_total") >= 8.0 * 2.0);
    assert!(s.metric("cera_constraint_mask_seconds_total") > 0.0);
    // Where the batcher's time went: steps with prompt rows among all, their seconds among the
    // steps', the steps' among the busy turns'.
    let (steps, prompt_steps) = (s.metric("cera_steps_total"), s.metric("cera_prompt_steps_total"));
    assert!(prompt_steps >= 1.0 && prompt_steps < steps, "{prompt_steps} of {steps} steps");
    assert!(s.metric("cera_step_rows_total") >= steps);
    let (step_s, prompt_s, busy_s) = (s.metric("cera_step_seconds_total"), s.metric("cera_prompt_step_seconds_total"), s.metric("cera_busy_seconds_total"));
    assert!(prompt_s > 0.0 && prompt_s < step_s && step_s <= busy_s, "{prompt_s} / {step_s} / {busy_s} s");
    for i in (2..16).step_by(4) {
        assert!(alone[i] == r#"{"mood":"calm"}"# || alone[i] == r#"{"mood":"rough"}"#, "{}", alone[i]);
        assert!(alone[i + 1] == "yes." || alone[i + 1] == "no.", "{}", alone[i + 1]);
    }
    assert_eq!(s.metric("cera_active_sequences"), 0.0);
    assert_eq!(s.metric("cera_requests_in_flight"), 0.0);
}

/// Sends a streamed request over a raw socket and returns the socket after the first event.
fn open_stream(url: &str, body: &Value) -> std::net::TcpStream {
    let addr = url.strip_prefix("http://").unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    let b = body.to_string();
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0);
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    sock
}

#[test]
fn a_client_that_disconnects_frees_its_sequence_and_a_full_queue_answers_429() {
    let s = Server::start(&["--parallel", "1", "--queue", "0"]);
    let mut body = chat("Write a very long story about a lighthouse keeper.", 900);
    body["stream"] = json!(true);
    let sock = open_stream(&s.url, &body);
    wait_for("the sequence to run", || s.metric("cera_active_sequences") == 1.0);
    // One in flight of one place: the next request is refused.
    let (status, v) = s.post("/v1/chat/completions", &chat("hi", 2));
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(s.metric("cera_requests_rejected_total"), 1.0);
    drop(sock);
    wait_for("the sequence to be freed", || s.metric("cera_active_sequences") == 0.0 && s.metric("cera_requests_in_flight") == 0.0);
    assert_eq!(s.metric("cera_requests_cancelled_total"), 1.0);
    assert!(s.metric("cera_generated_tokens_total") < 900.0);
    let (status, _) = s.post("/v1/chat/completions", &chat("hi", 2));
    assert_eq!(status, 200);
    // The same for a request that is not streamed: the client gives up while it runs.
    let addr = s.url.strip_prefix("http://").unwrap().to_string();
    let b = chat("Write a very long story about a lighthouse keeper.", 900).to_string();
    let mut sock = std::net::TcpStream::connect(&addr).unwrap();
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
    wait_for("the second sequence to run", || s.metric("cera_active_sequences") == 1.0);
    drop(sock);
    wait_for("the second sequence to be freed", || s.metric("cera_active_sequences") == 0.0 && s.metric("cera_requests_in_flight") == 0.0);
    assert_eq!(s.metric("cera_requests_cancelled_total"), 2.0);
    assert!(s.metric("cera_generated_tokens_total") < 1800.0);
}

#[test]
fn sigterm_lets_the_request_in_flight_finish() {
    let mut s = Server::start(&[]);
    let mut body = chat("Count from one to ten.", 40);
    body["stream"] = json!(true);
    let mut sock = open_stream(&s.url, &body);
    let pid = s.child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let mut rest = String::new();
    sock.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("data: [DONE]"), "{rest}");
    assert!(rest.contains("\"finish_reason\":\"length\"") || rest.contains("\"finish_reason\":\"stop\""), "{rest}");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the server did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

#[test]
fn models_tokenize_detokenize_and_metrics() {
    let s = Server::start(&["--alias", "smol"]);
    let (status, text) = s.get("/v1/models");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["data"][0]["id"], "smol");
    let (status, v) = s.post("/v1/chat/completions", &json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "smol");
    let (_, v) = s.post("/tokenize", &json!({"content": "Hello world", "with_pieces": true}));
    assert_eq!(v["tokens"], json!([{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}]));
    let (_, v) = s.post("/detokenize", &json!({"tokens": [19556, 905]}));
    assert_eq!(v["content"], "Hello world");
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200);
    for name in [
        "cera_requests_total",
        "cera_generated_tokens_total",
        "cera_queue_depth",
        "cera_active_sequences",
        "cera_kv_usage_ratio",
        "cera_prefix_cache_hit_tokens_total",
        "cera_tokens_per_second",
    ] {
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing:\n{text}");
    }
    assert_eq!(s.metric("cera_generated_tokens_total"), 2.0);
}

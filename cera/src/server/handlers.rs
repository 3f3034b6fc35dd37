//! The route handlers: generation (chat and completions, streamed or not), models, health,
//! tokenize and detokenize.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::call_stream::CallWatch;
use super::error::ApiError;
use super::openai::{self, Head, Kind};
use super::request::{self, WirePrompt};
use super::running::{Answer, EventStream, Msg, Running, account, body};
use super::tools;
use super::{Shared, unix_now};

fn count_error(state: &Shared, e: ApiError) -> Response {
    state.counters.errors.fetch_add(1, Ordering::Relaxed);
    e.into_response()
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(state): State<Shared>, b: Result<Bytes, BytesRejection>) -> Response {
    generate(&state, b, Kind::Chat).await.unwrap_or_else(|e| count_error(&state, e))
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Shared>, b: Result<Bytes, BytesRejection>) -> Response {
    generate(&state, b, Kind::Text).await.unwrap_or_else(|e| count_error(&state, e))
}

fn check_model(state: &Shared, model: Option<&str>) -> Result<String, ApiError> {
    let id = &state.opts.model_id;
    match model {
        None | Some("") => Ok(id.clone()),
        Some(m) if m == id => Ok(id.clone()),
        Some(m) => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::not_found("model_not_found", format!("the model {m:?} does not exist here (this server has {id:?})"))
        }),
    }
}

async fn generate(state: &Shared, b: Result<Bytes, BytesRejection>, kind: Kind) -> Result<Response, ApiError> {
    state.counters.requests.fetch_add(1, Ordering::Relaxed);
    let ready = state.ready()?;
    let b = body(b, state)?;
    let req = request::parse(&b)?;
    req.check_supported()?;
    let model = check_model(state, req.model.as_deref())?;
    let chat = kind == Kind::Chat;
    let batcher = &ready.batcher;
    let engine = batcher.engine();
    let tool_list = tools::parse_tools(req.tools.as_deref().unwrap_or(&[]))?;
    let choice = tools::parse_choice(req.tool_choice.as_ref(), &tool_list)?;
    let syntax = tools::syntax(engine.chat_template());
    let forced = tools::forced_grammar(&tool_list, &choice, syntax);
    if forced.is_some() && (req.grammar.is_some() || req.response_format.as_ref().is_some_and(|f| f.get("type").and_then(Value::as_str) != Some("text"))) {
        return Err(ApiError::bad_request(Some("tool_choice"), "a required tool call cannot be combined with response_format or grammar"));
    }
    // Calls are looked for in the answer when tools are offered.
    let calling = (choice != tools::Choice::None).then(|| tool_list.clone());
    let tokens = if chat {
        if req.prompt.is_some() {
            return Err(ApiError::bad_request(Some("prompt"), "chat completions take messages, not prompt"));
        }
        let msgs = req.chat_messages()?;
        let text = tools::render(engine.chat_template(), &msgs, req.tools.as_deref().unwrap_or(&[]), &tool_list, &choice)?;
        batcher.prompt_tokens(text)?
    } else {
        if !tool_list.is_empty() {
            return Err(ApiError::bad_request(Some("tools"), "tools are for chat completions"));
        }
        match req.prompt.clone() {
            None => return Err(ApiError::bad_request(Some("prompt"), "prompt is required")),
            Some(WirePrompt::Text(t)) => batcher.prompt_tokens(t)?,
            Some(WirePrompt::Texts(mut v)) if v.len() == 1 => batcher.prompt_tokens(v.remove(0))?,
            Some(WirePrompt::Texts(v)) => return Err(ApiError::unsupported("prompt", format!("a list of {} prompts (one per request)", v.len()))),
            Some(WirePrompt::Tokens(t)) => batcher.prompt_tokens(t)?,
        }
    };
    let n_ctx = engine.n_ctx();
    if tokens.len() >= n_ctx {
        let param = if chat { "messages" } else { "prompt" };
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(Some(param), format!("the prompt is {} tokens; the context holds {n_ctx} with room for at least one more", tokens.len()))
        });
    }
    let seed = state.next_id.load(Ordering::Relaxed) ^ unix_now().rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    let mut opts = req.generate_opts(chat, seed, n_ctx - tokens.len())?;
    opts.logit_bias = req.logit_bias(engine.config().vocab)?;
    opts.speculative = req.speculative(state.opts.speculative, batcher.draft_engine().is_some())?;
    let structure = match forced {
        Some(g) => Some(request::Structure::Lark(g)),
        None => req.structure()?,
    };
    if let Some(structure) = structure {
        let grammars =
            ready.grammars.get_or_init(|| super::grammar::Grammars::new(engine)).as_ref().map_err(|e| ApiError::internal(format!("structured output: {e}")))?;
        let (param, compiled) = match structure {
            request::Structure::Json(schema) => ("response_format", grammars.json_schema(schema)),
            request::Structure::Lark(g) => ("grammar", grammars.lark(&g)),
        };
        let c = compiled
            .map_err(|e| ApiError { code: Some("invalid_grammar"), ..ApiError::bad_request(Some(param), format!("the {param} cannot be used: {e}")) })?;
        opts.constraint = Some(c);
    }
    let logprobs = req.logprobs(chat)?;
    let stream = req.stream.unwrap_or(false);
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    if !stream && req.stream_options.is_some() {
        return Err(ApiError::bad_request(Some("stream_options"), "stream_options needs stream: true"));
    }
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = if chat { "chatcmpl" } else { "cmpl" };
    let head = Head { kind, id: format!("{prefix}-{n:x}{:x}", unix_now()), created: unix_now(), model };
    let run = Running::start(state, batcher, tokens, &opts, stream)?;
    if stream {
        let calls = calling.map(|t| CallWatch::new(t, syntax, &head.id));
        let answer = GenStream { head, logprobs, include_usage, state: state.clone(), started: false, calls };
        let s = EventStream::new(run, answer);
        return Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response());
    }
    let g = run.finish().await?;
    if let Some(tl) = &calling {
        let (text, calls) = tools::parse_calls(&g.text, tl, syntax);
        if !calls.is_empty() {
            let mut v = openai::whole(&head, engine.tokenizer(), &g, logprobs);
            v["choices"][0]["message"] = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text) }, "tool_calls": tools::calls_json(&calls, &head.id)});
            v["choices"][0]["finish_reason"] = json!("tool_calls");
            return Ok(Json(v).into_response());
        }
    }
    Ok(Json(openai::whole(&head, engine.tokenizer(), &g, logprobs)).into_response())
}

/// OpenAI's streamed answer: chunks, then `[DONE]`.
struct GenStream {
    head: Head,
    logprobs: Option<usize>,
    include_usage: bool,
    state: Shared,
    started: bool,
    /// With tools offered: the text that may be a call is held back until the end.
    calls: Option<CallWatch>,
}

fn event(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

impl Answer for GenStream {
    fn on_msg(&mut self, m: Msg, out: &mut VecDeque<Event>) {
        let chat = self.head.kind == Kind::Chat;
        if chat && !self.started {
            self.started = true;
            out.push_back(event(&openai::chunk(&self.head, json!({"role": "assistant", "content": ""}), Value::Null, None)));
        }
        let Some(ready) = self.state.ready.get() else { return };
        let tok = ready.batcher.engine().tokenizer();
        match m {
            Msg::Token { id, text, logprob, top } => {
                let lp = match (self.logprobs, logprob) {
                    (Some(_), Some(l)) if chat => json!({"content": [openai::chat_logprob(tok, id, l, &top)]}),
                    (Some(_), Some(l)) => openai::text_logprobs(tok, &[id], &[l], &[top], 0),
                    _ => Value::Null,
                };
                if text.is_empty() && lp.is_null() {
                    return;
                }
                let (text, calls) = match self.calls.as_mut() {
                    Some(w) => w.push(&text),
                    None => (text, Vec::new()),
                };
                if !(text.is_empty() && lp.is_null()) {
                    let delta = if chat { json!({"content": text}) } else { Value::String(text) };
                    out.push_back(event(&openai::chunk(&self.head, delta, lp, None)));
                }
                for c in calls {
                    out.push_back(event(&openai::chunk(&self.head, json!({"tool_calls": c}), Value::Null, None)));
                }
            }
            Msg::Done(Ok(g)) => {
                account(&self.state, &g);
                let mut finish = openai::finish_reason(g.finish);
                if let Some(w) = self.calls.take() {
                    // The held text: its calls as one tool_calls delta, the rest as content.
                    let (text, calls, called) = w.finish();
                    if !text.is_empty() {
                        out.push_back(event(&openai::chunk(&self.head, json!({"content": text}), Value::Null, None)));
                    }
                    if let Some(c) = calls {
                        out.push_back(event(&openai::chunk(&self.head, json!({"tool_calls": c}), Value::Null, None)));
                    }
                    if called {
                        finish = "tool_calls";
                    }
                }
                let delta = if chat { json!({}) } else { Value::String(String::new()) };
                out.push_back(event(&openai::chunk(&self.head, delta, Value::Null, Some(finish))));
                if self.include_usage {
                    out.push_back(event(&openai::usage_chunk(&self.head, &g)));
                }
                out.push_back(Event::default().data("[DONE]"));
            }
            Msg::Done(Err(e)) => {
                self.state.counters.errors.fetch_add(1, Ordering::Relaxed);
                out.push_back(event(&ApiError::from(e).body()));
                out.push_back(Event::default().data("[DONE]"));
            }
        }
    }

    fn closed(&mut self, out: &mut VecDeque<Event>) {
        out.push_back(event(&ApiError::internal("the batcher stopped").body()));
    }
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Shared>) -> Response {
    let created = state.ready.get().map_or(0, |r| r.created);
    Json(json!({"object": "list", "data": [{"id": state.opts.model_id, "object": "model", "created": created, "owned_by": "cera"}]})).into_response()
}

/// `GET /health`: 200 once the model is loaded, 503 before (and while stopping).
pub async fn health(State(state): State<Shared>) -> Response {
    match state.ready() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": if state.load_error.get().is_some() { "error" } else if state.stopping.load(Ordering::SeqCst) { "stopping" } else { "loading" }, "error": e.body()["error"]}))).into_response(),
    }
}

/// Any other route: 404 as JSON.
pub async fn not_found() -> Response {
    ApiError::not_found("not_found", "no such route").into_response()
}

fn json_body(state: &Shared, b: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let b = body(b, state)?;
    let v: Value = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(None, format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(None, "the body must be a JSON object"));
    }
    Ok(v)
}

/// `POST /tokenize` `{"content": TEXT, "add_special": bool, "with_pieces": bool}` → `{"tokens": [...]}`
/// (with pieces: `[{"id", "piece"}]`).
pub async fn tokenize(State(state): State<Shared>, b: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let ready = state.ready()?;
        let v = json_body(&state, b)?;
        let content = v.get("content").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request(Some("content"), "content (a string) is required"))?;
        let add_special = v
            .get("add_special")
            .map_or(Ok(false), |x| x.as_bool().ok_or_else(|| ApiError::bad_request(Some("add_special"), "add_special must be true or false")))?;
        let pieces = v.get("with_pieces").is_some_and(|x| x.as_bool() == Some(true));
        let tok = ready.batcher.engine().tokenizer();
        let ids = tok
            .encode(content, crate::tokenizer::EncodeOptions { add_special, parse_special: true })
            .map_err(|e| ApiError::bad_request(Some("content"), e.to_string()))?;
        let tokens: Vec<Value> = if pieces {
            ids.iter().map(|&id| json!({"id": id, "piece": String::from_utf8_lossy(&tok.piece(id, true).unwrap_or_default())})).collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(json!({"tokens": tokens}))
    };
    run().map_or_else(|e| count_error(&state, e), |v| Json(v).into_response())
}

/// `POST /detokenize` `{"tokens": [ids]}` → `{"content": TEXT}`.
pub async fn detokenize(State(state): State<Shared>, b: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let ready = state.ready()?;
        let v = json_body(&state, b)?;
        let ids: Vec<u32> = v
            .get("tokens")
            .cloned()
            .map(serde_json::from_value)
            .ok_or_else(|| ApiError::bad_request(Some("tokens"), "tokens (a list of ids) is required"))?
            .map_err(|e| ApiError::bad_request(Some("tokens"), format!("tokens must be a list of ids: {e}")))?;
        let engine = ready.batcher.engine();
        let vocab = engine.config().vocab;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::bad_request(Some("tokens"), format!("token id {id} is outside the vocabulary of {vocab}")));
        }
        let text =
            engine.tokenizer().decode(&ids, crate::tokenizer::DecodeOptions::default()).map_err(|e| ApiError::bad_request(Some("tokens"), e.to_string()))?;
        Ok(json!({"content": text}))
    };
    run().map_or_else(|e| count_error(&state, e), |v| Json(v).into_response())
}

//! `POST /v1/messages`: Anthropic's Messages API on the same batcher, streamed (its event
//! sequence: `message_start`, `content_block_start`, `content_block_delta`\*,
//! `content_block_stop`, `message_delta`, `message_stop`) or whole. Errors are Anthropic's
//! `{"type": "error", "error": {"type", "message"}}`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ApiError;
use super::request::MAX_STOP;
use super::running::{Answer, EventStream, Msg, Running, body};
use super::{Shared, unix_now};
use crate::chat_template::ChatMessage;
use crate::engine::{EngineError, FinishReason, GenerateOpts, Generation, SamplerOpts};

/// The request body.
#[derive(Debug, Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    max_tokens: Option<u64>,
    messages: Option<Vec<InMessage>>,
    system: Option<Blocks>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<u32>,
    stream: Option<bool>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct InMessage {
    role: String,
    content: Blocks,
}

/// Text, or content blocks (only `text` blocks are accepted).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Blocks {
    Text(String),
    List(Vec<Value>),
}

impl Blocks {
    fn text(&self, param: &str) -> Result<String, ApiError> {
        match self {
            Blocks::Text(t) => Ok(t.clone()),
            Blocks::List(v) => {
                let mut out = String::new();
                for b in v {
                    match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => out.push_str(t),
                        (kind, _) => return Err(ApiError::unsupported(param, format!("a content block of type {:?}", kind.unwrap_or("?")))),
                    }
                }
                Ok(out)
            }
        }
    }
}

/// Anthropic's error body for an [`ApiError`].
fn error(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 | 413 => "invalid_request_error",
        401 => "authentication_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    (e.status, Json(json!({"type": "error", "error": {"type": kind, "message": e.message}}))).into_response()
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<Shared>, b: Result<Bytes, BytesRejection>) -> Response {
    state.counters.requests.fetch_add(1, Ordering::Relaxed);
    match run(&state, b).await {
        Ok(r) => r,
        Err(e) => {
            state.counters.errors.fetch_add(1, Ordering::Relaxed);
            error(e)
        }
    }
}

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !x.is_finite() || x < lo || x > hi => Err(ApiError::bad_request(Some(param), format!("{param} is {x}; it must be in [{lo}, {hi}]"))),
        v => Ok(v),
    }
}

async fn run(state: &Shared, b: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let ready = state.ready()?;
    let b = body(b, state)?;
    let v: Value = serde_json::from_slice(&b).map_err(|e| ApiError::bad_request(None, format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(None, "the body must be a JSON object"));
    }
    let req: MessagesRequest = serde_json::from_value(v).map_err(|e| ApiError::bad_request(None, format!("a field has the wrong type: {e}")))?;
    let id = &state.opts.model_id;
    let model = match req.model.as_deref() {
        None | Some("") => id.clone(),
        Some(m) if m == id => id.clone(),
        Some(m) => {
            return Err(ApiError {
                param: Some("model".into()),
                ..ApiError::not_found("model_not_found", format!("the model {m:?} does not exist here (this server has {id:?})"))
            });
        }
    };
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) || req.tool_choice.is_some() {
        return Err(ApiError::unsupported("tools", "tools"));
    }
    if req.thinking.as_ref().is_some_and(|t| t.get("type").and_then(Value::as_str) != Some("disabled")) {
        return Err(ApiError::unsupported("thinking", "extended thinking"));
    }
    let max_tokens = match req.max_tokens {
        None => return Err(ApiError::bad_request(Some("max_tokens"), "max_tokens is required")),
        Some(0) => return Err(ApiError::bad_request(Some("max_tokens"), "max_tokens must be at least 1")),
        Some(n) => n.min(usize::MAX as u64) as usize,
    };
    let msgs = req.messages.as_ref().ok_or_else(|| ApiError::bad_request(Some("messages"), "messages is required"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad_request(Some("messages"), "messages is empty"));
    }
    let mut chat = Vec::new();
    if let Some(s) = &req.system {
        chat.push(ChatMessage::new("system", s.text("system")?));
    }
    for (i, m) in msgs.iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::bad_request(Some(&format!("messages[{i}].role")), format!("role {:?}: messages are from \"user\" or \"assistant\"", m.role)));
        }
        chat.push(ChatMessage::new(m.role.clone(), m.content.text(&format!("messages[{i}].content"))?));
    }
    let stop = req.stop_sequences.clone().unwrap_or_default();
    if stop.len() > MAX_STOP || stop.iter().any(String::is_empty) {
        return Err(ApiError::bad_request(Some("stop_sequences"), format!("at most {MAX_STOP} stop sequences, none empty")));
    }
    let d = SamplerOpts::default();
    let seed = state.next_id.load(Ordering::Relaxed) ^ unix_now().rotate_left(23) ^ 0x2545_f491_4f6c_dd1d;
    let sampler = SamplerOpts {
        temperature: range("temperature", req.temperature, 0.0, 1.0)?.unwrap_or(d.temperature),
        top_p: range("top_p", req.top_p, 0.0, 1.0)?.filter(|&p| p > 0.0).unwrap_or(d.top_p),
        top_k: req.top_k.map_or(d.top_k, |k| k as usize),
        seed,
        ..d
    };
    let batcher = &ready.batcher;
    let engine = batcher.engine();
    let text = engine.chat_template().render_continuing(&chat).map_err(|e| ApiError::from(EngineError::from(e)))?;
    let tokens = batcher.prompt_tokens(text)?;
    let n_ctx = engine.n_ctx();
    if tokens.len() >= n_ctx {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(
                Some("messages"),
                format!("the prompt is {} tokens; the context holds {n_ctx} with room for at least one more", tokens.len()),
            )
        });
    }
    let opts = GenerateOpts { sampler, max_tokens: max_tokens.min(n_ctx - tokens.len()), stop, ..GenerateOpts::default() };
    opts.check()?;
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let msg_id = format!("msg_{n:x}{:x}", unix_now());
    let prompt_len = tokens.len();
    let stream = req.stream.unwrap_or(false);
    let run = Running::start(state, batcher, tokens, &opts, stream)?;
    if stream {
        let s = EventStream::new(run, MessageStream { id: msg_id, model, prompt_len, started: false, state: state.clone(), stop: opts.stop });
        return Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response());
    }
    let g = run.finish().await?;
    let (reason, seq) = ending(&g, &opts.stop);
    Ok(Json(json!({
        "id": msg_id, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": g.text}],
        "stop_reason": reason, "stop_sequence": seq,
        "usage": usage(&g),
    }))
    .into_response())
}

fn usage(g: &Generation) -> Value {
    json!({"input_tokens": g.prompt_tokens - g.reused, "cache_read_input_tokens": g.reused, "cache_creation_input_tokens": 0, "output_tokens": g.ids.len()})
}

/// `stop_reason` and `stop_sequence`: a stop string ended it when the generation stopped
/// without a stop token.
fn ending(g: &Generation, stop: &[String]) -> (&'static str, Value) {
    match g.finish {
        FinishReason::MaxTokens | FinishReason::ContextFull => ("max_tokens", Value::Null),
        FinishReason::Stop if g.stop_token.is_none() && !stop.is_empty() => {
            // The generation's own text never holds the stop string: which one matched is not
            // kept, so the first that could have is named when there is only one.
            if stop.len() == 1 { ("stop_sequence", json!(stop[0])) } else { ("stop_sequence", Value::Null) }
        }
        _ => ("end_turn", Value::Null),
    }
}

/// The streamed answer: Anthropic's event sequence.
struct MessageStream {
    id: String,
    model: String,
    prompt_len: usize,
    started: bool,
    state: Shared,
    stop: Vec<String>,
}

fn ev(name: &str, v: Value) -> Event {
    Event::default().event(name).data(v.to_string())
}

impl Answer for MessageStream {
    fn on_msg(&mut self, m: Msg, out: &mut VecDeque<Event>) {
        if !self.started {
            self.started = true;
            out.push_back(ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": self.prompt_len, "output_tokens": 0}}}),
            ));
            out.push_back(ev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
        }
        match m {
            Msg::Token { text, .. } => {
                if !text.is_empty() {
                    out.push_back(ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})));
                }
            }
            Msg::Done(Ok(g)) => {
                super::running::account(&self.state, &g);
                let (reason, seq) = ending(&g, &self.stop);
                out.push_back(ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})));
                out.push_back(ev(
                    "message_delta",
                    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": {"output_tokens": g.ids.len()}}),
                ));
                out.push_back(ev("message_stop", json!({"type": "message_stop"})));
            }
            Msg::Done(Err(e)) => {
                self.state.counters.errors.fetch_add(1, Ordering::Relaxed);
                let e = ApiError::from(e);
                out.push_back(ev("error", json!({"type": "error", "error": {"type": "api_error", "message": e.message}})));
            }
        }
    }

    fn closed(&mut self, out: &mut VecDeque<Event>) {
        out.push_back(ev("error", json!({"type": "error", "error": {"type": "api_error", "message": "the batcher stopped"}})));
    }
}

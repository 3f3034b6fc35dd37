//! The request bodies of `/v1/chat/completions` and `/v1/completions`, and what they become: a
//! prompt and [`GenerateOpts`]. Unknown fields are ignored, as OpenAI's own clients send some
//! (`user`, `store`, `metadata`); every field that would change the output is either honoured
//! or refused with a 400 that names it.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::chat_template::ChatMessage;
use crate::engine::{DraftSource, GenerateOpts, SamplerOpts, Speculative};

/// The most stop strings a request may give.
pub const MAX_STOP: usize = 16;
/// The most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A structured-output request.
#[derive(Debug, Clone)]
pub enum Structure {
    /// A JSON schema.
    Json(Value),
    /// A Lark grammar.
    Lark(String),
}

/// A string, or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// A message's content: text, or a list of parts (only `text` parts are accepted).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Text.
    Text(String),
    /// Parts: `{"type": "text", "text": ...}`.
    Parts(Vec<Value>),
}

/// One chat message as sent.
#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (absent or null for an assistant turn that only called tools).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// A tool message's call id.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// A completion prompt: text, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum WirePrompt {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A list of texts (one only: several prompts would be `n` > 1).
    Texts(Vec<String>),
}

/// The fields of both endpoints (`messages` for chat, `prompt` for completions).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenRequest {
    pub model: Option<String>,
    pub messages: Option<Vec<WireMessage>>,
    pub prompt: Option<WirePrompt>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<OneOrMany>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Chat: a bool; completions: the number of top log-probabilities (0 to 20).
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<u32>,
    pub n: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub grammar: Option<String>,
    pub speculative: Option<Value>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u32>,
    /// Generate through end-of-generation tokens up to `max_tokens` (vLLM's and llama.cpp's
    /// extension; for benchmarks).
    pub ignore_eos: Option<bool>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// Parses a body, turning serde's complaint into a 400 that names the place.
pub fn parse(body: &[u8]) -> Result<GenRequest, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::bad_request(None, format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(None, "the body must be a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad_request(None, format!("a field has the wrong type: {e}")))
}

fn range(param: &str, v: Option<f32>, lo: f32, hi: f32, lo_open: bool) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !x.is_finite() || x > hi || x < lo || (lo_open && x == lo) => {
            let open = if lo_open { "(" } else { "[" };
            Err(ApiError::bad_request(Some(param), format!("{param} is {x}; it must be in {open}{lo}, {hi}]")))
        }
        v => Ok(v),
    }
}

/// Most `logit_bias` entries a request may give.
const MAX_LOGIT_BIAS: usize = 1024;

impl GenRequest {
    /// Refuses what this server does not implement (never silently ignored).
    pub fn check_supported(&self) -> Result<(), ApiError> {
        if let Some(n) = self.n
            && n != 1
        {
            return Err(ApiError::unsupported("n", format!("n = {n} (one choice per request)")));
        }
        if let Some(b) = self.best_of
            && b != 1
        {
            return Err(ApiError::unsupported("best_of", format!("best_of = {b}")));
        }
        if let Some(f) = &self.response_format {
            match f.get("type").and_then(Value::as_str) {
                Some("text" | "json_object" | "json_schema") => {}
                Some(t) => return Err(ApiError::unsupported("response_format", format!("response_format of type {t:?}"))),
                None => return Err(ApiError::bad_request(Some("response_format"), "response_format needs a \"type\"")),
            }
        }
        if self.grammar.is_some() && self.response_format.as_ref().is_some_and(|f| f.get("type").and_then(Value::as_str) != Some("text")) {
            return Err(ApiError::bad_request(Some("grammar"), "give either grammar or a JSON response_format, not both"));
        }
        if self.echo == Some(true) {
            return Err(ApiError::unsupported("echo", "echo"));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::unsupported("suffix", "suffix"));
        }
        Ok(())
    }

    /// How many top log-probabilities per token were asked for, and whether the chosen token's
    /// log-probability was (`chat`: `logprobs: true` with `top_logprobs`; completions:
    /// `logprobs: N`).
    pub fn logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let n = if chat {
            let on = match &self.logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => return Err(ApiError::bad_request(Some("logprobs"), format!("logprobs must be true or false, not {v}"))),
            };
            match (on, self.top_logprobs) {
                (false, Some(n)) if n > 0 => return Err(ApiError::bad_request(Some("top_logprobs"), "top_logprobs needs logprobs: true")),
                (false, _) => return Ok(None),
                (true, n) => n.unwrap_or(0) as usize,
            }
        } else {
            match &self.logprobs {
                None | Some(Value::Null) => return Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) => n as usize,
                    None => return Err(ApiError::bad_request(Some("logprobs"), format!("logprobs must be a whole number of top log-probabilities, not {v}"))),
                },
            }
        };
        if n > MAX_TOP_LOGPROBS {
            let param = if chat { "top_logprobs" } else { "logprobs" };
            return Err(ApiError::bad_request(Some(param), format!("{param} is {n}; at most {MAX_TOP_LOGPROBS}")));
        }
        Ok(Some(n))
    }

    /// The generation options. `default_seed` is used when the request gives none.
    pub fn generate_opts(&self, chat: bool, default_seed: u64, room: usize) -> Result<GenerateOpts, ApiError> {
        let d = SamplerOpts::default();
        let temperature = range("temperature", self.temperature, 0.0, 2.0, false)?.unwrap_or(d.temperature);
        let top_p = range("top_p", self.top_p, 0.0, 1.0, true)?.unwrap_or(d.top_p);
        let min_p = range("min_p", self.min_p, 0.0, 1.0, false)?.unwrap_or(d.min_p);
        let presence_penalty = range("presence_penalty", self.presence_penalty, -2.0, 2.0, false)?.unwrap_or(d.presence_penalty);
        let frequency_penalty = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, false)?.unwrap_or(d.frequency_penalty);
        let repeat_penalty = range("repeat_penalty", self.repeat_penalty, 0.0, f32::MAX, true)?.unwrap_or(d.repeat_penalty);
        let sampler = SamplerOpts {
            temperature,
            top_p,
            min_p,
            presence_penalty,
            frequency_penalty,
            repeat_penalty,
            top_k: self.top_k.map_or(d.top_k, |k| k as usize),
            seed: self.seed.map_or(default_seed, |s| s as u64),
            ..d
        };
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(0), _) => return Err(ApiError::bad_request(Some("max_completion_tokens"), "max_completion_tokens must be at least 1")),
            (None, Some(0)) => return Err(ApiError::bad_request(Some("max_tokens"), "max_tokens must be at least 1")),
            (Some(n), _) | (None, Some(n)) => (n.min(usize::MAX as u64) as usize).min(room),
            (None, None) => room,
        };
        let stop = match &self.stop {
            None => Vec::new(),
            Some(OneOrMany::One(s)) => vec![s.clone()],
            Some(OneOrMany::Many(v)) => v.clone(),
        };
        if stop.len() > MAX_STOP {
            return Err(ApiError::bad_request(Some("stop"), format!("{} stop strings; at most {MAX_STOP}", stop.len())));
        }
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::bad_request(Some("stop"), "an empty stop string"));
        }
        let top_logprobs = self.logprobs(chat)?.unwrap_or(0);
        let ignore_eos = self.ignore_eos.unwrap_or(false);
        let opts = GenerateOpts { sampler, max_tokens, stop, top_logprobs, ignore_eos, ..GenerateOpts::default() };
        opts.check().map_err(ApiError::from)?;
        Ok(opts)
    }

    /// Speculative decoding for this request: `{"type": "ngram" | "draft" | "none",
    /// "draft_max": N, "draft_min": N, "ngram": N}` (`draft`: the server's draft model, a 400
    /// when it has none; type left out: the server's default drafter, else n-gram; other
    /// fields left out: the server's default, else [`Speculative::default`]); absent: the
    /// server's default.
    pub fn speculative(&self, default: Option<Speculative>, has_draft: bool) -> Result<Option<Speculative>, ApiError> {
        let Some(v) = &self.speculative else { return Ok(default) };
        let bad = |what: String| ApiError::bad_request(Some("speculative"), what);
        let o = v.as_object().ok_or_else(|| bad(format!("speculative must be an object, not {v}")))?;
        let mut s = default.unwrap_or_default();
        match o.get("type") {
            None => {}
            Some(Value::String(t)) if t == "none" => return Ok(None),
            Some(Value::String(t)) if t == "ngram" => s.source = DraftSource::Ngram,
            Some(Value::String(t)) if t == "draft" && has_draft => s.source = DraftSource::Model,
            Some(Value::String(t)) if t == "draft" => {
                return Err(bad("speculative type \"draft\": the server has no draft model (cera serve --model-draft)".into()));
            }
            Some(t) => return Err(bad(format!("speculative type {t}: \"ngram\", \"draft\" or \"none\""))),
        }
        for (key, field) in [("draft_max", &mut s.draft_max), ("draft_min", &mut s.draft_min), ("ngram", &mut s.ngram)] {
            if let Some(x) = o.get(key) {
                *field = x.as_u64().ok_or_else(|| bad(format!("speculative.{key} must be a whole number, not {x}")))? as usize;
            }
        }
        if let Some(k) = o.keys().find(|k| !["type", "draft_max", "draft_min", "ngram"].contains(&k.as_str())) {
            return Err(bad(format!("unknown speculative field {k:?}")));
        }
        let check = GenerateOpts { speculative: Some(s), ..GenerateOpts::default() };
        check.check().map_err(|e| bad(e.to_string()))?;
        Ok(Some(s))
    }

    /// `logit_bias` as (id, bias) pairs: keys are token ids of the vocabulary of `vocab` ids,
    /// values numbers from -100 to 100 (OpenAI's bounds); at most 1024 entries.
    pub fn logit_bias(&self, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(m) = &self.logit_bias else { return Ok(Vec::new()) };
        if m.len() > MAX_LOGIT_BIAS {
            return Err(ApiError::bad_request(Some("logit_bias"), format!("{} entries; at most {MAX_LOGIT_BIAS}", m.len())));
        }
        let bad = |what: String| ApiError::bad_request(Some("logit_bias"), what);
        m.iter()
            .map(|(k, v)| {
                let id: u32 = k.trim().parse().map_err(|_| bad(format!("the key {k:?} is not a token id")))?;
                if id as usize >= vocab {
                    return Err(bad(format!("token id {id} is outside the vocabulary of {vocab}")));
                }
                let b = v.as_f64().ok_or_else(|| bad(format!("the bias of {id} is {v}, not a number")))?;
                if !(-100.0..=100.0).contains(&b) {
                    return Err(bad(format!("the bias of {id} is {b}; from -100 to 100")));
                }
                Ok((id, b as f32))
            })
            .collect()
    }

    /// What constrains the output, if anything: a JSON schema (`response_format` `json_object`
    /// is any object) or a Lark grammar.
    pub fn structure(&self) -> Result<Option<Structure>, ApiError> {
        if let Some(g) = &self.grammar {
            return Ok(Some(Structure::Lark(g.clone())));
        }
        let Some(f) = &self.response_format else { return Ok(None) };
        match f.get("type").and_then(Value::as_str) {
            Some("json_object") => Ok(Some(Structure::Json(serde_json::json!({"type": "object"})))),
            Some("json_schema") => {
                let schema = f
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .ok_or_else(|| ApiError::bad_request(Some("response_format.json_schema.schema"), "response_format json_schema needs json_schema.schema"))?;
                Ok(Some(Structure::Json(schema.clone())))
            }
            _ => Ok(None),
        }
    }

    /// The chat messages, for the template. `developer` is `system`.
    pub fn chat_messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        let msgs = self.messages.as_ref().ok_or_else(|| ApiError::bad_request(Some("messages"), "messages is required"))?;
        if msgs.is_empty() {
            return Err(ApiError::bad_request(Some("messages"), "messages is empty"));
        }
        msgs.iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "developer" => "system",
                    r @ ("system" | "user" | "assistant" | "tool") => r,
                    r => return Err(ApiError::bad_request(Some(&format!("messages[{i}].role")), format!("unknown role {r:?}"))),
                };
                let text = match &m.content {
                    None => String::new(),
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        let mut t = String::new();
                        for p in parts {
                            match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                                (Some("text"), Some(s)) => t.push_str(s),
                                (kind, _) => {
                                    return Err(ApiError::unsupported(
                                        &format!("messages[{i}].content"),
                                        format!("a content part of type {:?}", kind.unwrap_or("?")),
                                    ));
                                }
                            }
                        }
                        t
                    }
                };
                let mut msg = ChatMessage::new(role, text);
                msg.tool_calls = m.tool_calls.as_ref().and_then(super::tools::template_calls);
                msg.tool_call_id = m.tool_call_id.clone();
                Ok(msg)
            })
            .collect()
    }
}

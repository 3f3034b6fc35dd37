//! The answers' JSON, as OpenAI's API shapes them: whole completions, stream chunks, usage and
//! log-probabilities.

use serde_json::{Value, json};

use crate::engine::{FinishReason, Generation};
use crate::tokenizer::Tokenizer;

/// Which endpoint an answer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

/// What every answer of one request repeats.
#[derive(Clone, Debug)]
pub struct Head {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
    }
}

/// A token's text (control tokens rendered; part of a UTF-8 character shows U+FFFD) and bytes.
fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.piece(id, true).unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

fn round(lp: f32) -> f64 {
    (lp as f64 * 1e6).round() / 1e6
}

/// Chat's `logprobs.content` entry of one token.
pub fn chat_logprob(tok: &Tokenizer, id: u32, lp: f32, top: &[(u32, f32)]) -> Value {
    let (text, bytes) = token_text(tok, id);
    let tops: Vec<Value> = top
        .iter()
        .map(|&(t, l)| {
            let (tt, tb) = token_text(tok, t);
            json!({"token": tt, "logprob": round(l), "bytes": tb})
        })
        .collect();
    json!({"token": text, "logprob": round(lp), "bytes": bytes, "top_logprobs": tops})
}

/// Completions' `logprobs` object over some tokens (`text_offset` counted from `offset`).
pub fn text_logprobs(tok: &Tokenizer, ids: &[u32], lps: &[f32], tops: &[Vec<(u32, f32)>], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top_logprobs = Vec::new();
    let mut text_offset = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let (text, _) = token_text(tok, id);
        text_offset.push(offset);
        offset += text.len();
        tokens.push(text);
        token_logprobs.push(lps.get(i).map(|&l| round(l)));
        let top: serde_json::Map<String, Value> =
            tops.get(i).map_or(&[][..], Vec::as_slice).iter().map(|&(t, l)| (token_text(tok, t).0, json!(round(l)))).collect();
        top_logprobs.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offset})
}

/// The `usage` object.
pub fn usage(g: &Generation) -> Value {
    json!({
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.ids.len(),
        "total_tokens": g.prompt_tokens + g.ids.len(),
        "prompt_tokens_details": {"cached_tokens": g.reused},
    })
}

/// The whole answer of a request that was not streamed.
pub fn whole(h: &Head, tok: &Tokenizer, g: &Generation, logprobs: Option<usize>) -> Value {
    let finish = finish_reason(g.finish);
    match h.kind {
        Kind::Chat => {
            let lp = logprobs.map(|_| {
                let content: Vec<Value> = g
                    .ids
                    .iter()
                    .enumerate()
                    .map(|(i, &id)| chat_logprob(tok, id, g.logprobs[i], g.top_logprobs.get(i).map_or(&[][..], Vec::as_slice)))
                    .collect();
                json!({"content": content})
            });
            json!({
                "id": h.id, "object": "chat.completion", "created": h.created, "model": h.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": g.text}, "logprobs": lp, "finish_reason": finish}],
                "usage": usage(g),
            })
        }
        Kind::Text => {
            let lp = logprobs.map(|_| text_logprobs(tok, &g.ids, &g.logprobs, &g.top_logprobs, 0));
            json!({
                "id": h.id, "object": "text_completion", "created": h.created, "model": h.model,
                "choices": [{"index": 0, "text": g.text, "logprobs": lp, "finish_reason": finish}],
                "usage": usage(g),
            })
        }
    }
}

/// One stream chunk: `delta` is the chat delta object or the completion's text; `logprobs` as
/// the endpoint writes them; `finish` on the last.
pub fn chunk(h: &Head, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
    match h.kind {
        Kind::Chat => json!({
            "id": h.id, "object": "chat.completion.chunk", "created": h.created, "model": h.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }),
        Kind::Text => json!({
            "id": h.id, "object": "text_completion", "created": h.created, "model": h.model,
            "choices": [{"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}],
        }),
    }
}

/// The last chunk of `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk(h: &Head, g: &Generation) -> Value {
    let object = if h.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    json!({"id": h.id, "object": object, "created": h.created, "model": h.model, "choices": [], "usage": usage(g)})
}

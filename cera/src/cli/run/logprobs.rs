//! `--top-logprobs N` of `cera run`: each token's text beside its id and log-probability, in
//! the JSON object (`"logprobs"` for the chosen tokens, `"top_logprobs"` for the N most likely
//! at each step) or, without `--json`, one line per token on standard error while the text
//! streams to standard output:
//!
//! ```text
//! logprob " blue" -0.312 | top: " blue" -0.312, " sky" -1.870, " a" -2.941
//! ```

use serde_json::{Value, json};

use super::super::generation::{TextSink, note};
use crate::engine::{Generation, Sink, TokenEvent};
use crate::tokenizer::Tokenizer;

/// A token's text as the model wrote it (control tokens rendered; a piece that is part of a
/// UTF-8 character shows U+FFFD).
pub fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.piece(id, true).map(|p| String::from_utf8_lossy(&p).into_owned()).unwrap_or_default()
}

/// Log-probabilities rounded to 6 decimals, as they are worth.
fn round(lp: f32) -> f64 {
    (lp as f64 * 1e6).round() / 1e6
}

fn entry(tok: &Tokenizer, id: u32, lp: f32) -> Value {
    json!({"id": id, "token": token_text(tok, id), "logprob": round(lp)})
}

/// The JSON object's `logprobs` (one `{"id", "token", "logprob"}` per generated token) and
/// `top_logprobs` (a list of the same per token, most likely first).
pub fn json_fields(tok: &Tokenizer, g: &Generation) -> (Value, Value) {
    let chosen = g.ids.iter().zip(&g.logprobs).map(|(&id, &lp)| entry(tok, id, lp)).collect();
    let tops = g.top_logprobs.iter().map(|step| Value::Array(step.iter().map(|&(id, lp)| entry(tok, id, lp)).collect())).collect();
    (Value::Array(chosen), Value::Array(tops))
}

/// The line of one token on standard error.
fn line(tok: &Tokenizer, ev: &TokenEvent<'_>) -> String {
    let shown = |id: u32, lp: f32| format!("{:?} {lp:.3}", token_text(tok, id));
    let top: Vec<String> = ev.top_logprobs.iter().map(|&(id, lp)| shown(id, lp)).collect();
    format!("logprob {} | top: {}", shown(ev.id, ev.logprob.unwrap_or(f32::NAN)), top.join(", "))
}

/// The text sink of `cera run`, which also writes each token's line on standard error.
pub struct TextWithLogprobs<'o, 't> {
    /// The text's sink.
    pub text: TextSink<'o>,
    tok: &'t Tokenizer,
}

impl<'o, 't> TextWithLogprobs<'o, 't> {
    /// Streams the text to `text`, each token's log-probabilities to standard error.
    pub fn new(text: TextSink<'o>, tok: &'t Tokenizer) -> Self {
        TextWithLogprobs { text, tok }
    }
}

impl Sink for TextWithLogprobs<'_, '_> {
    fn token(&mut self, ev: &TokenEvent<'_>) {
        self.text.token(ev);
        note(&line(self.tok, ev));
    }
}

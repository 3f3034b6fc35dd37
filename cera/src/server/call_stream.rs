//! A streamed answer with tools offered: text is shown as it comes until a call may start; a
//! JSON call (Hermes `<tool_call>{...}`, or Llama 3's answer-long object) has its function name
//! sent as soon as it is read and its arguments as they are generated (OpenAI's `tool_calls`
//! deltas: the first with `id`, `type` and `name`, then `arguments` pieces); anything else that
//! may be a call (LFM2's Python-style lists, a call written arguments-first) is held and parsed
//! whole at the end.

use serde_json::{Value, json};

use super::tool_syntax::{ArgEvent, ArgStream, Syntax};
use super::tools::{self, Tool};

/// Where the watch is.
#[derive(Debug)]
enum State {
    /// Showing text (the tail that may start a call marker held).
    Text,
    /// Inside a JSON call whose arguments stream.
    Call(ArgStream),
    /// A streamed call's arguments are complete: waiting for its end marker (Hermes), the
    /// text after it held.
    After,
    /// Everything from here on is held and parsed at the end.
    Hold,
}

/// Watches a streamed answer for tool calls.
#[derive(Debug)]
pub struct CallWatch {
    pub tools: Vec<Tool>,
    syntax: Syntax,
    state: State,
    /// Text not shown yet.
    held: String,
    /// Calls streamed so far.
    streamed: usize,
    /// Whether any text was shown (Llama 3's call is the whole answer).
    shown_any: bool,
    id: String,
}

const HERMES_CLOSE: &str = "</tool_call>";

impl CallWatch {
    pub fn new(tools: Vec<Tool>, syntax: Syntax, request_id: &str) -> CallWatch {
        CallWatch { tools, syntax, state: State::Text, held: String::new(), streamed: 0, shown_any: false, id: request_id.to_string() }
    }

    /// Adds generated text; returns the content to show now and the `tool_calls` deltas.
    pub fn push(&mut self, text: &str) -> (String, Vec<Value>) {
        self.held.push_str(text);
        let mut shown = String::new();
        let mut deltas = Vec::new();
        loop {
            match &mut self.state {
                State::Hold => return (shown, deltas),
                State::Text => {
                    let (opener, skip) = match self.syntax {
                        Syntax::Hermes => (tools::OPEN, tools::OPEN.len()),
                        Syntax::Lfm2 => ("<|tool_call_start|>", 0),
                        Syntax::Llama3 => {
                            // A call is the whole answer: decided by its first visible text.
                            let t = self.held.trim_start();
                            if self.shown_any || t.is_empty() {
                                if !self.shown_any {
                                    return (shown, deltas);
                                }
                                shown.push_str(&std::mem::take(&mut self.held));
                                return (shown, deltas);
                            }
                            let tag = "<|python_tag|>";
                            if t.starts_with('{') || t.starts_with(tag) {
                                let body = t.strip_prefix(tag).unwrap_or(t).to_string();
                                self.held.clear();
                                self.state = State::Call(ArgStream::default());
                                self.feed(&body, &mut deltas);
                                continue;
                            }
                            if tag.starts_with(t) {
                                return (shown, deltas);
                            }
                            self.shown_any = true;
                            shown.push_str(&std::mem::take(&mut self.held));
                            return (shown, deltas);
                        }
                    };
                    if let Some(i) = self.held.find(opener) {
                        shown.push_str(&self.held[..i]);
                        let rest = self.held[i + skip..].to_string();
                        self.held.clear();
                        if self.syntax == Syntax::Hermes {
                            self.state = State::Call(ArgStream::default());
                            self.feed(&rest, &mut deltas);
                        } else {
                            self.held = rest;
                            self.state = State::Hold;
                        }
                        continue;
                    }
                    if self.syntax == Syntax::Lfm2 && !self.shown_any && shown.is_empty() && self.held.trim_start().starts_with('[') {
                        // A bare call list (markers left out by the detokenizer).
                        self.state = State::Hold;
                        return (shown, deltas);
                    }
                    // Keep the longest tail that may start the opener.
                    let keep = (1..opener.len().min(self.held.len() + 1))
                        .rev()
                        .find(|&k| self.held.is_char_boundary(self.held.len() - k) && opener.starts_with(&self.held[self.held.len() - k..]))
                        .unwrap_or(0);
                    let cut = self.held.len() - keep;
                    shown.push_str(&self.held[..cut]);
                    self.held.drain(..cut);
                    self.shown_any |= !shown.trim().is_empty();
                    return (shown, deltas);
                }
                State::Call(_) => {
                    let rest = std::mem::take(&mut self.held);
                    self.feed(&rest, &mut deltas);
                    if matches!(self.state, State::Call(_)) {
                        return (shown, deltas);
                    }
                }
                State::After => {
                    match self.syntax {
                        Syntax::Hermes => match self.held.find(HERMES_CLOSE) {
                            Some(i) => {
                                self.held.drain(..i + HERMES_CLOSE.len());
                                self.state = State::Text;
                            }
                            None => return (shown, deltas),
                        },
                        // Llama 3: more calls after `;` are parsed at the end.
                        _ => self.state = State::Hold,
                    }
                }
            }
        }
    }

    /// Feeds call text to the current [`ArgStream`]; moves on when it completes or refuses.
    fn feed(&mut self, text: &str, deltas: &mut Vec<Value>) {
        let State::Call(a) = &mut self.state else { return };
        for e in a.push(text, &self.tools) {
            let i = self.streamed;
            deltas.push(match e {
                ArgEvent::Name(name) => {
                    json!([{"index": i, "id": format!("call_{}_{i}", self.id), "type": "function", "function": {"name": name, "arguments": ""}}])
                }
                ArgEvent::Args(s) => json!([{"index": i, "function": {"arguments": s}}]),
            });
        }
        let State::Call(a) = &mut self.state else { return };
        if a.done {
            // The rest of this push is after the call's value.
            let after = a.rest();
            self.streamed += 1;
            self.held = after;
            self.state = State::After;
        } else if !a.started() && a.refused() {
            // Not a streamable call: hold it from its start and parse it at the end.
            self.held = match self.syntax {
                Syntax::Hermes => format!("{}{}", tools::OPEN, a.text()),
                _ => a.text().to_string(),
            };
            self.state = State::Hold;
        }
    }

    /// At the end: the held text's calls (after the streamed ones) as one delta, the rest as
    /// content; and whether the answer called anything.
    pub fn finish(self) -> (String, Option<Value>, bool) {
        let held = match self.state {
            State::After if self.syntax == Syntax::Hermes => String::new(),
            _ => self.held,
        };
        let (text, calls) = tools::parse_calls(&held, &self.tools, self.syntax);
        let text = if calls.is_empty() { held } else { text };
        let delta = (!calls.is_empty()).then(|| {
            let mut list = tools::calls_json(&calls, &self.id);
            for (k, c) in list.as_array_mut().into_iter().flatten().enumerate() {
                let i = self.streamed + k;
                c["index"] = json!(i);
                c["id"] = json!(format!("call_{}_{i}", self.id));
            }
            list
        });
        let called = self.streamed > 0 || delta.is_some();
        (text, delta, called)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        vec![Tool { name: "get_weather".into(), parameters: json!({"type": "object"}) }]
    }

    /// Pushes `text` a few bytes at a time; returns the shown text, the streamed deltas, and the
    /// end's text, delta and verdict.
    fn run(syntax: Syntax, text: &str) -> (String, Vec<Value>, (String, Option<Value>, bool)) {
        let mut w = CallWatch::new(tools(), syntax, "x");
        let (mut shown, mut deltas) = (String::new(), Vec::new());
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            let (s, d) = w.push(&piece.iter().collect::<String>());
            shown.push_str(&s);
            deltas.extend(d);
        }
        (shown, deltas, w.finish())
    }

    fn args_of(deltas: &[Value]) -> String {
        deltas.iter().filter_map(|d| d[0]["function"]["arguments"].as_str()).collect()
    }

    #[test]
    fn hermes_arguments_stream() {
        let (shown, deltas, (text, delta, called)) =
            run(Syntax::Hermes, "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
        assert_eq!(shown, "Let me look.");
        assert_eq!(deltas[0][0]["function"]["name"], "get_weather");
        assert_eq!(deltas[0][0]["id"], "call_x_0");
        assert!(deltas.len() > 2, "the arguments came in pieces: {deltas:?}");
        assert_eq!(args_of(&deltas), "{\"city\": \"Paris\"}");
        assert!(called && delta.is_none() && text.is_empty());
    }

    #[test]
    fn llama3_arguments_stream_and_text_passes() {
        let (shown, deltas, (_, _, called)) = run(Syntax::Llama3, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}");
        assert_eq!(shown, "");
        assert_eq!(args_of(&deltas), "{\"city\": \"Rome\"}");
        assert!(called);
        let (shown, deltas, (text, delta, called)) = run(Syntax::Llama3, "It is sunny {maybe}.");
        assert_eq!((shown.as_str(), deltas.len(), text.as_str(), delta, called), ("It is sunny {maybe}.", 0, "", None, false));
    }

    #[test]
    fn held_calls_are_parsed_at_the_end() {
        // LFM2's Python-style list; a Hermes call written arguments-first.
        let (shown, deltas, (text, delta, called)) = run(Syntax::Lfm2, "<|tool_call_start|>[get_weather(city=\"Oslo\")]<|tool_call_end|>");
        assert!(shown.is_empty() && deltas.is_empty() && text.is_empty() && called, "{shown:?} {deltas:?} {text:?} {called}");
        assert_eq!(delta.unwrap()[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
        let (_, deltas, (_, delta, called)) = run(Syntax::Hermes, "<tool_call>{\"arguments\": {\"city\": \"A\"}, \"name\": \"get_weather\"}</tool_call>");
        assert!(deltas.is_empty() && called);
        assert_eq!(delta.unwrap()[0]["function"]["name"], "get_weather");
        // No call: every byte shown.
        let (shown, _, (text, _, called)) = run(Syntax::Hermes, "Plain <tool answer>");
        assert_eq!(format!("{shown}{text}"), "Plain <tool answer>");
        assert!(!called);
    }
}

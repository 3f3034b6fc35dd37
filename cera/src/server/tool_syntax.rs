//! How models write tool calls, parsed back into OpenAI's `tool_calls`:
//!
//! - [`Syntax::Hermes`] (Qwen 2/2.5/3, Hermes, and every model whose template does not render
//!   tools, which the server then tells this form): `<tool_call>{"name": N, "arguments":
//!   {...}}</tool_call>`, anywhere in the answer, any number of them.
//! - [`Syntax::Llama3`] (Llama 3.1/3.2 templates: "Respond in the format {"name": function name,
//!   "parameters": dictionary ...}"): the answer is the call's JSON object, optionally after
//!   `<|python_tag|>`; several are separated by `;`.
//! - [`Syntax::Lfm2`] (LFM2's templates): `<|tool_call_start|>[f(a="x", b=2), g()]<|tool_call_end|>`,
//!   Python call syntax whose arguments are Python literals (strings in either quote, numbers,
//!   `True`/`False`/`None`, lists, dicts). The markers are special tokens, which a detokenizer
//!   may leave out: a whole answer of `[f(...)]` is a call list too.
//!
//! [`ArgStream`] follows one JSON call as it is generated, so its arguments can be streamed as
//! they come.

use serde_json::{Map, Value, json};

use super::tools::{Call, Tool};

/// A model's tool-call syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    Hermes,
    Llama3,
    Lfm2,
}

impl Syntax {
    /// The syntax a chat template's source asks for (Hermes when it names none).
    pub fn of_template(src: &str) -> Syntax {
        if src.contains("<|tool_call_start|>") || src.contains("<|tool_list_start|>") {
            Syntax::Lfm2
        } else if src.contains("<|python_tag|>") || src.contains("\"parameters\": dictionary") {
            Syntax::Llama3
        } else {
            Syntax::Hermes
        }
    }
}

fn known(tools: &[Tool], name: &str) -> bool {
    tools.iter().any(|t| t.name == name)
}

/// A call from a JSON object `{"name", "arguments" | "parameters"}` naming one of `tools`.
pub(super) fn json_call(v: &Value, tools: &[Tool]) -> Option<Call> {
    let name = v.get("name")?.as_str()?;
    if !known(tools, name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or_else(|| json!({}));
    let arguments = if let Value::String(s) = &args { s.clone() } else { args.to_string() };
    Some(Call { name: name.to_string(), arguments })
}

/// Llama 3's form: the whole answer is one call or several separated by `;` (after an optional
/// `<|python_tag|>`); anything else is text.
pub fn parse_llama3(text: &str, tools: &[Tool]) -> Option<Vec<Call>> {
    let body = text.trim();
    let mut rest = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim_start();
    if !rest.starts_with('{') {
        return None;
    }
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = de.next()?.ok()?;
        calls.push(json_call(&v, tools)?);
        rest = rest[de.byte_offset()..].trim_start();
        if let Some(r) = rest.strip_prefix(';') {
            rest = r.trim_start();
        }
    }
    Some(calls)
}

const LFM2_OPEN: &str = "<|tool_call_start|>";
const LFM2_CLOSE: &str = "<|tool_call_end|>";

/// LFM2's form: `(text, calls)`, the marked call lists taken out of the text, or the whole
/// answer when it is one bare `[f(...)]` list. Lists that do not parse, or name unknown
/// functions, stay text.
pub fn parse_lfm2(text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(LFM2_OPEN) {
        let after = &rest[start + LFM2_OPEN.len()..];
        let end = after.find(LFM2_CLOSE).unwrap_or(after.len());
        match python_calls(&after[..end], tools) {
            Some(cs) => {
                content.push_str(&rest[..start]);
                calls.extend(cs);
            }
            None => content.push_str(&rest[..start + LFM2_OPEN.len() + end + if end < after.len() { LFM2_CLOSE.len() } else { 0 }]),
        }
        rest = if end < after.len() { &after[end + LFM2_CLOSE.len()..] } else { "" };
    }
    content.push_str(rest);
    if calls.is_empty()
        && let Some(cs) = python_calls(text, tools)
    {
        return (String::new(), cs);
    }
    (content.trim().to_string(), calls)
}

/// `[f(a=1, b="x"), g()]` (the brackets optional around one call) as calls of `tools`.
fn python_calls(s: &str, tools: &[Tool]) -> Option<Vec<Call>> {
    let mut p = Py { s: s.trim().as_bytes(), at: 0 };
    let bracket = p.eat(b'[');
    let mut calls = Vec::new();
    loop {
        p.ws();
        if bracket && p.eat(b']') {
            break;
        }
        let name = p.ident()?;
        if !known(tools, &name) {
            return None;
        }
        p.ws();
        if !p.eat(b'(') {
            return None;
        }
        let mut args = Map::new();
        loop {
            p.ws();
            if p.eat(b')') {
                break;
            }
            let key = p.ident()?;
            p.ws();
            if !p.eat(b'=') {
                return None;
            }
            let v = p.value()?;
            args.insert(key, v);
            p.ws();
            if !p.eat(b',') {
                p.ws();
                if !p.eat(b')') {
                    return None;
                }
                break;
            }
        }
        calls.push(Call { name, arguments: Value::Object(args).to_string() });
        p.ws();
        if !bracket {
            break;
        }
        if !p.eat(b',') {
            p.ws();
            if !p.eat(b']') {
                return None;
            }
            break;
        }
    }
    p.ws();
    (p.at == p.s.len() && !calls.is_empty()).then_some(calls)
}

/// A small reader of Python literals.
struct Py<'a> {
    s: &'a [u8],
    at: usize,
}

impl Py<'_> {
    fn ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.s.get(self.at) == Some(&c);
        self.at += usize::from(hit);
        hit
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.at;
        while self.at < self.s.len() && (self.s[self.at].is_ascii_alphanumeric() || matches!(self.s[self.at], b'_' | b'.' | b'-')) {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        match *self.s.get(self.at)? {
            q @ (b'"' | b'\'') => self.string(q).map(Value::String),
            b'[' => {
                self.at += 1;
                let mut v = Vec::new();
                loop {
                    self.ws();
                    if self.eat(b']') {
                        return Some(Value::Array(v));
                    }
                    v.push(self.value()?);
                    self.ws();
                    if !self.eat(b',') {
                        self.ws();
                        return self.eat(b']').then_some(Value::Array(v));
                    }
                }
            }
            b'{' => {
                self.at += 1;
                let mut m = Map::new();
                loop {
                    self.ws();
                    if self.eat(b'}') {
                        return Some(Value::Object(m));
                    }
                    let k = match self.value()? {
                        Value::String(k) => k,
                        other => other.to_string(),
                    };
                    self.ws();
                    if !self.eat(b':') {
                        return None;
                    }
                    m.insert(k, self.value()?);
                    self.ws();
                    if !self.eat(b',') {
                        self.ws();
                        return self.eat(b'}').then_some(Value::Object(m));
                    }
                }
            }
            _ => {
                let start = self.at;
                while self.at < self.s.len() && !matches!(self.s[self.at], b',' | b')' | b']' | b'}') && !self.s[self.at].is_ascii_whitespace() {
                    self.at += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.at]).ok()?;
                match word {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    w => serde_json::from_str::<serde_json::Number>(w).ok().map(Value::Number),
                }
            }
        }
    }

    /// A quoted string (the opening quote `q` at `at`), with Python's common escapes.
    fn string(&mut self, q: u8) -> Option<String> {
        self.at += 1;
        let mut out = Vec::new();
        while let Some(&c) = self.s.get(self.at) {
            self.at += 1;
            match c {
                b'\\' => {
                    let e = *self.s.get(self.at)?;
                    self.at += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        other => other,
                    });
                }
                c if c == q => return String::from_utf8(out).ok(),
                c => out.push(c),
            }
        }
        None
    }
}

/// What [`ArgStream::push`] found.
#[derive(Debug, PartialEq)]
pub enum ArgEvent {
    /// The call's function (one of the tools).
    Name(String),
    /// More of its arguments' JSON text.
    Args(String),
}

/// Follows one JSON call `{"name": N, "arguments": VALUE ...}` (or `"parameters"`) as it is
/// generated: the name once `"name"` and the arguments key have been read, then the value's
/// text piece by piece until it is complete. A call written in another order (the arguments
/// first) or naming an unknown function gives nothing: the caller parses it whole at the end.
#[derive(Debug, Default)]
pub struct ArgStream {
    buf: String,
    /// Bytes of `buf` before the value (once the prefix is read).
    value_at: Option<usize>,
    /// Bytes of `buf` already handed out as arguments.
    sent: usize,
    depth: u32,
    in_str: bool,
    escaped: bool,
    pub done: bool,
    refused: bool,
}

impl ArgStream {
    /// Adds generated text; returns what became known.
    pub fn push(&mut self, text: &str, tools: &[Tool]) -> Vec<ArgEvent> {
        let mut out = Vec::new();
        if self.done || self.refused {
            return out;
        }
        self.buf.push_str(text);
        if self.value_at.is_none() {
            match prefix(&self.buf) {
                Prefix::Need => return out,
                Prefix::No => {
                    self.refused = true;
                    return out;
                }
                Prefix::Yes { name, value_at } => {
                    if !known(tools, &name) {
                        self.refused = true;
                        return out;
                    }
                    out.push(ArgEvent::Name(name));
                    self.value_at = Some(value_at);
                    self.sent = value_at;
                }
            }
        }
        // Scan the value from where the last push stopped; stop at its end.
        let bytes = self.buf.as_bytes();
        let mut end = None;
        let mut i = self.sent;
        while i < bytes.len() {
            let c = bytes[i];
            if self.in_str {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => self.in_str = false,
                    _ => {}
                }
            } else {
                match c {
                    b'"' => self.in_str = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth = self.depth.saturating_sub(1);
                        if self.depth == 0 {
                            end = Some(i + 1);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        let stop = end.unwrap_or(bytes.len());
        let piece = self.buf[self.sent..stop].to_string();
        self.sent = stop;
        if end.is_some() {
            self.done = true;
        }
        if !piece.is_empty() {
            out.push(ArgEvent::Args(piece));
        }
        out
    }

    /// Whether it gave a name (so the call is being streamed).
    pub fn started(&self) -> bool {
        self.value_at.is_some()
    }

    /// Whether the call is not one it streams (read whole at the end instead).
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// Everything pushed so far.
    pub fn text(&self) -> &str {
        &self.buf
    }

    /// What was pushed after the complete value.
    pub fn rest(&self) -> String {
        self.buf[self.sent..].to_string()
    }
}

enum Prefix {
    Need,
    No,
    Yes { name: String, value_at: usize },
}

/// Reads `{ "name" : "N" , "arguments" :` (whitespace anywhere) at the start of `s`, up to the
/// value's first byte (an object or array: other values are parsed whole at the end).
fn prefix(s: &str) -> Prefix {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let lit = |i: &mut usize, t: &str| -> Option<bool> {
        let n = t.len().min(b.len() - *i);
        if b[*i..*i + n] != t.as_bytes()[..n] {
            return Some(false);
        }
        if n < t.len() {
            return None;
        }
        *i += n;
        Some(true)
    };
    // Reads `toks` in order, whitespace before each: the verdict when the text ends first or
    // differs.
    let expect = |i: &mut usize, toks: &[&str]| -> Option<Prefix> {
        for tok in toks {
            ws(i);
            match lit(i, tok) {
                None => return Some(Prefix::Need),
                Some(false) => return Some(Prefix::No),
                Some(true) => {}
            }
        }
        None
    };
    if let Some(v) = expect(&mut i, &["{", "\"name\"", ":"]) {
        return v;
    }
    ws(&mut i);
    if i >= b.len() {
        return Prefix::Need;
    }
    if b[i] != b'"' {
        return Prefix::No;
    }
    let Some(close) = s[i + 1..].find('"') else { return Prefix::Need };
    let name = s[i + 1..i + 1 + close].to_string();
    if name.contains('\\') {
        return Prefix::No;
    }
    i += close + 2;
    if let Some(v) = expect(&mut i, &[","]) {
        return v;
    }
    ws(&mut i);
    let r = &s[i..];
    let key = if r.starts_with("\"a") {
        "\"arguments\""
    } else if r.starts_with("\"p") {
        "\"parameters\""
    } else if r.is_empty() || r == "\"" {
        return Prefix::Need;
    } else {
        return Prefix::No;
    };
    if let Some(v) = expect(&mut i, &[key, ":"]) {
        return v;
    }
    ws(&mut i);
    match b.get(i) {
        None => Prefix::Need,
        Some(b'{' | b'[') => Prefix::Yes { name, value_at: i },
        Some(_) => Prefix::No,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        ["get_weather", "add"].iter().map(|n| Tool { name: n.to_string(), parameters: json!({"type": "object"}) }).collect()
    }

    #[test]
    fn the_template_names_its_syntax() {
        assert_eq!(Syntax::of_template("{{ '<|tool_call_start|>' }}"), Syntax::Lfm2);
        assert_eq!(Syntax::of_template("Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name"), Syntax::Llama3);
        assert_eq!(Syntax::of_template("{{- '<|python_tag|>' }}"), Syntax::Llama3);
        assert_eq!(Syntax::of_template("<tool_call>"), Syntax::Hermes);
        assert_eq!(Syntax::of_template("{{ messages }}"), Syntax::Hermes);
    }

    #[test]
    fn llama3_calls() {
        let t = tools();
        let one = parse_llama3("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", &t).unwrap();
        assert_eq!(one, vec![Call { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() }]);
        let tagged =
            parse_llama3("<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}; {\"name\": \"add\", \"parameters\": {\"a\": 2}}", &t).unwrap();
        assert_eq!(tagged.len(), 2);
        assert_eq!(tagged[1].arguments, "{\"a\":2}");
        assert!(parse_llama3("The weather is {\"name\": \"add\"}", &t).is_none());
        assert!(parse_llama3("{\"name\": \"unknown\", \"parameters\": {}}", &t).is_none());
        assert!(parse_llama3("{\"name\": \"add\", \"parameters\": {", &t).is_none());
    }

    #[test]
    fn lfm2_calls() {
        let t = tools();
        let (text, calls) = parse_lfm2(
            "<|tool_call_start|>[get_weather(city=\"Paris\", days=3, metric=True, tags=['a', \"b\"], opts={'x': None})]<|tool_call_end|>Checking.",
            &t,
        );
        assert_eq!(text, "Checking.");
        assert_eq!(calls.len(), 1);
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "Paris", "days": 3, "metric": true, "tags": ["a", "b"], "opts": {"x": null}}));
        // Two calls in one list; the markers left out by the detokenizer.
        let (text, calls) = parse_lfm2("[add(a=1, b=-2.5), get_weather(city='It\\'s')]", &t);
        assert_eq!((text.as_str(), calls.len()), ("", 2));
        assert_eq!(calls[1].arguments, "{\"city\":\"It's\"}");
        // Not calls: prose, unknown names, broken syntax.
        for s in ["[not a call]", "[unknown(a=1)]", "<|tool_call_start|>[add(a=]<|tool_call_end|>", "Sure: add(a=1) is easy"] {
            let (text, calls) = parse_lfm2(s, &t);
            assert!(calls.is_empty(), "{s}");
            assert_eq!(text, s.trim());
        }
    }

    #[test]
    fn arguments_stream_as_they_come() {
        let t = tools();
        let mut a = ArgStream::default();
        let text = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa}ris\", \"n\": [1, {\"x\": 2}]}}";
        let mut name = None;
        let mut args = String::new();
        for ch in text.chars() {
            for e in a.push(&ch.to_string(), &t) {
                match e {
                    ArgEvent::Name(n) => name = Some(n),
                    ArgEvent::Args(s) => args.push_str(&s),
                }
            }
        }
        assert_eq!(name.as_deref(), Some("get_weather"));
        assert_eq!(args, "{\"city\": \"Pa}ris\", \"n\": [1, {\"x\": 2}]}");
        assert!(a.done);
        // The arguments first, an unknown function, or a string value: parsed whole later.
        for s in ["{\"arguments\": {}, \"name\": \"add\"}", "{\"name\": \"nope\", \"arguments\": {}}", "{\"name\": \"add\", \"arguments\": \"{}\"}"] {
            let mut a = ArgStream::default();
            assert!(a.push(s, &t).is_empty(), "{s}");
            assert!(!a.started());
        }
        // `parameters` (Llama 3) streams too.
        let mut a = ArgStream::default();
        let ev = a.push("{\"name\": \"add\", \"parameters\": {\"a\": 1}}", &t);
        assert_eq!(ev, vec![ArgEvent::Name("add".into()), ArgEvent::Args("{\"a\": 1}".into())]);
    }
}

//! Tool calls (OpenAI's `tools`, `tool_choice`, `tool_calls`). The tools reach the model through
//! its own chat template when the template reads `tools`, and the answer is parsed back in the
//! template's call syntax (Hermes/Qwen `<tool_call>` JSON, Llama 3's JSON object, LFM2's
//! Python-style list: [`super::tool_syntax`]); otherwise a system message describes them and
//! asks for the Hermes form. `tool_choice: "required"` or a named function constrains decoding (a Lark grammar over
//! the functions' JSON schemas), so the call always parses and its arguments validate.

use serde_json::{Value, json};

use super::error::ApiError;
pub use super::tool_syntax::Syntax;
use super::tool_syntax::{json_call, parse_lfm2, parse_llama3};
use crate::chat_template::{ChatMessage, ChatTemplate, TemplateSource};

/// One function the model may call.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A parsed call.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// Where a call starts and ends.
pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The request's `tools` (each `{"type": "function", "function": {"name", "parameters"}}`).
pub fn parse_tools(tools: &[Value]) -> Result<Vec<Tool>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let param = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::unsupported(&param, "a tool that is not of type \"function\""));
            }
            let f = t.get("function").ok_or_else(|| ApiError::bad_request(Some(&param), "a tool needs a function"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| ApiError::bad_request(Some(&format!("{param}.function.name")), "a function needs a name"))?;
            let parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
            if !parameters.is_object() {
                return Err(ApiError::bad_request(Some(&format!("{param}.function.parameters")), "parameters must be a JSON schema object"));
            }
            Ok(Tool { name: name.to_string(), parameters })
        })
        .collect()
}

/// The request's `tool_choice` (default: `auto` with tools, `none` without).
pub fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<Choice, ApiError> {
    let c = match v {
        None | Some(Value::Null) => return Ok(if tools.is_empty() { Choice::None } else { Choice::Auto }),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => return Err(ApiError::bad_request(Some("tool_choice"), format!("tool_choice {other:?}: none, auto, required or a function"))),
        },
        Some(o) => match o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(n) => Choice::Named(n.to_string()),
            None => {
                return Err(ApiError::bad_request(
                    Some("tool_choice"),
                    "tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            }
        },
    };
    match &c {
        Choice::Required | Choice::Named(_) if tools.is_empty() => Err(ApiError::bad_request(Some("tool_choice"), "tool_choice needs tools")),
        Choice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            Err(ApiError::bad_request(Some("tool_choice"), format!("tool_choice names {n:?}, which is not among the tools")))
        }
        _ => Ok(c),
    }
}

/// Whether the template renders `tools` itself.
fn template_knows_tools(t: &ChatTemplate) -> bool {
    matches!(t.source(), TemplateSource::Jinja(src) if src.contains("tools"))
}

/// The prompt: the conversation with the tools, through the template when it takes them, else
/// with a system message that describes them and the call syntax.
pub fn render(t: &ChatTemplate, msgs: &[ChatMessage], raw_tools: &[Value], tools: &[Tool], choice: &Choice) -> Result<String, ApiError> {
    let err = |e: crate::chat_template::TemplateError| ApiError::bad_request(Some("messages"), e.to_string());
    if tools.is_empty() || *choice == Choice::None {
        return t.render_continuing(msgs).map_err(err);
    }
    if template_knows_tools(t) {
        let extra = std::collections::BTreeMap::from([("tools".to_string(), Value::Array(raw_tools.to_vec()))]);
        return t.render_with(msgs, true, &extra).map_err(err);
    }
    let list: Vec<Value> = tools.iter().map(|t| json!({"name": t.name, "parameters": t.parameters})).collect();
    let guide = format!(
        "You can call functions. To call one, answer with {OPEN}{{\"name\": NAME, \"arguments\": ARGUMENTS}}{CLOSE}, the arguments a JSON object that follows the function's parameters. The functions:\n{}",
        serde_json::to_string(&list).unwrap_or_default()
    );
    let mut all = msgs.to_vec();
    match all.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{}\n\n{guide}", m.content),
        _ => all.insert(0, ChatMessage::new("system", guide)),
    }
    t.render_continuing(&all).map_err(err)
}

/// The call syntax of `t`'s answers: the template's own where it renders tools, else the
/// Hermes form the server's system message asks for.
pub fn syntax(t: &ChatTemplate) -> Syntax {
    match t.source() {
        TemplateSource::Jinja(src) if template_knows_tools(t) => Syntax::of_template(src),
        _ => Syntax::Hermes,
    }
}

/// The Lark grammar that forces one call (`required`: of any tool; a named choice: of that one),
/// in Llama 3's form (the answer is the JSON object, arguments under `parameters`) for
/// [`Syntax::Llama3`], else in the Hermes form (LFM2's Python-style calls are not constrained:
/// a forced call is written as Hermes JSON, which [`parse_calls`] also reads).
pub fn forced_grammar(tools: &[Tool], choice: &Choice, syntax: Syntax) -> Option<String> {
    let allowed: Vec<&Tool> = match choice {
        Choice::Required => tools.iter().collect(),
        Choice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
        _ => return None,
    };
    let key = if syntax == Syntax::Llama3 { "parameters" } else { "arguments" };
    let variants: Vec<Value> = allowed
        .iter()
        .map(|t| json!({"type": "object", "properties": {"name": {"const": t.name}, key: t.parameters}, "required": ["name", key], "additionalProperties": false}))
        .collect();
    let schema = if variants.len() == 1 { variants[0].clone() } else { json!({"anyOf": variants}) };
    let mut schema = schema;
    schema["x-guidance"] = json!({"whitespace_flexible": false});
    if syntax == Syntax::Llama3 {
        return Some(format!("start: call\ncall: %json {schema}"));
    }
    Some(format!("start: {:?} call {:?}\ncall: %json {}", OPEN, CLOSE, schema))
}

/// Splits an answer into its text and its calls, read in `syntax` (see [`super::tool_syntax`]),
/// then, where that finds none, in the Hermes form (a forced call's). Anything that is not a
/// call of one of the tools stays text.
pub fn parse_calls(text: &str, tools: &[Tool], syntax: Syntax) -> (String, Vec<Call>) {
    let found = match syntax {
        Syntax::Hermes => None,
        Syntax::Llama3 => parse_llama3(text, tools).map(|calls| (String::new(), calls)),
        Syntax::Lfm2 => Some(parse_lfm2(text, tools)).filter(|(_, calls)| !calls.is_empty()),
    };
    found.unwrap_or_else(|| parse_hermes(text, tools))
}

/// `<tool_call>` blocks whose JSON has a `name` among the tools.
fn parse_hermes(text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let mut rest = text;
    let mut content = String::new();
    let mut calls = Vec::new();
    while let Some(start) = rest.find(OPEN) {
        let after = &rest[start + OPEN.len()..];
        let Some(end) = after.find(CLOSE) else { break };
        let body = after[..end].trim();
        match serde_json::from_str::<Value>(body).ok().and_then(|v| json_call(&v, tools)) {
            Some(call) => {
                content.push_str(&rest[..start]);
                calls.push(call);
            }
            None => content.push_str(&rest[..start + OPEN.len() + end + CLOSE.len()]),
        }
        rest = &after[end + CLOSE.len()..];
    }
    content.push_str(rest);
    (content.trim().to_string(), calls)
}

/// OpenAI's `tool_calls` list (`id` made from the request's id).
pub fn calls_json(calls: &[Call], id: &str) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| json!({"index": i, "id": format!("call_{id}_{i}"), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect(),
    )
}

/// An assistant message's `tool_calls` as a template reads them (arguments as objects).
pub fn template_calls(v: &Value) -> Option<Value> {
    let list = v.as_array()?;
    Some(Value::Array(
        list.iter()
            .map(|c| {
                let f = &c["function"];
                let args = match &f["arguments"] {
                    Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                    other => other.clone(),
                };
                json!({"id": c.get("id"), "type": "function", "function": {"name": f["name"], "arguments": args}})
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Vec<Tool> {
        vec![Tool { name: "get_weather".into(), parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}) }]
    }

    #[test]
    fn calls_are_parsed_out_of_the_text() {
        let t = weather();
        let (text, calls) =
            parse_calls("Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", &t, Syntax::Hermes);
        assert_eq!(text, "Let me check.");
        assert_eq!(calls, vec![Call { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() }]);
        // An unknown function or broken JSON stays text.
        let s = "<tool_call>{\"name\": \"nope\"}</tool_call> and <tool_call>{oops</tool_call>";
        assert_eq!(parse_calls(s, &t, Syntax::Hermes), (s.to_string(), vec![]));
        // Two calls, and the `parameters` spelling.
        let two = "<tool_call>{\"name\":\"get_weather\",\"parameters\":{\"city\":\"A\"}}</tool_call><tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"B\"}}</tool_call>";
        assert_eq!(parse_calls(two, &t, Syntax::Hermes).1.len(), 2);
        // A forced (Hermes) call from an LFM2 model; Llama 3's form.
        assert_eq!(parse_calls(two, &t, Syntax::Lfm2).1.len(), 2);
        let l3 = parse_calls("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"C\"}}", &t, Syntax::Llama3);
        assert_eq!(l3, (String::new(), vec![Call { name: "get_weather".into(), arguments: "{\"city\":\"C\"}".into() }]));
    }

    #[test]
    fn choices_are_checked_against_the_tools() {
        let t = weather();
        assert_eq!(parse_choice(None, &t).unwrap(), Choice::Auto);
        assert_eq!(parse_choice(None, &[]).unwrap(), Choice::None);
        assert_eq!(parse_choice(Some(&json!("required")), &t).unwrap(), Choice::Required);
        assert_eq!(parse_choice(Some(&json!({"type": "function", "function": {"name": "get_weather"}})), &t).unwrap(), Choice::Named("get_weather".into()));
        assert!(parse_choice(Some(&json!({"type": "function", "function": {"name": "x"}})), &t).is_err());
        assert!(parse_choice(Some(&json!("sometimes")), &t).is_err());
        assert!(parse_choice(Some(&json!("required")), &[]).is_err());
        assert!(forced_grammar(&t, &Choice::Auto, Syntax::Hermes).is_none());
        assert!(forced_grammar(&t, &Choice::Required, Syntax::Hermes).unwrap().contains("%json"));
        let l3 = forced_grammar(&t, &Choice::Required, Syntax::Llama3).unwrap();
        assert!(l3.starts_with("start: call") && l3.contains("\"parameters\""));
    }
}

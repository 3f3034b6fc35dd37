//! Chat templates: turning a conversation into the prompt text a model was trained on.
//!
//! A file's `tokenizer.chat_template` (Jinja, as Hugging Face writes them) is rendered with
//! minijinja, set up like transformers' environment: `trim_blocks` and `lstrip_blocks`, loop
//! controls, Python string methods (`.strip()`, `.startswith()`, ... from `minijinja-contrib`'s
//! pycompat), `raise_exception`, `strftime_now` and a Python-compatible `tojson`. Files without
//! a template get a [`BuiltinTemplate`] (ChatML, or Gemma's format for Gemma models).
//!
//! ```no_run
//! use cera::chat_template::{ChatMessage, ChatTemplate};
//! use cera::gguf::GgufFile;
//! use cera::tokenizer::Tokenizer;
//! let file = GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let tpl = ChatTemplate::from_gguf(&file, &tok)?;
//! let prompt = tpl.render(&[ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi!")], true)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod builtin;
mod pyjson;

use std::collections::BTreeMap;

use minijinja::value::Serde;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

pub use builtin::BuiltinTemplate;

use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

/// Fuel for one render: bounds the work a hostile template can make us do.
const FUEL: u64 = 10_000_000;

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template does not parse.
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// Rendering failed (including running out of fuel).
    #[error("chat template failed: {0}")]
    Render(String),
    /// The template called `raise_exception`.
    #[error("chat template raised: {0}")]
    Raised(String),
    /// The file's template metadata is not a string.
    #[error(transparent)]
    Metadata(#[from] crate::gguf::MetadataError),
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or `tool`, ...).
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant turn's tool calls, as templates read them
    /// (`[{"type": "function", "function": {"name", "arguments"}}]`, arguments an object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message's answer to this call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None }
    }
}

/// Where a template came from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateSource {
    /// Jinja source (from the file or the caller).
    Jinja(String),
    /// A built-in format.
    Builtin(BuiltinTemplate),
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    source: TemplateSource,
    env: Option<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("raise_exception: {msg}")))
}

fn strftime_now(fmt: String) -> Result<String, Error> {
    use std::fmt::Write;
    let mut s = String::new();
    write!(s, "{}", chrono::Local::now().format(&fmt)).map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("bad strftime format {fmt:?}")))?;
    Ok(s)
}

fn tojson(v: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // transformers also accepts `separators`; only the default is supported here.
    let _: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&v).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(pyjson::dumps(&json, indent, sort_keys.unwrap_or(false))))
}

fn environment(source: &str) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build().map_err(|e| TemplateError::Syntax(e.to_string()))?;
    env.set_syntax(syntax);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env.add_template_owned("chat", strip_generation_tags(source)).map_err(|e| TemplateError::Syntax(format!("{e:#}")))?;
    Ok(env)
}

/// Removes transformers' `{% generation %}` / `{% endgeneration %}` markers (they only mark
/// assistant text for training masks and render nothing).
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(i) = rest.find("{%") {
        // The closing `%}` is searched after the opening `{%` (`{%}` must not close itself).
        let Some(j) = rest[i + 2..].find("%}") else {
            break;
        };
        let end = i + 2 + j + 2;
        let inner = rest[i + 2..i + 2 + j].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..i]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(&rest[i..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

impl ChatTemplate {
    /// Compiles Jinja source; `bos_token`/`eos_token` are the texts the template may use.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TemplateError> {
        Ok(ChatTemplate {
            env: Some(environment(source)?),
            source: TemplateSource::Jinja(source.to_string()),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// A built-in format.
    pub fn builtin(which: BuiltinTemplate) -> ChatTemplate {
        ChatTemplate { source: TemplateSource::Builtin(which), env: None, bos_token: String::new(), eos_token: String::new() }
    }

    /// The file's `tokenizer.chat_template`, or the built-in format for its architecture.
    pub fn from_gguf(file: &GgufFile, tok: &Tokenizer) -> Result<ChatTemplate, TemplateError> {
        let md = file.metadata();
        match md.optional("tokenizer.chat_template", crate::gguf::Metadata::get_str)? {
            Some(src) => {
                let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or_default();
                Self::new(src, &text(tok.special().bos), &text(tok.special().eos))
            }
            None => {
                let arch = md.get_str("general.architecture").unwrap_or("");
                Ok(Self::builtin(BuiltinTemplate::for_architecture(arch)))
            }
        }
    }

    /// Where the template came from.
    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    /// Renders a conversation. With `add_generation_prompt` the text ends with the opening of
    /// the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, TemplateError> {
        self.render_with(messages, add_generation_prompt, &BTreeMap::new())
    }

    /// Renders a conversation whose last message is an unfinished assistant reply that the
    /// model should continue: the earlier messages are rendered with the generation prompt and
    /// the last message's text is appended without an end-of-turn marker. This is what
    /// llama.cpp's server does when the last message is the assistant's ("prefill"). Without a
    /// final assistant message it is [`ChatTemplate::render`] with `add_generation_prompt`.
    pub fn render_continuing(&self, messages: &[ChatMessage]) -> Result<String, TemplateError> {
        match messages.split_last() {
            Some((last, earlier)) if last.role == "assistant" => {
                let mut out = self.render(earlier, true)?;
                out.push_str(&last.content);
                Ok(out)
            }
            _ => self.render(messages, true),
        }
    }

    /// Like [`ChatTemplate::render`], with extra template variables (e.g. `tools`,
    /// `enable_thinking`, `date_string`).
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &BTreeMap<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let env = match (&self.env, &self.source) {
            (Some(env), _) => env,
            (None, TemplateSource::Builtin(b)) => {
                return Ok(b.render(messages, add_generation_prompt));
            }
            // Only `new` makes Jinja templates, and it always compiles an environment.
            (None, TemplateSource::Jinja(_)) => {
                return Err(TemplateError::Render("template was not compiled".into()));
            }
        };
        let tpl = env.get_template("chat").map_err(|e| TemplateError::Render(e.to_string()))?;
        let mut ctx: BTreeMap<String, Value> = extra.iter().map(|(k, v)| (k.clone(), Value::from(Serde(v)))).collect();
        ctx.insert("messages".into(), Value::from(Serde(messages)));
        ctx.insert("add_generation_prompt".into(), Value::from(add_generation_prompt));
        ctx.insert("bos_token".into(), Value::from(self.bos_token.clone()));
        ctx.insert("eos_token".into(), Value::from(self.eos_token.clone()));
        tpl.render(ctx).map_err(|e| {
            let msg = format!("{e:#}");
            match e.kind() {
                ErrorKind::InvalidOperation if msg.contains("raise_exception: ") => {
                    let detail = msg.split("raise_exception: ").nth(1).unwrap_or(&msg);
                    TemplateError::Raised(detail.lines().next().unwrap_or("").to_string())
                }
                _ => TemplateError::Render(msg),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi "),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "Bye"),
        ]
    }

    #[test]
    fn builtin_gemma_folds_system() {
        let t = ChatTemplate::builtin(BuiltinTemplate::Gemma);
        assert_eq!(
            t.render(&msgs(), true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn jinja_helpers() {
        let src = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
                   [{{ m.role | upper }}:{{ m.content.strip() }}:{{ m.content.startswith(' ') }}]{% endfor %}\
                   {{ bos_token }}{{ {'b': 1, 'a': [true, none]} | tojson }}{% if add_generation_prompt %}>{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(t.render(&msgs(), true).unwrap(), "[USER:Hi:True][ASSISTANT:Hello!:False][USER:Bye:False]<s>{\"b\": 1, \"a\": [true, null]}>");
        let t = ChatTemplate::new("{{ raise_exception('no system') }}", "", "").unwrap();
        assert!(matches!(t.render(&msgs(), false), Err(TemplateError::Raised(m)) if m.contains("no system")));
        assert!(matches!(ChatTemplate::new("{% for %}", "", ""), Err(TemplateError::Syntax(_))));
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        assert_eq!(t.render(&[], false).unwrap().len(), 4);
    }

    #[test]
    fn generation_tags_are_ignored() {
        let src = "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{%- endgeneration %}\
                   {% else %}{{ m.content }}{% endif %}|{% endfor %}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        assert_eq!(t.render(&msgs(), false).unwrap(), "Be brief.| Hi |Hello!|Bye|");
        // Found by cargo fuzz: `{%}` used to slice out of order.
        for src in ["{%}", "a{%}b%}", "{%", "%}{%", "{%generation%}{%}"] {
            assert!(strip_generation_tags(src).len() <= src.len());
            let _ = ChatTemplate::new(src, "", "");
        }
        assert_eq!(strip_generation_tags("x{% generation %}y{%- endgeneration -%}z"), "xyz");
    }

    #[test]
    fn runaway_template_stops() {
        let t = ChatTemplate::new("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", "", "").unwrap();
        assert!(matches!(t.render(&[], false), Err(TemplateError::Render(_))));
    }
}

//! Built-in chat formats for files that carry no `tokenizer.chat_template`. They reproduce
//! llama.cpp's built-in templates of the same names.

use super::ChatMessage;

/// A built-in chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuiltinTemplate {
    /// `<|im_start|>{role}\n{content}<|im_end|>\n`, generation prompt `<|im_start|>assistant\n`.
    ChatMl,
    /// Gemma: `<start_of_turn>user\n{content}<end_of_turn>\n`, `assistant` is called `model`,
    /// the system prompt is folded into the first user turn, contents are trimmed, and the
    /// generation prompt is `<start_of_turn>model\n`.
    Gemma,
}

impl BuiltinTemplate {
    /// The name (`chatml`, `gemma`).
    pub fn name(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => "chatml",
            BuiltinTemplate::Gemma => "gemma",
        }
    }

    /// The template for a name.
    pub fn from_name(name: &str) -> Option<BuiltinTemplate> {
        match name {
            "chatml" => Some(BuiltinTemplate::ChatMl),
            "gemma" => Some(BuiltinTemplate::Gemma),
            _ => None,
        }
    }

    /// The usual template for a `general.architecture` value.
    pub fn for_architecture(arch: &str) -> BuiltinTemplate {
        if arch.starts_with("gemma") { BuiltinTemplate::Gemma } else { BuiltinTemplate::ChatMl }
    }

    /// Renders a conversation.
    pub fn render(self, messages: &[ChatMessage], add_generation_prompt: bool) -> String {
        let mut out = String::new();
        match self {
            BuiltinTemplate::ChatMl => {
                for m in messages {
                    out.push_str("<|im_start|>");
                    out.push_str(&m.role);
                    out.push('\n');
                    out.push_str(&m.content);
                    out.push_str("<|im_end|>\n");
                }
                if add_generation_prompt {
                    out.push_str("<|im_start|>assistant\n");
                }
            }
            BuiltinTemplate::Gemma => {
                let mut system = String::new();
                for m in messages {
                    if m.role == "system" {
                        system.push_str(c_trim(&m.content));
                        continue;
                    }
                    let role = if m.role == "assistant" { "model" } else { m.role.as_str() };
                    out.push_str("<start_of_turn>");
                    out.push_str(role);
                    out.push('\n');
                    if !system.is_empty() && role != "model" {
                        out.push_str(&system);
                        out.push_str("\n\n");
                        system.clear();
                    }
                    out.push_str(c_trim(&m.content));
                    out.push_str("<end_of_turn>\n");
                }
                if add_generation_prompt {
                    out.push_str("<start_of_turn>model\n");
                }
            }
        }
        out
    }
}

/// Trims the ASCII white space C's `isspace` knows, as llama.cpp's templates do.
fn c_trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'))
}

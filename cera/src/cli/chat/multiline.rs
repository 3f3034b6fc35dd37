//! Multi-line messages in `cera chat`, typed or piped: Ollama's `"""` opens a message that the
//! next line ending in `"""` closes (`"""one line"""` works too), and a line ending in `\`
//! goes on on the next line. The lines are joined with newlines; inside `"""`, a `\` is kept.
//! Blank text beside an opening or closing `"""` on its line is no line of the message.

/// A message put together from lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The text, its lines joined with `\n`.
    pub text: String,
    /// Whether it took more than one line or `"""` (then it is never a `/command`).
    pub multiline: bool,
}

const QUOTES: &str = "\"\"\"";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// No message under way.
    No,
    /// Inside `"""`.
    Quoted,
    /// The last line ended in `\`.
    Continued,
}

/// Collects lines into messages.
#[derive(Debug)]
pub struct Assembler {
    open: Open,
    lines: Vec<String>,
}

impl Default for Assembler {
    fn default() -> Self {
        Assembler { open: Open::No, lines: Vec::new() }
    }
}

impl Assembler {
    /// Whether a message is under way (the prompt then shows `...`).
    pub fn is_open(&self) -> bool {
        self.open != Open::No
    }

    /// Takes one line (without its line end); returns the message it completes, if any.
    pub fn push(&mut self, line: &str) -> Option<Message> {
        match self.open {
            Open::Quoted => match line.trim_end().strip_suffix(QUOTES) {
                Some(last) => {
                    self.push_part(last);
                    Some(self.take())
                }
                None => {
                    self.lines.push(line.to_string());
                    None
                }
            },
            Open::No if line.trim_start().starts_with(QUOTES) => {
                let rest = &line.trim_start()[QUOTES.len()..];
                match rest.trim_end().strip_suffix(QUOTES) {
                    Some(inner) => {
                        self.lines.push(inner.to_string());
                        self.open = Open::Quoted;
                        Some(self.take())
                    }
                    None => {
                        self.open = Open::Quoted;
                        self.push_part(rest);
                        None
                    }
                }
            }
            Open::No | Open::Continued => match line.strip_suffix('\\') {
                Some(part) => {
                    self.lines.push(part.to_string());
                    self.open = Open::Continued;
                    None
                }
                None => {
                    let multiline = self.open == Open::Continued;
                    self.lines.push(line.to_string());
                    let mut m = self.take();
                    m.multiline = multiline;
                    Some(m)
                }
            },
        }
    }

    /// At the end of input: the message under way, if any (an unclosed `"""` ends there).
    pub fn finish(&mut self) -> Option<Message> {
        self.is_open().then(|| self.take())
    }

    /// Drops the message under way (Ctrl-C); whether there was one.
    pub fn discard(&mut self) -> bool {
        let was = self.is_open();
        self.open = Open::No;
        self.lines.clear();
        was
    }

    /// The text beside an opening or closing `"""`: nothing when it is blank.
    fn push_part(&mut self, part: &str) {
        if !part.trim().is_empty() {
            self.lines.push(part.to_string());
        }
    }

    fn take(&mut self) -> Message {
        self.open = Open::No;
        Message { text: std::mem::take(&mut self.lines).join("\n"), multiline: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(lines: &[&str]) -> Vec<Message> {
        let mut a = Assembler::default();
        let mut out: Vec<Message> = lines.iter().filter_map(|l| a.push(l)).collect();
        out.extend(a.finish());
        out
    }

    fn m(text: &str, multiline: bool) -> Message {
        Message { text: text.into(), multiline }
    }

    #[test]
    fn lines_quotes_and_backslashes() {
        assert_eq!(messages(&["hi", "/exit"]), [m("hi", false), m("/exit", false)]);
        assert_eq!(messages(&["\"\"\"", "a", "", "  b \\", "c\"\"\"", "d"]), [m("a\n\n  b \\\nc", true), m("d", false)]);
        assert_eq!(messages(&["\"\"\"first", "last\"\"\"  "]), [m("first\nlast", true)]);
        assert_eq!(messages(&["  \"\"\"one line\"\"\""]), [m("one line", true)]);
        assert_eq!(messages(&["a\\", "b\\", "c", "/reset"]), [m("a\nb\nc", true), m("/reset", false)]);
        assert_eq!(messages(&["/system a\\", "b"]), [m("/system a\nb", true)]);
        // The end of input ends an open message.
        assert_eq!(messages(&["\"\"\"", "x"]), [m("x", true)]);
        assert_eq!(messages(&["x\\"]), [m("x", true)]);
        let mut a = Assembler::default();
        assert_eq!(a.push("\"\"\"a"), None);
        assert!(a.is_open() && a.discard() && !a.is_open());
        assert_eq!(a.push("b"), Some(m("b", false)));
    }
}

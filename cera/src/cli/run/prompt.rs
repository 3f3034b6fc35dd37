//! Where `cera run` takes its prompt: the argument, `-p`, `-f FILE`, or standard input (`-f -`,
//! `cera run -`, or piped with no prompt given).
//!
//! A file or standard input is read whole, as UTF-8; one final line end (`\n` or `\r\n`) is
//! dropped, so that `echo TEXT | cera run` and a file an editor wrote give the same tokens as
//! `cera run TEXT` (to end a `--raw` prompt with a newline, end the file with two). Everything
//! else is kept as it is. An empty prompt (nothing but white space) is an error.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;

use super::super::CliError;

/// Where the prompt comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// Given on the command line.
    Text(String),
    /// A file (`-f FILE`).
    File(PathBuf),
    /// Standard input: `-f -`, `cera run -`, or piped with no prompt given (`implicit`).
    Stdin { implicit: bool },
}

impl PromptSource {
    /// The source the arguments name (clap has already refused two of them at once). With none,
    /// standard input when it is not a terminal.
    pub fn from_args(positional: Option<&str>, flag: Option<&str>, file: Option<&std::path::Path>) -> Result<PromptSource, CliError> {
        Ok(match (positional, flag, file) {
            (Some("-"), _, _) => PromptSource::Stdin { implicit: false },
            (Some(text), _, _) | (None, Some(text), _) => PromptSource::Text(text.to_string()),
            (None, None, Some(path)) if path.as_os_str() == "-" => PromptSource::Stdin { implicit: false },
            (None, None, Some(path)) => PromptSource::File(path.to_path_buf()),
            (None, None, None) if !std::io::stdin().is_terminal() => PromptSource::Stdin { implicit: true },
            (None, None, None) => return Err(CliError::Message(NO_PROMPT.into())),
        })
    }

    /// Whether reading it waits for a person typing (standard input on a terminal).
    pub fn is_terminal(&self) -> bool {
        matches!(self, PromptSource::Stdin { .. }) && std::io::stdin().is_terminal()
    }

    /// Reads the prompt.
    pub fn read(self) -> Result<String, CliError> {
        let (bytes, name) = match self {
            PromptSource::Text(text) => return check_not_empty(text, "the prompt"),
            PromptSource::File(path) => {
                let bytes = std::fs::read(&path).map_err(|e| CliError::Message(format!("{}: cannot read the prompt: {e}", path.display())))?;
                (bytes, path.display().to_string())
            }
            PromptSource::Stdin { implicit } => {
                let mut bytes = Vec::new();
                std::io::stdin().lock().read_to_end(&mut bytes).map_err(|e| CliError::Message(format!("standard input: cannot read the prompt: {e}")))?;
                if implicit && bytes.is_empty() {
                    return Err(CliError::Message(format!("{NO_PROMPT} (standard input was empty)")));
                }
                (bytes, "standard input".to_string())
            }
        };
        let text = String::from_utf8(bytes)
            .map_err(|e| CliError::Message(format!("{name}: the prompt is not UTF-8 text (an invalid byte at offset {})", e.utf8_error().valid_up_to())))?;
        check_not_empty(drop_final_line_end(text), &format!("{name}: the prompt"))
    }
}

const NO_PROMPT: &str = "no prompt: give it as an argument, with -p TEXT or -f FILE, or through standard input";

/// Drops one final `\n` or `\r\n`.
pub fn drop_final_line_end(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

fn check_not_empty(text: String, what: &str) -> Result<String, CliError> {
    if text.trim().is_empty() {
        return Err(CliError::Message(format!("{what} is empty")));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_final_line_end_is_dropped() {
        for (text, want) in [("a", "a"), ("a\n", "a"), ("a\r\n", "a"), ("a\n\n", "a\n"), ("\na\n", "\na"), ("a\r", "a\r"), ("", "")] {
            assert_eq!(drop_final_line_end(text.to_string()), want, "{text:?}");
        }
    }

    #[test]
    fn sources_from_arguments() {
        let src = |pos: Option<&str>, flag: Option<&str>, file: Option<&str>| PromptSource::from_args(pos, flag, file.map(std::path::Path::new)).unwrap();
        assert_eq!(src(Some("-"), None, None), PromptSource::Stdin { implicit: false });
        assert_eq!(src(Some("hi"), None, None), PromptSource::Text("hi".into()));
        assert_eq!(src(None, Some("-"), None), PromptSource::Text("-".into()), "-p takes its text as it is");
        assert_eq!(src(None, None, Some("-")), PromptSource::Stdin { implicit: false });
        assert_eq!(src(None, None, Some("p.txt")), PromptSource::File("p.txt".into()));
        assert!(PromptSource::Text(" \n\t".into()).read().is_err());
    }
}

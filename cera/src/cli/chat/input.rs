//! Where `cera chat` reads its lines: a line editor (rustyline: arrows, Home/End, Ctrl-W, ...,
//! Up/Down through the history, saved in the user's data folder) on a terminal, or standard
//! input line by line otherwise (a pipe, a file). Lines become messages in `multiline.rs`.

use std::io::BufRead;
use std::path::PathBuf;

use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::super::CliError;
use super::super::generation::note;
use super::multiline::{Assembler, Message};

/// What reading gave.
#[derive(Debug)]
pub enum Read {
    /// A whole message.
    Message(Message),
    /// Ctrl-C at the prompt (line editor only); whether a message under way was dropped.
    Interrupted { dropped: bool },
    /// Ctrl-D on an empty line, or the end of input.
    Eof,
}

enum Lines {
    Editor { editor: Box<DefaultEditor>, history: Option<PathBuf> },
    Stdin(std::io::StdinLock<'static>),
}

/// The chat's input.
pub struct Input {
    lines: Lines,
    assembler: Assembler,
}

enum Line {
    Text(String),
    Interrupted,
    Eof,
}

impl Input {
    /// The line editor when standard input is a terminal (`interactive`), else plain lines.
    pub fn new(interactive: bool) -> Input {
        let editor = if interactive { DefaultEditor::new().map_err(|e| note(&format!("(no line editing on this terminal: {e})"))).ok() } else { None };
        let lines = if let Some(mut editor) = editor {
            let history = history_file();
            if let Some(path) = &history {
                // A file that is not there yet is the usual case; one that cannot be read is a note.
                if let Err(e) = editor.load_history(path) {
                    if path.exists() {
                        note(&format!("(the chat history {} cannot be read: {e})", path.display()));
                    }
                }
            }
            Lines::Editor { editor: Box::new(editor), history }
        } else {
            Lines::Stdin(std::io::stdin().lock())
        };
        Input { lines, assembler: Assembler::default() }
    }

    /// Reads lines until they make a message.
    pub fn read(&mut self) -> Result<Read, CliError> {
        loop {
            let prompt = if self.assembler.is_open() { "... " } else { "> " };
            match self.line(prompt)? {
                Line::Text(l) => {
                    if let Some(m) = self.assembler.push(&l) {
                        return Ok(Read::Message(m));
                    }
                }
                Line::Interrupted => return Ok(Read::Interrupted { dropped: self.assembler.discard() }),
                Line::Eof => return Ok(self.assembler.finish().map_or(Read::Eof, Read::Message)),
            }
        }
    }

    fn line(&mut self, prompt: &str) -> Result<Line, CliError> {
        match &mut self.lines {
            Lines::Editor { editor, history } => match editor.readline(prompt) {
                Ok(line) => {
                    if !line.trim().is_empty() {
                        add_to_history(editor, history, &line);
                    }
                    Ok(Line::Text(line))
                }
                Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(ReadlineError::Eof) => Ok(Line::Eof),
                Err(e) => Err(CliError::Message(format!("standard input: {e}"))),
            },
            Lines::Stdin(input) => {
                let mut buf = String::new();
                loop {
                    match input.read_line(&mut buf) {
                        Ok(0) => return Ok(Line::Eof),
                        Ok(_) => return Ok(Line::Text(buf.trim_end_matches(['\n', '\r']).to_string())),
                        // Ctrl-C at the prompt may interrupt the read (the Ctrl-C handler counts it).
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(CliError::Message(format!("standard input: {e}"))),
                    }
                }
            }
        }
    }
}

/// Adds a typed line to the history and saves the history; when it cannot be saved, a note,
/// once, and no more saving.
fn add_to_history(editor: &mut DefaultEditor, history: &mut Option<PathBuf>, line: &str) {
    let _ = editor.add_history_entry(line);
    let Some(path) = history else { return };
    let saved = match path.parent() {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| e.to_string()),
        None => Ok(()),
    }
    .and_then(|()| editor.save_history(path).map_err(|e| e.to_string()));
    if let Err(e) = saved {
        note(&format!("(the chat history cannot be saved to {}: {e})", path.display()));
        *history = None;
    }
}

/// The history file: `$XDG_DATA_HOME/cera/chat_history`, else
/// `~/.local/share/cera/chat_history` (`%APPDATA%\cera\chat_history` on Windows).
pub fn history_file() -> Option<PathBuf> {
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    let data = std::env::var_os("XDG_DATA_HOME").and_then(absolute).or_else(|| {
        if cfg!(windows) {
            std::env::var_os("APPDATA").and_then(absolute)
        } else {
            std::env::var_os("HOME").and_then(absolute).map(|h| h.join(".local").join("share"))
        }
    })?;
    Some(data.join("cera").join("chat_history"))
}

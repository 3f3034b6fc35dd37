//! `cera chat`: an interactive conversation on standard input with the model's chat template.
//!
//! Each turn re-renders the whole conversation; the session reuses the cached tokens it shares
//! with the previous turn and runs only the new ones (the stats line shows how many were
//! reused). Commands: `/reset` (a new conversation), `/system TEXT` (the system message; without
//! TEXT: none), `/exit`. Ctrl-C stops the current reply, not the program; at the prompt, a
//! second Ctrl-C in a row exits. End of input exits.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::generation::{ModelArgs, SampleArgs, TextSink, engine_error, load, note, stats_line};
use super::{CliError, Output};
use crate::chat_template::ChatMessage;
use crate::engine::{CancelToken, EngineError, FinishReason};

/// Arguments of `cera chat`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Commands: /reset, /system TEXT, /exit. Ctrl-C stops the reply; Ctrl-C twice at the prompt, /exit or end of input leaves.")]
pub struct Args {
    /// The model and the device.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling and stopping (-n: most tokens per reply).
    #[command(flatten)]
    pub sample: SampleArgs,
    /// The system message.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
}

/// What Ctrl-C does: cancel the reply while one is generated, else count presses at the prompt.
struct Interrupt {
    cancel: CancelToken,
    generating: AtomicBool,
    presses: AtomicU32,
}

impl Interrupt {
    fn install(cancel: CancelToken, interactive: bool) -> Arc<Interrupt> {
        let it = Arc::new(Interrupt { cancel, generating: AtomicBool::new(false), presses: AtomicU32::new(0) });
        let handler = it.clone();
        // Without a handler Ctrl-C simply ends the program, which is still correct at the prompt.
        let installed = ctrlc::set_handler(move || {
            if handler.generating.load(Ordering::SeqCst) {
                handler.cancel.cancel();
            } else if handler.presses.fetch_add(1, Ordering::SeqCst) >= 1 {
                note("");
                std::process::exit(130);
            } else {
                note("\n(Ctrl-C again to leave, or /exit)");
                if interactive {
                    let mut out = std::io::stdout();
                    let _ = out.write_all(b"> ").and_then(|()| out.flush());
                }
            }
        });
        if let Err(e) = installed {
            note(&format!("warning: Ctrl-C cannot stop a reply here ({e})"));
        }
        it
    }
}

enum Line {
    Text(String),
    Eof,
}

fn read_line(input: &mut impl BufRead) -> Result<Line, CliError> {
    let mut buf = String::new();
    match input.read_line(&mut buf) {
        Ok(0) => Ok(Line::Eof),
        Ok(_) => Ok(Line::Text(buf.trim_end_matches(['\n', '\r']).to_string())),
        // Ctrl-C at the prompt may interrupt the read.
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(Line::Text(String::new())),
        Err(e) => Err(CliError::Message(format!("standard input: {e}"))),
    }
}

/// The conversation: the system message and the turns.
struct Conversation {
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl Conversation {
    fn messages(&self) -> Vec<ChatMessage> {
        self.system.iter().map(|s| ChatMessage::new("system", s.clone())).chain(self.turns.iter().cloned()).collect()
    }
}

/// Runs `cera chat`.
pub fn run(args: Args, out: &mut Output) -> Result<(), CliError> {
    let engine = load(&args.model)?;
    let mut session = engine.session().map_err(CliError::from_err)?;
    let interactive = std::io::stdin().is_terminal();
    let interrupt = Interrupt::install(session.cancel_token(), interactive);
    if interactive {
        note(&format!("{} on {} | /reset, /system TEXT, /exit; Ctrl-C stops a reply", engine.model_name().unwrap_or("model"), engine.device_name()));
    }
    let mut conv = Conversation { system: args.system.clone(), turns: Vec::new() };
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let opts = args.sample.opts();
    let mut first = true;
    loop {
        if interactive {
            out.write_str("> ")?;
            out.flush()?;
        }
        let line = match read_line(&mut input)? {
            Line::Eof => break,
            Line::Text(t) => t,
        };
        interrupt.presses.store(0, Ordering::SeqCst);
        let text = line.trim();
        match text.split_once(' ').map_or((text, ""), |(c, rest)| (c, rest.trim())) {
            ("", _) => continue,
            ("/exit" | "/quit", _) => break,
            ("/reset", _) => {
                conv.turns.clear();
                note("(new conversation)");
                continue;
            }
            ("/system", s) => {
                conv.system = (!s.is_empty()).then(|| s.to_string());
                note(if s.is_empty() { "(no system message)" } else { "(system message set)" });
                continue;
            }
            (c, _) if c.starts_with('/') && !c[1..].contains('/') => {
                note(&format!("unknown command {c} (/reset, /system TEXT, /exit)"));
                continue;
            }
            _ => {}
        }
        conv.turns.push(ChatMessage::new("user", text));
        let prompt = engine.chat_template().render(&conv.messages(), true).map_err(CliError::from_err)?;
        session.reset();
        session.append_text(&prompt).map_err(CliError::from_err)?;
        let mut sink = TextSink::new(out, session.cancel_token());
        interrupt.generating.store(true, Ordering::SeqCst);
        let g = session.generate(&opts, &mut sink);
        interrupt.generating.store(false, Ordering::SeqCst);
        sink.finish()?;
        let g = match g {
            Ok(g) => g,
            Err(e @ EngineError::ContextOverflow { .. }) => {
                conv.turns.pop();
                note(&format!("{} — /reset starts a new conversation", engine_error(e)));
                continue;
            }
            Err(e) => return Err(engine_error(e)),
        };
        if g.finish == FinishReason::Cancelled {
            note("(stopped)");
        }
        conv.turns.push(ChatMessage::new("assistant", g.text.trim()));
        note(&stats_line(&engine, &g, (opts.sampler.temperature > 0.0).then_some(opts.sampler.seed), first));
        first = false;
    }
    Ok(())
}

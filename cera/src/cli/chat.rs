//! `cera chat`: a conversation with the model's chat template, typed on a terminal or piped.
//!
//! Each turn re-renders the whole conversation; the session reuses the cached tokens it shares
//! with the previous turn and runs only the new ones (the stats line shows how many were
//! reused). When the conversation outgrows the context, its oldest turns are dropped
//! (`conversation.rs`). On a terminal, lines are edited and recalled with a line editor
//! (`input.rs`); `"""` and a final `\` make multi-line messages (`multiline.rs`). Commands:
//! `/reset` (a new conversation), `/system TEXT` (the system message; without TEXT: none),
//! `/exit`. Ctrl-C stops the current reply, not the program; at the prompt, a second Ctrl-C in
//! a row exits (status 130). Ctrl-D or the end of input exits.

mod conversation;
mod input;
mod multiline;

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use self::conversation::{Conversation, FitError, dropped_note, reply_reserve};
use self::input::{Input, Read};
use super::generation::{Generator, ModelArgs, SampleArgs, TextSink, engine_error, load, note, stats_line, warn_fallback_template};
use super::{CliError, Output};
use crate::engine::{CancelToken, EngineError, FinishReason};

/// The status of a chat left with Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: i32 = 130;

/// Arguments of `cera chat`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Commands: /reset, /system TEXT, /exit. A message in \"\"\" ... \"\"\" or with lines ending in \\ spans lines. \
                          On a terminal: arrows, Home/End and Ctrl-W edit the line, Up/Down recall earlier ones. \
                          Ctrl-C stops the reply; Ctrl-C twice at the prompt, /exit, Ctrl-D or the end of input leaves.")]
pub struct Args {
    /// The model and the device.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Sampling and stopping (-n: most tokens per reply).
    #[command(flatten)]
    pub sample: SampleArgs,
    /// The system message.
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    pub system: Option<String>,
}

/// What Ctrl-C does: cancel the reply while one is generated, else count presses at the prompt
/// (the line editor reports those at its own prompt).
struct Interrupt {
    cancel: CancelToken,
    generating: AtomicBool,
    presses: AtomicU32,
}

impl Interrupt {
    fn install(cancel: CancelToken) -> Arc<Interrupt> {
        let it = Arc::new(Interrupt { cancel, generating: AtomicBool::new(false), presses: AtomicU32::new(0) });
        let handler = it.clone();
        // Without a handler Ctrl-C simply ends the program, which is still correct at the prompt.
        let installed = ctrlc::set_handler(move || {
            if handler.generating.load(Ordering::SeqCst) {
                handler.cancel.cancel();
            } else {
                handler.pressed_at_prompt();
            }
        });
        if let Err(e) = installed {
            note(&format!("warning: Ctrl-C cannot stop a reply here ({e})"));
        }
        it
    }

    /// A Ctrl-C at the prompt: a note the first time, the end at the second in a row.
    fn pressed_at_prompt(&self) {
        if self.presses.fetch_add(1, Ordering::SeqCst) >= 1 {
            note("");
            std::process::exit(EXIT_INTERRUPTED);
        }
        note("(Ctrl-C again to leave, or /exit)");
    }
}

/// Runs `cera chat`.
pub fn run(args: Args, out: &mut Output) -> Result<(), CliError> {
    args.sample.opts()?; // bad flags before the model loads
    let engine = load(&args.model)?;
    warn_fallback_template(&engine);
    let mut session = engine.session().map_err(CliError::from_err)?;
    let interactive = std::io::stdin().is_terminal();
    let interrupt = Interrupt::install(session.cancel_token());
    let mut input = Input::new(interactive);
    if interactive {
        note(&format!(
            "{} on {} | /reset, /system TEXT, /exit; \"\"\" or a final \\ for more lines; Ctrl-C stops a reply",
            engine.model_name().unwrap_or("model"),
            engine.device_name()
        ));
    }
    let mut conv = Conversation::new(args.system.clone());
    let opts = args.sample.opts()?;
    let mut generator = Generator::new(&args.model, &args.sample.spec, &engine)?;
    let reserve = reply_reserve(opts.max_tokens, engine.n_ctx());
    let mut first = true;
    loop {
        let message = match input.read()? {
            Read::Eof => break,
            Read::Interrupted { dropped } => {
                if dropped {
                    note("(message dropped)");
                }
                interrupt.pressed_at_prompt();
                continue;
            }
            Read::Message(m) => m,
        };
        interrupt.presses.store(0, Ordering::SeqCst);
        let text = message.text.trim();
        let command = if message.multiline { ("", "") } else { text.split_once(' ').map_or((text, ""), |(c, rest)| (c, rest.trim())) };
        match command {
            _ if text.is_empty() => continue,
            ("/exit" | "/quit", _) => break,
            ("/reset", _) => {
                conv.clear();
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
        match conv.prompt(&engine, &mut session, text, reserve) {
            Ok(0) => {}
            Ok(dropped) => note(&dropped_note(dropped)),
            Err(FitError::TooLong { tokens, reserve, n_ctx }) => {
                note(&format!(
                    "error: this message takes {tokens} tokens, which with {reserve} kept for the reply do not fit the context of {n_ctx} positions \
                     (a longer context: -c/--ctx-size)"
                ));
                continue;
            }
            Err(FitError::Other(e)) => return Err(e),
        }
        let mut sink = TextSink::new(out, session.cancel_token());
        interrupt.generating.store(true, Ordering::SeqCst);
        let g = generator.generate(&mut session, &opts, &mut sink);
        interrupt.generating.store(false, Ordering::SeqCst);
        sink.finish()?;
        let g = match g {
            Ok(g) => g,
            Err(e @ EngineError::ContextOverflow { .. }) => {
                conv.forget_last();
                note(&format!("{} — /reset starts a new conversation", engine_error(e)));
                continue;
            }
            Err(e) => return Err(engine_error(e)),
        };
        if g.finish == FinishReason::Cancelled {
            note("(stopped)");
        }
        conv.reply(g.text.trim());
        note(&stats_line(&engine, &g, (opts.sampler.temperature > 0.0).then_some(opts.sampler.seed), first));
        first = false;
    }
    out.flush()
}

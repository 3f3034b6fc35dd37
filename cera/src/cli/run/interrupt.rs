//! Ctrl-C in `cera run`: the output is finished, not cut.
//!
//! The handler is installed before the prompt is read and the model loads. A Ctrl-C stops the
//! generation through the session's [`CancelToken::cancel_all`]: one that comes before the
//! generation starts (while the model loads) is not lost, the generation then runs nothing.
//! The text's line is ended, the stats line says `cancelled`, `--json` prints the whole
//! object, and the exit status is 130. A second Ctrl-C, or one while the prompt is typed on a
//! terminal, ends the program at once (status 130).

use std::sync::{Arc, Mutex};

use super::super::generation::note;
use crate::engine::CancelToken;

/// The status of a program ended by Ctrl-C (128 + SIGINT), as shells report it.
pub const EXIT_INTERRUPTED: i32 = 130;

#[derive(Default)]
struct State {
    /// Ctrl-C presses so far.
    presses: u32,
    /// The session's token, once there is a session.
    token: Option<CancelToken>,
    /// The prompt is being typed on a terminal: Ctrl-C ends the program.
    typing: bool,
}

/// What Ctrl-C did, shared with the handler.
pub struct Interrupt {
    state: Mutex<State>,
}

impl Interrupt {
    /// Installs the Ctrl-C handler (a note when it cannot be: Ctrl-C then ends the program).
    pub fn install() -> Arc<Interrupt> {
        let it = Arc::new(Interrupt { state: Mutex::new(State::default()) });
        let handler = it.clone();
        if let Err(e) = ctrlc::set_handler(move || handler.pressed()) {
            note(&format!("warning: Ctrl-C cannot stop the generation cleanly here ({e})"));
        }
        it
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pressed(&self) {
        let mut s = self.lock();
        s.presses += 1;
        if s.typing || s.presses > 1 {
            note("");
            std::process::exit(EXIT_INTERRUPTED);
        }
        match &s.token {
            Some(t) => t.cancel_all(),
            None => note("(Ctrl-C: stopping before the generation starts)"),
        }
    }

    /// Runs `read` (reading the prompt); while `typing` (on a terminal), Ctrl-C ends the program.
    pub fn reading<T>(&self, typing: bool, read: impl FnOnce() -> T) -> T {
        self.lock().typing = typing;
        let r = read();
        self.lock().typing = false;
        r
    }

    /// From now on Ctrl-C cancels through `token`; a Ctrl-C that came before cancels it now.
    pub fn watch(&self, token: CancelToken) {
        let mut s = self.lock();
        if s.presses > 0 {
            token.cancel_all();
        }
        s.token = Some(token);
    }

    /// Whether Ctrl-C was pressed.
    pub fn interrupted(&self) -> bool {
        self.lock().presses > 0
    }
}

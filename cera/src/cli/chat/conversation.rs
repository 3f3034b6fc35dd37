//! The chat's conversation, and what happens when it outgrows the context.
//!
//! Each turn the whole conversation is rendered with the chat template. When it does not fit
//! the context with room for the reply (`min(-n, context / 4)` positions kept free;
//! `context / 4` with `-n -1`), the oldest turns (a user message and its reply) are dropped,
//! the system message kept, with a note, as Ollama does. A message that does not fit even alone
//! (with the system message) is an error for that turn only.

use super::super::CliError;
use crate::chat_template::ChatMessage;
use crate::engine::{Engine, Session};

/// The conversation: the system message and the turns.
#[derive(Debug, Default)]
pub struct Conversation {
    /// The system message.
    pub system: Option<String>,
    /// User messages and replies, alternating, oldest first.
    turns: Vec<ChatMessage>,
}

/// Why a turn's prompt was not made.
#[derive(Debug)]
pub enum FitError {
    /// The message does not fit even alone.
    TooLong { tokens: usize, reserve: usize, n_ctx: usize },
    /// Rendering or tokenizing failed.
    Other(CliError),
}

impl Conversation {
    /// A conversation with the system message `system`.
    pub fn new(system: Option<String>) -> Conversation {
        Conversation { system, turns: Vec::new() }
    }

    /// Forgets the turns (the system message stays).
    pub fn clear(&mut self) {
        self.turns.clear();
    }

    /// Adds the reply to the last message.
    pub fn reply(&mut self, text: &str) {
        self.turns.push(ChatMessage::new("assistant", text));
    }

    fn messages(&self, turns: &[ChatMessage]) -> Vec<ChatMessage> {
        self.system.iter().map(|s| ChatMessage::new("system", s.clone())).chain(turns.iter().cloned()).collect()
    }

    /// Puts the conversation with the user's message `text` into `session` (its sequence
    /// replaced), leaving `reserve` positions of the context free: returns how many of the
    /// oldest turns were dropped for it. On an error the conversation is as it was.
    pub fn prompt(&mut self, engine: &Engine, session: &mut Session, text: &str, reserve: usize) -> Result<usize, FitError> {
        let n_ctx = engine.n_ctx();
        let put = |session: &mut Session, turns: &[ChatMessage]| -> Result<bool, FitError> {
            let mut msgs = self.messages(turns);
            msgs.push(ChatMessage::new("user", text));
            let prompt = engine.chat_template().render(&msgs, true).map_err(|e| FitError::Other(CliError::from_err(e)))?;
            session.reset();
            let tokens = session.append_text(&prompt).map_err(|e| FitError::Other(CliError::from_err(e)))?;
            Ok(tokens + reserve <= n_ctx)
        };
        if put(session, &self.turns)? {
            self.turns.push(ChatMessage::new("user", text));
            return Ok(0);
        }
        if !put(session, &[])? {
            let tokens = session.tokens().len();
            session.reset();
            return Err(FitError::TooLong { tokens, reserve, n_ctx });
        }
        // Some of the newest turns fit: drop the oldest ones until they do.
        let mut dropped = 1;
        while !put(session, &self.turns[(2 * dropped).min(self.turns.len())..])? {
            dropped += 1;
        }
        self.turns.drain(..2 * dropped);
        self.turns.push(ChatMessage::new("user", text));
        Ok(dropped)
    }

    /// Drops the last user message (its reply failed).
    pub fn forget_last(&mut self) {
        if self.turns.last().is_some_and(|m| m.role == "user") {
            self.turns.pop();
        }
    }
}

/// The positions kept free for the reply: `min(n_predict, n_ctx / 4)` (`n_ctx / 4` when
/// `n_predict` is unlimited).
pub fn reply_reserve(n_predict: usize, n_ctx: usize) -> usize {
    n_predict.min(n_ctx / 4)
}

/// The note for dropped turns.
pub fn dropped_note(dropped: usize) -> String {
    if dropped == 1 { "(context full: dropped the oldest turn)".to_string() } else { format!("(context full: dropped the {dropped} oldest turns)") }
}

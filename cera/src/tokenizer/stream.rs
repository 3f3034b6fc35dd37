//! Streaming detokenization: push generated ids one at a time, get text that never ends inside
//! a UTF-8 character.
//!
//! A byte-level BPE token or a `<0xE2>` byte-fallback token can carry part of a character; the
//! decoder holds such bytes back until the character is complete. Bytes that can never form a
//! character are emitted as U+FFFD, exactly once.

use super::{DecodeOptions, Tokenizer, TokenizerError};

/// Incremental decoder; see the module docs. Concatenating every [`StreamDecoder::push`] result
/// and [`StreamDecoder::finish`] gives the same text as [`Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    opts: DecodeOptions,
    pending: Vec<u8>,
    first: bool,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder with [`DecodeOptions::default`].
    pub fn new(tok: &'t Tokenizer) -> StreamDecoder<'t> {
        Self::with_options(tok, DecodeOptions::default())
    }

    /// A decoder with explicit options.
    pub fn with_options(tok: &'t Tokenizer, opts: DecodeOptions) -> StreamDecoder<'t> {
        StreamDecoder { tok, opts, pending: Vec::new(), first: true }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let mut out = String::new();
        self.push_into(id, &mut out)?;
        Ok(out)
    }

    /// [`Self::push`], appending the text to `out`. Once the decoder's buffer has grown and the
    /// tokenizer has looked `id` up before, this allocates nothing beyond `out`'s growth.
    pub fn push_into(&mut self, id: u32, out: &mut String) -> Result<(), TokenizerError> {
        let mut piece = self.tok.piece_for_stream(id, self.opts.render_special)?;
        if self.first && !piece.is_empty() {
            self.first = false;
            if self.opts.strip_space_prefix && self.tok.adds_space_prefix() && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
        }
        self.pending.extend_from_slice(piece);
        self.drain_complete(out);
        Ok(())
    }

    /// Returns what is still held back (an unfinished character becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        let mut rest = String::new();
        self.finish_into(&mut rest);
        rest
    }

    /// [`Self::finish`], appending to `out`.
    pub fn finish_into(&mut self, out: &mut String) {
        out.push_str(&String::from_utf8_lossy(&self.pending));
        self.pending.clear();
        self.first = true;
    }

    /// Bytes held back because they may start a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    fn drain_complete(&mut self, out: &mut String) {
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // SAFETY-free: the prefix is valid UTF-8 by construction.
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start = valid + n;
                        }
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
    }
}

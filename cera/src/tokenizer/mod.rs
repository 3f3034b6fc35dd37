//! Tokenizers: text to token ids and back.
//!
//! Three kinds share one [`Tokenizer`] type:
//! - GGUF `gpt2` byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`
//!   (SmolLM2, Qwen, Llama 3), in [`bpe`] and [`pretokenize`];
//! - GGUF `llama` SentencePiece-style BPE with scores and byte fallback (Llama 2, Gemma), in [`spm`];
//! - Hugging Face `tokenizer.json` (for safetensors models), through the `tokenizers` crate, in [`hf`].
//!
//! The GGUF tokenizers reproduce llama.cpp's output exactly (checked against goldens made with
//! llama.cpp's server). [`StreamDecoder`] turns ids into text one at a time without ever emitting
//! half a UTF-8 character.
//!
//! ```no_run
//! use cera::gguf::GgufFile;
//! use cera::tokenizer::{EncodeOptions, Tokenizer};
//! let file = GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("<|im_start|>user\nHi!", EncodeOptions { add_special: true, parse_special: true })?;
//! let mut stream = tok.stream_decoder();
//! for &id in &ids {
//!     print!("{}", stream.push(id)?);
//! }
//! print!("{}", stream.finish());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bpe;
mod bytes;
mod gguf_vocab;
pub mod hf;
pub mod pretokenize;
pub mod spm;
mod stream;
mod unicode;
mod vocab;

use std::path::PathBuf;
use std::sync::OnceLock;

pub use stream::StreamDecoder;
pub use vocab::{TokenAttr, TokenType, Vocab};

use crate::gguf::{GgufFile, Metadata, MetadataError};

/// Why a tokenizer could not be built or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required metadata key is missing or has the wrong type.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer `{0}`")]
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (lengths differ, bad merges, empty, ...).
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    /// A pre-tokenizer regex failed to compile or to run.
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    InvalidTokenId {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The Hugging Face tokenizer failed to load or run.
    #[error("tokenizer.json: {0}")]
    Hf(String),
}

/// Which algorithm a tokenizer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenizerKind {
    /// GGUF `gpt2`: byte-level BPE.
    Bpe,
    /// GGUF `llama`: SentencePiece-style BPE with byte fallback.
    SentencePiece,
    /// A Hugging Face `tokenizer.json`.
    HuggingFace,
}

impl std::fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TokenizerKind::Bpe => "byte-level BPE (gpt2)",
            TokenizerKind::SentencePiece => "SentencePiece BPE (llama)",
            TokenizerKind::HuggingFace => "Hugging Face tokenizer.json",
        })
    }
}

/// Special token ids and whether BOS/EOS are added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn (`<|im_end|>`, `<end_of_turn>`, `<|eot_id|>`).
    pub eot: Option<u32>,
    /// End of message (`<|eom_id|>`).
    pub eom: Option<u32>,
    /// Unknown.
    pub unk: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// Separator.
    pub sep: Option<u32>,
    /// Every id that ends generation (EOS, EOT, EOM and the other end markers in the vocabulary).
    pub eog: Vec<u32>,
    /// Whether `encode` with `add_special` puts BOS first.
    pub add_bos: bool,
    /// Whether `encode` with `add_special` puts EOS last.
    pub add_eos: bool,
}

/// Options of [`Tokenizer::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Add BOS/EOS as the model's metadata asks.
    pub add_special: bool,
    /// Recognise control tokens (`<|im_start|>`, `<bos>`) written in the text. User-defined
    /// tokens are always recognised. Turn this off for untrusted user text.
    pub parse_special: bool,
}

impl Default for EncodeOptions {
    /// `add_special: true, parse_special: false`, as llama.cpp's `common_tokenize`.
    fn default() -> Self {
        EncodeOptions { add_special: true, parse_special: false }
    }
}

/// Options of [`Tokenizer::decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Render control tokens as their text (otherwise they produce nothing).
    pub render_special: bool,
    /// Drop the leading space that SentencePiece's `add_space_prefix` put in front (from the
    /// first piece that produces text, so an unrendered BOS does not stop it).
    pub strip_space_prefix: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions { render_special: true, strip_space_prefix: true }
    }
}

enum Inner {
    Gguf(Box<gguf_vocab::GgufTokenizer>),
    Hf(Box<hf::HfTokenizer>),
}

/// A tokenizer of any supported kind.
pub struct Tokenizer {
    inner: Inner,
    special: SpecialTokens,
    /// Pieces the stream decoder looked up, kept per id (with and without special tokens
    /// rendered), so that a generation loop detokenizes without allocating once it has seen
    /// its ids.
    stream_pieces: [OnceLock<PieceTable>; 2],
}

/// One kept piece per id ([`Tokenizer::piece_for_stream`]).
type PieceTable = Box<[OnceLock<Box<[u8]>>]>;

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("kind", &self.kind()).field("vocab_size", &self.vocab_size()).field("special", &self.special).finish()
    }
}

impl Tokenizer {
    /// The tokenizer stored in a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Self::from_gguf_metadata(file.metadata())
    }

    /// The tokenizer described by GGUF metadata.
    pub fn from_gguf_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let (inner, special) = gguf_vocab::GgufTokenizer::from_metadata(md)?;
        Ok(Tokenizer { inner: Inner::Gguf(Box::new(inner)), special, stream_pieces: Default::default() })
    }

    /// A Hugging Face `tokenizer.json`; `tokenizer_config.json` beside it, if present, supplies
    /// the BOS/EOS tokens.
    pub fn from_hf_file(path: impl Into<PathBuf>) -> Result<Tokenizer, TokenizerError> {
        let (inner, special) = hf::HfTokenizer::from_file(path.into())?;
        Ok(Tokenizer { inner: Inner::Hf(Box::new(inner)), special, stream_pieces: Default::default() })
    }

    /// A Hugging Face tokenizer from the bytes of `tokenizer.json` (and optionally
    /// `tokenizer_config.json`).
    pub fn from_hf_bytes(json: &[u8], config: Option<&[u8]>) -> Result<Tokenizer, TokenizerError> {
        let (inner, special) = hf::HfTokenizer::from_bytes(json, config)?;
        Ok(Tokenizer { inner: Inner::Hf(Box::new(inner)), special, stream_pieces: Default::default() })
    }

    /// The algorithm.
    pub fn kind(&self) -> TokenizerKind {
        match &self.inner {
            Inner::Gguf(g) => g.kind(),
            Inner::Hf(_) => TokenizerKind::HuggingFace,
        }
    }

    /// The pre-tokenizer name (`tokenizer.ggml.pre`) of a BPE tokenizer.
    pub fn pre_tokenizer(&self) -> Option<&str> {
        match &self.inner {
            Inner::Gguf(g) => g.pre_tokenizer(),
            Inner::Hf(_) => None,
        }
    }

    /// Special tokens and BOS/EOS policy.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.special.eog.contains(&id)
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Gguf(g) => g.vocab().len(),
            Inner::Hf(h) => h.vocab_size(),
        }
    }

    /// The GGUF vocabulary (token texts, scores and types), for GGUF tokenizers.
    pub fn gguf_vocab(&self) -> Option<&Vocab> {
        match &self.inner {
            Inner::Gguf(g) => Some(g.vocab()),
            Inner::Hf(_) => None,
        }
    }

    /// A token's stored text (`Ġworld`, `▁world`, `<|im_start|>`).
    pub fn token_text(&self, id: u32) -> Option<String> {
        match &self.inner {
            Inner::Gguf(g) => g.vocab().text(id).map(str::to_string),
            Inner::Hf(h) => h.token_text(id),
        }
    }

    /// The id of the token with exactly this stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(g) => g.vocab().id(text),
            Inner::Hf(h) => h.token_id(text),
        }
    }

    /// Tokenizes `text`.
    pub fn encode(&self, text: &str, opts: EncodeOptions) -> Result<Vec<u32>, TokenizerError> {
        match &self.inner {
            Inner::Gguf(g) => g.encode(text, opts, &self.special),
            Inner::Hf(h) => h.encode(text, opts),
        }
    }

    fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.vocab_size() { Ok(()) } else { Err(TokenizerError::InvalidTokenId { id, vocab_size: self.vocab_size() }) }
    }

    /// The bytes one token stands for (a byte-level BPE token may be part of a UTF-8
    /// character). Control and unknown tokens give their text only with `render_special`.
    pub fn piece(&self, id: u32, render_special: bool) -> Result<Vec<u8>, TokenizerError> {
        self.check_id(id)?;
        Ok(match &self.inner {
            Inner::Gguf(g) => g.piece(id, render_special),
            Inner::Hf(h) => h.piece(id, render_special)?,
        })
    }

    /// [`Self::piece`], computed once per id and kept.
    /// (The table's length is the vocabulary's size: a Hugging Face tokenizer counts its
    /// vocabulary by building it.)
    pub(crate) fn piece_for_stream(&self, id: u32, render_special: bool) -> Result<&[u8], TokenizerError> {
        let table = self.stream_pieces[render_special as usize].get_or_init(|| (0..self.vocab_size()).map(|_| OnceLock::new()).collect());
        let cell = table.get(id as usize).ok_or(TokenizerError::InvalidTokenId { id, vocab_size: table.len() })?;
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let p = self.piece(id, render_special)?;
        Ok(cell.get_or_init(|| p.into_boxed_slice()))
    }

    /// Whether encoding puts a space in front of the text (SentencePiece `add_space_prefix`, or
    /// a Hugging Face Metaspace pre-tokenizer), which decoding then strips.
    pub fn adds_space_prefix(&self) -> bool {
        match &self.inner {
            Inner::Gguf(g) => g.adds_space_prefix(),
            Inner::Hf(h) => h.adds_space_prefix(),
        }
    }

    /// Turns ids back into text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32], opts: DecodeOptions) -> Result<String, TokenizerError> {
        for &id in ids {
            self.check_id(id)?;
        }
        match &self.inner {
            Inner::Gguf(g) => Ok(g.decode(ids, opts)),
            Inner::Hf(h) => h.decode(ids, !opts.render_special),
        }
    }

    /// A decoder for generated ids, one at a time.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    pub(crate) fn hf(&self) -> Option<&hf::HfTokenizer> {
        match &self.inner {
            Inner::Hf(h) => Some(h),
            Inner::Gguf(_) => None,
        }
    }
}

//! Structured output through `llguidance`: `response_format` (`json_object`, `json_schema`) and
//! `grammar` (Lark) compiled against the model's vocabulary into a [`Constraint`] whose mask the
//! engine applies at every step. A schema or grammar that does not compile (a JSON-schema
//! keyword llguidance does not implement, a Lark syntax error) is refused with the compiler's
//! message, which names it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

use crate::engine::{Constraint, Engine, TokenConstraint};
use crate::tokenizer::EncodeOptions;

/// The model's vocabulary as llguidance sees it: each id's bytes (control tokens behind the
/// special-token marker, so a grammar never produces them as text).
struct Vocab {
    trie: TokTrie,
    engine: Engine,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.engine.tokenizer().encode(&String::from_utf8_lossy(s), EncodeOptions { add_special: false, parse_special: false }).unwrap_or_default()
    }
}

/// Time spent computing masks, for `/metrics`.
#[derive(Debug, Default)]
pub struct MaskCost {
    /// Masks computed (one per constrained token).
    pub masks: AtomicU64,
    /// Nanoseconds spent computing them.
    pub nanos: AtomicU64,
}

/// Compiles grammars for one model.
pub struct Grammars {
    factory: ParserFactory,
    /// What the masks have cost so far.
    pub cost: Arc<MaskCost>,
}

impl Grammars {
    /// The compiler for `engine`'s vocabulary (built once per server, at the first structured
    /// request).
    pub fn new(engine: &Engine) -> Result<Grammars, String> {
        let tok = engine.tokenizer();
        let vocab = engine.config().vocab;
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let plain = tok.piece(id, false).unwrap_or_default();
                if !plain.is_empty() {
                    return plain;
                }
                let shown = tok.piece(id, true).unwrap_or_default();
                let name = if shown.is_empty() { format!("<[{id}]>").into_bytes() } else { shown };
                [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &name].concat()
            })
            .collect();
        let eos = engine.eog_ids().first().copied().or(tok.special().eos).ok_or("the model has no end-of-generation token")?;
        let info = TokRxInfo::new(vocab as u32, eos);
        let env: llguidance::toktrie::TokEnv = Arc::new(Vocab { trie: TokTrie::from(&info, &words), engine: engine.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Grammars { factory, cost: Arc::default() })
    }

    /// A constraint from a grammar, compiled now (so a bad one is refused before anything runs).
    fn constraint(&self, g: TopLevelGrammar) -> Result<Constraint, String> {
        let parser = self.factory.create_parser(g).map_err(|e| e.to_string())?;
        let cost = self.cost.clone();
        Ok(Constraint::new(move || {
            Ok(Box::new(Guided { matcher: Matcher::new(Ok(parser.deep_clone())), mask: Vec::new(), cost: cost.clone() }) as Box<dyn TokenConstraint>)
        }))
    }

    /// A JSON schema (compact JSON: no free whitespace, unless the schema's `x-guidance` says
    /// otherwise).
    pub fn json_schema(&self, mut schema: Value) -> Result<Constraint, String> {
        if let Some(o) = schema.as_object_mut() {
            o.entry("x-guidance").or_insert_with(|| json!({"whitespace_flexible": false}));
        } else if schema != Value::Bool(true) {
            return Err("a JSON schema must be an object".into());
        }
        self.constraint(TopLevelGrammar::from_json_schema(schema))
    }

    /// A Lark grammar.
    pub fn lark(&self, grammar: &str) -> Result<Constraint, String> {
        self.constraint(TopLevelGrammar::from_lark(grammar.to_string()))
    }
}

/// One generation's matcher.
struct Guided {
    matcher: Matcher,
    mask: Vec<u32>,
    cost: Arc<MaskCost>,
}

impl TokenConstraint for Guided {
    fn allowed(&mut self, _vocab: usize) -> Result<&[u32], String> {
        let start = Instant::now();
        let m = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        self.mask.clear();
        self.mask.extend_from_slice(m.as_slice());
        self.cost.masks.fetch_add(1, Ordering::Relaxed);
        self.cost.nanos.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(&self.mask)
    }

    fn accept(&mut self, id: u32) -> Result<(), String> {
        self.matcher.consume_token(id).map_err(|e| e.to_string())
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

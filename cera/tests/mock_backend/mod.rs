//! The scripted executor of `engine_loop.rs`: a mock `Backend` whose logits are a function of
//! the tokens in its cache, with a checked cache (a step at a position past what was written,
//! over the ubatch or past the context is an error) and a log of every step, its SentencePiece
//! vocabulary with byte fallback, and the engine built on them.

use std::sync::{Arc, Mutex};

use cera::chat_template::{BuiltinTemplate, ChatTemplate};
use cera::engine::{
    Arch, Backend, BackendState, Engine, EngineError, EngineParts, GateAct, GenerateOpts, KvType, LayerKind, LayerRope, ModelConfig, StateOpts, StepCounters,
    StepInput, StepOutput, TokenEvent, Want, end_of_generation_ids,
};
use cera::gguf::{Metadata, MetadataArray, MetadataValue};
use cera::tokenizer::Tokenizer;

/// The vocabulary: a SentencePiece model with byte fallback. `€` is `<0xE2><0x82><0xAC>`.
pub const TOKENS: [&str; 20] =
    ["<unk>", "<s>", "</s>", "<|im_end|>", "▁Hello", "▁world", "!", "E", "N", "D", "<0xE2>", "<0x82>", "<0xAC>", "▁", "a", "b", "c", "x", "y", "z"];
pub const TYPES: [i32; 20] = [2, 3, 3, 3, 1, 1, 1, 1, 1, 1, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1];
pub const VOCAB: usize = TOKENS.len();
pub const HELLO: u32 = 4;
pub const WORLD: u32 = 5;
pub const BANG: u32 = 6;
pub const E: u32 = 7;
pub const N: u32 = 8;
pub const D: u32 = 9;
pub const B0: u32 = 10;
pub const B1: u32 = 11;
pub const B2: u32 = 12;
pub const A: u32 = 14;
pub const B: u32 = 15;
pub const C: u32 = 16;
pub const X: u32 = 17;
pub const Y: u32 = 18;
pub const Z: u32 = 19;
pub const IM_END: u32 = 3;
pub const EOS: u32 = 2;

pub fn tokenizer() -> Tokenizer {
    let mut md = Metadata::default();
    md.set("tokenizer.ggml.model", MetadataValue::String("llama".into()));
    md.set("tokenizer.ggml.tokens", MetadataValue::Array(MetadataArray::String(TOKENS.iter().map(|s| s.to_string()).collect())));
    md.set("tokenizer.ggml.scores", MetadataValue::Array(MetadataArray::F32((0..VOCAB).map(|i| -(i as f32)).collect())));
    md.set("tokenizer.ggml.token_type", MetadataValue::Array(MetadataArray::I32(TYPES.to_vec())));
    md.set("tokenizer.ggml.add_space_prefix", MetadataValue::Bool(false));
    Tokenizer::from_gguf_metadata(&md).unwrap()
}

pub fn config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        n_layers: 1,
        dim: 8,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 8,
        ffn_dim: 8,
        vocab: VOCAB,
        norm_eps: 1e-5,
        rope_dim: 8,
        rope: vec![LayerRope { base: 10_000.0, linear_factor: 1.0 }],
        window: vec![None],
        context_length: 64,
        embed_scale: 1.0,
        gate_act: GateAct::Silu,
        qk_norm: false,
        post_norms: false,
        attn_scale: 1.0,
        final_softcap: None,
        attn_softcap: None,
        kinds: vec![LayerKind::Attention],
        conv_kernel: 0,
    }
}

pub type Rule = Arc<dyn Fn(&[u32]) -> Vec<f32> + Send + Sync>;

/// One step as the mock saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub pos: usize,
    pub tokens: Vec<u32>,
    pub last_argmax: bool,
    pub want: Want,
}

pub struct Mock {
    pub rule: Rule,
    pub log: Arc<Mutex<Vec<Step>>>,
}

pub struct MockState {
    pub rule: Rule,
    pub log: Arc<Mutex<Vec<Step>>>,
    pub opts: StateOpts,
    pub cache: Vec<u32>,
    pub argmax: Option<u32>,
    pub mask: Vec<u32>,
    pub done: std::collections::VecDeque<StepOutput>,
}

pub fn bad(what: String) -> EngineError {
    EngineError::Device { device: "mock".into(), reason: what }
}

impl Backend for Mock {
    fn new_state(&self, opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError> {
        Ok(Box::new(MockState {
            rule: self.rule.clone(),
            log: self.log.clone(),
            opts: *opts,
            cache: Vec::new(),
            argmax: None,
            mask: Vec::new(),
            done: Default::default(),
        }))
    }
    fn device_name(&self) -> String {
        "mock".into()
    }
    fn is_gpu(&self) -> bool {
        false
    }
}

pub fn sorted_desc(row: &[f32]) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = row.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

impl MockState {
    fn run_step(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<StepOutput, EngineError> {
        let (tokens, last_argmax) = match input {
            StepInput::Tokens(t) => (t.to_vec(), false),
            StepInput::LastArgmax => (vec![self.argmax.ok_or_else(|| bad("LastArgmax without a previous argmax".into()))?], true),
        };
        self.argmax = None;
        if tokens.is_empty() || tokens.len() > self.opts.ubatch {
            return Err(bad(format!("{} tokens in a step (ubatch {})", tokens.len(), self.opts.ubatch)));
        }
        if pos > self.cache.len() || pos + tokens.len() > self.opts.n_ctx {
            return Err(bad(format!("step at {pos} of {} tokens: cache holds {}, context {}", tokens.len(), self.cache.len(), self.opts.n_ctx)));
        }
        self.cache.truncate(pos);
        self.cache.extend_from_slice(&tokens);
        self.log.lock().unwrap().push(Step { pos, tokens, last_argmax, want });
        let row = (self.rule)(&self.cache);
        Ok(match want {
            Want::Nothing => StepOutput::Nothing,
            Want::Argmax => {
                let id = sorted_desc(&row).into_iter().map(|c| c.0).find(|id| !self.mask.contains(id)).unwrap();
                self.argmax = Some(id);
                StepOutput::Argmax(id)
            }
            Want::TopK(k) => StepOutput::TopK(sorted_desc(&row).into_iter().take(k).collect()),
            Want::Logits => StepOutput::Logits(row),
        })
    }
}

impl BackendState for MockState {
    fn submit(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(), EngineError> {
        if self.done.len() >= cera::engine::MAX_IN_FLIGHT {
            return Err(bad(format!("a step submitted with {} outstanding", self.done.len())));
        }
        let out = self.run_step(input, pos, want)?;
        self.done.push_back(out);
        Ok(())
    }
    fn collect(&mut self) -> Result<StepOutput, EngineError> {
        self.done.pop_front().ok_or_else(|| bad("collect without a submitted step".into()))
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
    fn set_argmax_mask(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        self.mask = ids.to_vec();
        Ok(())
    }
    fn reset(&mut self) -> Result<(), EngineError> {
        self.done.clear();
        Ok(())
    }
    fn last_step_counters(&self) -> StepCounters {
        StepCounters::default()
    }
}

/// The best next token is `next[last]` (logit 10), the second best `second[last]` (logit 9),
/// every other token a logit under 1 that depends on the whole history.
pub fn chain(next: &'static [(u32, u32)], second: &'static [(u32, u32)]) -> Rule {
    Arc::new(move |h: &[u32]| {
        let last = *h.last().unwrap();
        let salt = h.iter().fold(0u32, |a, &t| a.wrapping_mul(31).wrapping_add(t));
        let mut row: Vec<f32> = (0..VOCAB as u32).map(|i| ((i.wrapping_mul(7).wrapping_add(salt)) % 10) as f32 / 10.0).collect();
        if let Some(&(_, s)) = second.iter().find(|p| p.0 == last) {
            row[s as usize] = 9.0;
        }
        if let Some(&(_, n)) = next.iter().find(|p| p.0 == last) {
            row[n as usize] = 10.0;
        }
        row
    })
}

/// A flat distribution for sampling: every token's logit depends on the history.
pub fn flat() -> Rule {
    Arc::new(|h: &[u32]| {
        let salt = h.iter().fold(7u32, |a, &t| a.wrapping_mul(131).wrapping_add(t + 1));
        (0..VOCAB as u32).map(|i| ((i.wrapping_mul(2654435761).wrapping_add(salt) >> 7) % 1000) as f32 / 400.0).collect()
    })
}

pub struct Setup {
    pub engine: Engine,
    pub log: Arc<Mutex<Vec<Step>>>,
}

impl Setup {
    pub fn steps(&self) -> Vec<Step> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
}

pub fn setup(rule: Rule, n_ctx: usize, ubatch: usize) -> Setup {
    let log = Arc::new(Mutex::new(Vec::new()));
    let eog = end_of_generation_ids(&tokenizer());
    let parts = parts(Mock { rule, log: log.clone() }, n_ctx, ubatch, eog);
    Setup { engine: Engine::from_parts(parts).unwrap(), log }
}

/// The engine's parts around `mock`: the vocabulary, ChatML, the mock's model config, an f16
/// cache.
pub fn parts(mock: Mock, n_ctx: usize, ubatch: usize, eog: Vec<u32>) -> EngineParts {
    EngineParts {
        backend: Arc::new(mock),
        tokenizer: tokenizer(),
        template: ChatTemplate::builtin(BuiltinTemplate::ChatMl),
        config: config(),
        eog,
        n_ctx,
        ubatch,
        kv: KvType::F16,
    }
}

/// Greedy generation collecting every event's id and text.
pub fn run(s: &mut cera::engine::Session, opts: &GenerateOpts) -> (cera::engine::Generation, Vec<(u32, String)>) {
    let mut events = Vec::new();
    let g = s.generate(opts, &mut |ev: &TokenEvent| events.push((ev.id, ev.text.to_string()))).unwrap();
    (g, events)
}

//! The model as a description both executors run: a flat list of [`Op`]s over named activation
//! [`Slot`]s and named weights. An architecture (`arch/`) writes this list once; the GPU executor
//! turns it into boostr plans recorded per token (fusing neighbouring ops where a fused kernel
//! exists, e.g. RMSNorm into the next mat-vec), the CPU executor interprets it with boostr's CPU
//! references. The two devices therefore cannot drift apart: what differs is only how an op is
//! computed, never which ops run.
//!
//! Every slot holds `n_tok` rows of its width (see [`ModelGraph::width`]) for the tokens of the
//! current step. [`Slot::Hidden`] is the residual stream.

use super::EngineError;
use super::config::{GateAct, LayerRope, ModelConfig};
use super::weights::WeightSource;

/// An activation buffer of the step (rows = the step's tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// The residual stream, `dim` wide.
    Hidden,
    /// A normalised copy of the residual stream, `dim` wide (the next mat-vec's input).
    Normed,
    /// Packed `[q | k | v]` rows, `(n_heads + 2 n_kv_heads) * head_dim` wide.
    Qkv,
    /// The attention output, `n_heads * head_dim` wide.
    Attn,
    /// A block's output before the residual add, `dim` wide.
    Delta,
    /// A normalised block output (gemma3's post-norms), `dim` wide.
    DeltaNormed,
    /// Packed `[gate | up]` rows, `2 * ffn_dim` wide.
    GateUp,
    /// The GLU output, `ffn_dim` wide.
    Glu,
    /// Next-token logits, `vocab` wide (only the step's last token is computed).
    Logits,
    /// LFM2's conv input projection, `[B | C | x]` rows `3 * dim` wide.
    ConvIn,
    /// LFM2's conv output `C * conv(B * x)`, `dim` wide.
    Conv,
}

/// A weight matrix stored `[rows, cols]` row-major (ggml dims `[cols, rows]`), by tensor name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatRef {
    /// The tensor's name in the file (`blk.3.attn_q.weight`).
    pub name: String,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
}

/// A vector weight (norm weights), by tensor name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VecRef {
    /// The tensor's name in the file.
    pub name: String,
    /// Its length.
    pub len: usize,
}

/// One operation of the model.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `Hidden = scale * table[id]` for the step's token ids.
    Embed {
        /// The `[vocab, dim]` table.
        table: MatRef,
        /// Row multiplier (gemma3: `sqrt(dim)`).
        scale: f32,
    },
    /// `out = rmsnorm(x) * w`.
    Norm {
        /// Input.
        x: Slot,
        /// Weight (`dim`).
        w: VecRef,
        /// Output (never `x`).
        out: Slot,
    },
    /// `Hidden += x`, then `out = rmsnorm(Hidden) * w`.
    AddNorm {
        /// What is added to the residual stream.
        x: Slot,
        /// Weight.
        w: VecRef,
        /// Output.
        out: Slot,
    },
    /// `out = x W^T` with the matrices' rows concatenated (fused Q/K/V, fused gate/up).
    Linear {
        /// The matrices, all `cols` wide; `out` is the sum of their rows wide.
        ws: Vec<MatRef>,
        /// Input.
        x: Slot,
        /// Output.
        out: Slot,
    },
    /// On [`Slot::Qkv`] in place: optional per-head RMSNorm of q and k, RoPE of q and k at the
    /// tokens' positions, and the K/V rows written into the layer's cache at those positions.
    QkvRope {
        /// The layer (cache index).
        layer: usize,
        /// Per-head norm weights of q and k (`head_dim` each).
        qk_norm: Option<(VecRef, VecRef)>,
        /// RoPE base and scaling of this layer.
        rope: LayerRope,
        /// Rotate pairs `(i, i + rot_dim / 2)` (NeoX, gemma3) instead of `(2i, 2i + 1)` (llama).
        neox: bool,
        /// Per-frequency divisors of the inverse frequencies (`rope_freqs.weight`, Llama 3.1's
        /// long-context scaling as llama.cpp's converter stores it), `rope_dim / 2` long.
        freq_factors: Option<VecRef>,
    },
    /// Causal attention of the step's queries over the layer's cache, into [`Slot::Attn`].
    Attention {
        /// The layer.
        layer: usize,
        /// Sliding window (`None`: global).
        window: Option<usize>,
    },
    /// `x += b` per row, in place, with `b` the vectors concatenated (Qwen2's Q/K/V bias on
    /// [`Slot::Qkv`]).
    Bias {
        /// The rows (their width is the vectors' total length).
        x: Slot,
        /// The bias vectors, in the order of the row's columns.
        bs: Vec<VecRef>,
    },
    /// LFM2's gated short convolution: [`Slot::Conv`] `= C * conv(B * x)` from the
    /// [`Slot::ConvIn`] rows `[B | C | x]`, against the rolling state `state` (the `state`-th
    /// conv layer), which the op advances to the step's tokens.
    ShortConv {
        /// The state (conv-layer index).
        state: usize,
        /// The depthwise taps, `[dim, kernel]` (GGUF `shortconv.conv`).
        w: MatRef,
    },
    /// `out = act(gate) * up` from packed `[gate | up]` rows of `x`.
    Glu {
        /// The gate activation.
        act: GateAct,
        /// Input (`2 * ffn_dim` wide).
        x: Slot,
        /// Output (`ffn_dim` wide).
        out: Slot,
    },
    /// `Logits = Normed[last] W^T` for the step's last token, with optional soft-capping.
    LmHead {
        /// `[vocab, dim]`.
        w: MatRef,
        /// `cap * tanh(logit / cap)`.
        softcap: Option<f32>,
    },
}

impl Op {
    /// The layer the op belongs to (from its cache index or its weights' `blk.{layer}.` names);
    /// `None` for the embedding, the final norm and the LM head.
    pub fn layer(&self) -> Option<usize> {
        match self {
            Op::QkvRope { layer, .. } | Op::Attention { layer, .. } => Some(*layer),
            _ => {
                let name = self.mats().first().map(|m| m.name.as_str()).or_else(|| self.vecs().first().map(|v| v.name.as_str()))?;
                name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
            }
        }
    }

    /// The op's weights, matrices first.
    pub fn mats(&self) -> Vec<&MatRef> {
        match self {
            Op::Embed { table, .. } => vec![table],
            Op::Linear { ws, .. } => ws.iter().collect(),
            Op::LmHead { w, .. } => vec![w],
            Op::ShortConv { w, .. } => vec![w],
            _ => vec![],
        }
    }

    /// The op's vector weights.
    pub fn vecs(&self) -> Vec<&VecRef> {
        match self {
            Op::Norm { w, .. } | Op::AddNorm { w, .. } => vec![w],
            Op::QkvRope { qk_norm, freq_factors, .. } => qk_norm.iter().flat_map(|(q, k)| [q, k]).chain(freq_factors).collect(),
            Op::Bias { bs, .. } => bs.iter().collect(),
            _ => vec![],
        }
    }

    /// The activation slots the op reads.
    pub fn reads(&self) -> Vec<Slot> {
        match self {
            Op::Embed { .. } => vec![],
            Op::Norm { x, .. } | Op::Linear { x, .. } | Op::Glu { x, .. } => vec![*x],
            Op::AddNorm { x, .. } => vec![*x, Slot::Hidden],
            Op::QkvRope { .. } => vec![Slot::Qkv],
            Op::Bias { x, .. } => vec![*x],
            Op::Attention { .. } => vec![Slot::Qkv],
            Op::ShortConv { .. } => vec![Slot::ConvIn],
            Op::LmHead { .. } => vec![Slot::Normed],
        }
    }

    /// The activation slots the op writes.
    pub fn writes(&self) -> Vec<Slot> {
        match self {
            Op::Embed { .. } => vec![Slot::Hidden],
            Op::Norm { out, .. } | Op::Linear { out, .. } | Op::Glu { out, .. } => vec![*out],
            Op::AddNorm { out, .. } => vec![Slot::Hidden, *out],
            Op::QkvRope { .. } => vec![Slot::Qkv],
            Op::Bias { x, .. } => vec![*x],
            Op::Attention { .. } => vec![Slot::Attn],
            Op::ShortConv { .. } => vec![Slot::Conv],
            Op::LmHead { .. } => vec![Slot::Logits],
        }
    }
}

/// What a decode step reads of the weights ([`ModelGraph::decode_traffic`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecodeTraffic {
    /// Bytes per token.
    pub bytes: u64,
    /// Bytes per matrix format (`("Q4_0", bytes)`), largest first.
    pub formats: Vec<(String, u64)>,
}

impl DecodeTraffic {
    /// The format holding most of the bytes (`Q4_0`), or `-`.
    pub fn main_format(&self) -> &str {
        self.formats.first().map_or("-", |f| f.0.as_str())
    }
}

/// The whole model: the ops in order (embedding, every layer, final norm, LM head).
#[derive(Clone, Debug)]
pub struct ModelGraph {
    /// The resolved configuration the ops were written from.
    pub cfg: ModelConfig,
    /// The ops, in execution order.
    pub ops: Vec<Op>,
}

impl ModelGraph {
    /// Elements per row of a slot.
    pub fn width(&self, slot: Slot) -> usize {
        let c = &self.cfg;
        match slot {
            Slot::Hidden | Slot::Normed | Slot::Delta | Slot::DeltaNormed | Slot::Conv => c.dim,
            Slot::ConvIn => 3 * c.dim,
            Slot::Qkv => c.qkv_dim(),
            Slot::Attn => c.n_heads * c.head_dim,
            Slot::GateUp => 2 * c.ffn_dim,
            Slot::Glu => c.ffn_dim,
            Slot::Logits => c.vocab,
        }
    }

    /// The weights one decode step reads, in the source's bytes, each tensor once: every
    /// matrix of the linear ops and the LM head, and every vector. An embedding table is
    /// counted only where the LM head reads it (a tied head); the embedding gathers one row.
    /// With the formats of the matrices, largest share first (`Q4_0: 0.93`...).
    pub fn decode_traffic(&self, src: &dyn WeightSource) -> Result<DecodeTraffic, EngineError> {
        let mut seen = std::collections::HashSet::new();
        let mut t = DecodeTraffic::default();
        for op in &self.ops {
            let mats = match op {
                Op::Linear { .. } | Op::LmHead { .. } | Op::ShortConv { .. } => op.mats(),
                _ => Vec::new(),
            };
            for m in mats {
                if seen.insert(m.name.as_str()) {
                    let s = src.stored(m)?;
                    t.bytes += s.bytes;
                    match t.formats.iter_mut().find(|f| f.0 == s.format) {
                        Some(f) => f.1 += s.bytes,
                        None => t.formats.push((s.format, s.bytes)),
                    }
                }
            }
            for v in op.vecs() {
                if seen.insert(v.name.as_str()) {
                    t.bytes += 4 * v.len as u64;
                }
            }
        }
        t.formats.sort_by_key(|f| std::cmp::Reverse(f.1));
        Ok(t)
    }

    /// The slots the ops use (what they read and write), and always the residual stream, the
    /// logits and `Normed` (where a prefill chunk's last row goes for the LM head).
    pub fn slots(&self) -> Vec<Slot> {
        let mut s: Vec<Slot> = vec![Slot::Hidden, Slot::Logits, Slot::Normed];
        for op in &self.ops {
            s.extend(op.reads());
            s.extend(op.writes());
        }
        s.sort();
        s.dedup();
        s
    }
}

/// Helper for architecture files: tracks whether a block output is waiting to be added to the
/// residual stream, so that the add fuses into the next norm.
pub(crate) struct GraphBuilder {
    pub(crate) ops: Vec<Op>,
    pending: Option<Slot>,
}

impl GraphBuilder {
    pub(crate) fn new() -> GraphBuilder {
        GraphBuilder { ops: Vec::new(), pending: None }
    }

    pub(crate) fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// `out = rmsnorm(Hidden (+ the pending block output)) * w`.
    pub(crate) fn norm_residual(&mut self, w: VecRef, out: Slot) {
        match self.pending.take() {
            Some(x) => self.ops.push(Op::AddNorm { x, w, out }),
            None => self.ops.push(Op::Norm { x: Slot::Hidden, w, out }),
        }
    }

    /// Layer `l`'s pre-norm SwiGLU FFN (`ffn_norm`, fused `ffn_gate`/`ffn_up`, the GLU,
    /// `ffn_down`), its output pending for the residual stream.
    pub(crate) fn swiglu_ffn(&mut self, l: usize, dim: usize, ffn: usize) {
        self.norm_residual(blk_vec(l, "ffn_norm", dim), Slot::Normed);
        self.push(Op::Linear { ws: vec![blk_mat(l, "ffn_gate", ffn, dim), blk_mat(l, "ffn_up", ffn, dim)], x: Slot::Normed, out: Slot::GateUp });
        self.push(Op::Glu { act: GateAct::Silu, x: Slot::GateUp, out: Slot::Glu });
        self.push(Op::Linear { ws: vec![blk_mat(l, "ffn_down", dim, ffn)], x: Slot::Glu, out: Slot::Delta });
        self.residual(Slot::Delta);
    }

    /// Marks `slot` as a block output to add to the residual stream before the next norm.
    pub(crate) fn residual(&mut self, slot: Slot) {
        debug_assert!(self.pending.is_none(), "two block outputs pending");
        self.pending = Some(slot);
    }
}

/// A matrix of `blk.{layer}.{name}.weight`.
pub(crate) fn blk_mat(layer: usize, name: &str, rows: usize, cols: usize) -> MatRef {
    MatRef { name: format!("blk.{layer}.{name}.weight"), rows, cols }
}

/// A vector of `blk.{layer}.{name}.weight`.
pub(crate) fn blk_vec(layer: usize, name: &str, len: usize) -> VecRef {
    VecRef { name: format!("blk.{layer}.{name}.weight"), len }
}

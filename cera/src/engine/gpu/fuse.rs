//! Which ops of the graph the decode plan fuses (see `plans.rs`), decided on the op list alone:
//! - `Linear { out: d }` then `AddNorm { x: d, w, out: o }`: the GEMV adds into the residual
//!   stream (`accumulate`); the norm of the stream is left pending for `o`;
//! - `Norm { x: Hidden, w, out: o }`: pending for `o` likewise;
//! - a pending norm is taken by the next op when it is a `Linear`/`LmHead` reading `o`
//!   (`Prologue::RmsNorm` over the stream), else it runs as a norm of the stream;
//! - `Glu { x: gu, out: h }` then `Linear { x: h }`: the GEMV runs on the GLU of `gu`;
//! - `Linear { out: Qkv }` then `QkvRope` without a QK-norm and with "normal" pairs: the GEMV
//!   rotates Q and K and writes the KV cache itself (boostr's `rope_kv` epilogue), where the
//!   plan builder says the GEMV can (`rope_ok`).
//!
//! A fusion that skips writing a slot (the delta, the normed or the GLU output) is made only when
//! no later op reads that slot before writing it.

use super::super::config::GateAct;
use super::super::graph::{Op, Slot};
use boostr::act::ActKind;

/// What a linear op reads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Input {
    /// Its own input slot.
    Plain,
    /// The RMSNorm (weight name) of the residual stream.
    Norm(String),
    /// The GLU of this packed `[gate | up]` slot.
    Glu(ActKind, Slot),
}

/// One op's part in the fused plan.
#[derive(Clone, Debug)]
pub(crate) struct Fused {
    /// Nothing to record: folded into a neighbour.
    pub(crate) skip: bool,
    /// A `Norm`/`AddNorm` recorded as a norm of the residual stream (its add, if any, was fused
    /// into the previous GEMV).
    pub(crate) materialize: bool,
    /// A linear op's input.
    pub(crate) input: Input,
    /// A linear op adds into the residual stream.
    pub(crate) accumulate: bool,
    /// A linear op also runs this `QkvRope` op (skipped): RoPE and the KV write in its epilogue.
    pub(crate) rope: Option<usize>,
    /// A batched plan's GEMM split over K in this many parts (0: not split this way): a linear
    /// op leaves its partial sums unsummed, and the `AddNorm` after it adds them up itself.
    pub(crate) partial_sums: u32,
}

/// Per op.
pub(crate) struct Fusions {
    pub(crate) ops: Vec<Fused>,
}

impl Fusions {
    /// Every op as it is.
    pub(crate) fn none(n: usize) -> Fusions {
        Fusions { ops: vec![Fused { skip: false, materialize: false, input: Input::Plain, accumulate: false, rope: None, partial_sums: 0 }; n] }
    }
}

/// The fusions of a batched plan whose rows all run through the GEMM: where a linear op's GEMM
/// splits over K (`splits_of`, above 1) and the next op is the residual add and norm of its
/// output, which nothing after reads, the norm adds up the partial sums itself (boostr's
/// `NormPlan::with_partials`, the split sum's order), one dispatch instead of two: the output
/// and down projections of a llama layer.
/// The Q/K/V projection's partials go likewise to the `QkvRope` right after it, which sums
/// them in its own slot (the slot then holds one `rows x width` per partial,
/// [`split_qkv_rows`]).
pub(crate) fn fuse_split_sums(ops: &[Op], splits_of: &dyn Fn(usize) -> u32) -> Fusions {
    let mut f = Fusions::none(ops.len());
    for i in (0..ops.len()).filter(|&i| sums_downstream(ops, i)) {
        let s = splits_of(i);
        if s > 1 {
            f.ops[i].partial_sums = s;
            f.ops[i + 1].partial_sums = s;
        }
    }
    f
}

/// Whether op `i` is a linear op whose partial sums the op after it can add up: the residual add
/// and norm of its output (which nothing after reads), or the RoPE op of its Q/K/V rows.
fn sums_downstream(ops: &[Op], i: usize) -> bool {
    match (&ops[i], ops.get(i + 1)) {
        (Op::Linear { out, .. }, Some(Op::AddNorm { x, .. })) => x == out && !read_later(ops, i + 2, *out),
        (Op::Linear { out: Slot::Qkv, .. }, Some(Op::QkvRope { .. })) => true,
        _ => false,
    }
}

/// Partials the Q/K/V slot of a plan fused by [`fuse_split_sums`] holds: the most splits of a
/// Q/K/V projection whose RoPE op sums them (1: none).
pub(crate) fn split_qkv_rows(ops: &[Op], splits_of: &dyn Fn(usize) -> u32) -> u32 {
    (0..ops.len()).filter(|&i| matches!(ops[i], Op::Linear { out: Slot::Qkv, .. }) && sums_downstream(ops, i)).map(splits_of).max().unwrap_or(1).max(1)
}

/// Whether an op from `from` on reads `slot` before one writes it.
fn read_later(ops: &[Op], from: usize, slot: Slot) -> bool {
    for op in &ops[from..] {
        if op.reads().contains(&slot) {
            return true;
        }
        if op.writes().contains(&slot) {
            return false;
        }
    }
    false
}

/// boostr's activation for the graph's gate activation.
pub(crate) fn act_kind(a: GateAct) -> ActKind {
    match a {
        GateAct::Silu => ActKind::Silu,
        GateAct::GeluTanh => ActKind::GeluTanh,
    }
}

/// Which fusions [`fuse_decode`] may make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allow {
    /// RMSNorm into the consuming GEMV, when its input has at most this many features.
    pub(crate) norm_max_k: usize,
    /// The residual add into the producing GEMV.
    pub(crate) residual: bool,
    /// The GLU into the down projection.
    pub(crate) glu: bool,
    /// RoPE and the KV-cache write into the Q/K/V projection.
    pub(crate) rope: bool,
}

impl Allow {
    /// Every fusion.
    #[cfg(test)]
    pub(crate) const ALL: Allow = Allow { norm_max_k: usize::MAX, residual: true, glu: true, rope: true };
}

/// The decode fusions of `ops`; `k_of(i)`: the input features of linear op `i`, `None` where its
/// kernel takes no fused RMSNorm or GLU; `rope_ok(i)`: whether linear op `i`'s GEMV can take
/// the next op's RoPE and KV write.
pub(crate) fn fuse_decode(ops: &[Op], allow: Allow, k_of: &dyn Fn(usize) -> Option<usize>, rope_ok: &dyn Fn(usize) -> bool) -> Fusions {
    let mut f = Fusions::none(ops.len());
    // A norm of the residual stream into `o` (its op index and weight) not yet recorded.
    let mut pending: Option<(usize, Slot, String)> = None;
    for i in 0..ops.len() {
        if f.ops[i].skip {
            continue;
        }
        // A pending norm goes into this op, or is recorded as a norm now.
        if let Some((at, o, w)) = pending.take() {
            let takes = match &ops[i] {
                Op::Linear { x, .. } => *x == o,
                Op::LmHead { .. } => o == Slot::Normed,
                _ => false,
            };
            if takes && k_of(i).is_some_and(|k| k <= allow.norm_max_k) && !read_later(ops, i + 1, o) {
                f.ops[i].input = Input::Norm(w);
            } else {
                f.ops[at].skip = false;
                f.ops[at].materialize = true;
            }
        }
        match &ops[i] {
            Op::Norm { x: Slot::Hidden, w, out } => {
                f.ops[i].skip = true;
                pending = Some((i, *out, w.name.clone()));
            }
            Op::Linear { out: Slot::Qkv, .. } => {
                if let Some(Op::QkvRope { qk_norm: None, neox: false, .. }) = ops.get(i + 1)
                    && allow.rope
                    && rope_ok(i)
                {
                    f.ops[i].rope = Some(i + 1);
                    f.ops[i + 1].skip = true;
                }
            }
            Op::Linear { out, .. } => {
                if let Some(Op::AddNorm { x, w, out: o }) = ops.get(i + 1)
                    && allow.residual
                    && x == out
                    && !read_later(ops, i + 2, *out)
                    && !matches!(f.ops[i].input, Input::Norm(_))
                {
                    f.ops[i].accumulate = true;
                    f.ops[i + 1].skip = true;
                    pending = Some((i + 1, *o, w.name.clone()));
                }
            }
            Op::Glu { act, x, out } => {
                if let Some(Op::Linear { x: lx, .. }) = ops.get(i + 1)
                    && allow.glu
                    && k_of(i + 1).is_some()
                    && lx == out
                    && !read_later(ops, i + 2, *out)
                {
                    f.ops[i].skip = true;
                    f.ops[i + 1].input = Input::Glu(act_kind(*act), *x);
                }
            }
            _ => {}
        }
    }
    if let Some((at, ..)) = pending {
        f.ops[at].skip = false;
        f.ops[at].materialize = true;
    }
    f
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::engine::arch::{FileFacts, build};
    use crate::engine::config::{Arch, LayerKind, LayerRope, ModelConfig};

    pub(crate) fn config(arch: Arch, n_layers: usize) -> ModelConfig {
        ModelConfig {
            arch,
            n_layers,
            dim: 64,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 32,
            ffn_dim: 128,
            vocab: 100,
            norm_eps: 1e-5,
            rope_dim: 32,
            rope: vec![LayerRope { base: 10_000.0, linear_factor: 1.0 }; n_layers],
            window: vec![None; n_layers],
            context_length: 64,
            embed_scale: 1.0,
            gate_act: GateAct::Silu,
            qk_norm: arch == Arch::Gemma3,
            post_norms: arch == Arch::Gemma3,
            attn_scale: 1.0,
            final_softcap: None,
            attn_softcap: None,
            kinds: (0..n_layers).map(|l| if arch == Arch::Lfm2 && l % 3 != 2 { LayerKind::ShortConv } else { LayerKind::Attention }).collect(),
            conv_kernel: if arch == Arch::Lfm2 { 3 } else { 0 },
        }
    }

    #[test]
    fn every_slot_an_op_reads_was_written_before_and_is_allocated() {
        // The ops' reads and writes (`Op::reads`, `Op::writes`) are the data flow the fusions
        // and the slot allocation rely on: in every architecture each read follows a write,
        // every slot read or written is among `ModelGraph::slots`, and the embedding comes first.
        for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3, Arch::Lfm2] {
            let g = build(&config(arch, 3), &FileFacts::default());
            assert!(matches!(g.ops[0], Op::Embed { .. }), "{arch:?}");
            let slots = g.slots();
            let mut written = std::collections::HashSet::new();
            for (i, op) in g.ops.iter().enumerate() {
                for s in op.reads() {
                    assert!(written.contains(&s), "{arch:?} op {i} {op:?} reads {s:?} before any op writes it");
                }
                for s in op.reads().into_iter().chain(op.writes()) {
                    assert!(slots.contains(&s), "{arch:?}: {s:?} is not allocated");
                }
                written.extend(op.writes());
            }
            assert!(slots.contains(&Slot::Normed) && slots.contains(&Slot::Logits), "{arch:?}");
        }
    }

    fn recorded(f: &Fusions) -> usize {
        f.ops.iter().filter(|o| !o.skip).count()
    }

    #[test]
    fn a_llama_layer_is_six_ops_and_nothing_reads_a_skipped_slot() {
        let g = build(&config(Arch::Llama, 3), &FileFacts::default());
        let f = fuse_decode(&g.ops, Allow::ALL, &|_| Some(64), &|_| false);
        // Embedding, 6 per layer (the rope kept apart here), the LM head (with the final norm).
        assert_eq!(recorded(&f), 2 + 6 * 3);
        let acc = f.ops.iter().filter(|o| o.accumulate).count();
        let norm = f.ops.iter().filter(|o| matches!(o.input, Input::Norm(_))).count();
        let glu = f.ops.iter().filter(|o| matches!(o.input, Input::Glu(..))).count();
        assert_eq!((acc, norm, glu), (6, 7, 3));
        assert!(f.ops.iter().all(|o| !(o.accumulate && matches!(o.input, Input::Norm(_)))), "a GEMV may not read and add into the stream");
        // Without fusions every op is recorded as it is.
        let none = fuse_decode(&g.ops, Allow { norm_max_k: 0, residual: false, glu: false, rope: false }, &|_| Some(64), &|_| true);
        assert_eq!(recorded(&none), g.ops.len());
        assert!(none.ops.iter().all(|o| o.input == Input::Plain && !o.accumulate));
        // (Only the first norm, of the stream itself, is recorded as a norm of the stream.)
        assert_eq!(none.ops.iter().filter(|o| o.materialize).count(), 1);
        // Norms over wider inputs than allowed run on their own (the residual add stays fused).
        let wide = fuse_decode(&g.ops, Allow { norm_max_k: 32, ..Allow::ALL }, &|_| Some(64), &|_| false);
        assert_eq!(recorded(&wide), 2 + 8 * 3 + 1);
        assert!(wide.ops.iter().all(|o| !matches!(o.input, Input::Norm(_))));
    }

    #[test]
    fn rope_goes_into_the_qkv_gemv_where_the_plan_can_take_it() {
        let g = build(&config(Arch::Llama, 3), &FileFacts::default());
        let f = fuse_decode(&g.ops, Allow::ALL, &|_| Some(64), &|_| true);
        // Embedding, 5 per layer, the LM head.
        assert_eq!(recorded(&f), 2 + 5 * 3);
        for (i, fu) in f.ops.iter().enumerate() {
            if let Some(r) = fu.rope {
                assert!(matches!(g.ops[i], Op::Linear { out: Slot::Qkv, .. }) && matches!(g.ops[r], Op::QkvRope { .. }) && f.ops[r].skip);
            }
        }
        assert_eq!(f.ops.iter().filter(|o| o.rope.is_some()).count(), 3);
        // Not where the GEMV cannot, nor where a QK-norm or NeoX pairs need the rope kernel.
        assert!(fuse_decode(&g.ops, Allow::ALL, &|_| Some(64), &|_| false).ops.iter().all(|o| o.rope.is_none()));
        assert!(fuse_decode(&g.ops, Allow { rope: false, ..Allow::ALL }, &|_| Some(64), &|_| true).ops.iter().all(|o| o.rope.is_none()));
        let gemma = build(&config(Arch::Gemma3, 2), &FileFacts::default());
        assert!(fuse_decode(&gemma.ops, Allow::ALL, &|_| Some(64), &|_| true).ops.iter().all(|o| o.rope.is_none()));
    }

    #[test]
    fn split_sums_go_to_the_rope_and_the_residual_norms_after_their_gemms() {
        // Llama: Q/K/V into its RoPE op, the output and down projections into the residual add
        // and norm after them (the last layer's into the final norm), gate/up keeps its sum.
        let g = build(&config(Arch::Llama, 3), &FileFacts::default());
        let f = fuse_split_sums(&g.ops, &|_| 4);
        let marked: Vec<usize> = (0..g.ops.len()).filter(|&i| f.ops[i].partial_sums > 0).collect();
        assert_eq!(marked.len(), 2 * 3 * 3, "{marked:?}");
        for i in marked.iter().copied().filter(|&i| matches!(g.ops[i], Op::Linear { .. })) {
            assert_eq!(f.ops[i + 1].partial_sums, 4);
            assert!(
                matches!((&g.ops[i], &g.ops[i + 1]), (Op::Linear { out: Slot::Qkv, .. }, Op::QkvRope { .. }) | (Op::Linear { .. }, Op::AddNorm { .. })),
                "{:?}",
                g.ops[i]
            );
        }
        assert_eq!(split_qkv_rows(&g.ops, &|_| 4), 4);
        // No split, no fusion; a Q/K/V bias (Qwen2) keeps its projection's sum, and Gemma 3's
        // post-norms keep the output and down projections' (their deltas are normed first).
        assert!(fuse_split_sums(&g.ops, &|_| 1).ops.iter().all(|o| o.partial_sums == 0));
        assert_eq!(split_qkv_rows(&g.ops, &|_| 1), 1);
        let qwen2 = build(&config(Arch::Qwen2, 2), &FileFacts::default());
        let fq = fuse_split_sums(&qwen2.ops, &|_| 2);
        assert!(qwen2.ops.iter().zip(&fq.ops).all(|(op, fu)| fu.partial_sums == 0 || !matches!(op, Op::Linear { out: Slot::Qkv, .. } | Op::QkvRope { .. })));
        assert_eq!(split_qkv_rows(&qwen2.ops, &|_| 2), 1);
        let gemma = build(&config(Arch::Gemma3, 2), &FileFacts::default());
        let fg = fuse_split_sums(&gemma.ops, &|_| 2);
        assert!(gemma.ops.iter().zip(&fg.ops).all(|(op, fu)| fu.partial_sums == 0 || matches!(op, Op::Linear { out: Slot::Qkv, .. } | Op::QkvRope { .. })));
    }

    #[test]
    fn gemma_post_norms_keep_their_residual_adds() {
        let g = build(&config(Arch::Gemma3, 2), &FileFacts::default());
        let f = fuse_decode(&g.ops, Allow::ALL, &|_| Some(64), &|_| false);
        // The deltas are normed before they are added: no GEMV adds into the stream.
        assert!(f.ops.iter().all(|o| !o.accumulate));
        assert!(f.ops.iter().any(|o| matches!(o.input, Input::Glu(..))));
        for (op, fu) in g.ops.iter().zip(&f.ops) {
            if matches!(op, Op::AddNorm { .. }) {
                assert!(!fu.skip && !fu.materialize, "{op:?}");
            }
        }
    }
}

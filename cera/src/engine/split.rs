//! A model's layers split across devices (`--devices`, `--tensor-split`): which layers each
//! device runs ([`split_layers`]) and the part of the graph it runs ([`ModelGraph::stages`]).
//!
//! A stage is the ops of a contiguous range of layers, with the embedding on the first stage and
//! the final norm and the LM head on the last. Its cache indices (`QkvRope`/`Attention`
//! `layer`, `ShortConv` `state`) are renumbered from 0, so each device allocates only its own
//! layers' KV cache and conv rings, and its configuration lists only its layers. What crosses a
//! boundary is every slot the ops after it read before writing ([`live_slots`]): for every
//! architecture here the residual stream and the last block's output, whose add is the next
//! layer's first op (the `AddNorm` of its input norm).

use std::collections::HashMap;
use std::ops::Range;

use super::EngineError;
use super::graph::{ModelGraph, Op, Slot};

/// One device's part of a split model.
#[derive(Clone, Debug)]
pub struct Stage {
    /// The device's layers (of the whole model).
    pub layers: Range<usize>,
    /// The stage's graph: its ops, renumbered cache indices, its layers' configuration.
    pub graph: ModelGraph,
    /// The slots the previous stage hands over (empty on the first stage).
    pub live_in: Vec<Slot>,
    /// The slots handed to the next stage (empty on the last).
    pub live_out: Vec<Slot>,
}

/// The layers of each of `ratios.len()` devices for a model of `n_layers`, in proportion to
/// `ratios` (empty: the same share each for `devices` devices): device `i` ends at
/// `round(n_layers * (r_0 + .. + r_i) / sum)`. A ratio that is negative or not finite, a sum of
/// zero, or a device left with no layers is [`EngineError::Usage`].
pub fn split_layers(n_layers: usize, devices: usize, ratios: &[f64]) -> Result<Vec<Range<usize>>, EngineError> {
    if devices == 0 {
        return Err(EngineError::Usage("a split over no devices".into()));
    }
    let ratios: Vec<f64> = if ratios.is_empty() { vec![1.0; devices] } else { ratios.to_vec() };
    if ratios.len() != devices {
        return Err(EngineError::Usage(format!("--tensor-split gives {} ratios for {devices} devices", ratios.len())));
    }
    if let Some(r) = ratios.iter().find(|r| !r.is_finite() || **r < 0.0) {
        return Err(EngineError::Usage(format!("--tensor-split ratio {r}: a finite number of 0 or more")));
    }
    let sum: f64 = ratios.iter().sum();
    if sum <= 0.0 {
        return Err(EngineError::Usage("--tensor-split ratios that add up to 0".into()));
    }
    let mut out = Vec::with_capacity(devices);
    let (mut cum, mut start) = (0.0, 0);
    for (i, r) in ratios.iter().enumerate() {
        cum += r;
        let end = if i + 1 == devices { n_layers } else { ((n_layers as f64 * cum / sum).round() as usize).min(n_layers) };
        if end <= start {
            let shown: Vec<String> = ratios.iter().map(|r| r.to_string()).collect();
            return Err(EngineError::Usage(format!(
                "--tensor-split {} leaves device {i} with no layers (the model has {n_layers}; each device needs at least one)",
                shown.join(",")
            )));
        }
        out.push(start..end);
        start = end;
    }
    Ok(out)
}

/// Per op, the layer it belongs to: its own ([`Op::layer`]), else the previous op's (a GLU),
/// else 0 (the embedding). The final norm and the LM head take the last layer's.
fn op_layers(ops: &[Op]) -> Vec<usize> {
    let mut last = 0;
    ops.iter()
        .map(|op| {
            if let Some(l) = op.layer() {
                last = l;
            }
            last
        })
        .collect()
}

/// The slots whose next access from op `at` on is a read: what must hold its values when op
/// `at` runs, sorted.
pub fn live_slots(ops: &[Op], at: usize) -> Vec<Slot> {
    let (mut live, mut dead) = (Vec::new(), Vec::new());
    for op in &ops[at..] {
        for s in op.reads() {
            if !dead.contains(&s) && !live.contains(&s) {
                live.push(s);
            }
        }
        for s in op.writes() {
            if !live.contains(&s) && !dead.contains(&s) {
                dead.push(s);
            }
        }
    }
    live.sort();
    live
}

impl ModelGraph {
    /// The stages of this graph over `ranges` (consecutive, from layer 0 to the last, each
    /// non-empty: [`split_layers`] makes them).
    pub fn stages(&self, ranges: &[Range<usize>]) -> Result<Vec<Stage>, EngineError> {
        let n = self.cfg.n_layers;
        let contiguous = ranges.first().is_some_and(|r| r.start == 0)
            && ranges.last().is_some_and(|r| r.end == n)
            && ranges.windows(2).all(|w| w[0].end == w[1].start)
            && ranges.iter().all(|r| r.start < r.end);
        if !contiguous {
            return Err(EngineError::Usage(format!("layer ranges {ranges:?} do not cover the model's {n} layers in order")));
        }
        let layer_of = op_layers(&self.ops);
        // The first op of each stage after the first.
        let starts: Vec<usize> = ranges.iter().map(|r| layer_of.iter().position(|&l| l >= r.start).unwrap_or(self.ops.len())).collect();
        let mut out = Vec::with_capacity(ranges.len());
        for (i, r) in ranges.iter().enumerate() {
            let from = if i == 0 { 0 } else { starts[i] };
            let to = starts.get(i + 1).copied().unwrap_or(self.ops.len());
            let graph = self.stage_graph(r.clone(), &self.ops[from..to]);
            let live_in = if i == 0 { Vec::new() } else { live_slots(&self.ops, from) };
            let live_out = if i + 1 == ranges.len() { Vec::new() } else { live_slots(&self.ops, to) };
            let allocated = graph.slots();
            if let Some(s) = live_in.iter().chain(&live_out).find(|s| !allocated.contains(s)) {
                return Err(EngineError::Unsupported {
                    what: format!("a split at layer {}: the stage of layers {r:?} hands on {s:?} without using it", if i == 0 { r.end } else { r.start }),
                });
            }
            out.push(Stage { layers: r.clone(), graph, live_in, live_out });
        }
        Ok(out)
    }

    /// The graph of `ops` (the ops of `layers`), with cache and conv-state indices from 0 and the
    /// configuration of those layers.
    fn stage_graph(&self, layers: Range<usize>, ops: &[Op]) -> ModelGraph {
        let mut cfg = self.cfg.clone();
        cfg.n_layers = layers.len();
        cfg.rope = self.cfg.rope[layers.clone()].to_vec();
        cfg.window = self.cfg.window[layers.clone()].to_vec();
        cfg.kinds = self.cfg.kinds[layers].to_vec();
        let (mut caches, mut states) = (HashMap::new(), HashMap::new());
        let ops = ops
            .iter()
            .map(|op| {
                let mut op = op.clone();
                match &mut op {
                    Op::QkvRope { layer, .. } | Op::Attention { layer, .. } => {
                        let next = caches.len();
                        *layer = *caches.entry(*layer).or_insert(next);
                    }
                    Op::ShortConv { state, .. } => {
                        let next = states.len();
                        *state = *states.entry(*state).or_insert(next);
                    }
                    _ => {}
                }
                op
            })
            .collect();
        ModelGraph { cfg, ops }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::arch::{FileFacts, build};
    use crate::engine::config::Arch;
    use crate::engine::gpu::test_config;

    #[test]
    fn layers_split_in_proportion_and_a_device_without_layers_is_an_error() {
        assert_eq!(split_layers(30, 2, &[]).unwrap(), vec![0..15, 15..30]);
        assert_eq!(split_layers(30, 2, &[1.0, 3.0]).unwrap(), vec![0..8, 8..30]);
        assert_eq!(split_layers(3, 2, &[1.0, 3.0]).unwrap(), vec![0..1, 1..3]);
        assert_eq!(split_layers(80, 3, &[24.0, 24.0, 48.0]).unwrap(), vec![0..20, 20..40, 40..80]);
        assert_eq!(split_layers(5, 1, &[]).unwrap(), vec![0..5]);
        for (n, d, r, what) in [
            (30, 2, vec![0.0, 1.0], "leaves device 0 with no layers"),
            (30, 2, vec![1.0, 0.0], "leaves device 1 with no layers"),
            (2, 3, vec![], "leaves device"),
            (30, 2, vec![1.0], "2 devices"),
            (30, 2, vec![-1.0, 2.0], "0 or more"),
            (30, 2, vec![f64::NAN, 2.0], "0 or more"),
            (30, 2, vec![0.0, 0.0], "add up to 0"),
            (30, 0, vec![], "no devices"),
        ] {
            let e = split_layers(n, d, &r).unwrap_err();
            assert!(matches!(e, EngineError::Usage(_)) && e.to_string().contains(what), "{n} {d} {r:?}: {e}");
        }
    }

    #[test]
    fn stages_hold_every_op_once_with_their_own_cache_indices() {
        for arch in [Arch::Llama, Arch::Qwen3, Arch::Gemma3, Arch::Lfm2] {
            let g = build(&test_config(arch, 6), &FileFacts::default());
            for ranges in [vec![0..3, 3..6], vec![0..1, 1..6], vec![0..2, 2..4, 4..6]] {
                let stages = g.stages(&ranges).unwrap();
                // Every op once, in order, and each stage's weights are of its layers.
                let all: Vec<&Op> = stages.iter().flat_map(|s| &s.graph.ops).collect();
                assert_eq!(all.len(), g.ops.len(), "{arch:?} {ranges:?}");
                for (s, r) in stages.iter().zip(&ranges) {
                    assert_eq!(s.graph.cfg.n_layers, r.len());
                    for op in &s.graph.ops {
                        if let Some(l) = op.layer().filter(|_| !matches!(op, Op::QkvRope { .. } | Op::Attention { .. })) {
                            assert!(r.contains(&l), "{arch:?} {ranges:?}: {op:?} in the stage of {r:?}");
                        }
                    }
                    // Cache and conv indices from 0, within the stage's own counts.
                    let caches: Vec<usize> =
                        s.graph.ops.iter().filter_map(|op| if let Op::Attention { layer, .. } = op { Some(*layer) } else { None }).collect();
                    assert_eq!(caches, (0..s.graph.cfg.kv_layers()).collect::<Vec<_>>(), "{arch:?} {ranges:?}");
                    let convs: Vec<usize> =
                        s.graph.ops.iter().filter_map(|op| if let Op::ShortConv { state, .. } = op { Some(*state) } else { None }).collect();
                    assert_eq!(convs, (0..s.graph.cfg.conv_layers()).collect::<Vec<_>>(), "{arch:?} {ranges:?}");
                }
                assert!(matches!(stages[0].graph.ops[0], Op::Embed { .. }));
                assert!(matches!(stages.last().unwrap().graph.ops.last(), Some(Op::LmHead { .. })));
                // What crosses a boundary: the residual stream and the block output not yet added.
                for w in stages.windows(2) {
                    assert_eq!(w[0].live_out, w[1].live_in);
                    assert!(w[1].live_in.contains(&Slot::Hidden), "{arch:?}: {:?}", w[1].live_in);
                    // Each stage reads nothing before writing it but what it is handed.
                    let mut have: Vec<Slot> = w[1].live_in.clone();
                    for op in &w[1].graph.ops {
                        assert!(op.reads().iter().all(|s| have.contains(s)), "{arch:?} {ranges:?}: {op:?} reads {:?} with {have:?}", op.reads());
                        have.extend(op.writes());
                    }
                }
            }
        }
    }
}

//! The decode step with each layer as one chain (`numr::gpu::chain`, `Chains::On`) gives the
//! logits of the same step dispatched op by op (`Chains::Off`), bit for bit, on SmolLM2 over several
//! steps (the chains' counters reset themselves between steps), and records one dispatch per layer.
//! On a CPU adapter (lavapipe in CI) numr refuses chains, and `Chains::On` must fall back to the
//! plain plan with the same logits.

use cera::engine::arch::{FileFacts, build};
use cera::engine::gpu::GpuBackend;
use cera::engine::{Backend, Chains, KvType, ModelConfig, StateOpts, StepInput, StepOutput, Want};
use cera::fetch::{ModelId, ensure_model};
use cera::gguf::GgufFile;
use numr::testing::test_gpu;
use std::sync::Arc;

fn logits(out: StepOutput) -> Vec<f32> {
    match out {
        StepOutput::Logits(l) => l,
        other => panic!("expected logits, got {other:?}"),
    }
}

#[test]
fn chained_decode_gives_the_unchained_logits() {
    let Some(ctx) = test_gpu() else { return };
    let chained = numr::gpu::chains_run_on(ctx.capabilities());
    if !chained {
        numr::testing::skip_path(&ctx, "SmolLM2's decode as one chain per layer", "the adapter does not run chains; Chains::On falls back to plain dispatches");
    }
    let file = GgufFile::open(ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2")).unwrap();
    let rows = file.tensor("token_embd.weight").and_then(|t| t.dims.get(1)).map(|&r| r as usize);
    let cfg = ModelConfig::from_hparams(&file.hparams().unwrap(), rows).unwrap();
    let g = build(&cfg, &FileFacts { has_output: file.tensor("output.weight").is_some(), ..Default::default() });
    let prompt = [1u32, 504, 3458, 282, 4649, 314];
    let forced = [42u32, 1000, 7, 9, 11];
    let mut runs = Vec::new();
    for chains in [Chains::Off, Chains::On] {
        let backend = GpuBackend::load(Arc::new(ctx.clone()), &g, &file, None).unwrap().with_chains(chains);
        let mut state = backend.new_state(&StateOpts { n_ctx: 64, ubatch: 16, kv: KvType::F16 }).unwrap();
        state.step(StepInput::Tokens(&prompt), 0, Want::Nothing).unwrap();
        let mut steps = Vec::new();
        for (i, id) in forced.iter().enumerate() {
            steps.push(logits(state.step(StepInput::Tokens(&[*id]), prompt.len() + i, Want::Logits).unwrap()));
            let c = state.last_step_counters();
            if chains == Chains::On && chained {
                // The embedding and one chain per layer (the last one ends with the LM head).
                assert_eq!(c.dispatches, 1 + g.cfg.n_layers, "{c:?}");
            } else {
                assert!(c.dispatches > 3 * g.cfg.n_layers, "{c:?}");
            }
        }
        runs.push(steps);
    }
    // The chain runs each stage's own code over the same buffers in the same order: the same
    // bits, not merely close ones.
    for (i, (off, on)) in runs[0].iter().zip(&runs[1]).enumerate() {
        let differ = off.iter().zip(on).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "step {i}: {differ} chained logits differ from the unchained ones");
    }
}

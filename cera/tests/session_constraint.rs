//! A constrained generation in a session (`GenerateOpts::constraint`) on the real
//! SmolLM2-135M-Instruct Q4_1, on the CPU and on the GPU (lavapipe in CI): each step's
//! allowed-id mask goes to the executor (`BackendState::set_step_bits`; on the GPU boostr's
//! `MaskBitsPlan` on the logits row), which returns an argmax or top-k candidates instead of the
//! whole row. The ids equal those of the same generation with `top_logprobs` (whole rows read
//! back and masked on the host), greedy and seeded sampling alike; every id is allowed, and the
//! constraint ends the generation.

mod batch_support;

use cera::engine::{DeviceChoice, Engine, FinishReason, GenerateOpts, LoadOptions, TokenEvent};
use cera::fetch::{ModelId, ensure_model};

fn check(device: DeviceChoice, len: usize) {
    if device == DeviceChoice::Gpu && numr::testing::test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let e = Engine::load(path, &LoadOptions { device, n_ctx: Some(256), ..Default::default() }, None).unwrap();
    let p = batch_support::prompts(&e, 1).remove(0);
    let run = |o: &GenerateOpts| {
        let mut s = e.session().unwrap();
        s.append_tokens(&p).unwrap();
        s.generate(o, &mut |_: &TokenEvent| {}).unwrap()
    };
    for (phase, base) in [(0, GenerateOpts::greedy(len + 3)), (1, GenerateOpts::default().with_seed(11).with_temperature(0.9))] {
        let o = GenerateOpts { constraint: Some(batch_support::thirds(phase, len)), max_tokens: len + 3, ..base };
        let got = run(&o);
        let want = run(&GenerateOpts { top_logprobs: 1, ..o.clone() });
        assert_eq!(got.ids, want.ids, "{device:?} phase {phase}: masked on the executor vs on the host");
        assert_eq!((got.ids.len(), got.finish), (len, FinishReason::Stop), "{device:?} phase {phase}");
        for (j, &id) in got.ids.iter().enumerate() {
            assert_eq!(id % 3, (j as u32 + phase) % 3, "{device:?} phase {phase} token {j}");
        }
    }
}

#[test]
fn a_constraint_masks_on_the_cpu_executor() {
    check(DeviceChoice::Cpu, 8);
}

#[test]
fn a_constraint_masks_on_the_gpu() {
    check(DeviceChoice::Gpu, 4);
}

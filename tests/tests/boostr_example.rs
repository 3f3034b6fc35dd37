//! `boostr/examples/llama_greedy.rs` (a greedy decode on boostr's plans and numr alone, no cera)
//! on the real SmolLM2 file gives the same 8 ids as cera's engine on the CPU's exact path (f32
//! activations), from the prompt of the `raw_short` golden case.

#[allow(dead_code)]
#[path = "../../boostr/examples/llama_greedy.rs"]
mod example;

use cera::engine::{DecodeGemv, DeviceChoice, Engine, GenerateOpts, LoadOptions, TokenEvent};
use cera::fetch::{ModelId, ensure_model};

#[test]
fn the_boostr_example_decodes_what_cera_decodes() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let prompt = [504u32, 3575, 282, 4649, 314];
    let got = example::greedy(path.to_str().unwrap(), &prompt, 8).unwrap();
    // The CPU's exact path (f32 activations), as the example's f32 GEMVs.
    let o = LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(64), decode_gemv: DecodeGemv::F32, ..Default::default() };
    let engine = Engine::load(&path, &o, None).unwrap();
    let mut s = engine.session().unwrap();
    s.append_tokens(&prompt).unwrap();
    let g = s.generate(&GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(8) }, &mut |_: &TokenEvent| {}).unwrap();
    println!("boostr example: {got:?}; cera: {:?}", g.ids);
    assert_eq!(got, g.ids);
}

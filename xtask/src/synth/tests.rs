//! End to end on the `tiny` preset: every arch × qtype is written, read back with cera's GGUF
//! reader (types by the rule, weights finite and of the target RMS through boostr's CPU
//! decoders), and loaded by cera's engine on the CPU for 4 greedy tokens.

use std::path::PathBuf;

use cera::engine::{DeviceChoice, Engine, GenerateOpts, LoadOptions, TokenEvent};
use cera::gguf::{GgmlType, GgufFile};

use super::tensors::expected_type;
use super::*;

/// A temporary file, removed on drop.
struct Temp(PathBuf);

impl Temp {
    fn new(tag: &str) -> Temp {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Temp(std::env::temp_dir().join(format!("xtask-synth-{}-{n}-{tag}.gguf", std::process::id())))
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn opts(arch: Arch, qtype: QType, seed: u64) -> SynthOptions {
    SynthOptions { arch, preset: Preset::by_name("tiny").unwrap(), qtype, seed, threads: Some(2) }
}

fn check_weights(f: &GgufFile, o: &SynthOptions) {
    let p = &o.preset;
    for t in f.tensors() {
        let want = expected_type(o.qtype, &t.name, p.tied, p.n_layers, t.dims[0]);
        assert_eq!(t.ty, want, "{} {}: {}", o.arch, o.qtype, t.name);
    }
    let names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight", "blk.0.attn_norm.weight"];
    let conv = ["blk.0.shortconv.in_proj.weight", "blk.0.shortconv.out_proj.weight"];
    let names: Vec<&str> = names.iter().chain(if o.arch == Arch::Lfm2 { &conv[..] } else { &[] }).copied().filter(|n| f.tensor(n).is_some()).collect();
    assert!(names.len() >= 5, "{} {}: {names:?}", o.arch, o.qtype);
    for name in names {
        let t = f.tensor(name).unwrap();
        let v = boostr::formats::dequantize(t.ty, f.tensor_data(name).unwrap(), t.n_elements as usize).unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
        let rms = (v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / v.len() as f64).sqrt();
        let want = if t.ty == GgmlType::F32 { 1.0 } else { 1.0 / (t.dims[0] as f64).sqrt() };
        assert!(rms > want / 2.0 && rms < want * 2.0, "{} {}: {name} ({}) RMS {rms}, want {want}", o.arch, o.qtype, t.ty);
    }
}

fn generate(path: &std::path::Path, o: &SynthOptions) {
    let load = LoadOptions { device: DeviceChoice::Cpu, n_ctx: Some(64), threads: Some(2), ..Default::default() };
    let e = Engine::load(path, &load, None).unwrap_or_else(|err| panic!("{} {}: {err}", o.arch, o.qtype));
    assert_eq!((e.config().n_layers, e.config().dim, e.config().vocab), (2, 256, 1024));
    let mut s = e.session().unwrap();
    s.append_text("Hello, world").unwrap();
    let g = s.generate(&GenerateOpts { ignore_eos: true, top_logprobs: 2, ..GenerateOpts::greedy(4) }, &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(g.ids.len(), 4, "{} {}", o.arch, o.qtype);
    assert!(g.ids.iter().all(|&i| i < 1024));
    assert!(g.top_logprobs.iter().flatten().all(|&(i, lp)| i < 1024 && lp.is_finite() && lp <= 0.0), "{:?}", g.top_logprobs);
}

#[test]
fn every_arch_and_qtype_loads_and_generates() {
    // Every architecture the engine runs (cera's own list: a new one must be synthesizable).
    for arch in Arch::ALL {
        for qtype in QType::ALL {
            let o = opts(arch, qtype, 0);
            let tmp = Temp::new(&format!("{arch}-{qtype}"));
            let w = synth(&o, &tmp.0).unwrap();
            assert_eq!(w.bytes, std::fs::metadata(&tmp.0).unwrap().len());
            let f = GgufFile::open(&tmp.0).unwrap();
            assert_eq!(f.architecture().unwrap(), arch.name());
            assert_eq!(f.tensors().len(), w.tensors);
            check_weights(&f, &o);
            drop(f);
            generate(&tmp.0, &o);
        }
    }
}

#[test]
fn the_seed_decides_the_bytes() {
    let write = |seed: u64, threads: usize| {
        let tmp = Temp::new(&format!("seed{seed}-{threads}"));
        synth(&SynthOptions { threads: Some(threads), ..opts(Arch::Llama, QType::Q4K, seed) }, &tmp.0).unwrap();
        std::fs::read(&tmp.0).unwrap()
    };
    let a = write(1, 1);
    assert!(a == write(1, 3), "same seed, other thread count: same bytes");
    assert!(a != write(2, 1), "another seed: other bytes");
    assert_eq!(a.len(), write(2, 1).len());
}

/// LFM2's conv rings across every way a sequence is cut, on the CPU and the GPU: chunked
/// prefill (ubatch 5) and pipelined decoding give the ids of one pass one token at a time; a
/// second turn that reuses the session's prefix (after the pipelined overrun token) equals a
/// fresh session given the same tokens; and truncating further back than the ring reaches runs
/// the sequence again from 0 and still gives the same ids.
#[test]
fn lfm2_conv_state_across_chunks_pipelining_turns_and_truncation() {
    let o = opts(Arch::Lfm2, QType::Q8_0, 3);
    let tmp = Temp::new("lfm2-state");
    synth(&o, &tmp.0).unwrap();
    let mut devices = vec![DeviceChoice::Cpu];
    if numr::testing::test_gpu().is_some() {
        devices.push(DeviceChoice::Gpu);
    }
    let greedy = |n: usize, pipeline: bool| GenerateOpts { ignore_eos: true, pipeline, ..GenerateOpts::greedy(n) };
    for device in devices {
        let load = |ubatch: usize| LoadOptions { device, n_ctx: Some(256), ubatch, threads: Some(2), ..Default::default() };
        let (one, chunked) = (Engine::load(&tmp.0, &load(512), None).unwrap(), Engine::load(&tmp.0, &load(5), None).unwrap());
        let prompt = "The quick brown fox jumps over the lazy dog, and then it runs away.";
        let run = |e: &Engine, pipeline: bool| {
            let mut s = e.session().unwrap();
            s.append_text(prompt).unwrap();
            s.generate(&greedy(12, pipeline), &mut |_: &TokenEvent| {}).unwrap().ids
        };
        let want = run(&one, false);
        assert_eq!(run(&chunked, false), want, "{device:?}: chunked prefill");
        assert_eq!(run(&one, true), want, "{device:?}: pipelined decoding");
        // Two turns in one session, against a fresh session of the same tokens.
        let mut s = chunked.session().unwrap();
        s.append_text(prompt).unwrap();
        s.generate(&greedy(7, true), &mut |_: &TokenEvent| {}).unwrap();
        s.append_text(" Next,").unwrap();
        let (before, cached) = (s.tokens().to_vec(), s.cached_tokens());
        let second = s.generate(&greedy(6, true), &mut |_: &TokenEvent| {}).unwrap();
        assert!(cached > 40 && second.reused == cached, "{device:?}: the second turn reused {} of {cached} cached tokens", second.reused);
        let mut fresh = chunked.session().unwrap();
        fresh.append_tokens(&before).unwrap();
        assert_eq!(fresh.generate(&greedy(6, false), &mut |_: &TokenEvent| {}).unwrap().ids, second.ids, "{device:?}: the second turn");
        // Back past the ring's reach: the sequence runs again from 0.
        s.truncate(20);
        let again = s.generate(&greedy(6, false), &mut |_: &TokenEvent| {}).unwrap();
        assert_eq!(again.reused, 0, "{device:?}: truncated 20 of {} positions back", before.len() + 6);
        let mut fresh = chunked.session().unwrap();
        fresh.append_tokens(&before[..20]).unwrap();
        assert_eq!(fresh.generate(&greedy(6, false), &mut |_: &TokenEvent| {}).unwrap().ids, again.ids, "{device:?}: after truncation");
    }
}

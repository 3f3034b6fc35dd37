//! The batcher on the GPU executor (lavapipe in CI) with the real SmolLM2-135M-Instruct Q4_1:
//! sequences in shared steps give exactly the ids each gives alone (greedy and seeded, joining
//! at different steps), greedy matches the GPU session's continuation, and a batched step is one
//! submit whose dispatch count does not grow with the sequences; with a q8_0 cache, the
//! session's ids. lavapipe runs a SmolLM2 step in
//! about a second on CI's two cores, so the counts here are small; the CPU path
//! (`batch_cpu.rs`) runs 16 sequences, prefix sharing, cancellation and preemption.

mod batch_support;

use batch_support::{alone, prompts, run_staggered};
use boostr::paged::{BlockAllocator, BlockTable};
use cera::engine::{BatchEntry, BatchOpts, BatcherOpts, DecodeGemv, DeviceChoice, Engine, GenerateOpts, KvType, LoadOptions, TokenEvent, Want};
use cera::fetch::{ModelId, ensure_model};

fn engine() -> Option<Engine> {
    engine_kv(KvType::F16)
}

fn engine_kv(kv: KvType) -> Option<Engine> {
    numr::testing::test_gpu()?;
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let o = LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(512), kv, ..Default::default() };
    Some(Engine::load(path, &o, None).expect("load SmolLM2 on the GPU"))
}

#[test]
fn sequences_equal_each_alone_and_the_session() {
    let Some(e) = engine() else { return };
    let ps = prompts(&e, 3);
    let opts = [GenerateOpts::greedy(5), GenerateOpts::default().with_seed(3), GenerateOpts::greedy(4)];
    let opts: Vec<GenerateOpts> = opts.into_iter().map(|o| GenerateOpts { max_tokens: o.max_tokens.min(5), ..o }).collect();
    let b = e.batcher(BatcherOpts { max_seqs: 4, kv_budget: Some(64 << 20), ..BatcherOpts::default() }).unwrap();
    let got = run_staggered(&b, &ps, &opts);
    for i in 0..3 {
        assert_eq!(got[i].ids, alone(&e, &ps[i], &opts[i]).ids, "sequence {i}");
    }
    // Greedy: the session's decode kernels (GEMV) give the same continuation here.
    let mut s = e.session().unwrap();
    s.append_tokens(&ps[0]).unwrap();
    let want = s.generate(&opts[0], &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(got[0].ids, want.ids);
}

/// The int8 decode path (`--decode-gemv int8`, the default for models of hidden size 2048 or
/// more): decode rows run in the decode lane through the integer-dot rows GEMV, whose quantizer
/// takes the RMSNorm or the GLU and whose output takes the residual add; each sequence gives
/// the ids it gives alone.
#[test]
fn int8_decode_rows_give_each_sequence_its_ids_alone() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let o = LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(512), decode_gemv: DecodeGemv::Int8, ..Default::default() };
    let e = Engine::load(path, &o, None).unwrap();
    let ps = prompts(&e, 2);
    let opts = vec![GenerateOpts::greedy(4), GenerateOpts::default().with_seed(9)];
    let opts: Vec<GenerateOpts> = opts.into_iter().map(|o| GenerateOpts { max_tokens: 4, ..o }).collect();
    let b = e.batcher(BatcherOpts { max_seqs: 2, kv_budget: Some(32 << 20), ..BatcherOpts::default() }).unwrap();
    let got = run_staggered(&b, &ps, &opts);
    for i in 0..2 {
        assert_eq!(got[i].ids, alone(&e, &ps[i], &opts[i]).ids, "sequence {i}");
    }
    let mut s = e.session().unwrap();
    s.append_tokens(&ps[0]).unwrap();
    let want = s.generate(&opts[0], &mut |_: &TokenEvent| {}).unwrap();
    assert_eq!(got[0].ids, want.ids, "the int8 session's greedy continuation");
    // `--tune batch_lanes=off`: every row in one unfused plan, the same greedy ids here.
    let mut tuning = cera::engine::GpuTuning::default();
    tuning.set("batch_lanes", "off").unwrap();
    let one_plan = Engine::load(ensure_model(ModelId::SmolLM2_135M).unwrap(), &LoadOptions { tuning, ..o }, None).unwrap();
    let b = one_plan.batcher(BatcherOpts { max_seqs: 2, kv_budget: Some(32 << 20), ..BatcherOpts::default() }).unwrap();
    assert_eq!(b.generate(ps[0].clone(), &opts[0]).unwrap().ids, got[0].ids);
}

/// `gemm_f16_input=1`: a batched plan's GEMMs read their rows rounded to f16 (on lavapipe's
/// tiled GEMM, where the default leaves them f32), the rounding skipped with the GEMM in steps
/// of decode rows only; with `batch_gemv_max_seqs=0` as well, every row (decode rows too) goes
/// through the GEMM on f16 input. Either way each sequence gives the ids it gives alone under
/// the same setting.
#[test]
fn f16_gemm_input_keeps_each_sequence_as_alone() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    for extra in [None, Some(("batch_gemv_max_seqs", "0"))] {
        let mut tuning = cera::engine::GpuTuning::default();
        tuning.set("gemm_f16_input", "1").unwrap();
        if let Some((k, v)) = extra {
            tuning.set(k, v).unwrap();
        }
        let o = LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(512), tuning, ..Default::default() };
        let e = Engine::load(&path, &o, None).unwrap();
        let ps = prompts(&e, 2);
        let opts = vec![GenerateOpts::greedy(3), GenerateOpts::default().with_seed(5)];
        let opts: Vec<GenerateOpts> = opts.into_iter().map(|o| GenerateOpts { max_tokens: 3, ..o }).collect();
        let b = e.batcher(BatcherOpts { max_seqs: 2, kv_budget: Some(32 << 20), ..BatcherOpts::default() }).unwrap();
        let got = run_staggered(&b, &ps, &opts);
        for i in 0..2 {
            assert_eq!(got[i].ids, alone(&e, &ps[i], &opts[i]).ids, "sequence {i}, {extra:?}");
        }
    }
}

/// `batch_gemv_max_seqs=0` with `batch_split_k=2`: every row (decode rows too) goes through
/// the GEMM, split over K and summed (lavapipe's tiled GEMM; on the H200 the coopmat one, in
/// whichever row band the step's rows pick), and each row's attention split by its own length
/// (`batch_attn_split_keys=8`); each sequence gives the ids it gives alone under the same
/// settings.
#[test]
fn every_row_through_the_split_gemm_keeps_each_sequence_as_alone() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    let path = ensure_model(ModelId::SmolLM2_135M).expect("fetch SmolLM2");
    let mut tuning = cera::engine::GpuTuning::default();
    tuning.set("batch_gemv_max_seqs", "0").unwrap();
    tuning.set("batch_split_k", "2").unwrap();
    // Each row's attention in chunks of 8 of its own keys: 1 to 3 chunks for these prompts.
    tuning.set("batch_attn_split_keys", "8").unwrap();
    let o = LoadOptions { device: DeviceChoice::Gpu, n_ctx: Some(512), tuning, ..Default::default() };
    let e = Engine::load(&path, &o, None).unwrap();
    let ps = prompts(&e, 3);
    let opts = [GenerateOpts::greedy(4), GenerateOpts::default().with_seed(11), GenerateOpts::greedy(3)];
    let opts: Vec<GenerateOpts> = opts.into_iter().map(|o| GenerateOpts { max_tokens: o.max_tokens.min(4), ..o }).collect();
    let b = e.batcher(BatcherOpts { max_seqs: 3, kv_budget: Some(32 << 20), ..BatcherOpts::default() }).unwrap();
    let got = run_staggered(&b, &ps, &opts);
    for i in 0..3 {
        assert_eq!(got[i].ids, alone(&e, &ps[i], &opts[i]).ids, "sequence {i}");
    }
    // The split's sums: a dispatch of their own after gate/up; the RoPE op after Q/K/V and the
    // residual add and norm after the output and down projections add those partials up
    // themselves.
    let dispatches = |e: &Engine| {
        let o = BatchOpts { kv: KvType::F16, block_len: 16, n_blocks: 8, max_tokens: 16, max_seqs: 2, n_ctx: 64 };
        let mut st = e.backend().new_batch(&o).unwrap();
        let mut table = BlockTable::new();
        table.grow(&mut BlockAllocator::new(o.n_blocks), 16, 3).unwrap();
        let toks = [1, 2, 3];
        st.step(&[BatchEntry { slot: 0, tokens: &toks, pos: 0, table: &table, want: Want::Argmax, decode: false, out_rows: 1, mask: None }]).unwrap();
        st.last_step_counters().dispatches
    };
    let mut tuning = o.tuning.clone();
    tuning.set("batch_split_k", "1").unwrap();
    let unsplit = Engine::load(&path, &LoadOptions { tuning, ..o.clone() }, None).unwrap();
    let (split, plain, layers) = (dispatches(&e), dispatches(&unsplit), e.config().n_layers);
    assert_eq!(split, plain + layers, "{split} dispatches split, {plain} not, {layers} layers");
}

/// A q8_0 KV cache: the paged q8_0 blocks give each sequence the greedy ids of the session's
/// contiguous q8_0 cache.
#[test]
fn a_q8_0_cache_gives_the_session_ids() {
    let Some(e) = engine_kv(KvType::Q8_0) else { return };
    let ps = prompts(&e, 2);
    let opts = vec![GenerateOpts::greedy(4); 2];
    let b = e.batcher(BatcherOpts { max_seqs: 2, kv_budget: Some(32 << 20), ..BatcherOpts::default() }).unwrap();
    let got = run_staggered(&b, &ps, &opts);
    for (i, (g, p)) in got.iter().zip(&ps).enumerate() {
        let mut s = e.session().unwrap();
        s.append_tokens(p).unwrap();
        let want = s.generate(&opts[i], &mut |_: &TokenEvent| {}).unwrap();
        assert_eq!(g.ids, want.ids, "sequence {i}");
    }
}

#[test]
fn an_entry_past_its_blocks_is_a_typed_error() {
    let Some(e) = engine() else { return };
    batch_support::an_entry_past_its_blocks_is_a_typed_error(&e);
}

#[test]
fn a_batched_step_is_a_few_submits_of_a_fixed_dispatch_count() {
    let Some(e) = engine() else { return };
    let o = BatchOpts { kv: KvType::F16, block_len: 16, n_blocks: 64, max_tokens: 64, max_seqs: 8, n_ctx: 128 };
    let mut st = e.backend().new_batch(&o).unwrap();
    let mut alloc = BlockAllocator::new(o.n_blocks);
    let tables: Vec<BlockTable> = (0..8)
        .map(|_| {
            let mut t = BlockTable::new();
            t.grow(&mut alloc, 16, 8).unwrap();
            t
        })
        .collect();
    let toks: Vec<Vec<u32>> = (0..8u32).map(|i| vec![1 + i, 2 + i, 3 + i]).collect();
    let entries: Vec<BatchEntry> = (0..8)
        .map(|i| BatchEntry { slot: i, tokens: &toks[i], pos: 0, table: &tables[i], want: Want::Argmax, decode: false, out_rows: 1, mask: None })
        .collect();
    st.step(&entries[..1]).unwrap();
    let one = st.last_step_counters();
    st.step(&entries).unwrap();
    let eight = st.last_step_counters();
    // The plan's first 16, 32, 64, ... dispatches go out early while the host encodes the rest.
    assert_eq!(one.submits, eight.submits);
    assert!(one.submits >= 2 && one.submits <= 1 + (one.dispatches / 16 + 1).ilog2() as usize, "{one:?}");
    assert_eq!(one.dispatches, eight.dispatches, "dispatches do not grow with the sequences");
    // Decode rows of all eight (the head reads the rows in place: no copies, one pass fewer breaks).
    let next: Vec<Vec<u32>> = (0..8u32).map(|i| vec![4 + i]).collect();
    let entries: Vec<BatchEntry> = (0..8)
        .map(|i| BatchEntry { slot: i, tokens: &next[i], pos: 3, table: &tables[i], want: Want::Argmax, decode: true, out_rows: 1, mask: None })
        .collect();
    st.step(&entries).unwrap();
    let decode = st.last_step_counters();
    // Decode rows run in their own lane, fused as a verification plan (the norms and the GLU in
    // the GEMVs' prologues, the residual adds in the GEMVs): at least 3 dispatches a layer fewer
    // than the prompt rows' plan, and as many for one row as for eight.
    let layers = e.config().n_layers;
    assert!(decode.dispatches + 3 * layers <= one.dispatches, "decode rows {decode:?}, a prompt step {one:?}");
    assert!(decode.submits >= 2 && decode.submits <= 1 + (decode.dispatches / 16 + 1).ilog2() as usize, "{decode:?}");
    st.step(&entries[..1]).unwrap();
    assert_eq!(st.last_step_counters().dispatches, decode.dispatches, "decode dispatches do not grow with the sequences");
    // A step of both: both lanes.
    let mixed = [entries[0], BatchEntry { slot: 1, tokens: &toks[1], pos: 0, table: &tables[1], want: Want::Argmax, decode: false, out_rows: 1, mask: None }];
    st.step(&mixed).unwrap();
    let both = st.last_step_counters();
    assert!(both.dispatches >= decode.dispatches + one.dispatches - 8, "{both:?}");
    println!("SmolLM2 batched step: {} dispatches (prompt rows), {} (decode rows), {} (both)", one.dispatches, decode.dispatches, both.dispatches);
}

/// A constraint's allowed-id mask applied on the GPU before argmax / top-k (`MaskBitsPlan`)
/// gives the ids of the host masking whole rows.
#[test]
fn constrained_requests_mask_on_the_gpu() {
    let Some(e) = engine() else { return };
    batch_support::constrained_requests_mask_on_the_device(&e, 4);
}

/// The prefix cache's copy on write on the GPU (`PagedKvCache::copy_block`): a prompt that parts
/// from a cached one inside a block takes the shared blocks and a copy of the parted block's
/// start, computes only its own tokens, and gives the ids it gives alone.
#[test]
fn a_prompt_parting_inside_a_block_copies_its_start() {
    let Some(e) = engine() else { return };
    let shared = batch_support::long_prefix(&e, 40);
    let mut a = shared.clone();
    a.extend(e.tokenizer().encode(" Question one: what is two plus two?", Default::default()).unwrap());
    let mut c = shared.clone();
    c.extend(e.tokenizer().encode(" Question two: name a colour.", Default::default()).unwrap());
    let opts = GenerateOpts::greedy(3);
    let b = e.batcher(BatcherOpts { max_seqs: 2, kv_budget: Some(32 << 20), ..BatcherOpts::default() }).unwrap();
    b.generate(a.clone(), &opts).unwrap();
    let second = b.generate(c.clone(), &opts).unwrap();
    let common = a.iter().zip(&c).take_while(|(x, y)| x == y).count();
    assert!(common % 16 != 0 && common < a.len() / 16 * 16, "the prompts part inside a cached block: {common}");
    assert_eq!((second.reused, second.prefilled), (common, c.len() - common));
    assert_eq!(second.ids, alone(&e, &c, &opts).ids);
}

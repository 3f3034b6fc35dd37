//! Plans of the small ops (norms, activations, short conv, embedding, bias; sampling's plans are
//! in `plans_sampling`): each recorded into an explicit recorder equals its CPU reference and the eager path; each
//! recorded several times in one recorder with different step values gives each step's result
//! without being rebuilt, creating no buffer and no bind group; argmax feeds the embedding on the
//! GPU; bad inputs are typed errors. Tolerances: the f32 table of `numr::dtype::rtol`.

#[path = "plans_ops_util.rs"]
mod util;

use boostr::act::{Act, ActIo, ActKind, ActPlan, GluInput};
use boostr::conv::{ShortConv, ShortConvIo, ShortConvPlan};
use boostr::embedding::{EmbeddingPlan, GpuEmbedding, embedding_ref, embedding_ref_lenient};
use boostr::formats::{GgmlType, PackedWeights, repack};
use boostr::norm::{Norm, NormIo, NormKind, NormPlan};
use boostr::ops_common::{GpuView, OpPlan, OpsError, pseudo_random as rnd};
use boostr::sampling::{self, ArgmaxPlan, Penalties, PenaltyPlan, TopKPlan};
use numr::gpu::StepValues;
use numr::{DType, Device, Tensor};
use util::*;

#[test]
fn norm_plan_steps_match_reference_and_eager() {
    let Some((ctx, _serial)) = gpu() else { return };
    let (max_rows, n) = (7, 300);
    let x = rnd(max_rows * n, 1, 2.0);
    let w = rnd(n, 2, 1.0);
    let b = rnd(n, 3, 0.5);
    let r0 = rnd(max_rows * n, 4, 1.0);
    for (ci, cfg) in Norm::all().into_iter().enumerate() {
        let (xb, wb, bb, rb) = (f32_buf(&ctx, &x), f32_buf(&ctx, &w), f32_buf(&ctx, &b), f32_buf(&ctx, &r0));
        // Every other variant writes into a given output (an engine's activation buffer) at an
        // offset of 5 words.
        let given = (ci % 2 == 1).then(|| zeros(&ctx, max_rows * n + 5));
        let io = NormIo {
            x: (&xb).into(),
            w: (&wb).into(),
            b: cfg.bias.then(|| (&bb).into()),
            residual: cfg.residual.then(|| (&rb).into()),
            out: given.as_ref().map(|g| GpuView::new(numr::gpu::Binding::whole(g), 5)),
        };
        let plan = NormPlan::new(&ctx, &cfg, &io, n, max_rows, 1e-6).unwrap();
        let outs = zeros(&ctx, 3 * max_rows * n);
        let res_outs = zeros(&ctx, 3 * max_rows * n);
        let c = Counters::now(&ctx);
        let mut rec = ctx.recorder();
        for (i, &rows) in STEPS.iter().enumerate() {
            plan.record(&mut rec, &StepValues::chunk(0, rows as u32)).unwrap();
            copy_out(&mut rec, plan.out(), rows * n, &outs, i * max_rows * n);
            if cfg.residual {
                copy_in(&mut rec, &rb, 0, &res_outs, i * max_rows * n, max_rows * n);
            }
        }
        assert_eq!(rec.dispatch_count(), 3);
        rec.submit().unwrap();
        c.unchanged(&ctx, &format!("{cfg:?}"));
        let got = read_f32(&ctx, &outs, 3 * max_rows * n);
        let got_res = read_f32(&ctx, &res_outs, 3 * max_rows * n);
        // The CPU chain: the residual stream advances step by step, as on the GPU.
        let mut res = r0.clone();
        for (i, &rows) in STEPS.iter().enumerate() {
            let want = cfg.reference(&x[..rows * n], &w, cfg.bias.then_some(&b[..]), cfg.residual.then_some(&mut res[..rows * n]), n, 1e-6).unwrap();
            let base = i * max_rows * n;
            close(&got[base..base + rows * n], &want, &format!("{cfg:?} rows {rows}"));
            if cfg.residual {
                close(&got_res[base..base + max_rows * n], &res, &format!("{cfg:?} residual after rows {rows}"));
            }
        }
        // The eager path on 3 rows.
        let rt = tensor(&ctx, &r0[..3 * n], &[3, n]);
        let bt = tensor(&ctx, &b, &[n]);
        let eager = cfg
            .run(&ctx, &tensor(&ctx, &x[..3 * n], &[3, n]), &tensor(&ctx, &w, &[n]), cfg.bias.then_some(&bt), cfg.residual.then_some(&rt), 1e-6)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mut rr = r0[..3 * n].to_vec();
        let want = cfg.reference(&x[..3 * n], &w, cfg.bias.then_some(&b[..]), cfg.residual.then_some(&mut rr[..]), n, 1e-6).unwrap();
        close(&eager, &want, &format!("{cfg:?} eager"));
    }
    let _ = NormKind::Layer;
}

#[test]
fn act_plan_steps_match_reference_and_eager() {
    let Some((ctx, _serial)) = gpu() else { return };
    // 333 outputs per row: the scalar kernel; 332: the vec4 one.
    for (max_rows, n, cfg) in [333, 332].into_iter().flat_map(|n| Act::all().into_iter().map(move |c| (7, n, c))) {
        let wd = cfg.input_width(n);
        let a = rnd(max_rows * wd, 7, 6.0);
        let up = rnd(max_rows * n, 8, 2.0);
        let (ab, ub) = (f32_buf(&ctx, &a), f32_buf(&ctx, &up));
        let two = cfg.input == GluInput::TwoTensors;
        let io = ActIo { a: (&ab).into(), b: two.then(|| (&ub).into()), out: None };
        let plan = ActPlan::new(&ctx, &cfg, &io, n, max_rows).unwrap();
        let outs = zeros(&ctx, 3 * max_rows * n);
        let c = Counters::now(&ctx);
        let mut rec = ctx.recorder();
        for (i, &rows) in STEPS.iter().enumerate() {
            plan.record(&mut rec, &StepValues::chunk(0, rows as u32)).unwrap();
            copy_out(&mut rec, plan.out(), rows * n, &outs, i * max_rows * n);
        }
        rec.submit().unwrap();
        c.unchanged(&ctx, &format!("{cfg:?}"));
        let got = read_f32(&ctx, &outs, 3 * max_rows * n);
        for (i, &rows) in STEPS.iter().enumerate() {
            let want = cfg.reference(&a[..rows * wd], two.then_some(&up[..rows * n]), rows, n).unwrap();
            close(&got[i * max_rows * n..i * max_rows * n + rows * n], &want, &format!("{cfg:?} rows {rows}"));
        }
        let ut = tensor(&ctx, &up[..3 * n], &[3, n]);
        let eager = cfg.run(&ctx, &tensor(&ctx, &a[..3 * wd], &[3, wd]), two.then_some(&ut)).unwrap().to_vec::<f32>().unwrap();
        close(&eager, &cfg.reference(&a[..3 * wd], two.then_some(&up[..3 * n]), 3, n).unwrap(), &format!("{cfg:?} eager"));
    }
    let _ = ActKind::GeluTanh;
}

/// Chunks of 3, 1 and 3 tokens; then the same 7 tokens in one step from position 0 (a new
/// sequence needs no reset); then positions 5 and 6 run again (a rollback the ring allows). The
/// outputs and rings agree with each other and with the CPU.
#[test]
fn short_conv_plan_chunked_equals_one_pass() {
    let Some((ctx, _serial)) = gpu() else { return };
    let (ch, max_tok) = (77, 7);
    for conv in ShortConv::all() {
        let k = conv.kernel as usize;
        let ring = k + 2;
        let w = rnd(ch * k, 3, 1.0);
        let all = rnd(max_tok * 3 * ch, 100 + k as u64, 1.0);
        let (wb, allb, bcx) = (f32_buf(&ctx, &w), f32_buf(&ctx, &all), zeros(&ctx, max_tok * 3 * ch));
        let io = ShortConvIo { bcx: (&bcx).into(), w: (&wb).into(), state: None, out: None };
        let plan = ShortConvPlan::new(&ctx, &conv, &io, ch, max_tok, ring).unwrap();
        assert_eq!(plan.ring(), ring);
        let (outs, states) = (zeros(&ctx, (2 * max_tok + 2) * ch), zeros(&ctx, 5 * ring * ch));
        let chunks = [3usize, 1, 3];
        let c = Counters::now(&ctx);
        let mut rec = ctx.recorder();
        let mut t0 = 0;
        for (i, &n_tok) in chunks.iter().enumerate() {
            copy_in(&mut rec, &allb, t0 * 3 * ch, &bcx, 0, n_tok * 3 * ch);
            plan.record(&mut rec, &StepValues::chunk(t0 as u32, n_tok as u32)).unwrap();
            copy_out(&mut rec, plan.out(), n_tok * ch, &outs, t0 * ch);
            copy_out(&mut rec, plan.state(), ring * ch, &states, i * ring * ch);
            t0 += n_tok;
        }
        copy_in(&mut rec, &allb, 0, &bcx, 0, max_tok * 3 * ch);
        plan.record(&mut rec, &StepValues::chunk(0, max_tok as u32)).unwrap();
        copy_out(&mut rec, plan.out(), max_tok * ch, &outs, max_tok * ch);
        copy_out(&mut rec, plan.state(), ring * ch, &states, 3 * ring * ch);
        copy_in(&mut rec, &allb, 5 * 3 * ch, &bcx, 0, 2 * 3 * ch);
        plan.record(&mut rec, &StepValues::chunk(5, 2)).unwrap();
        copy_out(&mut rec, plan.out(), 2 * ch, &outs, 2 * max_tok * ch);
        copy_out(&mut rec, plan.state(), ring * ch, &states, 4 * ring * ch);
        rec.submit().unwrap();
        c.unchanged(&ctx, &format!("{conv:?}"));
        let got = read_f32(&ctx, &outs, (2 * max_tok + 2) * ch);
        let got_s = read_f32(&ctx, &states, 5 * ring * ch);
        let mut state = vec![0.0f32; ring * ch];
        let mut want = Vec::new();
        let mut t0 = 0;
        for (i, &n_tok) in chunks.iter().enumerate() {
            want.extend(conv.reference(&all[t0 * 3 * ch..(t0 + n_tok) * 3 * ch], &w, &mut state, t0, n_tok, ch).unwrap());
            close(&got_s[i * ring * ch..(i + 1) * ring * ch], &state, &format!("{conv:?} ring after chunk {i}"));
            t0 += n_tok;
        }
        close(&got[..max_tok * ch], &want, &format!("{conv:?} chunked"));
        close(&got[max_tok * ch..2 * max_tok * ch], &want, &format!("{conv:?} one pass from position 0"));
        close(&got_s[3 * ring * ch..4 * ring * ch], &state, &format!("{conv:?} ring after one pass"));
        close(&got[2 * max_tok * ch..], &want[5 * ch..], &format!("{conv:?} positions 5 and 6 again"));
        close(&got_s[4 * ring * ch..], &state, &format!("{conv:?} ring after the rollback"));
        // Eager, over a given ring tensor updated in place.
        let st = tensor(&ctx, &vec![0.0; ring * ch], &[ring, ch]);
        let wt = tensor(&ctx, &w, &[ch, k]);
        let mut s2 = vec![0.0f32; ring * ch];
        for (t0, n_tok) in [(0usize, 4usize), (4, 3)] {
            let part = &all[t0 * 3 * ch..(t0 + n_tok) * 3 * ch];
            let eager = conv.run(&ctx, &tensor(&ctx, part, &[n_tok, 3 * ch]), &wt, &st, t0).unwrap().to_vec::<f32>().unwrap();
            close(&eager, &conv.reference(part, &w, &mut s2, t0, n_tok, ch).unwrap(), &format!("{conv:?} eager"));
        }
        close(&st.to_vec::<f32>().unwrap(), &s2, &format!("{conv:?} eager state"));
    }
}

/// GGUF Q8_0 bytes for `vals` (round to nearest).
fn q8_0(vals: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in vals.chunks(32) {
        let amax = b.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        out.extend(half::f16::from_f32(d).to_le_bytes());
        b.iter().for_each(|&v| out.push((v / d).round() as i8 as u8));
    }
    out
}

fn tables(vocab: usize, cols: usize) -> Vec<PackedWeights> {
    let vals = rnd(vocab * cols, 5, 3.0);
    let f16: Vec<u8> = vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    vec![repack(GgmlType::Q8_0, &q8_0(&vals), vocab, cols).unwrap(), repack(GgmlType::F16, &f16, vocab, cols).unwrap()]
}

#[test]
fn embedding_plan_reads_gpu_ids_at_token_offsets() {
    let Some((ctx, _serial)) = gpu() else { return };
    let (vocab, cols, max_tok) = (37, 64, 4);
    for table in tables(vocab, cols) {
        let row_bytes = (table.qs_words_per_block() * table.blocks_per_row() * 4) as u64;
        let emb = GpuEmbedding::new(&ctx, &table, Some(5 * row_bytes)).unwrap();
        assert!(emb.n_chunks() > 1, "the test exercises a split table");
        // 40 is out of range: its row becomes zeros.
        let ids = [36u32, 5, 0, 40, 17, 9, 30];
        let idb = u32_buf(&ctx, &ids);
        let plan = EmbeddingPlan::new(&ctx, &emb, &(&idb).into(), max_tok, 1.5, None).unwrap();
        // Steps: (token offset, tokens); the third puts the out-of-range id in row 0, which the
        // first step filled.
        let steps = [(0u32, 1u32), (1, 3), (3, 4), (2, 2)];
        let outs = zeros(&ctx, steps.len() * max_tok * cols);
        let c = Counters::now(&ctx);
        let mut rec = ctx.recorder();
        for (i, &(t, n)) in steps.iter().enumerate() {
            plan.record(&mut rec, &StepValues::chunk(t, n).with_token(t)).unwrap();
            copy_out(&mut rec, plan.out(), n as usize * cols, &outs, i * max_tok * cols);
        }
        rec.submit().unwrap();
        c.unchanged(&ctx, "embedding");
        let got = read_f32(&ctx, &outs, steps.len() * max_tok * cols);
        for (i, &(t, n)) in steps.iter().enumerate() {
            let want = embedding_ref_lenient(&table, &ids[t as usize..(t + n) as usize], 1.5).unwrap();
            close(&got[i * max_tok * cols..i * max_tok * cols + n as usize * cols], &want, &format!("token {t}, {n} rows"));
        }
        assert!(got[2 * max_tok * cols..2 * max_tok * cols + cols].iter().all(|&v| v == 0.0), "an out-of-range id gives a row of zeros");
        let eager = emb.embed(&ctx, &ids[..3], 1.5).unwrap().to_vec::<f32>().unwrap();
        close(&eager, &embedding_ref(&table, &ids[..3], 1.5).unwrap(), "eager");
    }
}

/// A greedy loop entirely on the GPU, with each id depending on the last: the "model" is an
/// F16 table of `vocab x vocab` whose row `i` is the logits after token `i` (row `i` peaks at
/// `(5 i + 3) % vocab`). Step t embeds `ids[t]` straight into the argmax plan's logits, and the
/// argmax writes `ids[t + 1]`, all in one recorder; the ids and logits equal a CPU loop's.
#[test]
fn argmax_feeds_embedding_on_the_gpu() {
    let Some((ctx, _serial)) = gpu() else { return };
    let vocab = 64;
    let mut vals = rnd(vocab * vocab, 5, 3.0);
    for i in 0..vocab {
        vals[i * vocab + (5 * i + 3) % vocab] = 4.0;
    }
    let f16: Vec<u8> = vals.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let table = repack(GgmlType::F16, &f16, vocab, vocab).unwrap();
    let row_bytes = (table.qs_words_per_block() * table.blocks_per_row() * 4) as u64;
    let emb = GpuEmbedding::new(&ctx, &table, Some(9 * row_bytes)).unwrap();
    assert!(emb.n_chunks() > 1);
    let steps = 6;
    let ids = u32_buf(&ctx, &[7u32, 0, 0, 0, 0, 0, 0, 0]);
    let logits = zeros(&ctx, vocab);
    let emb_plan = EmbeddingPlan::new(&ctx, &emb, &(&ids).into(), 1, 1.0, Some((&logits).into())).unwrap();
    let argmax = ArgmaxPlan::new(&ctx, &(&logits).into(), vocab, Some((&ids).into()), 8).unwrap();
    let seen = zeros(&ctx, steps * vocab);
    let c = Counters::now(&ctx);
    let mut rec = ctx.recorder();
    for t in 0..steps {
        let step = StepValues::decode(t as u32).with_token(t as u32);
        emb_plan.record(&mut rec, &step).unwrap();
        copy_in(&mut rec, &logits, 0, &seen, t * vocab, vocab);
        argmax.record(&mut rec, &step.with_token(t as u32 + 1)).unwrap();
    }
    assert_eq!(rec.dispatch_count(), steps * (emb.n_chunks() + 1));
    rec.submit().unwrap();
    c.unchanged(&ctx, "argmax -> embedding");
    let got_ids = read_u32(&ctx, &ids, steps + 1);
    let got_logits = read_f32(&ctx, &seen, steps * vocab);
    let mut want_ids = vec![7u32];
    let mut want_logits = Vec::new();
    for _ in 0..steps {
        let l = embedding_ref(&table, &want_ids[want_ids.len() - 1..], 1.0).unwrap();
        want_ids.push(sampling::argmax_ref(&l).unwrap().0);
        want_logits.extend(l);
    }
    assert_eq!(want_ids[..3], [7, 38, 1], "the CPU loop follows the table's chain");
    assert_eq!(got_ids, want_ids);
    close(&got_logits, &want_logits, "the logits embedded from GPU-chosen ids");
}

fn is_bad<T: std::fmt::Debug>(r: Result<T, OpsError>, what: &str) {
    assert!(matches!(r, Err(OpsError::BadArgs { .. })), "{what}: {r:?}");
}

#[test]
fn bad_inputs_are_typed_errors() {
    let Some((ctx, _serial)) = gpu() else { return };
    let dev = Device::Gpu(ctx.clone());
    let n = 64;
    let x = tensor(&ctx, &rnd(2 * n, 1, 1.0), &[2, n]);
    let w = tensor(&ctx, &rnd(n, 2, 1.0), &[n]);
    let xu = Tensor::zeros(&[2, n], DType::U32, &dev).unwrap();
    let xt = tensor(&ctx, &rnd(2 * n, 1, 1.0), &[n, 2]).transpose(0, 1).unwrap();
    // Norm: dtype, contiguity, lengths.
    is_bad(Norm::rms().run(&ctx, &xu, &w, None, None, 1e-6), "norm of u32");
    is_bad(Norm::rms().run(&ctx, &xt, &w, None, None, 1e-6), "norm of a transposed view");
    is_bad(Norm::rms().run(&ctx, &x, &tensor(&ctx, &[1.0; 3], &[3]), None, None, 1e-6), "norm weight length");
    is_bad(Norm::rms().run(&ctx, &x, &w, None, Some(&x), 1e-6), "residual on a variant without");
    // Act.
    let silu = Act { kind: ActKind::Silu, input: GluInput::None };
    is_bad(silu.run(&ctx, &xu, None), "act of u32");
    is_bad(silu.run(&ctx, &xt, None), "act of a transposed view");
    let packed = Act { kind: ActKind::Silu, input: GluInput::Packed };
    is_bad(packed.run(&ctx, &tensor(&ctx, &[1.0; 6], &[2, 3]), None), "packed GLU of odd width");
    // Short conv: rank 1 (used to panic), dtype, contiguity, shapes, taps.
    let conv = ShortConv { kernel: 3 };
    let st = tensor(&ctx, &[0.0; 2 * 4], &[2, 4]);
    let cw = tensor(&ctx, &[0.5; 12], &[4, 3]);
    is_bad(conv.run(&ctx, &tensor(&ctx, &[1.0; 12], &[12]), &cw, &st, 0), "short conv of a rank-1 input");
    is_bad(conv.run(&ctx, &Tensor::zeros(&[2, 12], DType::U32, &dev).unwrap(), &cw, &st, 0), "short conv of u32");
    let bt = tensor(&ctx, &[1.0; 24], &[12, 2]).transpose(0, 1).unwrap();
    is_bad(conv.run(&ctx, &bt, &cw, &st, 0), "short conv of a transposed view");
    is_bad(conv.run(&ctx, &tensor(&ctx, &[1.0; 24], &[2, 12]), &cw, &tensor(&ctx, &[0.0; 4], &[4]), 0), "short conv state size");
    let r = ShortConv { kernel: 1 }.run(&ctx, &tensor(&ctx, &[1.0; 24], &[2, 12]), &cw, &st, 0);
    assert!(matches!(r, Err(OpsError::Unsupported { .. })), "one tap: {r:?}");
    // CPU references with inconsistent lengths.
    is_bad(Norm::rms().reference(&[1.0; 10], &[1.0; 3], None, None, 4, 1e-6), "norm reference, x not whole rows");
    is_bad(Norm::rms().reference(&[1.0; 8], &[1.0; 3], None, None, 4, 1e-6), "norm reference, weight");
    is_bad(Norm { residual: true, ..Norm::rms() }.reference(&[1.0; 8], &[1.0; 4], None, Some(&mut [0.0; 3]), 4, 1e-6), "norm reference, residual");
    is_bad(silu.reference(&[1.0; 5], None, 2, 3), "act reference");
    is_bad(Act { input: GluInput::TwoTensors, ..silu }.reference(&[1.0; 6], None, 2, 3), "act reference without up");
    is_bad(conv.reference(&[1.0; 10], &[1.0; 12], &mut [0.0; 8], 0, 1, 4), "conv reference, bcx");
    is_bad(conv.reference(&[1.0; 12], &[1.0; 12], &mut [0.0; 7], 0, 1, 4), "conv reference, state");
    is_bad(conv.reference(&[1.0; 12], &[1.0; 12], &mut [0.0; 4], 0, 1, 4), "conv reference, a ring of one row for 3 taps");
    is_bad(sampling::top_k_ref(&[1.0; 3], 4, 1.0), "top_k reference, k > n");
    is_bad(sampling::top_k_ref(&[1.0; 3], 2, 0.0), "top_k reference, temperature 0");
    is_bad(sampling::argmax_ref(&[]), "argmax reference, empty");
    let r = sampling::repetition_penalty_ref(&mut [1.0; 3], &[3], 1.1);
    assert!(matches!(r, Err(OpsError::TokenOutOfRange { id: 3, vocab: 3 })), "{r:?}");
    // Undersized bindings at plan build.
    let small = zeros(&ctx, 10);
    let big = zeros(&ctx, 4096);
    let io = NormIo { x: (&small).into(), w: (&big).into(), b: None, residual: None, out: None };
    is_bad(NormPlan::new(&ctx, &Norm::rms(), &io, n, 2, 1e-6), "norm plan, x too small");
    let io = NormIo { x: (&big).into(), w: (&big).into(), b: None, residual: None, out: Some((&small).into()) };
    is_bad(NormPlan::new(&ctx, &Norm::rms(), &io, n, 2, 1e-6), "norm plan, out too small");
    let io = NormIo { x: (&big).into(), w: (&big).into(), b: Some((&big).into()), residual: None, out: None };
    is_bad(NormPlan::new(&ctx, &Norm::rms(), &io, n, 2, 1e-6), "norm plan, bias on a variant without");
    let io = ActIo { a: (&big).into(), b: None, out: Some(GpuView::new(numr::gpu::Binding::whole(&big), 4000)) };
    is_bad(ActPlan::new(&ctx, &silu, &io, n, 2), "act plan, out too small at its offset");
    let io = ShortConvIo { bcx: (&big).into(), w: (&big).into(), state: Some((&small).into()), out: None };
    is_bad(ShortConvPlan::new(&ctx, &conv, &io, 8, 4, 2), "conv plan, state too small");
    let io = ShortConvIo { bcx: (&small).into(), w: (&big).into(), state: None, out: None };
    is_bad(ShortConvPlan::new(&ctx, &conv, &io, 8, 4, 2), "conv plan, bcx too small");
    let io = ShortConvIo { bcx: (&big).into(), w: (&big).into(), state: None, out: None };
    is_bad(ShortConvPlan::new(&ctx, &conv, &io, 8, 4, 1), "conv plan, a ring shorter than the taps");
    let table = tables(37, 64).remove(0);
    let emb = GpuEmbedding::new(&ctx, &table, None).unwrap();
    is_bad(EmbeddingPlan::new(&ctx, &emb, &(&big).into(), 2, 1.0, Some((&small).into())), "embedding plan, out too small");
    is_bad(ArgmaxPlan::new(&ctx, &(&small).into(), 11, None, 1), "argmax plan, logits too small");
    is_bad(ArgmaxPlan::new(&ctx, &(&big).into(), 100, Some((&small).into()), 11), "argmax plan, ids too small");
    is_bad(TopKPlan::new(&ctx, &(&big).into(), 100, 8, 1.0, 2, Some(((&small).into(), (&big).into()))), "top_k plan, ids too small");
    is_bad(TopKPlan::new(&ctx, &(&big).into(), 100, 129, 1.0, 1, None), "top_k plan, k > MAX_TOP_K");
    is_bad(PenaltyPlan::new(&ctx, &(&small).into(), 11, &(&big).into(), 4, Penalties::repetition(1.1)), "penalty plan, logits too small");
    is_bad(PenaltyPlan::new(&ctx, &(&big).into(), 11, &(&big).into(), 4, Penalties::repetition(0.0)), "penalty plan, repetition 0");
    // Steps a plan was not built for: typed errors at record, nothing recorded.
    let mut rec = ctx.recorder();
    let io = NormIo { x: (&big).into(), w: (&big).into(), b: None, residual: None, out: None };
    let norm = NormPlan::new(&ctx, &Norm::rms(), &io, n, 2, 1e-6).unwrap();
    is_bad(norm.record(&mut rec, &StepValues::chunk(0, 3)), "norm step of 3 rows, built for 2");
    let emb_plan = EmbeddingPlan::new(&ctx, &emb, &(&small).into(), 4, 1.0, None).unwrap();
    is_bad(emb_plan.record(&mut rec, &StepValues::chunk(0, 2).with_token(9)), "embedding ids past the id buffer");
    let am = ArgmaxPlan::new(&ctx, &(&big).into(), 100, Some((&small).into()), 10).unwrap();
    is_bad(am.record(&mut rec, &StepValues::decode(0).with_token(10)), "argmax slot past the buffer");
    let pen = PenaltyPlan::new(&ctx, &(&big).into(), 100, &(&small).into(), 4, Penalties::repetition(1.1)).unwrap();
    let r = pen.record(&mut rec, &StepValues::decode(10));
    assert!(matches!(r, Err(OpsError::ContextOverflow { needed: 11, capacity: 10 })), "{r:?}");
    assert_eq!(rec.dispatch_count(), 0);
}

/// The bias add, recorded for 3 then 1 of at most 4 rows into one recorder, against the CPU
/// reference; a short bias is a typed error.
#[test]
fn bias_plan_adds_per_step_rows() {
    use boostr::bias::{BiasPlan, bias_reference};
    let Some((ctx, _g)) = gpu() else { return };
    let (n, rows) = (37usize, 4usize);
    let (x, b) = (rnd(n * rows, 3, 1.0), rnd(n, 5, 1.0));
    let (xb, bb) = (f32_buf(&ctx, &x), f32_buf(&ctx, &b));
    let plan = BiasPlan::new(&ctx, &GpuView::whole(&xb), &GpuView::whole(&bb), n, rows).unwrap();
    let before = Counters::now(&ctx);
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::chunk(0, 3)).unwrap();
    plan.record(&mut rec, &StepValues::chunk(3, 1)).unwrap();
    rec.submit().unwrap();
    before.unchanged(&ctx, "bias");
    let mut want = x.clone();
    bias_reference(&mut want[..3 * n], &b);
    bias_reference(&mut want[..n], &b);
    close(&read_f32(&ctx, &xb, n * rows), &want, "bias");
    assert!(BiasPlan::new(&ctx, &GpuView::whole(&xb), &GpuView::whole(&f32_buf(&ctx, &b[..n - 1])), n, rows).is_err());
    assert!(plan.record(&mut ctx.recorder(), &StepValues::chunk(0, 5)).is_err());
}

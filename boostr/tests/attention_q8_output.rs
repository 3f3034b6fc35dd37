//! The decode attention's int8 output (`DecodePlanBuilder::quantized_output`): the fused merge
//! quantizes each head's blocks as it writes them, for an integer-dot output projection.
//!
//! Checked: the f32 output against `attention_ref` (1e-4, as `plans_attention.rs`), and the int8
//! activations **bit-identical** to `QuantizeQ8` run on that f32 output (the same values through
//! the same block quantizer), at several KV lengths recorded into one recorder (1, 150, 400:
//! one split and many), with GQA, f16 and q8_0 caches; a segmented cache, where the merge is not
//! fused, is a typed error.

use boostr::attention::{AttnOptions, DecodeAttnSg, DecodeKernel, DecodePlan, attention_ref};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype, KvWritePlan};
use boostr::ops_common::{OpPlan, OpsError, env_of, pseudo_random as rnd};
use boostr::quant::Q8Activations;
use boostr::rope::QkvLayout;
use numr::gpu::{Binding, BufferKind, GpuContext, KernelEnv, StepValues};
use numr::testing::{check_close_rtol, test_gpu, validate_wgsl};

fn cache(ctx: &GpuContext, n_kv: usize, hd: usize, capacity: usize, dtype: KvDtype, seg: Option<usize>) -> KvCache {
    let pos_bytes = (n_kv * dtype.row_words(hd) * 4) as u64;
    KvCache::new(ctx, KvCacheConfig { n_layers: 1, n_kv_heads: n_kv, head_dim: hd, capacity, dtype, max_segment_bytes: seg.map(|s| s as u64 * pos_bytes) })
        .unwrap()
}

fn q8_of(ctx: &GpuContext, xa: &Q8Activations) -> (Vec<u8>, Vec<u8>) {
    let nb = (xa.k() / 32) as u64;
    (ctx.read_bytes(xa.xq(), 0, nb * 32).unwrap(), ctx.read_bytes(xa.xs(), 0, nb * 16).unwrap())
}

#[test]
fn quantized_decode_variants_validate_with_naga() {
    let mut n = 0;
    for env in KernelEnv::all_for_validation().into_iter().filter(|e| e.coherent && e.subgroups && e.subgroup_min_size >= 8) {
        for cfg in DecodeAttnSg::all().into_iter().filter(|c| c.quantize) {
            let src = cfg.source(&env).unwrap();
            validate_wgsl(&src.wgsl).unwrap_or_else(|e| panic!("{}: {e}\n{}", src.name, src.wgsl));
            n += 1;
        }
    }
    assert!(n > 20, "{n} variants");
    let base = DecodeAttnSg::new(128, 4, KvDtype::F16, false).unwrap();
    assert!(matches!(DecodeAttnSg { quantize: true, ..base }.validate(), Err(OpsError::Unsupported { .. })), "quantize without the fused merge");
}

#[test]
fn quantized_output_equals_quantize_q8_of_the_output() {
    let Some(ctx) = test_gpu() else { return };
    if DecodeKernel::best(&env_of(&ctx)) != DecodeKernel::Subgroup {
        panic!("the test adapter has no subgroups of 8: the subgroup decode kernel cannot run");
    }
    let cap = 400;
    for (hd, n_q, n_kv, dtype) in [(128, 8, 2, KvDtype::F16), (64, 6, 3, KvDtype::Q8_0)] {
        let what = format!("hd {hd} {n_q}q/{n_kv}kv {dtype:?}");
        let kv_cache = cache(&ctx, n_kv, hd, cap, dtype, None);
        assert!(DecodePlan::quantized_output_supported(&ctx, &kv_cache, 0), "{what}: the test adapter runs the fused merge");
        let l = QkvLayout { n_tok: cap, n_q: 0, n_kv, head_dim: hd, tok_stride: 2 * n_kv * hd, x_off: 0, q_off: 0, k_off: 0, v_off: n_kv * hd };
        let x = rnd(cap * 2 * n_kv * hd, 5 + hd as u64, 1.0);
        let xb = ctx.upload(bytemuck::cast_slice(&x)).unwrap();
        KvWritePlan::new(&ctx, &Binding::whole(&xb), &l, &kv_cache, 0).unwrap().run(&ctx, &StepValues::chunk(0, cap as u32)).unwrap();
        let (k, v) = kv_cache.read_layer(&ctx, 0, cap).unwrap();
        let q = rnd(n_q * hd, 77, 2.0);
        let qb = ctx.upload(bytemuck::cast_slice(&q)).unwrap();
        let out = ctx.alloc((n_q * hd * 4) as u64, BufferKind::Storage).unwrap();
        let target = Q8Activations::written_by_producer(&ctx, n_q * hd, None).unwrap();
        let opts = AttnOptions::new(hd);
        let (qbind, obind) = (Binding::whole(&qb), Binding::whole(&out));
        let plan = DecodePlan::builder(&ctx, &qbind, 0, n_q, &kv_cache, 0, &opts).output(&obind, 0).quantized_output(&target).build().unwrap();
        assert!(plan.is_fused());
        let standalone = Q8Activations::new(&ctx, &obind, 1, n_q * hd).unwrap();
        // The single split (one and two workgroup steps, its last length), then the split variants.
        for kv in [1usize, 100, 128, 129, 150, 400] {
            let step = DecodePlan::step(kv).unwrap();
            let mut rec = ctx.recorder();
            plan.record(&mut rec, &step).unwrap();
            rec.submit().unwrap();
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ctx.read_bytes(&out, 0, (n_q * hd * 4) as u64).unwrap());
            let pre = |a: &[f32]| -> Vec<f32> { (0..n_kv).flat_map(|h| a[h * cap * hd..(h * cap + kv) * hd].to_vec()).collect() };
            let want = attention_ref(&q, &pre(&k), &pre(&v), 1, n_q, n_kv, hd, kv, kv - 1, &opts).unwrap();
            let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
            check_close_rtol(&f(&got), &f(&want), 1e-4).unwrap_or_else(|e| panic!("{what} kv {kv}: {e}"));
            let fused_q8 = q8_of(&ctx, &target);
            standalone.run(&ctx, &StepValues::decode(0)).unwrap();
            assert_eq!(fused_q8, q8_of(&ctx, &standalone), "{what} kv {kv}: the merge's int8 output differs from QuantizeQ8 of its f32 output");
        }
        // A segmented cache merges in a second dispatch: no int8 output.
        let seg = cache(&ctx, n_kv, hd, cap, dtype, Some(100));
        assert!(!DecodePlan::quantized_output_supported(&ctx, &seg, 0));
        let r = DecodePlan::builder(&ctx, &qbind, 0, n_q, &seg, 0, &opts).output(&obind, 0).quantized_output(&target).build();
        assert!(matches!(r, Err(OpsError::Unsupported { .. })), "{what}: segmented cache: {:?}", r.err());
        // A target of the wrong width.
        let narrow = Q8Activations::written_by_producer(&ctx, n_q * hd - 32, None).unwrap();
        let r = DecodePlan::builder(&ctx, &qbind, 0, n_q, &kv_cache, 0, &opts).output(&obind, 0).quantized_output(&narrow).build();
        assert!(matches!(r, Err(OpsError::BadArgs { .. })), "{what}: narrow target: {:?}", r.err());
    }
}

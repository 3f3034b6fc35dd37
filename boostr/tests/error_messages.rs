//! Errors a user can meet say what is wrong in words: no `Debug` dump of a configuration struct
//! (`KvCacheConfig { n_layers: 2, ... }`), only the values that matter and what is supported.

use boostr::attention::{AttnOptions, DecodePlan, PrefillPlan, QueryLayout};
use boostr::kv_cache::{KvCache, KvCacheConfig, KvDtype};
use numr::testing::test_gpu;
use numr::{Device, Tensor};

/// No braces, no struct or `Option` spelled as Rust prints it.
fn assert_in_words(msg: &str) {
    for debug in ["{", "}", "Config", "Some(", "None", "KvDtype", "F16", "Q8_0"] {
        assert!(!msg.contains(debug), "`{debug}` in the message: {msg}");
    }
}

fn cfg(head_dim: usize, capacity: usize, dtype: KvDtype) -> KvCacheConfig {
    KvCacheConfig { n_layers: 2, n_kv_heads: 1, head_dim, capacity, dtype, max_segment_bytes: None }
}

#[test]
fn a_head_size_the_attention_kernels_lack_is_named() {
    let Some(ctx) = test_gpu() else { return };
    // f16 rows of 80 values are storable; no attention kernel takes them.
    let cache = KvCache::new(&ctx, cfg(80, 16, KvDtype::F16)).unwrap();
    let q = Tensor::from_slice(&[0.0f32; 2 * 80 * 4], &[2 * 80 * 4], &Device::Gpu(ctx.clone())).unwrap();
    let qb = q.gpu_binding(4).unwrap().0;
    let want = "unsupported attention head size: head size 80 is not supported on the GPU (64, 128 or 256)";
    let decode = DecodePlan::builder(&ctx, &qb, 0, 2, &cache, 0, &AttnOptions::new(80)).build().map(|_| ()).unwrap_err().to_string();
    assert_eq!(decode, want);
    let ql = QueryLayout { n_tok: 4, n_q: 2, q_off: 0, tok_stride: 2 * 80 };
    let prefill = PrefillPlan::new(&ctx, &qb, &ql, &cache, 0, &AttnOptions::new(80)).map(|_| ()).unwrap_err().to_string();
    assert_eq!(prefill, want);
    assert_in_words(&decode);
    assert_in_words(&prefill);
}

#[test]
fn a_kv_cache_the_gpu_cannot_hold_is_named() {
    let Some(ctx) = test_gpu() else { return };
    let err = |c: KvCacheConfig| KvCache::new(&ctx, c).map(|_| ()).unwrap_err().to_string();
    let e = err(cfg(300, 16, KvDtype::F16));
    assert_eq!(e, "unsupported KV cache head size: head size 300 cannot be stored as f16 rows (even, at most 256)");
    assert_in_words(&e);
    let e = err(cfg(80, 16, KvDtype::Q8_0));
    assert_eq!(e, "unsupported KV cache head size: head size 80 cannot be stored as q8_0 rows (a multiple of 32, at most 256)");
    assert_in_words(&e);
    let e = err(cfg(64, 0, KvDtype::F16));
    assert_eq!(e, "unsupported KV cache shape: 2 layers of 1 KV heads of head size 64, 0 positions, f16 (positions and KV heads must be positive)");
    assert_in_words(&e);
}

#[test]
fn query_heads_that_do_not_group_over_the_kv_heads_are_named() {
    let Some(ctx) = test_gpu() else { return };
    let cache = KvCache::new(&ctx, KvCacheConfig { n_kv_heads: 2, ..cfg(64, 16, KvDtype::F16) }).unwrap();
    let q = Tensor::from_slice(&[0.0f32; 3 * 64], &[3 * 64], &Device::Gpu(ctx.clone())).unwrap();
    let qb = q.gpu_binding(4).unwrap().0;
    let e = DecodePlan::builder(&ctx, &qb, 0, 3, &cache, 0, &AttnOptions::new(64)).build().map(|_| ()).unwrap_err().to_string();
    assert_eq!(e, "unsupported attention heads: 3 query heads over 2 KV heads (a whole number of query heads per KV head, at most 16)");
    assert_in_words(&e);
}

//! `GpuTuning`'s defaults are the measured values, every key sets its field, and bad settings
//! are typed errors that name the key and what it takes.

use super::*;

#[test]
fn the_defaults_are_the_measured_values() {
    let t = GpuTuning::default();
    assert_eq!(t.decode_fusions, DecodeFusions::ALL);
    assert_eq!((t.norm_fuse_max_k, t.norm_stage_k), (usize::MAX, 0));
    assert_eq!((t.gemv_eight_rows_min_k, t.gemv_small, t.gemv_rows, t.gemv_threads), (2048, 1024, None, None));
    assert_eq!((t.q8_min_rows, t.q8_tall_above, t.q8_tall_min_rows, t.q8_wide_k, t.q8_max_wgs), (2, 8192, 4, 4096, 0));
    for o in [t.q8, t.q8_wide, t.q8_tall, t.q8_small] {
        assert_eq!(o, Q8Override::default());
    }
    assert_eq!((t.q8_subgroup_rows, t.q8_prefetch), (None, None));
    assert_eq!(t.glu_local, Some(WorkgroupShape::new(64, 512, 1, 2)));
    assert_eq!((t.norm_local_max_k, t.norm_local_small, t.norm_local_wide), (4096, Some(WorkgroupShape::new(32, 1024, 1, 1)), None));
    assert_eq!((t.attn_tuning, t.attn_single_kv, t.prefill_attn), (None, None, None));
    assert_eq!((t.prefill_split_k, t.qkv_split_max_blocks, t.prefill_lead), (true, 256, 16));
    assert_eq!((t.chains, t.chain_kernels.is_empty(), t.chain_layers, t.chain_max, t.chain_poll), (Chains::Auto, true, 1, None, ChainPoll::Every));
    assert_eq!(Diagnostics::default(), Diagnostics { ablate: vec![], step_trace: false, chain_verbose: false });
}

#[test]
fn every_key_is_documented_and_sets_something() {
    // A value each key takes; setting it must change the default.
    let value = |k: &str| match k {
        "decode_fusion" => "norm,glu",
        "glu_local" | "norm_local" | "norm_local_small" => "off",
        "norm_local_wide" => "32,1024,1,1",
        "attn_tuning" => "1,2,3",
        "prefill_attn" => "tiled",
        "prefill_split_k" => "1",
        "gemm_f16_input" => "1",
        "q8_prefetch" => "1",
        "chain" => "quant_gemv_q8",
        "chain_poll" => "first",
        "batch_gemv" => "4,2,128,1",
        "batch_q8" | "verify_q8" | "batch_lanes" => "off",
        _ => "3",
    };
    for (k, doc) in TUNING_KEYS {
        assert!(!doc.is_empty());
        let mut t = GpuTuning::default();
        t.set(k, value(k)).unwrap_or_else(|e| panic!("{k}: {e}"));
        assert_ne!(t, GpuTuning::default(), "{k}={} changes nothing", value(k));
    }
    let mut d = Diagnostics::default();
    for (k, v) in [("ablate", "-attn_decode"), ("step_trace", "1"), ("chain_verbose", "1")] {
        let before = d.clone();
        d.set(k, v).unwrap();
        assert_ne!(d, before, "{k}");
    }
    assert_eq!(DIAGNOSTIC_KEYS.len(), 3);
}

#[test]
fn settings_parse_into_their_fields() {
    let mut t = GpuTuning::default();
    for s in [
        "decode_fusion=norm, residual,rope",
        "Q8_ROWS=4",
        "q8_wide_unroll=2",
        "q8_tall_threads=128",
        "q8_small_rows=1",
        "q8_sg_rows=2",
        "q8_prefetch=0",
        "gemv_rows=8",
        "batch_gemv=8,2,256,1",
        "batch_q8=4,8,128,2",
        "verify_q8=1,2,32,2",
        "batch_gemv_max_seqs=4",
        "batch_lanes=off",
        "batch_split_k=2",
        "batch_attn_split_keys=0",
        "norm_local=16,512,1,1",
        "norm_local_small=off",
        "attn_tuning=2,4,264",
        "attn_single_kv=0",
        "prefill_attn=subgroup",
        "prefill_split_k=1",
        "prefill_lead=0",
        "chain=quant_gemv_q8,attn_decode",
        "chain_layers=2",
        "chain_max=8",
        "chain_poll=first",
    ] {
        t.set_pair(s).unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    assert_eq!(t.decode_fusions, DecodeFusions { norm: true, residual: true, rope: true, ..DecodeFusions::NONE });
    assert_eq!(t.q8, Q8Override { rows: Some(4), ..Default::default() });
    assert_eq!((t.q8_wide.unroll, t.q8_tall.threads, t.q8_small.rows), (Some(2), Some(128), Some(1)));
    assert_eq!((t.q8_subgroup_rows, t.q8_prefetch, t.gemv_rows), (Some(2), Some(false), Some(8)));
    // `norm_local` sets both classes; the later `norm_local_small=off` only the small one.
    assert_eq!((t.norm_local_small, t.norm_local_wide), (None, Some(WorkgroupShape::new(16, 512, 1, 1))));
    assert_eq!(t.attn_tuning, Some(AttnTuning { heads: 2, keys: 4, target_wgs: 264 }));
    assert_eq!((t.attn_single_kv, t.prefill_attn), (Some(0), Some(DecodeKernel::Subgroup)));
    assert_eq!((t.prefill_split_k, t.prefill_lead), (false, 0));
    assert_eq!((t.chains, t.chain_kernels.clone()), (Chains::On, vec!["quant_gemv_q8".to_string(), "attn_decode".to_string()]));
    assert_eq!((t.chain_layers, t.chain_max, t.chain_poll), (2, Some(8), ChainPoll::First));
    assert_eq!(t.batch_gemv, super::BatchGemv { rows: 8, group: 2, threads: 256, f16: true });
    assert_eq!((t.batch_q8, t.batch_gemv_max_seqs), (Some(super::BatchQ8 { rows: 4, group: 8, threads: 128, unroll: 2 }), 4));
    assert_eq!(t.verify_q8, Some(super::BatchQ8 { rows: 1, group: 2, threads: 32, unroll: 2 }));
    assert!(!t.batch_lanes);
    assert_eq!((t.batch_split_k, t.batch_attn_split_keys), (Some(2), Some(0)));
    for s in [
        "batch_gemv=2,4,128,0",
        "batch_q8=2,4,64,1",
        "verify_q8=2,3,64,1",
        "batch_gemv_max_seqs=16",
        "batch_lanes=on",
        "batch_split_k=auto",
        "batch_attn_split_keys=auto",
    ] {
        t.set_pair(s).unwrap();
    }
    // `auto` returns an override to the default, `all` / `off` the chains' mode.
    for s in ["q8_rows=auto", "q8_wide_unroll=auto", "q8_tall_threads=auto", "q8_small_rows=auto", "q8_sg_rows=auto", "q8_prefetch=auto"] {
        t.set_pair(s).unwrap();
    }
    for s in ["gemv_rows=auto", "norm_local=32,1024,1,1", "norm_local_wide=off", "attn_tuning=auto", "attn_single_kv=auto", "prefill_attn=auto"] {
        t.set_pair(s).unwrap();
    }
    for s in ["decode_fusion=all", "prefill_split_k=2", "prefill_lead=16", "chain=auto", "chain_layers=1", "chain_max=auto", "chain_poll=every"] {
        t.set_pair(s).unwrap();
    }
    assert_eq!(t, GpuTuning::default());
    t.set_pair("chain=all").unwrap();
    assert_eq!((t.chains, t.chain_kernels.len()), (Chains::On, 0));
    t.set_pair("chain=off").unwrap();
    assert_eq!(t.chains, Chains::Off);
    t.set_pair("decode_fusion=none").unwrap();
    assert_eq!(t.decode_fusions, DecodeFusions::NONE);

    let mut d = Diagnostics::default();
    d.set_pair("ablate=-attn_decode, +_epglu").unwrap();
    d.set_pair("step_trace=1").unwrap();
    assert_eq!(d.ablate, [AblateRule { kernel: "attn_decode".into(), twice: false }, AblateRule { kernel: "_epglu".into(), twice: true }]);
    assert!(d.step_trace && !d.chain_verbose);
}

#[test]
fn bad_settings_are_typed_errors() {
    let mut t = GpuTuning::default();
    let e = t.set_pair("q8_rowz=4").unwrap_err();
    let TuningError::UnknownKey { key, known } = &e else { panic!("{e:?}") };
    assert_eq!(key, "q8_rowz");
    assert!(known.contains("q8_rows") && known.contains("prefill_lead") && known.contains("chain_poll"), "{known}");
    assert!(e.to_string().starts_with("unknown key `q8_rowz` (known: decode_fusion, "), "{e}");
    for (s, expected) in [
        ("q8_rows=four", "rows per workgroup (an integer, or `auto`)"),
        ("glu_local=64,512,1", "`off` or rows,threads,unroll,sg_rows"),
        ("attn_tuning=1,2", "heads,keys,target_wgs (or `auto`)"),
        ("prefill_attn=fast", "coop, subgroup, tiled or auto"),
        ("prefill_split_k=3", "1 (off) or 2 (on)"),
        ("batch_split_k=9", "1 (off) to 8, or `auto`: K splits of the GEMMs of batch states that run every row through them"),
        ("decode_fusion=norm,fast", "`all`, `none` or a comma list of norm, residual, glu, epilogue, attn_q8, rope"),
        ("chain_layers=0", "layers per chain (an integer, at least 1)"),
        ("chain=a,,b", "auto, on, off, all, or a comma list of kernel-name prefixes"),
        ("q8_prefetch=2", "0 or 1 (or `auto`)"),
        ("norm_stage_k=-1", "input features (an integer; 0: off)"),
    ] {
        let (k, v) = s.split_once('=').unwrap();
        assert_eq!(t.set_pair(s), Err(TuningError::BadValue { key: k.into(), value: v.into(), expected }), "{s}");
    }
    assert_eq!(t, GpuTuning::default(), "a failed setting changes nothing");
    assert_eq!(t.set_pair("q8_rows"), Err(TuningError::NotAPair("q8_rows".into())));
    let e = t.set_pair("prefill_split_k=3").unwrap_err().to_string();
    assert_eq!(e, "`prefill_split_k=3`: expected 1 (off) or 2 (on)");

    let mut d = Diagnostics::default();
    assert!(matches!(d.set_pair("q8_rows=4"), Err(TuningError::UnknownKey { .. })), "a tuning key is no diagnostic");
    assert!(matches!(GpuTuning::default().set_pair("ablate=-attn"), Err(TuningError::UnknownKey { .. })), "nor the reverse");
    for s in ["ablate=attn_decode", "ablate=+", "step_trace=yes"] {
        assert!(matches!(d.set_pair(s), Err(TuningError::BadValue { .. })), "{s}");
    }
    assert_eq!(d, Diagnostics::default());
}

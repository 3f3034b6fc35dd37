//! What the speculative-decoding tests share: the tiny random checkpoints and their prompts, and
//! the distribution check (a two-sample chi-square test of sampled tokens with and without
//! drafts).

#![allow(dead_code)]

use std::path::PathBuf;

use cera::engine::{DeviceChoice, Engine, LoadOptions};

/// A tiny random checkpoint's folder (`tests/golden/hf/MODEL`; all share one 320-token
/// vocabulary).
pub fn hf_dir(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf").join(model)
}

/// The longest golden prompt of a tiny checkpoint followed by transformers' greedy continuation
/// of it, so that the model's own tokens recur and n-gram drafts find some.
pub fn hf_prompt(model: &str) -> Vec<u32> {
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(hf_dir(model).join("golden.json")).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect::<Vec<u32>>();
    let case = g["cases"].as_array().unwrap().iter().max_by_key(|c| c["ids"].as_array().unwrap().len()).unwrap();
    [ids(&case["ids"]), ids(&case["generated"])].concat()
}

/// A tiny checkpoint on `device` with a context of 128 and two CPU threads.
pub fn tiny(model: &str, device: DeviceChoice) -> Engine {
    Engine::load(hf_dir(model), &LoadOptions { device, n_ctx: Some(128), threads: Some(2), ..Default::default() }, None).unwrap()
}

/// The upper 0.1% point of the chi-square distribution with `df` degrees of freedom
/// (Wilson-Hilferty).
pub fn chi2_crit(df: f64) -> f64 {
    let z = 3.090;
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Asserts that token `at` of the `plain` and `fast` generations (one per seed each) comes
/// from the same distribution: a two-sample chi-square over the tokens seen at least 10 times
/// in all (the rest pooled), below the 0.1% point, with at least 2 degrees of freedom.
pub fn assert_same_distribution(plain: &[Vec<u32>], fast: &[Vec<u32>], at: usize) {
    let mut counts: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
    for (ids, arm) in plain.iter().map(|v| (v, 0)).chain(fast.iter().map(|v| (v, 1))) {
        let c = counts.entry(ids[at]).or_default();
        if arm == 0 { c.0 += 1.0 } else { c.1 += 1.0 }
    }
    let (mut bins, mut rest) = (Vec::new(), (0.0, 0.0));
    for (_, (a, f)) in counts {
        if a + f >= 10.0 { bins.push((a, f)) } else { rest = (rest.0 + a, rest.1 + f) }
    }
    if rest.0 + rest.1 > 0.0 {
        bins.push(rest);
    }
    let stat: f64 = bins.iter().map(|(a, f)| (a - f).powi(2) / (a + f)).sum();
    let df = (bins.len() - 1) as f64;
    assert!(df >= 2.0, "token {at}: too few distinct tokens ({})", bins.len());
    assert!(stat < chi2_crit(df), "token {at}: chi-square {stat:.1} over {df} degrees of freedom (0.1% point {:.1})", chi2_crit(df));
    println!("token {at}: chi-square {stat:.1}, {df} degrees of freedom (0.1% point {:.1})", chi2_crit(df));
}

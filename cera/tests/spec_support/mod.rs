//! The speculative-decoding tests' distribution check: a two-sample chi-square test of sampled
//! tokens with and without drafts.

#![allow(dead_code)]

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

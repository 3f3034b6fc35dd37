//! `CERA_ABLATE`: what each kernel family costs inside the real decode chain (a diagnostic for
//! timing only: the generated tokens are wrong while it is set).
//!
//! The profile (`cera bench --profile`) serialises every dispatch around timestamps, so it
//! overstates small kernels and says nothing of the drain and ramp between dependent ones. This
//! switch changes the decode plan instead, and the bench's tok/s difference is the family's
//! cost in place: `CERA_ABLATE` is a comma list of `-NAME` (drop every dispatch whose kernel
//! name contains NAME) and `+NAME` (record each such dispatch twice in a row, so the cost of
//! one more dependent copy shows). Example: `CERA_ABLATE=+attn_decode` or `-attn_decode,+_epglu`.

use numr::gpu::Plan;

/// `plan` with the dispatches `CERA_ABLATE` names dropped or doubled (unchanged when unset).
pub(crate) fn ablated(plan: Plan) -> Plan {
    let Ok(spec) = std::env::var("CERA_ABLATE") else { return plan };
    let rules: Vec<(bool, String)> = spec
        .split(',')
        .filter_map(|r| {
            let r = r.trim();
            let (twice, name) = (r.starts_with('+'), r.trim_start_matches(['+', '-']));
            (!name.is_empty()).then(|| (twice, name.to_string()))
        })
        .collect();
    let mut out = Plan::new();
    let (mut dropped, mut doubled) = (0, 0);
    for d in plan.dispatches() {
        let name = d.kernel().name();
        let copies = match rules.iter().find(|(_, n)| name.contains(n.as_str())) {
            Some((true, _)) => 2,
            Some((false, _)) => 0,
            None => 1,
        };
        dropped += usize::from(copies == 0);
        doubled += usize::from(copies == 2);
        for _ in 0..copies {
            out.push(d.clone());
        }
    }
    eprintln!("CERA_ABLATE={spec}: {dropped} decode dispatches dropped, {doubled} doubled (timing only: the output is wrong)");
    out
}

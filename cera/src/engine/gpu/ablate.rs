//! Ablation ([`Diagnostics::ablate`](super::super::tuning::Diagnostics::ablate)): what each kernel family costs inside the real decode
//! chain (a diagnostic for timing only: the generated tokens are wrong while a rule is set).
//!
//! The profile (`cera bench --profile`) serialises every dispatch around timestamps, so it
//! overstates small kernels and says nothing of the drain and ramp between dependent ones. The
//! rules change the decode plan instead, and the bench's tok/s difference is the family's cost
//! in place: `-NAME` drops every dispatch whose kernel name contains NAME, `+NAME` records each
//! such dispatch twice in a row, so the cost of one more dependent copy shows. Example:
//! `cera bench --diag ablate=+attn_decode` or `--diag ablate=-attn_decode,+_epglu`.

use numr::gpu::Plan;

use super::super::tuning::AblateRule;

/// `plan` with the dispatches `rules` name dropped or doubled (unchanged when there are none).
pub(crate) fn ablated(plan: Plan, rules: &[AblateRule]) -> Plan {
    if rules.is_empty() {
        return plan;
    }
    let mut out = Plan::new();
    let (mut dropped, mut doubled) = (0, 0);
    for d in plan.dispatches() {
        let name = d.kernel().name();
        let copies = match rules.iter().find(|r| name.contains(r.kernel.as_str())) {
            Some(r) if r.twice => 2,
            Some(_) => 0,
            None => 1,
        };
        dropped += usize::from(copies == 0);
        doubled += usize::from(copies == 2);
        for _ in 0..copies {
            out.push(d.clone());
        }
    }
    let spec: Vec<String> = rules.iter().map(|r| format!("{}{}", if r.twice { '+' } else { '-' }, r.kernel)).collect();
    eprintln!("ablate={}: {dropped} decode dispatches dropped, {doubled} doubled (timing only: the output is wrong)", spec.join(","));
    out
}

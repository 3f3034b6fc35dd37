//! The decode plan's dependent dispatches fused into chains ([`mod@numr::gpu::chain`]): each run
//! of consecutive dispatches with one workgroup size becomes one dispatch whose stages wait on
//! arrival counters instead of a barrier, so the GPU does not drain and ramp up between them.
//!
//! A chain never spans more than [`LAYERS_PER_CHAIN`] layers, so that every chain of a model
//! with identical layers has the same WGSL (one pipeline), and never more bindings than the
//! adapter allows. Whether chains run at all is [`Chains`] (`GpuBackend::with_chains`).
//!
//! Diagnostic switches, to measure what the chains give: `CERA_CHAIN` = `off`, `all` or a comma
//! list of kernel-name prefixes a stage must start with (for example `quant_gemv_q8`), which
//! overrides [`Chains::Auto`]; `CERA_CHAIN_LAYERS`: layers per chain; `CERA_CHAIN_MAX`: stages per
//! chain at most; `CERA_CHAIN_POLL` = `first`: only invocation 0 of a waiting workgroup polls
//! ([`numr::gpu::Poll`]); `CERA_CHAIN_VERBOSE`: print the chains and why a run was left unchained.

use std::sync::Arc;

use numr::gpu::{ChainOptions, GpuContext, Plan, PlanDispatch, Poll, chain_plan};

use super::super::options::Chains;

/// Layers per chain.
pub(crate) const LAYERS_PER_CHAIN: usize = 1;

/// `plan` (whose layers start at dispatches `layer_starts`) with its chainable runs fused, where
/// `chains` (or `CERA_CHAIN`) enables them (`chain_plan` leaves every dispatch as it is on an
/// adapter that cannot run chains).
pub(crate) fn chained(ctx: &GpuContext, plan: Plan, layer_starts: &[usize], chains: Chains) -> Plan {
    let env = std::env::var("CERA_CHAIN").ok().filter(|_| chains == Chains::Auto);
    let mode = env.unwrap_or_else(|| if chains.enabled(ctx.capabilities()) { "all".into() } else { "off".into() });
    if mode == "off" {
        return plan;
    }
    let per = std::env::var("CERA_CHAIN_LAYERS").ok().and_then(|v| v.parse().ok()).unwrap_or(LAYERS_PER_CHAIN).max(1);
    let breaks: Vec<usize> = layer_starts.iter().step_by(per).copied().collect();
    let max_stages = std::env::var("CERA_CHAIN_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX);
    let filter: Arc<dyn Fn(&PlanDispatch) -> bool + Send + Sync> = if mode == "all" {
        Arc::new(|_| true)
    } else {
        let prefixes: Vec<String> = mode.split(',').map(|s| s.trim().to_string()).collect();
        Arc::new(move |d: &PlanDispatch| prefixes.iter().any(|p| d.kernel().name().starts_with(p.as_str())))
    };
    let poll = if std::env::var("CERA_CHAIN_POLL").is_ok_and(|v| v == "first") { Poll::First } else { Poll::Every };
    let (fused, refused) = chain_plan(ctx, &plan, &ChainOptions { max_stages, filter, breaks, poll });
    if std::env::var_os("CERA_CHAIN_VERBOSE").is_some() {
        eprintln!("chains: {} decode dispatches -> {}", plan.dispatches().len(), fused.dispatches().len());
        for d in fused.dispatches() {
            eprintln!("  {}", d.kernel().name());
        }
        for e in &refused {
            eprintln!("  left unchained: {e}");
        }
    }
    fused
}

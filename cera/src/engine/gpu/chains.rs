//! The decode plan's dependent dispatches fused into chains ([`mod@numr::gpu::chain`]): each run
//! of consecutive dispatches with one workgroup size becomes one dispatch whose stages wait on
//! arrival counters instead of a barrier, so the GPU does not drain and ramp up between them.
//!
//! A chain never spans more than [`GpuTuning::chain_layers`] layers, so that every chain of a
//! model with identical layers has the same WGSL (one pipeline), and never more bindings than
//! the adapter allows. Whether chains run at all is [`GpuTuning::chains`]
//! (`GpuBackend::with_chains`); [`GpuTuning::chain_kernels`], [`GpuTuning::chain_max`] and
//! [`GpuTuning::chain_poll`] choose which stages join and how they wait, to measure what the
//! chains give; [`Diagnostics::chain_verbose`](super::super::tuning::Diagnostics::chain_verbose)
//! prints the chains and why a run was left unchained.

use std::sync::Arc;

use numr::gpu::{ChainOptions, GpuContext, Plan, PlanDispatch, Poll, chain_plan};

use super::super::tuning::{ChainPoll, GpuTuning};

/// `plan` (whose layers start at dispatches `layer_starts`) with its chainable runs fused, where
/// the tuning enables them (`chain_plan` leaves every dispatch as it is on an adapter that
/// cannot run chains); `verbose` prints them.
pub(crate) fn chained(ctx: &GpuContext, plan: Plan, layer_starts: &[usize], t: &GpuTuning, verbose: bool) -> Plan {
    if !t.chains.enabled(ctx.capabilities()) {
        return plan;
    }
    let breaks: Vec<usize> = layer_starts.iter().step_by(t.chain_layers.max(1)).copied().collect();
    let max_stages = t.chain_max.unwrap_or(usize::MAX);
    let filter: Arc<dyn Fn(&PlanDispatch) -> bool + Send + Sync> = if t.chain_kernels.is_empty() {
        Arc::new(|_| true)
    } else {
        let prefixes = t.chain_kernels.clone();
        Arc::new(move |d: &PlanDispatch| prefixes.iter().any(|p| d.kernel().name().starts_with(p.as_str())))
    };
    let poll = match t.chain_poll {
        ChainPoll::Every => Poll::Every,
        ChainPoll::First => Poll::First,
    };
    let (fused, refused) = chain_plan(ctx, &plan, &ChainOptions { max_stages, filter, breaks, poll });
    if verbose {
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

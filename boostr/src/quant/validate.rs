//! Checks shared by the quantized plans: binding sizes, 32-bit sizes, thread counts.

use numr::gpu::{Binding, Capabilities, KernelEnv, StepValues};

use super::{QuantError, Result};

/// `v` as a u32 kernel word, or [`QuantError::TooLarge`] naming `what`.
pub(crate) fn to_u32(what: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| QuantError::TooLarge { what, value: v as u64 })
}

/// `a * b`, or [`QuantError::TooLarge`] naming `what` when it overflows.
pub(crate) fn mul(what: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(QuantError::TooLarge { what, value: u64::MAX })
}

/// Checks that a kernel indexing `elems` elements of `elem_bytes` each (indices below `elems`,
/// which must fit a u32 word) fits binding `b`, named `buffer` in errors.
pub(crate) fn check_binding(op: &'static str, buffer: &'static str, b: &Binding, elems: usize, elem_bytes: u64) -> Result<()> {
    to_u32(buffer, elems)?;
    let needed = (elems as u64).checked_mul(elem_bytes).ok_or(QuantError::TooLarge { what: buffer, value: u64::MAX })?;
    if b.size < needed {
        return Err(QuantError::BufferTooSmall { op, buffer, needed, actual: b.size });
    }
    Ok(())
}

/// Checks a workgroup of `threads` invocations that reduces `sums` partial sums per invocation
/// (`wg_reduce_<sums>` of [`super::gemv`]): a power of two within the adapter's limit and at least
/// `sums` (invocation `i < sums` writes sum `i`).
pub(crate) fn check_threads(what: &'static str, caps: &Capabilities, threads: u32, sums: u32) -> Result<()> {
    let max = caps.limits.max_compute_invocations_per_workgroup.min(caps.limits.max_compute_workgroup_size_x);
    if !threads.is_power_of_two() || threads > max || threads < sums {
        return Err(QuantError::Config {
            what,
            reason: format!("{threads} threads per workgroup (a power of two, at most {max}, at least the {sums} sums it reduces)"),
        });
    }
    Ok(())
}

/// The kernel environment of an adapter.
pub(crate) fn env_of(caps: &Capabilities) -> KernelEnv {
    KernelEnv::from_caps(caps)
}

/// The rows a step of a plan built for `max` rows computes: `n_tok`, never more than `max` (the
/// plans' `record` refuses larger steps; the clamp keeps an appended plan in bounds anyway).
pub(crate) fn step_rows(s: &StepValues, max: u32) -> u32 {
    s.n_tok.min(max)
}

/// [`QuantError::StepTooLarge`] when `step` has more tokens than `max`.
pub(crate) fn check_step(op: &'static str, step: &StepValues, max: usize) -> Result<()> {
    if step.n_tok as usize > max {
        return Err(QuantError::StepTooLarge { op, n_tok: step.n_tok, max });
    }
    Ok(())
}

//! Early submits: a step of hundreds of dispatches that the host records and submits at once
//! leaves the GPU idle while wgpu encodes all of them (3.5–4.3 µs a dispatch on the H200), and a
//! step the host then waits for pays that encoding in full. [`record_with_lead`] submits the
//! step's first `lead` dispatches at once, then `2 * lead`, `4 * lead`, ..., so the GPU runs the
//! first layers while the host encodes the rest; the last part stays in the caller's recorder
//! with whatever it records after (the sampler, the readbacks), for the caller to submit.
//!
//! Used by a prefill chunk, a speculative verification step and a batched step; a pipelined
//! decode step (whose encoding already overlaps the GPU's previous step) submits once.

use numr::gpu::{PlanDispatch, Recorder, StepValues};

use super::super::backend::StepCounters;

/// Records `dispatches` with `values` into `rec`, submitting leading parts of doubling size
/// (`lead`, `2 * lead`, ... dispatches recorded; 0: none) on the way. A dispatch the step skips
/// (an empty grid, such as a GEMM's other row bands) counts in no part. Returns what the early
/// submits held (dispatches, passes, submits); the rest is in `rec`, not submitted. Work already
/// in `rec` goes out with the first part.
pub(super) fn record_with_lead(rec: &mut Recorder, dispatches: &[PlanDispatch], values: &StepValues, lead: usize) -> numr::Result<StepCounters> {
    let mut made = StepCounters::default();
    let (mut size, mut in_part) = (lead, 0);
    for (i, d) in dispatches.iter().enumerate() {
        let before = rec.dispatch_count();
        d.record(rec, values)?;
        in_part += rec.dispatch_count() - before;
        if size > 0 && in_part >= size && i + 1 < dispatches.len() {
            made.dispatches += rec.dispatch_count();
            made.passes += rec.pass_count();
            made.submits += 1;
            rec.submit_and_clear()?;
            (size, in_part) = (size * 2, 0);
        }
    }
    Ok(made)
}

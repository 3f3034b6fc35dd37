//! The step trace ([`Diagnostics::step_trace`](super::super::tuning::Diagnostics::step_trace),
//! `--diag step_trace=1`): where a decode loop's host time goes (a diagnostic, off by default).
//!
//! Each submitted step records when its recording started and was submitted, and when its
//! readback was waited for and returned. When the executor is reset (a new generation) or
//! dropped (the end of `cera run`), the summary goes to stderr: per step, the host's recording
//! and submit, the time blocked in the readback, the period between two readbacks, and how many
//! readbacks had to wait for all queued work ([`numr::GpuContext::read_wait_fallbacks`]). A
//! GPU-bound loop blocks in the readback for most of the period; a host-bound one hardly at all.

use std::time::Instant;

use numr::GpuContext;

pub(crate) struct StepTrace {
    ctx: GpuContext,
    on: bool,
    submits: Vec<(Instant, Instant)>,
    collects: Vec<(Instant, Instant)>,
    fallbacks_at_start: u64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

impl StepTrace {
    /// A trace that records and prints when `on`.
    pub(crate) fn new(ctx: &GpuContext, on: bool) -> Self {
        StepTrace { ctx: ctx.clone(), on, submits: Vec::new(), collects: Vec::new(), fallbacks_at_start: ctx.read_wait_fallbacks() }
    }

    pub(crate) fn start(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    pub(crate) fn submitted(&mut self, t0: Option<Instant>) {
        if let Some(t0) = t0 {
            self.submits.push((t0, Instant::now()));
        }
    }

    pub(crate) fn collected(&mut self, t0: Option<Instant>) {
        if let Some(t0) = t0 {
            self.collects.push((t0, Instant::now()));
        }
    }

    /// Prints the summary of the steps since the last flush (when on and at least three ran),
    /// and starts counting anew.
    pub(crate) fn flush(&mut self) {
        if self.on && self.collects.len() >= 3 {
            self.print();
        }
        self.submits.clear();
        self.collects.clear();
        self.fallbacks_at_start = self.ctx.read_wait_fallbacks();
    }

    fn print(&self) {
        let us = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e6;
        let mut record: Vec<f64> = self.submits.iter().map(|&(a, b)| us(a, b)).collect();
        let mut wait: Vec<f64> = self.collects.iter().map(|&(a, b)| us(a, b)).collect();
        let mut period: Vec<f64> = self.collects.windows(2).map(|w| us(w[0].1, w[1].1)).collect();
        let fallbacks = self.ctx.read_wait_fallbacks() - self.fallbacks_at_start;
        let total = us(self.collects[0].1, self.collects[self.collects.len() - 1].1);
        eprintln!(
            "step trace: {} steps, {:.0} µs/step over the run; record+submit p50 {:.0} p90 {:.0}; readback wait p10 {:.0} p50 {:.0} p90 {:.0}; period p10 {:.0} p50 {:.0} p90 {:.0}; readbacks that waited for everything: {}",
            self.collects.len(),
            total / (self.collects.len() - 1) as f64,
            pct(&mut record, 0.5),
            pct(&mut record, 0.9),
            pct(&mut wait, 0.1),
            pct(&mut wait, 0.5),
            pct(&mut wait, 0.9),
            pct(&mut period, 0.1),
            pct(&mut period, 0.5),
            pct(&mut period, 0.9),
            fallbacks
        );
    }
}

impl Drop for StepTrace {
    fn drop(&mut self) {
        self.flush();
    }
}

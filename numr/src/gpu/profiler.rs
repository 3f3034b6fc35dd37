//! Opt-in GPU timestamps: [`super::Recorder::submit_profiled`] writes a timestamp before and after
//! every dispatch (inside the pass where the adapter allows it, else one pass per dispatch) and
//! reports GPU time per labelled dispatch.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::context::GpuContext;
use crate::error::{NumrError, Result};

const QUERIES_PER_SET: u32 = 4096;

/// GPU time of each dispatch of one profiled submit, in recording order.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// One `(label, GPU nanoseconds)` per dispatch.
    pub entries: Vec<(Arc<str>, f64)>,
}

impl Profile {
    /// Total GPU nanoseconds over all dispatches.
    pub fn total_ns(&self) -> f64 {
        self.entries.iter().map(|e| e.1).sum()
    }

    /// Nanoseconds and count per label, sorted by label.
    pub fn by_label(&self) -> BTreeMap<String, (f64, usize)> {
        let mut m = BTreeMap::new();
        for (l, ns) in &self.entries {
            let e = m.entry(l.to_string()).or_insert((0.0, 0));
            e.0 += ns;
            e.1 += 1;
        }
        m
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (label, (ns, n)) in self.by_label() {
            writeln!(f, "{:>10.1} us  {:>5}x  {label}", ns / 1e3, n)?;
        }
        write!(f, "{:>10.1} us  total", self.total_ns() / 1e3)
    }
}

pub(crate) struct QueryPlan {
    sets: Vec<wgpu::QuerySet>,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    n: u32,
    pass_level: bool,
}

impl QueryPlan {
    pub(crate) fn new(ctx: &GpuContext, dispatches: u32) -> Result<Self> {
        let caps = ctx.capabilities();
        if !caps.timestamps {
            return Err(NumrError::MissingFeature("TIMESTAMP_QUERY"));
        }
        let queries = dispatches.max(1) * 2;
        let dev = ctx.device();
        let sets = ctx.scoped("creating timestamp queries", || {
            (0..queries.div_ceil(QUERIES_PER_SET))
                .map(|i| {
                    let count = (queries - i * QUERIES_PER_SET).min(QUERIES_PER_SET);
                    dev.create_query_set(&wgpu::QuerySetDescriptor { label: Some("numr-profile"), ty: wgpu::QueryType::Timestamp, count })
                })
                .collect::<Vec<_>>()
        })?;
        let bytes = queries as u64 * 8;
        let mk = |usage| dev.create_buffer(&wgpu::BufferDescriptor { label: Some("numr-profile"), size: bytes, usage, mapped_at_creation: false });
        let resolve = mk(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC);
        let readback = mk(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST);
        Ok(QueryPlan { sets, resolve, readback, n: dispatches, pass_level: !caps.timestamps_inside_passes })
    }

    /// True when timestamps can only be written at pass boundaries (one pass per dispatch).
    pub(crate) fn pass_level(&self) -> bool {
        self.pass_level
    }

    fn slot(&self, q: u32) -> (&wgpu::QuerySet, u32) {
        (&self.sets[(q / QUERIES_PER_SET) as usize], q % QUERIES_PER_SET)
    }

    pub(crate) fn pass_writes(&self, dispatch: u32) -> wgpu::ComputePassTimestampWrites<'_> {
        let (set, i) = self.slot(dispatch * 2);
        // Both queries of one dispatch are in the same set: the set size is even.
        wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(i), end_of_pass_write_index: Some(i + 1) }
    }

    pub(crate) fn write_before(&self, pass: &mut wgpu::ComputePass<'_>, dispatch: u32) {
        let (set, i) = self.slot(dispatch * 2);
        pass.write_timestamp(set, i);
    }

    pub(crate) fn write_after(&self, pass: &mut wgpu::ComputePass<'_>, dispatch: u32) {
        let (set, i) = self.slot(dispatch * 2 + 1);
        pass.write_timestamp(set, i);
    }

    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        let total = self.n.max(1) * 2;
        for (s, set) in self.sets.iter().enumerate() {
            let first = s as u32 * QUERIES_PER_SET;
            let count = (total - first).min(QUERIES_PER_SET);
            enc.resolve_query_set(set, 0..count, &self.resolve, first as u64 * 8);
        }
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, total as u64 * 8);
    }

    pub(crate) fn read(self, ctx: &GpuContext, labels: Vec<Arc<str>>, submission: &super::Submission) -> Result<Profile> {
        let ticks: Vec<u64> = super::transfer::map_read(ctx, &self.readback, 0, self.n as u64 * 16, submission, |b| bytemuck::cast_slice(b).to_vec())?;
        let period = ctx.queue().get_timestamp_period() as f64;
        let entries = labels.into_iter().enumerate().map(|(i, l)| (l, ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period)).collect();
        Ok(Profile { entries })
    }
}

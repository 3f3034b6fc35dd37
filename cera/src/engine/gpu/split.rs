//! A model's layers split across GPUs ([`SplitBackend`]): each device holds the weights, plans
//! and KV cache of its own [`Stage`] of the graph (its layers; the embedding on the first, the
//! final norm and the LM head on the last) and runs it as one [`GpuBackend`] does.
//!
//! A step runs the stages in order. wgpu has no copy between devices, so what crosses a
//! boundary ([`Stage::live_out`]: the residual stream and the block output not yet added to it,
//! `n x dim` f32 each) is read back into host memory through a mapped staging buffer and written
//! into the next device's slots before its step is submitted (the rows' reads go out in the
//! same submit as the step). The host records each device's step while the device before it
//! runs ([`GpuState::record_deferred`]), so recording is off the critical path: the first
//! device's next step is recorded while the last device still runs this one, and a greedy
//! step's id ([`StepInput::LastArgmax`]) is written just before that step is submitted, once
//! the last device's argmax is back. The last device's output is collected by
//! [`BackendState::collect`], so a session pipelines a split model as it does one device.
//!
//! Batched steps ([`BatchState`], the batcher and `cera serve`) run the same way
//! ([`super::split_batch`]): each device keeps a paged cache of its layers with the same block
//! numbering, so one block table serves every device, and a step's rows cross each boundary
//! lane by lane, in micro-batches that keep the devices busy at once.
//!
//! A speculative verification step runs each device's verification plan the same way; a profiled
//! step gives each device's kernels under its index (`dev0:`, `dev1:`, ...).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use numr::gpu::GpuContext;

use super::super::EngineError;
use super::super::backend::{Backend, BackendState, KernelTime, LoadProgress, MAX_IN_FLIGHT, ProgressFn, StateOpts, StepCounters, StepInput, StepOutput, Want};
use super::super::batch::{BatchOpts, BatchState};
use super::super::graph::ModelGraph;
use super::super::split::Stage;
use super::super::weights::WeightSource;
use super::GpuBackend;
use super::split_batch::SplitBatch;
use super::state::GpuState;
use super::weights::total_bytes;

/// A model whose layers are split across several GPUs.
pub struct SplitBackend {
    stages: Vec<(GpuBackend, Stage)>,
}

impl SplitBackend {
    /// Loads each stage of `graph` over `ranges` (one per context, consecutive layers:
    /// [`super::super::split::split_layers`]) onto its device, in order; `configure` sets each
    /// device's options (GEMV activations, tuning). Progress counts the bytes of every device.
    pub fn load(
        ctxs: Vec<Arc<GpuContext>>,
        graph: &ModelGraph,
        ranges: &[Range<usize>],
        src: &dyn WeightSource,
        progress: Option<ProgressFn<'_>>,
        configure: &dyn Fn(GpuBackend) -> GpuBackend,
    ) -> Result<SplitBackend, EngineError> {
        if ctxs.len() != ranges.len() {
            return Err(EngineError::Usage(format!("{} devices for {} layer ranges", ctxs.len(), ranges.len())));
        }
        let stages = graph.stages(ranges)?;
        let totals = stages.iter().map(|s| total_bytes(&s.graph, src)).collect::<Result<Vec<_>, _>>()?;
        let total: u64 = totals.iter().sum();
        let mut out = Vec::with_capacity(stages.len());
        let mut offset = 0;
        for ((ctx, stage), t) in ctxs.into_iter().zip(stages).zip(totals) {
            let each = |p: LoadProgress| {
                if let Some(f) = progress {
                    f(LoadProgress { done: offset + p.done, total });
                }
            };
            let backend = configure(GpuBackend::load(ctx, &stage.graph, src, Some(&each))?);
            out.push((backend, stage));
            offset += t;
        }
        Ok(SplitBackend { stages: out })
    }

    /// Each device's backend and stage, first layers first.
    pub fn stages(&self) -> impl Iterator<Item = (&GpuBackend, &Stage)> {
        self.stages.iter().map(|(b, s)| (b, s))
    }
}

impl Backend for SplitBackend {
    fn new_state(&self, opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError> {
        let states = self.stages.iter().map(|(b, _)| GpuState::new(b, opts)).collect::<Result<Vec<_>, _>>()?;
        let stages = self.stages.iter().map(|(_, s)| s.clone()).collect();
        Ok(Box::new(SplitState { states, stages, outputs: VecDeque::new(), newest_argmax: false, last: None, counters: StepCounters::default() }))
    }

    fn device_name(&self) -> String {
        let parts: Vec<String> = self.stages.iter().map(|(b, s)| format!("{} (layers {}-{})", b.device_name(), s.layers.start, s.layers.end - 1)).collect();
        parts.join(" + ")
    }

    fn is_gpu(&self) -> bool {
        true
    }

    fn weight_write_time(&self) -> Option<Duration> {
        Some(self.stages.iter().filter_map(|(b, _)| b.weight_write_time()).sum())
    }

    fn weight_wait_time(&self) -> Option<Duration> {
        Some(self.stages.iter().filter_map(|(b, _)| b.weight_wait_time()).sum())
    }

    fn new_batch(&self, opts: &BatchOpts) -> Result<Box<dyn BatchState>, EngineError> {
        Ok(Box::new(SplitBatch::new(&self.stages, opts)?))
    }
}

/// One sequence of a split model: a state per device.
struct SplitState {
    states: Vec<GpuState>,
    stages: Vec<Stage>,
    /// Outputs taken from the last device before [`BackendState::collect`] asked for them (a
    /// greedy step waited there for the id before it), oldest first; the later ones are still
    /// in the last device's queue.
    outputs: VecDeque<StepOutput>,
    /// The newest step submitted wants [`Want::Argmax`] (its id feeds [`StepInput::LastArgmax`]).
    newest_argmax: bool,
    /// That id, once it has come back.
    last: Option<u32>,
    counters: StepCounters,
}

/// What [`SplitState::run`] runs on each device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    Verify,
    /// A step with device timestamps.
    Profile,
}

impl SplitState {
    /// Runs a step, a verification step or a profiled step on every device in turn and returns
    /// the last device's outputs, with every device's kernel times when profiled (each label
    /// under its device's index: `dev0:`, `dev1:`, ...).
    fn run(&mut self, tokens: &[u32], pos: usize, want: Want, run: Run) -> Result<(Vec<StepOutput>, Vec<KernelTime>), EngineError> {
        let n = tokens.len();
        let start = std::time::Instant::now();
        let verify = run == Run::Verify;
        let mut counters = StepCounters::default();
        let (mut carried, mut times): (Vec<Vec<f32>>, Vec<KernelTime>) = (Vec::new(), Vec::new());
        let last = self.states.len() - 1;
        let mut out = Vec::new();
        for (i, (st, stage)) in self.states.iter_mut().zip(&self.stages).enumerate() {
            if verify {
                st.prepare_verify()?;
            }
            for (slot, rows) in stage.live_in.iter().zip(&carried) {
                st.write_rows(*slot, n, rows, verify)?;
            }
            let w = if i == last { want } else { Want::Nothing };
            out = match run {
                Run::Verify => st.verify(tokens, pos, w)?,
                Run::Profile => {
                    let (o, t) = st.profile_step(StepInput::Tokens(tokens), pos, w)?;
                    times.extend(t.into_iter().map(|k| KernelTime { label: format!("dev{i}:{}", k.label), ..k }));
                    vec![o]
                }
            };
            let c = st.last_step_counters();
            (counters.dispatches, counters.passes, counters.submits) =
                (counters.dispatches + c.dispatches, counters.passes + c.passes, counters.submits + c.submits);
            if i < last {
                carried = st.read_rows(&stage.live_out, n, verify)?;
                counters.submits += 1;
            }
        }
        counters.host_ns = start.elapsed().as_nanos() as u64;
        self.counters = counters;
        Ok((out, times))
    }

    fn last_state(&mut self) -> &mut GpuState {
        self.states.last_mut().expect("a split has at least one device")
    }

    /// The last device's oldest outstanding output; the newest step's id when it was that one.
    fn collect_last(&mut self) -> Result<StepOutput, EngineError> {
        let o = self.last_state().collect()?;
        if self.last_state().in_flight() == 0
            && self.newest_argmax
            && let StepOutput::Argmax(id) = o
        {
            self.last = Some(id);
        }
        Ok(o)
    }

    /// A step's ids: `input`'s, or (in `one`) the id the newest step's argmax chose. Whatever
    /// happens to the step, that id is no longer the newest after it.
    fn take_ids<'a>(&mut self, input: StepInput<'a>, one: &'a mut [u32; 1]) -> Result<&'a [u32], EngineError> {
        let ids = match input {
            StepInput::Tokens(t) => t,
            StepInput::LastArgmax => {
                one[0] = self.newest_id()?;
                &one[..]
            }
        };
        (self.newest_argmax, self.last) = (false, None);
        Ok(ids)
    }

    /// The id the newest step's argmax chose, waiting for it (the outputs before it are kept
    /// for [`BackendState::collect`]).
    fn newest_id(&mut self) -> Result<u32, EngineError> {
        if !self.newest_argmax {
            return Err(EngineError::Usage("StepInput::LastArgmax without a previous argmax".into()));
        }
        while self.last.is_none() && self.last_state().in_flight() > 0 {
            let o = self.collect_last()?;
            self.outputs.push_back(o);
        }
        self.last.ok_or_else(|| EngineError::Usage("StepInput::LastArgmax without a previous argmax".into()))
    }
}

impl BackendState for SplitState {
    /// Records each device's step while the device before it runs: the first device's while
    /// the last still runs the step before (a greedy step's id is written just before the
    /// submit), each later device's while the one before runs this step; then waits for the
    /// rows it needs, writes them, and submits. The last device's output is collected later.
    fn submit(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(), EngineError> {
        if self.in_flight() >= MAX_IN_FLIGHT {
            return Err(EngineError::Usage(format!("a step submitted with {MAX_IN_FLIGHT} outstanding (collect one first)")));
        }
        let n = match input {
            StepInput::Tokens(t) => t.len(),
            StepInput::LastArgmax if !self.newest_argmax => return Err(EngineError::Usage("StepInput::LastArgmax without a previous argmax".into())),
            StepInput::LastArgmax => 1,
        };
        let last = self.states.len() - 1;
        let w = |i: usize| if i == last { want } else { Want::Nothing };
        let d0 = self.states[0].record_deferred(n, pos, w(0), &self.stages[0].live_out)?;
        let mut one = [0];
        let tokens = self.take_ids(input, &mut one)?;
        let mut counters = StepCounters::default();
        let mut rows = self.states[0].submit_deferred(d0, tokens)?;
        for i in 0..=last {
            if i > 0 {
                let d = self.states[i].record_deferred(n, pos, w(i), &self.stages[i].live_out)?;
                for (slot, r) in self.stages[i].live_in.iter().zip(rows) {
                    let v: Vec<f32> = bytemuck::pod_collect_to_vec(&r.wait().map_err(|e| self.states[i - 1].err(e))?);
                    self.states[i].write_rows(*slot, n, &v, false)?;
                }
                rows = self.states[i].submit_deferred(d, tokens)?;
            }
            let c = self.states[i].last_step_counters();
            (counters.dispatches, counters.passes, counters.submits) =
                (counters.dispatches + c.dispatches, counters.passes + c.passes, counters.submits + c.submits);
            if i < last {
                // Its output is nothing: only the rows went on.
                self.states[i].collect()?;
            }
        }
        self.counters = counters;
        self.newest_argmax = want == Want::Argmax;
        Ok(())
    }

    fn collect(&mut self) -> Result<StepOutput, EngineError> {
        if let Some(o) = self.outputs.pop_front() {
            return Ok(o);
        }
        if self.last_state().in_flight() == 0 {
            return Err(EngineError::Usage("collecting a step that was not submitted".into()));
        }
        self.collect_last()
    }

    fn in_flight(&self) -> usize {
        self.outputs.len() + self.states.last().map_or(0, |s| s.in_flight())
    }

    fn set_argmax_mask(&mut self, ids: &[u32]) -> Result<(), EngineError> {
        self.last_state().set_argmax_mask(ids)
    }

    fn applies_step_bits(&self) -> bool {
        true
    }

    fn set_step_bits(&mut self, bits: &[u32]) -> Result<(), EngineError> {
        self.last_state().set_step_bits(bits)
    }

    fn profile_step(&mut self, input: StepInput<'_>, pos: usize, want: Want) -> Result<(StepOutput, Vec<KernelTime>), EngineError> {
        if self.in_flight() > 0 {
            return Err(EngineError::Usage("a profiled step with steps outstanding (collect them first)".into()));
        }
        let mut one = [0];
        let tokens = self.take_ids(input, &mut one)?;
        let (mut out, times) = self.run(tokens, pos, want, Run::Profile)?;
        Ok((out.pop().unwrap_or(StepOutput::Nothing), times))
    }

    fn resume_floor(&self) -> usize {
        self.states.iter().map(|s| s.resume_floor()).max().unwrap_or(0)
    }

    fn verify(&mut self, tokens: &[u32], pos: usize, want: Want) -> Result<Vec<StepOutput>, EngineError> {
        if self.in_flight() > 0 {
            return Err(EngineError::Usage(format!("a verification step with {} steps not collected", self.in_flight())));
        }
        (self.newest_argmax, self.last) = (false, None);
        Ok(self.run(tokens, pos, want, Run::Verify)?.0)
    }

    fn prepare_verify(&mut self) -> Result<(), EngineError> {
        self.states.iter_mut().try_for_each(|s| s.prepare_verify())
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        self.outputs.clear();
        (self.newest_argmax, self.last) = (false, None);
        for s in &mut self.states {
            s.reset()?;
        }
        Ok(())
    }

    fn last_step_counters(&self) -> StepCounters {
        self.counters
    }
}

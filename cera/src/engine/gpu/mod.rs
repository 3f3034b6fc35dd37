//! The GPU executor of the model graph: weights uploaded once at load (`weights.rs`), per
//! sequence the graph turned into boostr plans over its own buffers and KV cache (`plans.rs`),
//! and a step recorded and submitted once per token (`state.rs`).

mod ablate;
mod batch;
mod chains;
mod fuse;
mod lead;
mod links;
mod plan_ops;
mod plans;
mod split;
mod split_batch;
mod state;
#[cfg(test)]
mod tests;
mod trace;
mod tuning;
mod weights;

#[cfg(test)]
pub(crate) use fuse::tests::config as test_config;

use std::sync::Arc;

use numr::gpu::GpuContext;

pub use split::SplitBackend;

use super::EngineError;
use super::backend::{Backend, BackendState, ProgressFn, StateOpts};
use super::graph::ModelGraph;
use super::options::{Chains, DecodeGemv};
use super::tuning::{Diagnostics, GpuTuning};
use super::weights::WeightSource;

/// The model uploaded to one GPU.
pub struct GpuBackend {
    ctx: Arc<GpuContext>,
    graph: Arc<ModelGraph>,
    weights: Arc<weights::GpuWeights>,
    device: String,
    decode_gemv: DecodeGemv,
    tuning: GpuTuning,
    diagnostics: Diagnostics,
}

pub(crate) fn device_name(ctx: &GpuContext) -> String {
    let c = ctx.capabilities();
    format!("{} ({})", c.adapter_name, c.backend)
}

pub(crate) fn dev_err(ctx: &GpuContext, e: numr::NumrError) -> EngineError {
    EngineError::Device { device: device_name(ctx), reason: e.to_string() }
}

pub(crate) fn ops_err(e: boostr::ops_common::OpsError) -> EngineError {
    EngineError::Device { device: "GPU".into(), reason: e.to_string() }
}

pub(crate) fn quant_err(ctx: &GpuContext, name: &str, e: boostr::quant::QuantError) -> EngineError {
    match e {
        boostr::quant::QuantError::Gpu(g) => dev_err(ctx, g),
        e => EngineError::Unsupported { what: format!("tensor {name}: {e}") },
    }
}

impl GpuBackend {
    /// Uploads every weight the graph names (progress in bytes) and checks that the plans of a
    /// sequence can be built (kernels compiled here, not at the first token).
    pub fn load(ctx: Arc<GpuContext>, graph: &ModelGraph, src: &dyn WeightSource, progress: Option<ProgressFn<'_>>) -> Result<GpuBackend, EngineError> {
        // Every write goes through the upload's bulk writer, whose last batch it waits for.
        let weights = weights::GpuWeights::upload(&ctx, graph, src, progress)?;
        let device = device_name(&ctx);
        Ok(GpuBackend {
            ctx,
            graph: Arc::new(graph.clone()),
            weights: Arc::new(weights),
            device,
            decode_gemv: DecodeGemv::Auto,
            tuning: GpuTuning::default(),
            diagnostics: Diagnostics::default(),
        })
    }

    /// The decode step's GEMV activations for the sequences made from now on.
    pub fn with_decode_gemv(mut self, d: DecodeGemv) -> GpuBackend {
        self.decode_gemv = d;
        self
    }

    /// Whether the decode step of the sequences made from now on runs each layer as one chain
    /// ([`GpuTuning::chains`]).
    pub fn with_chains(mut self, c: Chains) -> GpuBackend {
        self.tuning.chains = c;
        self
    }

    /// The plan builder's tuning for the sequences made from now on (default: the measured
    /// [`GpuTuning::default`]).
    pub fn with_tuning(mut self, t: GpuTuning) -> GpuBackend {
        self.tuning = t;
        self
    }

    /// Diagnostics for measuring the sequences made from now on. For measuring only: ablation
    /// makes the output wrong ([`Diagnostics`]).
    pub fn with_measuring_only_diagnostics(mut self, d: Diagnostics) -> GpuBackend {
        self.diagnostics = d;
        self
    }

    /// The context the model lives on.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Bytes of weights on the GPU.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes
    }
}

impl Backend for GpuBackend {
    fn new_batch(&self, opts: &super::batch::BatchOpts) -> Result<Box<dyn super::batch::BatchState>, EngineError> {
        Ok(Box::new(batch::GpuBatch::new(self, opts)?))
    }
    fn new_state(&self, opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError> {
        Ok(Box::new(state::GpuState::new(self, opts)?))
    }
    fn weight_write_time(&self) -> Option<std::time::Duration> {
        Some(self.weights.write_time)
    }

    fn weight_wait_time(&self) -> Option<std::time::Duration> {
        Some(self.weights.wait_time)
    }
    fn device_name(&self) -> String {
        self.device.clone()
    }
    fn is_gpu(&self) -> bool {
        true
    }
}

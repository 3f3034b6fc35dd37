//! The GPU executor of the model graph (boostr plans recorded per token).

use std::sync::Arc;

use numr::gpu::GpuContext;

use super::EngineError;
use super::backend::{Backend, BackendState, ProgressFn, StateOpts};
use super::graph::ModelGraph;
use super::weights::WeightSource;

/// The model uploaded to one GPU.
pub struct GpuBackend {
    ctx: Arc<GpuContext>,
}

impl GpuBackend {
    /// Uploads every weight the graph names and compiles every kernel.
    pub fn load(ctx: Arc<GpuContext>, graph: &ModelGraph, src: &dyn WeightSource, progress: Option<ProgressFn<'_>>) -> Result<GpuBackend, EngineError> {
        let _ = (graph, src, progress, ctx);
        Err(EngineError::Unsupported { what: "the GPU executor".into() })
    }
}

impl Backend for GpuBackend {
    fn new_state(&self, _opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError> {
        Err(EngineError::Unsupported { what: "the GPU executor".into() })
    }
    fn device_name(&self) -> String {
        format!("{} ({})", self.ctx.capabilities().adapter_name, self.ctx.capabilities().backend)
    }
    fn is_gpu(&self) -> bool {
        true
    }
}

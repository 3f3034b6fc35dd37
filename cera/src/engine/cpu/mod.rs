//! The CPU executor of the model graph (boostr's CPU references, threads over rows).

use super::EngineError;
use super::backend::{Backend, BackendState, ProgressFn, StateOpts};
use super::graph::ModelGraph;
use super::weights::WeightSource;

/// The model prepared for the CPU.
pub struct CpuBackend {
    _graph: ModelGraph,
}

impl CpuBackend {
    /// Prepares every weight the graph names; `threads` workers split each mat-vec by rows.
    pub fn load(graph: &ModelGraph, src: &dyn WeightSource, threads: usize, progress: Option<ProgressFn<'_>>) -> Result<CpuBackend, EngineError> {
        let _ = (src, threads, progress);
        Err(EngineError::Unsupported { what: format!("the CPU executor ({} is not assembled yet)", graph.cfg.arch.name()) })
    }
}

impl Backend for CpuBackend {
    fn new_state(&self, _opts: &StateOpts) -> Result<Box<dyn BackendState>, EngineError> {
        Err(EngineError::Unsupported { what: "the CPU executor".into() })
    }
    fn device_name(&self) -> String {
        "CPU".into()
    }
    fn is_gpu(&self) -> bool {
        false
    }
}

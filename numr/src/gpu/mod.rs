//! The wgpu side of numr: context, capabilities, buffer pool, kernels and pipeline cache,
//! recorder, profiler and transfers.

pub mod bulk;
pub mod capabilities;
pub mod chain;
pub mod context;
pub mod kernel;
pub mod pipeline;
pub mod plan;
pub mod pool;
pub mod profiler;
pub mod recorder;
pub mod submission;
pub mod transfer;
mod wgsl_names;

pub use bulk::BulkUpload;
pub use capabilities::{Capabilities, CoopMatShape, ParamMode};
pub use chain::{ChainOptions, Poll, chain, chain_bindings, chain_plan, chain_source, chain_with, chainable, chains_run_on};
pub use context::{GpuContext, GpuOptions, RuntimeChecks};
pub use kernel::{Access, KernelBuilder, KernelEnv, KernelParts, KernelSource, MAX_PARAM_WORDS, grid_2d};
pub use pipeline::{Binding, BoundGroup, Kernel};
pub use plan::{Plan, PlanDispatch, StepGrid, StepParam, StepValues};
pub use pool::{BufferKind, GpuBuffer, PoolStats, size_class};
pub use profiler::Profile;
pub use recorder::{Recorded, Recorder};
pub use submission::{PendingRead, ReadTarget, Submission};

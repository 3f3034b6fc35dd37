//! The GPU executor of the model graph (boostr plans recorded per token).

//! The CPU executor of the model graph (boostr's CPU references, threads over rows).

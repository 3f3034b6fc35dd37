//! WGSL generators for numr's core ops. Each family is a typed config with a `source` function;
//! `all_sources` lists every variant so a test can validate them with naga without a GPU.

pub mod binary;
pub mod convert;
pub mod matmul;
pub mod reduce;
pub mod snippets;
pub mod stream;

use crate::gpu::{KernelEnv, KernelSource};

/// Every kernel variant numr generates for `env`.
pub fn all_sources(env: &KernelEnv) -> Vec<KernelSource> {
    let mut v = Vec::new();
    v.extend(convert::Convert::all().iter().map(|k| k.source(env)));
    v.extend(binary::Binary::all().iter().map(|k| k.source(env)));
    v.extend(reduce::RowReduce::all().iter().map(|k| k.source(env)));
    v.extend(matmul::Matmul::all(env).iter().map(|k| k.source(env)));
    v.push(stream::StreamRead.source(env));
    v
}

//! naga validation (parse, validate, SPIR-V) of every generated variant of the decoder-block ops
//! in every kernel environment. No GPU needed.

use boostr::act::Act;
use boostr::attention::{AttnCombine, DecodeAttn, DecodeAttnSg, DecodeKernel, PrefillAttn, PrefillAttnCoop};
use boostr::conv::{ShortConv, ShortConvBatch};
use boostr::embedding::MatrixGather;
use boostr::norm::Norm;
use boostr::paged::{PagedAttn, PagedKvWrite};
use boostr::rope::QkvRope;
use boostr::sampling::{Argmax, Mask, MaskBits, Penalty, TopK};
use numr::gpu::{KernelEnv, KernelSource};
use numr::testing::validate_wgsl;

fn sources(env: &KernelEnv) -> Vec<KernelSource> {
    let mut v = Vec::new();
    v.extend(Norm::all().iter().flat_map(|c| [false, true].map(|v4| c.source_vec(env, v4))));
    v.extend(Act::all().iter().flat_map(|c| [false, true].map(|v4| c.source_vec(env, v4))));
    v.extend(QkvRope::all().iter().map(|c| c.source(env)));
    v.extend(DecodeAttn::all().iter().map(|c| c.source(env).unwrap()));
    if DecodeKernel::best(env) == DecodeKernel::Subgroup {
        // The fused merge needs @coherent storage: its variants exist only in such environments.
        v.extend(DecodeAttnSg::all().iter().filter(|c| !c.fused || env.coherent).map(|c| c.source(env).unwrap()));
    }
    v.extend(PrefillAttn::all().iter().map(|c| c.source(env).unwrap()));
    if env.f16 && env.subgroups {
        v.extend(PrefillAttnCoop::all().iter().map(|c| c.source(env).unwrap()));
    }
    v.extend([64, 128, 256].map(|head_dim| AttnCombine { head_dim }.source(env).unwrap()));
    v.extend(PagedAttn::all().iter().map(|c| c.source(env).unwrap()));
    v.extend(PagedKvWrite::all().iter().map(|c| c.source(env).unwrap()));
    v.extend([8, 16, 80, 96].map(|head_dim| AttnCombine { head_dim }.source(env).unwrap()));
    v.extend(ShortConv::all().iter().map(|c| c.source(env)));
    v.extend(ShortConvBatch::all().iter().map(|c| c.source(env)));
    v.extend(MatrixGather::all().iter().map(|c| c.source(env)));
    v.extend([true, false].map(|first| Argmax { first }.source(env)));
    v.extend([true, false].map(|first| TopK { first }.source(env)));
    v.push(Penalty.source(env));
    v.push(Mask.source(env));
    v.push(MaskBits.source(env));
    v.push(boostr::bias::bias_source(env));
    v
}

#[test]
fn every_variant_validates() {
    let mut n = 0;
    let mut failures = Vec::new();
    for env in KernelEnv::all_for_validation() {
        for src in sources(&env) {
            n += 1;
            if let Err(e) = validate_wgsl(&src.wgsl) {
                failures.push(format!("{} ({env:?}): {e}", src.name));
            }
        }
    }
    assert!(failures.is_empty(), "{} of {n} failed:\n{}", failures.len(), failures[..failures.len().min(4)].join("\n"));
}

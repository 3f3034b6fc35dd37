//! A step loop that keeps one recorder and reads back into targets made once
//! (`Recorder::submit_and_clear`, `Recorder::read_into`, `PendingRead::wait_with`):
//! - each step reads back exactly what its own plan wrote, two steps in flight, the recorder
//!   empty after each submit;
//! - a target with a read outstanding refuses a second one (a typed error) until that read is
//!   waited for or dropped, and a read that does not fit the target is refused.
//!
//! That such a loop allocates nothing on the host heap is asserted end to end in
//! `cera/tests/decode_allocations.rs`.

use numr::NumrError;
use numr::gpu::{Access, KernelBuilder, KernelEnv, Plan, PlanDispatch, StepValues};
use numr::testing::test_gpu;

#[test]
fn a_kept_recorder_and_read_targets_give_each_step_its_own_bytes() {
    let Some(ctx) = test_gpu() else { return };
    let env = KernelEnv::from_caps(ctx.capabilities());
    let src = KernelBuilder::new("step_loop_put", env)
        .storage("x", Access::ReadWrite, "array<u32>")
        .params(&["slot", "pos"])
        .body("    if (lidx == 0u) { x[p.slot] = 1000u + p.pos; }\n")
        .build();
    let k = ctx.kernel(&src).unwrap();
    let buf = ctx.upload(&[0u8; 64]).unwrap();
    let group = ctx.bind(&k, &[numr::gpu::Binding::whole(&buf)]).unwrap();
    // Step `pos` writes `1000 + pos` into word `pos % 2`.
    let plan = Plan::from(PlanDispatch::new(&k, group, [1, 1, 1]).unwrap().per_step("slot", |s| s.pos % 2).unwrap().per_step("pos", |s| s.pos).unwrap());
    let targets = [ctx.read_target(4).unwrap(), ctx.read_target(4).unwrap()];
    let mut rec = ctx.recorder();
    let mut pending = std::collections::VecDeque::new();
    let mut seen = Vec::new();
    for pos in 0..8u32 {
        plan.record(&mut rec, &StepValues::decode(pos)).unwrap();
        let t = targets.iter().find(|t| !t.is_busy()).expect("a free target");
        pending.push_back(rec.read_into(t, &buf, 4 * (pos as u64 % 2), 4).unwrap());
        assert_eq!(rec.dispatch_count(), 1);
        rec.submit_and_clear().unwrap();
        assert!(rec.is_empty() && rec.dispatch_count() == 0);
        if pending.len() == 2 {
            let r = pending.pop_front().unwrap();
            seen.push(r.wait_with(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap());
        }
    }
    while let Some(r) = pending.pop_front() {
        seen.push(r.wait_with(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap());
    }
    assert_eq!(seen, (1000..1008).collect::<Vec<u32>>());
    assert!(targets.iter().all(|t| !t.is_busy()));
}

#[test]
fn a_busy_or_small_target_is_refused() {
    let Some(ctx) = test_gpu() else { return };
    let buf = ctx.upload(&7u32.to_le_bytes().repeat(1024)).unwrap();
    let t = ctx.read_target(4).unwrap();
    let mut rec = ctx.recorder();
    let first = rec.read_into(&t, &buf, 0, 4).unwrap();
    assert!(t.is_busy());
    assert!(matches!(rec.read_into(&t, &buf, 4, 4), Err(NumrError::Validation { .. })));
    rec.submit_and_clear().unwrap();
    assert_eq!(first.wait().unwrap(), 7u32.to_le_bytes());
    assert!(!t.is_busy());
    // Dropping an unwaited read frees the target too.
    drop(rec.read_into(&t, &buf, 8, 4).unwrap());
    assert!(!t.is_busy());
    rec.submit_and_clear().unwrap();
    let big = t.capacity() + 4;
    assert!(matches!(rec.read_into(&t, &buf, 0, big), Err(NumrError::Validation { .. })));
    assert!(!t.is_busy());
    let again = rec.read_into(&t, &buf, 12, 4).unwrap();
    rec.submit_and_clear().unwrap();
    assert_eq!(again.wait_with(|b| b.to_vec()).unwrap(), 7u32.to_le_bytes());
}

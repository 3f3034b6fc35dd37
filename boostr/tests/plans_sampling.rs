//! Plans of sampling (argmax, top-k, the id mask, penalties): each recorded into an explicit
//! recorder equals its CPU reference and the eager path, and recorded several times with
//! different step values gives each step's result without being rebuilt.

#[path = "plans_ops_util.rs"]
mod util;

use boostr::ops_common::{OpPlan, pseudo_random as rnd};
use boostr::sampling::{self, ArgmaxPlan, MaskPlan, Penalties, PenaltyPlan, TopKPlan};
use numr::gpu::StepValues;
use util::*;

/// Logits with a tie: the lowest index wins.
fn logits_with_winner(n: usize, seed: u64, win: usize) -> Vec<f32> {
    let mut l = rnd(n, seed, 10.0);
    l[win] = 30.0;
    l[(win + 7) % n] = 30.0;
    l[n - 1 - win % 3] = f32::NEG_INFINITY;
    l
}

#[test]
fn argmax_plan_writes_slots() {
    let Some((ctx, _serial)) = gpu() else { return };
    for n in [1000usize, 10_001] {
        let ls: Vec<Vec<f32>> = [3usize, n / 2, n - 9].iter().enumerate().map(|(i, &w)| logits_with_winner(n, 20 + i as u64, w)).collect();
        let all = f32_buf(&ctx, &ls.concat());
        let logits = zeros(&ctx, n);
        let ids = zeros(&ctx, 4);
        let plan = ArgmaxPlan::new(&ctx, &(&logits).into(), n, Some((&ids).into()), 4).unwrap();
        let c = Counters::now(&ctx);
        let mut rec = ctx.recorder();
        for slot in 0..3 {
            copy_in(&mut rec, &all, slot * n, &logits, 0, n);
            plan.record(&mut rec, &StepValues::decode(9).with_token(slot as u32)).unwrap();
        }
        rec.submit().unwrap();
        c.unchanged(&ctx, "argmax");
        let got = read_u32(&ctx, &ids, 4);
        let vals = read_f32(&ctx, plan.values().buffer(), 3);
        for (slot, l) in ls.iter().enumerate() {
            let (id, v) = sampling::argmax_ref(l).unwrap();
            assert_eq!(got[slot], id, "n {n} slot {slot}");
            assert_eq!(vals[slot], v, "n {n} slot {slot} value");
            assert_eq!(sampling::argmax(&ctx, &tensor(&ctx, l, &[n])).unwrap(), id, "eager n {n} slot {slot}");
        }
        assert_eq!(got[3], 0, "slot 3 untouched");
    }
}

/// Every row of a step at once (a batched step's head): each row's winner, ties to the lowest
/// index, rows past the step's untouched; the same plan at another row count.
#[test]
fn argmax_rows_plan_takes_each_row() {
    let Some((ctx, _serial)) = gpu() else { return };
    for n in [700usize, 10_001] {
        let max_rows = 6;
        let mut ls: Vec<Vec<f32>> = (0..max_rows).map(|r| logits_with_winner(n, 40 + r as u64, (r * 977 + 5) % n)).collect();
        // A tie in row 1: the lower index wins.
        let top = ls[1].iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        ls[1][2] = top;
        let logits = f32_buf(&ctx, &ls.concat());
        let plan = ArgmaxPlan::rows(&ctx, &(&logits).into(), n, max_rows, None).unwrap();
        for rows in [max_rows, 4, 1] {
            let ids = plan.ids().clone();
            let mut rec = ctx.recorder();
            rec.clear(ids.buffer()).unwrap();
            plan.record(&mut rec, &StepValues::chunk(0, rows as u32)).unwrap();
            rec.submit().unwrap();
            let got = read_u32(&ctx, ids.buffer(), max_rows);
            for (r, l) in ls.iter().enumerate() {
                let want = if r < rows { sampling::argmax_ref(l).unwrap().0 } else { 0 };
                assert_eq!(got[r], want, "n {n}, {rows} rows: row {r}");
            }
        }
        assert_eq!(sampling::argmax_ref(&ls[1]).unwrap().0, 2);
    }
    let l = zeros(&ctx, 10);
    assert!(ArgmaxPlan::rows(&ctx, &(&l).into(), 6, 2, None).is_err(), "12 logits in a binding of 10");
}

/// Every row of a step at once (a batched step's sampling rows): each row's `k` best raw logits
/// and ids in order, as the reference gives them, over one, two and three rounds.
#[test]
fn top_k_rows_plan_takes_each_row() {
    let Some((ctx, _serial)) = gpu() else { return };
    for (n, k) in [(700usize, 40usize), (3000, 128), (70_000, 64)] {
        let max_rows = 3;
        let mut ls: Vec<Vec<f32>> = (0..max_rows).map(|r| logits_with_winner(n, 60 + r as u64, (r * 977 + 5) % n)).collect();
        // A tie in row 2: the lower id first.
        let top = ls[2].iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        ls[2][1] = top;
        let logits = f32_buf(&ctx, &ls.concat());
        let plan = TopKPlan::rows(&ctx, &(&logits).into(), n, k, max_rows).unwrap();
        for rows in [max_rows, 2] {
            let mut rec = ctx.recorder();
            rec.clear(plan.ids().buffer()).unwrap();
            plan.record(&mut rec, &StepValues::chunk(0, rows as u32)).unwrap();
            rec.submit().unwrap();
            let ids = read_u32(&ctx, plan.ids().buffer(), max_rows * k);
            let vals = read_f32(&ctx, plan.values().buffer(), max_rows * k);
            for (r, l) in ls.iter().enumerate().take(rows) {
                let want = sampling::top_k_ref(l, k, 1.0).unwrap();
                let got: Vec<(u32, f32)> = (0..k).map(|e| (ids[r * k + e], vals[r * k + e])).collect();
                assert_eq!(got, want, "n {n}, k {k}, {rows} rows: row {r}");
            }
            if rows < max_rows {
                assert!(ids[rows * k..].iter().all(|&i| i == 0), "n {n}: rows past the step untouched");
            }
        }
    }
    let l = zeros(&ctx, 10);
    assert!(TopKPlan::rows(&ctx, &(&l).into(), 6, 2, 2).is_err(), "12 logits in a binding of 10");
    assert!(TopKPlan::rows(&ctx, &(&l).into(), 5, 6, 2).is_err(), "k over n");
}

#[test]
fn top_k_plan_writes_slots() {
    let Some((ctx, _serial)) = gpu() else { return };
    for (n, k) in [(5000usize, 40usize), (3000, 128), (700, 1)] {
        let ls: Vec<Vec<f32>> = (0..3).map(|i| logits_with_winner(n, 40 + i, 100 * i as usize + 1)).collect();
        let all = f32_buf(&ctx, &ls.concat());
        let logits = zeros(&ctx, n);
        let plan = TopKPlan::new(&ctx, &(&logits).into(), n, k, 0.7, 3, None).unwrap();
        let hot = plan.with_temperature(1.3).unwrap();
        let (ids2, vals2) = (zeros(&ctx, 3 * k), zeros(&ctx, 3 * k));
        let c = Counters::now(&ctx);
        let mut rec = ctx.recorder();
        for slot in 0..3 {
            copy_in(&mut rec, &all, slot * n, &logits, 0, n);
            plan.record(&mut rec, &StepValues::decode(0).with_token(slot as u32)).unwrap();
            // The same slot at another temperature (the same output buffers), copied aside, then
            // the first temperature again.
            hot.record(&mut rec, &StepValues::decode(0).with_token(slot as u32)).unwrap();
            rec.copy(hot.ids().buffer(), (slot * k * 4) as u64, &ids2, (slot * k * 4) as u64, (k * 4) as u64).unwrap();
            rec.copy(hot.values().buffer(), (slot * k * 4) as u64, &vals2, (slot * k * 4) as u64, (k * 4) as u64).unwrap();
            plan.record(&mut rec, &StepValues::decode(0).with_token(slot as u32)).unwrap();
        }
        rec.submit().unwrap();
        c.unchanged(&ctx, "top_k");
        let (ids, vals) = (read_u32(&ctx, plan.ids().buffer(), 3 * k), read_f32(&ctx, plan.values().buffer(), 3 * k));
        let (ids2, vals2) = (read_u32(&ctx, &ids2, 3 * k), read_f32(&ctx, &vals2, 3 * k));
        for (slot, l) in ls.iter().enumerate() {
            for (t, (gi, gv)) in [(0.7, (&ids, &vals)), (1.3, (&ids2, &vals2))] {
                let want = sampling::top_k_ref(l, k, t).unwrap();
                let r = slot * k..(slot + 1) * k;
                assert_eq!(&gi[r.clone()], &want.iter().map(|w| w.0).collect::<Vec<_>>()[..], "n {n} k {k} slot {slot} t {t}");
                close(&gv[r], &want.iter().map(|w| w.1).collect::<Vec<_>>(), &format!("n {n} k {k} slot {slot} t {t}"));
            }
            let eager = sampling::top_k(&ctx, &tensor(&ctx, l, &[n]), k, 0.7).unwrap();
            assert_eq!(eager.iter().map(|e| e.0).collect::<Vec<_>>(), ids[slot * k..(slot + 1) * k].to_vec(), "eager n {n} k {k}");
            close(&eager.iter().map(|e| e.1).collect::<Vec<_>>(), &vals[slot * k..(slot + 1) * k], &format!("eager n {n} k {k}"));
        }
    }
}

#[test]
fn mask_plan_hides_listed_ids_from_argmax() {
    let Some((ctx, _serial)) = gpu() else { return };
    let n = 5000;
    let mut l0 = rnd(n, 67, 4.0);
    // The two largest logits are masked (one id twice), one id is past the vocabulary.
    l0[4321] = 50.0;
    l0[17] = 40.0;
    l0[300] = 30.0;
    let mask = [4321u32, 17, 99_999, 4321];
    let (lb, mb) = (f32_buf(&ctx, &l0), u32_buf(&ctx, &mask));
    let plan = MaskPlan::new(&ctx, &(&lb).into(), n, &(&mb).into(), mask.len()).unwrap();
    let argmax = ArgmaxPlan::new(&ctx, &(&lb).into(), n, None, 1).unwrap();
    let mut rec = ctx.recorder();
    plan.record(&mut rec, &StepValues::decode(0)).unwrap();
    argmax.record(&mut rec, &StepValues::decode(0)).unwrap();
    rec.submit().unwrap();
    let mut want = l0.clone();
    sampling::mask_ref(&mut want, &mask);
    assert_eq!(read_f32(&ctx, &lb, n), want);
    assert_eq!(read_u32(&ctx, argmax.ids().buffer(), 1)[0], 300);
    assert!(MaskPlan::new(&ctx, &(&lb).into(), n, &(&mb).into(), 0).is_err());
    assert!(MaskPlan::new(&ctx, &(&lb).into(), n, &(&mb).into(), 5).is_err());
}

#[test]
fn penalty_plan_windows_over_gpu_history() {
    let Some((ctx, _serial)) = gpu() else { return };
    let n = 600;
    let l0 = rnd(n, 61, 4.0);
    // Repeats inside the window, an id past the vocabulary (skipped).
    let history = [5u32, 17, 5, 599, 17, 5, 9000, 17, 0, 0];
    let p = Penalties { repetition: 1.3, frequency: 0.25, presence: 0.5 };
    let window = 4;
    let (lb, pristine, hb) = (zeros(&ctx, n), f32_buf(&ctx, &l0), u32_buf(&ctx, &history));
    let plan = PenaltyPlan::new(&ctx, &(&lb).into(), n, &(&hb).into(), window, p).unwrap();
    let rep_only = plan.with_penalties(Penalties::repetition(1.1)).unwrap();
    let kv = [5u32, 6, 7, 3];
    let outs = zeros(&ctx, (kv.len() + 1) * n);
    let c = Counters::now(&ctx);
    let mut rec = ctx.recorder();
    for (i, &kv_len) in kv.iter().enumerate() {
        copy_in(&mut rec, &pristine, 0, &lb, 0, n);
        plan.record(&mut rec, &StepValues::decode(kv_len - 1)).unwrap();
        copy_out(&mut rec, &(&lb).into(), n, &outs, i * n);
    }
    copy_in(&mut rec, &pristine, 0, &lb, 0, n);
    rep_only.record(&mut rec, &StepValues::chunk(0, 10)).unwrap();
    copy_out(&mut rec, &(&lb).into(), n, &outs, kv.len() * n);
    rec.submit().unwrap();
    c.unchanged(&ctx, "penalties");
    let got = read_f32(&ctx, &outs, (kv.len() + 1) * n);
    for (i, &kv_len) in kv.iter().enumerate() {
        let mut want = l0.clone();
        sampling::penalties_ref(&mut want, &history[..kv_len as usize], window, &p).unwrap();
        assert_ne!(want, l0);
        close(&got[i * n..(i + 1) * n], &want, &format!("history length {kv_len}"));
    }
    let mut want = l0.clone();
    sampling::penalties_ref(&mut want, &history, window, &Penalties::repetition(1.1)).unwrap();
    close(&got[kv.len() * n..], &want, "repetition only, window of a history of 10");
    // Eager repetition penalty over unique ids.
    let t = tensor(&ctx, &l0, &[n]);
    let ids = [5u32, 17, 5, 599, 3];
    sampling::repetition_penalty(&ctx, &t, &ids, 1.3).unwrap();
    let mut want = l0.clone();
    sampling::repetition_penalty_ref(&mut want, &ids, 1.3).unwrap();
    close(&t.to_vec::<f32>().unwrap(), &want, "eager repetition penalty");
}

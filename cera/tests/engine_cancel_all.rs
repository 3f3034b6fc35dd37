//! [`CancelToken::cancel_all`] on the scripted executor of `mock_backend`: a cancellation that
//! comes before the generation starts (a Ctrl-C while `cera run` loads the model) is not
//! cleared by it, unlike [`CancelToken::cancel`]; the generation runs nothing and returns no
//! tokens, and so does every later one.

use cera::engine::{CancelToken, FinishReason, GenerateOpts, TokenEvent};

// The helpers of engine_loop.rs; not every one is used here.
#[allow(dead_code)]
mod mock_backend;

use mock_backend::*;

const LOOP: &[(u32, u32)] = &[(HELLO, A), (A, B), (B, A)];

#[test]
fn cancel_all_before_the_start_stops_every_generation() {
    let t = setup(chain(LOOP, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let cancel: CancelToken = s.cancel_token();
    // A plain cancellation before the start is cleared by the start: three tokens.
    cancel.cancel();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(3));
    assert_eq!((g.ids.as_slice(), g.finish), (&[A, B, A][..], FinishReason::MaxTokens));
    assert!(!cancel.is_cancelled());
    t.steps();
    // cancel_all (after a cancel, and followed by another: neither undoes it).
    cancel.cancel();
    cancel.cancel_all();
    cancel.cancel();
    for _ in 0..2 {
        let before = s.tokens().to_vec();
        let (g, events) = run(&mut s, &GenerateOpts::greedy(3));
        assert_eq!(g.finish, FinishReason::Cancelled);
        assert!(g.ids.is_empty() && events.is_empty() && g.prefilled == 0, "{g:?}");
        assert_eq!(g.prompt_tokens, before.len());
        assert_eq!(s.tokens(), before.as_slice(), "nothing generated, nothing appended");
        assert!(cancel.is_cancelled());
    }
    assert_eq!(t.steps(), Vec::new(), "no step ran");
}

#[test]
fn cancel_all_during_a_generation_stops_it_and_the_next() {
    let t = setup(chain(LOOP, &[]), 64, 512);
    let mut s = t.engine.session().unwrap();
    s.append_tokens(&[1, HELLO]).unwrap();
    let cancel = s.cancel_token();
    let mut n = 0;
    let g = s
        .generate(&GenerateOpts::greedy(50), &mut |_: &TokenEvent| {
            n += 1;
            if n == 2 {
                cancel.cancel_all();
            }
        })
        .unwrap();
    assert_eq!((g.ids.as_slice(), g.finish), (&[A, B][..], FinishReason::Cancelled));
    t.steps();
    let (g, _) = run(&mut s, &GenerateOpts::greedy(3));
    assert_eq!((g.ids.len(), g.finish), (0, FinishReason::Cancelled));
    assert_eq!(t.steps(), Vec::new(), "no step ran");
}

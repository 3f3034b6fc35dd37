//! Choosing the adapter: a name or an index (`NUMR_ADAPTER`, `GpuOptions::adapter`) that
//! matches no adapter is `NumrError::AdapterNotFound`, listing the adapters found as
//! `GpuContext::list_adapters` prints them, so that the user can pick one.

use numr::testing::test_gpu;
use numr::{GpuContext, GpuOptions, NumrError};

fn choose(adapter: &str) -> Result<GpuContext, NumrError> {
    GpuContext::with_options(GpuOptions { adapter: Some(adapter.into()), ..GpuOptions::default() })
}

#[test]
fn a_choice_that_matches_no_adapter_lists_the_adapters() {
    // The test needs an adapter to list (it fails without one, as every GPU test does).
    if test_gpu().is_none() {
        return;
    }
    let listed = GpuContext::list_adapters();
    for filter in ["no-such-adapter-name", "9999"] {
        match choose(filter) {
            Err(NumrError::AdapterNotFound { filter: f, found }) => {
                assert_eq!(f, filter);
                assert!(!found.is_empty(), "the test adapter is found");
                for line in &found {
                    assert!(listed.contains(line), "{line} is listed by list_adapters: {listed:?}");
                }
                let msg = NumrError::AdapterNotFound { filter: f, found: found.clone() }.to_string();
                assert!(msg.starts_with(&format!("no GPU adapter matches `{filter}`")) && msg.contains(&found[0]), "{msg}");
            }
            Err(e) => panic!("{filter}: {e}"),
            Ok(ctx) => panic!("{filter} chose {}", ctx.capabilities().adapter_name),
        }
    }
    // The adapter's own name still chooses it.
    let ctx = test_gpu().unwrap();
    let name = ctx.capabilities().adapter_name.clone();
    assert_eq!(choose(&name).unwrap().capabilities().adapter_name, name);
}

#[test]
fn the_message_says_none_when_nothing_was_found() {
    let e = NumrError::AdapterNotFound { filter: "h200".into(), found: Vec::new() };
    assert_eq!(e.to_string(), "no GPU adapter matches `h200` (NUMR_ADAPTER: a name substring or an index); found: none");
}

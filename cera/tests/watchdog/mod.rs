//! A generous watchdog for tests of malformed input: each case must end (with its typed error),
//! never hang. Speed is not asserted here (that belongs in benches); a case that has not ended
//! after [`LIMIT`] has hung, and the test fails naming it instead of running until CI's limit.

use std::sync::mpsc;
use std::time::Duration;

/// Far beyond any case's real time (milliseconds), so a loaded machine never trips it.
pub const LIMIT: Duration = Duration::from_secs(120);

/// Runs `f` on its own thread and returns its result; panics if it has not ended within [`LIMIT`]
/// (the thread is left behind; the test process ends with the failure).
pub fn within_limit<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no result after {LIMIT:?}: it hangs"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

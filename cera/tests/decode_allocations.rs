//! A greedy decode step allocates nothing on the host heap after warm-up, on the GPU executor
//! (lavapipe in CI); on the CPU executor, nothing outside the executor itself.
//!
//! What is counted: every `alloc`, `alloc_zeroed` and `realloc` through the global allocator
//! (this binary's counting `#[global_allocator]`), on every thread (the CPU executor's workers
//! too; lavapipe's threads do not use Rust's allocator), from one token's event reaching the
//! sink to the next token's: that is one whole iteration of `Session::generate`'s loop
//! (choosing the id, the stop checks, detokenizing, stop strings, streaming, submitting the step
//! of the token after next, collecting the next one). Frees are not counted. The two tests
//! measure one at a time.
//!
//! Whose allocation it is: the GPU path calls wgpu (`create_command_encoder`,
//! `begin_compute_pass`, the pass's commands, `submit`, `on_submitted_work_done`, `map_async`,
//! the error scopes, ...), which allocates inside itself; that is wgpu's floor and outside the
//! engine's control. Each counted allocation's stack is captured (`std::backtrace`, with the
//! counting switched off while capturing) and resolved after the generation, walking from the
//! allocator outwards past the standard library and generic containers (`alloc`, `core`, `std`,
//! `hashbrown`, `smallvec`, `arrayvec`): a frame in `wgpu`, `wgpu_core`, `wgpu_hal`,
//! `wgpu_types`, `naga`, `ash`, `gpu_alloc` or `gpu_descriptor` met before any frame of this
//! workspace (numr, boostr, cera) makes it wgpu's, with the helper crates wgpu calls; a frame of
//! the workspace met first makes it ours, with the crates we call (pollster, tokenizers, ...),
//! and so does a stack with neither, so a misattribution can only make the test stricter. Where wgpu boxes a callback we hand it (`map_async`,
//! `on_submitted_work_done`), the `Box` is made inside wgpu and counts as wgpu's: its API takes
//! the closure by value. Nothing in the libraries exists for this test: it costs release builds
//! nothing.
//!
//! Asserted on the GPU: ours is zero at every measured step (it was about 376 of 451 a token
//! before: a label `Arc<str>` per dispatch, the recording's lists, a staging buffer's `Arc`, a
//! channel, the readback's `Vec`s, pollster's wakers, the detokenizer's and stop matcher's
//! `String`s, and a Hugging Face tokenizer building its vocabulary map per token). wgpu's floor
//! is reported: 75 a step on lavapipe, from encoding, the pass's commands, submitting and
//! mapping. Zero of ours also says that a step creates no GPU buffer and no bind group: numr's
//! buffer pool makes an `Arc` per buffer it hands out (a reused one too), and its bind-group
//! cache a key per group. The structural budget stays: a decode step is one compute pass in
//! one submit.
//!
//! On the CPU executor the session's part is zero as well; the executor's own allocations (41
//! a step on this model: scratch rows in attention and the linear layers, the boostr reference
//! norm, activation, embedding and KV rounding it calls, top-k, the worker pool's job) are
//! counted and printed, and not yet removed.
//!
//! Warm-up: a first generation of the same tokens, so that the tokenizer has looked up the
//! pieces of these ids (each once, then kept) and every buffer a step reuses has grown.

use std::alloc::{GlobalAlloc, Layout, System};
use std::backtrace::Backtrace;
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use cera::engine::{DeviceChoice, Engine, GenerateOpts, LoadOptions, TokenEvent};

struct Counting;

/// Allocations on every thread are recorded (the CPU executor's workers too).
static TRACK: AtomicBool = AtomicBool::new(false);
/// The stack of every recorded allocation, in order.
static LOG: Mutex<Vec<Backtrace>> = Mutex::new(Vec::new());
/// One measurement at a time (the tests of this file run in parallel otherwise).
static ONE: Mutex<()> = Mutex::new(());

thread_local! {
    /// Inside the recorder itself (its own allocations pass through).
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

fn record() {
    if !TRACK.load(Ordering::Relaxed) || BUSY.with(Cell::get) {
        return;
    }
    BUSY.with(|b| b.set(true));
    let bt = Backtrace::force_capture();
    LOG.lock().unwrap_or_else(|p| p.into_inner()).push(bt);
    BUSY.with(|b| b.set(false));
}

fn logged() -> usize {
    LOG.lock().unwrap_or_else(|p| p.into_inner()).len()
}

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Crates whose frames are passed over to find the caller: the standard library and generic
/// containers.
const PASS: [&str; 6] = ["std", "core", "alloc", "hashbrown", "smallvec", "arrayvec"];
/// wgpu and what it allocates through.
const WGPU: [&str; 8] = ["wgpu", "wgpu_core", "wgpu_hal", "wgpu_types", "naga", "ash", "gpu_alloc", "gpu_descriptor"];
/// Source folders of this workspace (its frames carry line tables, so their names are short;
/// this crate's own files show as `./src/..`, `./tests/..`).
const OURS: [&str; 5] = ["numr/src/", "boostr/src/", "cera/src/", "cera/tests/", "./tests/"];
/// This workspace's crates, where a frame has a symbol's path but no file.
const WORKSPACE: [&str; 4] = ["numr", "boostr", "cera", "decode_allocations"];

/// The crate a frame belongs to: from its file where that is a dependency's source
/// (`.../wgpu-30.0.2/src/...` -> `wgpu`, a generic instantiated in our code), else from its
/// demangled symbol (`<wgpu_core::X as core::ops::Drop>::drop` -> `wgpu_core`; `<C as
/// wgpu_hal::Trait>::f` -> `wgpu_hal`).
fn crate_of<'a>(symbol: &'a str, at: &'a str) -> &'a str {
    for root in ["/registry/src/", "/rust/deps/"] {
        if let Some(i) = at.find(root) {
            let rest = &at[i + root.len()..];
            // `index.crates.io-HASH/NAME-VERSION/...` or `NAME-VERSION/...`.
            let dir = if root == "/registry/src/" { rest.split('/').nth(1) } else { rest.split('/').next() };
            if let Some(d) = dir {
                return d.rsplit_once('-').map_or(d, |(name, _)| name);
            }
        }
    }
    let s = symbol.trim_start_matches('<').trim_start_matches('&').trim_start_matches("mut ").trim_start_matches("dyn ");
    if let Some((ty, tr)) = s.split_once(" as ")
        && !ty.contains("::")
    {
        return tr.split("::").next().unwrap_or(tr);
    }
    s.split("::").next().unwrap_or(s)
}

/// Whose allocation: `Some((true, _))` wgpu's, `Some((false, frame))` ours, named by its first
/// frame outside the allocator and [`PASS`]; `None` for the test harness's own thread (its
/// "running for over 60 seconds" notes).
fn owner(bt: &Backtrace) -> Option<(bool, String)> {
    // `N: symbol` lines, each followed by `at file:line:col` where the frame has line tables.
    let text = format!("{bt}");
    let mut frames: Vec<(String, String)> = Vec::new();
    for l in text.lines().map(str::trim_start) {
        if let Some(at) = l.strip_prefix("at ") {
            if let Some(f) = frames.last_mut() {
                f.1 = at.to_string();
            }
        } else if let Some((n, rest)) = l.split_once(": ")
            && n.chars().all(|c| c.is_ascii_digit())
        {
            frames.push((rest.trim().to_string(), String::new()));
        }
    }
    if frames.iter().any(|(f, _)| f.contains("run_tests_console")) {
        return None;
    }
    // The frames up to the allocator's entry point are the capture, the recorder and the counting
    // allocator. Optimised builds inline some of them or name the entry point differently
    // (`__rustc::__rust_alloc`): the last frame that is one of them ends the shim.
    const SHIM: [&str; 4] =
        ["__rust_alloc", "__rust_realloc", "decode_allocations::record", "decode_allocations::Counting as core::alloc::global::GlobalAlloc"];
    let shim = frames.iter().rposition(|(f, _)| SHIM.iter().any(|s| f.contains(s))).map_or(0, |i| i + 1);
    // Outwards from the allocator: a wgpu frame before any of ours makes it wgpu's (with the
    // helper crates wgpu calls); one of ours first makes it ours (with the crates we call).
    let mut first = None;
    for (f, at) in &frames[shim..] {
        let c = crate_of(f, at).replace('-', "_");
        if at.contains("library/") || PASS.contains(&c.as_str()) {
            continue;
        }
        if WGPU.contains(&c.as_str()) {
            return Some((true, format!("{f} {at}")));
        }
        first.get_or_insert_with(|| format!("{f} {at}"));
        if at.starts_with("./src/") || OURS.iter().any(|o| at.contains(o)) || WORKSPACE.contains(&c.as_str()) {
            return Some((false, first.unwrap_or_default()));
        }
    }
    Some((false, first.unwrap_or_else(|| "<no frame outside the standard library>".into())))
}

/// A binary without symbols (stripped) cannot say whose an allocation is: fail instead of counting
/// every allocation as ours. Checked on a backtrace taken here, on the test's own thread (an
/// allocation on another thread, such as a worker's, may have no frame of this test at all).
#[inline(never)]
fn assert_symbols() {
    let text = format!("{}", Backtrace::force_capture());
    assert!(
        text.contains("decode_allocations"),
        "backtraces name no function of this test: its binary has no symbols (stripped?), which this test needs\n{text}"
    );
}

/// Per measured step: (wgpu's allocations, ours with their first frames).
type Steps = Vec<(usize, Vec<String>)>;

/// Generates `n` tokens greedily, recording allocations from each event to the next, and
/// attributes those of events `skip..n` (steps after warm-up).
fn measure(e: &Engine, prompt: &str, n: usize, skip: usize) -> Steps {
    assert_symbols();
    let mut s = e.session().unwrap();
    s.append_text(prompt).unwrap();
    let opts = GenerateOpts { ignore_eos: true, ..GenerateOpts::greedy(n) };
    // Where each event's log starts (pushed with recording off).
    let mut marks: Vec<usize> = Vec::with_capacity(n + 1);
    LOG.lock().unwrap().clear();
    let g = s
        .generate(&opts, &mut |_: &TokenEvent| {
            TRACK.store(false, Ordering::Relaxed);
            marks.push(logged());
            TRACK.store(true, Ordering::Relaxed);
        })
        .unwrap();
    TRACK.store(false, Ordering::Relaxed);
    assert_eq!(g.ids.len(), n, "{g:?}");
    assert_eq!(marks.len(), n, "one event per token");
    if e.is_gpu() {
        // The structural budget: a greedy decode step is one submit of one compute pass.
        let c = s.last_step_counters();
        assert_eq!((c.passes, c.submits), (1, 1), "{c:?}");
    }
    let log = std::mem::take(&mut *LOG.lock().unwrap());
    marks
        .windows(2)
        .skip(skip)
        .map(|w| {
            let mut wgpu = 0;
            let mut ours = Vec::new();
            for bt in &log[w[0]..w[1]] {
                match owner(bt) {
                    Some((true, _)) => wgpu += 1,
                    Some((false, f)) => ours.push(f),
                    None => {}
                }
            }
            (wgpu, ours)
        })
        .collect()
}

fn llama_tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/hf/llama-tiny")
}

/// Whether an allocation of ours is the CPU executor's own (its kernels, its scratch, the boostr
/// references it calls): counted and reported, not yet removed (see the module docs).
fn cpu_executor(frame: &str) -> bool {
    frame.contains("src/engine/cpu/") || frame.contains("boostr/src/")
}

fn check(device: DeviceChoice) {
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    // wgpu's lock tracing (debug builds) captures a backtrace under std's backtrace lock, where
    // the counting allocator would capture one too: library backtraces off (panics keep theirs).
    // SAFETY: set before any thread reads it (the engine is not loaded yet).
    unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    let opts = LoadOptions { device, n_ctx: Some(128), threads: Some(2), ..Default::default() };
    let e = Engine::load(llama_tiny(), &opts, None).unwrap();
    // A first generation of the same tokens warms every cache: the pools, the recordings'
    // capacities, the tokenizer's pieces of these ids (each id's piece is looked up once and
    // kept; HF's lookup builds its whole vocabulary map).
    measure(&e, "Hello there", 24, 0);
    let mut steps = measure(&e, "Hello there", 24, 4);
    let executor: Vec<usize> = steps
        .iter_mut()
        .map(|(_, ours)| {
            let n = ours.len();
            if device == DeviceChoice::Cpu {
                ours.retain(|f| !cpu_executor(f));
            }
            n - ours.len()
        })
        .collect();
    let wgpu: Vec<usize> = steps.iter().map(|s| s.0).collect();
    let ours: Vec<usize> = steps.iter().map(|s| s.1.len()).collect();
    eprintln!("{device:?}: per step after warm-up: wgpu's allocations {wgpu:?}, the CPU executor's {executor:?}, ours besides {ours:?}");
    for (i, (_, frames)) in steps.iter().enumerate().filter(|(_, s)| !s.1.is_empty()) {
        let mut f = frames.clone();
        f.sort();
        f.dedup();
        eprintln!("step {i}: ours {} ({f:#?})", frames.len());
    }
    assert!(ours.iter().all(|&n| n == 0), "{device:?}: a greedy decode step allocated on the host heap (see above)");
}

#[test]
fn a_greedy_gpu_decode_step_allocates_nothing_of_ours() {
    if numr::testing::test_gpu().is_none() {
        return;
    }
    check(DeviceChoice::Gpu);
}

/// The session's part of a CPU step (choosing, streaming, stop checks) allocates nothing; the
/// executor's own allocations are reported.
#[test]
fn a_greedy_cpu_decode_step_allocates_nothing_outside_the_executor() {
    check(DeviceChoice::Cpu);
}

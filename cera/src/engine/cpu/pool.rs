//! The worker threads of the CPU executor, started once at load and shared by every sequence.
//!
//! A step runs about a hundred parallel ops (each mat-mul, each attention), so handing work to
//! a thread has to cost microseconds: spawning one costs 0.4-1 ms on some systems and a futex
//! wake tens of microseconds. Workers therefore spin on a generation counter for a while after
//! each job, then yield, and only park on a condition variable after several milliseconds idle
//! (between generations, say).
//!
//! A [`Job`] is cut into chunks that the calling thread and the workers claim from a shared
//! counter, so a worker the OS does not schedule (a loaded machine) delays nothing: the others
//! take its chunks. The job is shared as an `Arc` (it owns `Arc`s of what it reads), so no
//! borrowed data crosses threads and no `unsafe` is needed. Chunk `c` writes its output into
//! result buffer `c`, which the caller reads with [`Pool::result`] after [`Pool::run`].

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::EngineError;

/// The most chunks a job is cut into.
pub(super) const MAX_CHUNKS: usize = 64;

/// Work cut into chunks; chunk `c` writes its output into `out` (its own buffer: the job sizes
/// it).
pub(super) trait Job: Send + Sync {
    /// The number of chunks (1 to [`MAX_CHUNKS`]).
    fn chunks(&self) -> usize;
    /// Runs chunk `c`.
    fn run(&self, c: usize, out: &mut Vec<f32>);
}

/// How long an idle worker spins, then yields, before it parks.
const SPIN: Duration = Duration::from_micros(200);
const YIELD: Duration = Duration::from_millis(5);

/// One run of a job: its chunk counters.
struct Run {
    job: Arc<dyn Job>,
    n: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
}

impl Run {
    /// Claims and runs chunks until none is left.
    fn work(&self, results: &[Mutex<Vec<f32>>]) {
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.n {
                return;
            }
            if catch_unwind(AssertUnwindSafe(|| self.job.run(c, &mut lock(&results[c])))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Shared {
    run: Mutex<Option<Arc<Run>>>,
    wake: Condvar,
    /// Bumped (under `run`'s lock) for every parallel run.
    generation: AtomicU64,
    /// Workers parked on `wake` (changed under `run`'s lock).
    parked: AtomicUsize,
    quit: AtomicBool,
    results: Vec<Mutex<Vec<f32>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `threads - 1` workers plus the calling thread.
pub(super) struct Pool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `threads - 1` workers (`threads` at least 1).
    pub(super) fn new(threads: usize) -> Result<Pool, EngineError> {
        let shared = Arc::new(Shared {
            run: Mutex::new(None),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            quit: AtomicBool::new(false),
            results: (0..MAX_CHUNKS).map(|_| Mutex::new(Vec::new())).collect(),
        });
        let mut pool = Pool { shared, handles: Vec::new() };
        for w in 1..threads.max(1) {
            let s = pool.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("cera-cpu-{w}"))
                .spawn(move || worker(&s))
                .map_err(|e| EngineError::Device { device: "CPU".into(), reason: format!("cannot start worker thread {w}: {e}") })?;
            pool.handles.push(h);
        }
        Ok(pool)
    }

    /// Threads a parallel job runs on (the workers and the caller).
    pub(super) fn threads(&self) -> usize {
        self.handles.len() + 1
    }

    /// Runs every chunk of `job`, over all threads when `parallel` (else on the calling thread
    /// alone); chunk `c`'s output is then [`Pool::result`]`(c)`.
    pub(super) fn run(&mut self, job: Arc<dyn Job>, parallel: bool) -> Result<(), EngineError> {
        let s = &*self.shared;
        let n = job.chunks().clamp(1, MAX_CHUNKS);
        let run = Arc::new(Run { job, n, next: AtomicUsize::new(0), done: AtomicUsize::new(0), panicked: AtomicBool::new(false) });
        let parallel = parallel && n > 1 && !self.handles.is_empty();
        if parallel {
            let mut g = lock(&s.run);
            *g = Some(run.clone());
            s.generation.fetch_add(1, Ordering::Release);
            if s.parked.load(Ordering::Relaxed) > 0 {
                s.wake.notify_all();
            }
        }
        run.work(&s.results);
        if parallel {
            let t0 = Instant::now();
            let mut spins = 0u32;
            while run.done.load(Ordering::Acquire) < n {
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(64) && t0.elapsed() > SPIN {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            *lock(&s.run) = None;
        }
        if run.panicked.load(Ordering::Relaxed) {
            return Err(EngineError::Device { device: "CPU".into(), reason: "a worker thread panicked".into() });
        }
        Ok(())
    }

    /// The output of chunk `c` of the last run.
    pub(super) fn result(&self, c: usize) -> MutexGuard<'_, Vec<f32>> {
        lock(&self.shared.results[c])
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let _g = lock(&self.shared.run);
            self.shared.quit.store(true, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let t0 = Instant::now();
        let mut spins = 0u32;
        while s.generation.load(Ordering::Acquire) == seen {
            if s.quit.load(Ordering::Acquire) {
                return;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let idle = t0.elapsed();
            if idle < SPIN {
                std::hint::spin_loop();
            } else if idle < YIELD {
                std::thread::yield_now();
            } else {
                let mut g = lock(&s.run);
                while s.generation.load(Ordering::Acquire) == seen && !s.quit.load(Ordering::Acquire) {
                    s.parked.fetch_add(1, Ordering::Relaxed);
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                    s.parked.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        let run = {
            let g = lock(&s.run);
            seen = s.generation.load(Ordering::Acquire);
            g.clone()
        };
        if let Some(run) = run {
            run.work(&s.results);
        }
    }
}

//! `cera serve`: an OpenAI-compatible HTTP server on the [`Batcher`] (feature `server`, on by
//! default). Every request becomes one sequence of the batcher, so concurrent requests share
//! each step's weight reads.
//!
//! Routes:
//! - `POST /v1/chat/completions`, `POST /v1/completions`: streamed (server-sent events ending in
//!   `data: [DONE]`) or not; `usage` in every answer, with the prefix cache's hits in
//!   `prompt_tokens_details.cached_tokens`; structured output (`response_format`, `grammar`);
//! - `POST /v1/messages`: Anthropic's Messages API, streamed (its event sequence) or not;
//! - `GET /v1/models`, `GET /health` (503 while the model loads), `POST /tokenize`,
//!   `POST /detokenize`, `GET /metrics` (Prometheus text);
//! - `GET /`: a chat page (streamed replies, Markdown and code, the conversation, a stop button).
//!
//! Limits and safety: `parallel` sequences run at once and `queue` more wait; past that the
//! answer is 429. Bodies over `max_body` get 413. With an API key, every route but `/health`
//! needs `Authorization: Bearer KEY` (or `x-api-key: KEY`). CORS is off unless origins are given. Every error is
//! OpenAI's JSON error object with a 4xx/5xx status. SIGTERM or Ctrl-C stops accepting
//! requests, lets the ones in flight finish, then returns.
//!
//! ```no_run
//! use cera::engine::{Engine, LoadOptions};
//! use cera::server::{ServeOpts, serve};
//!
//! let opts = ServeOpts { port: 8080, ..ServeOpts::new("smollm2") };
//! serve(opts, || Engine::load("SmolLM2-135M-Instruct.Q4_1.gguf", &LoadOptions::default(), None).map_err(|e| e.to_string()), &mut |line| eprintln!("{line}"))?;
//! # Ok::<(), cera::server::ServeError>(())
//! ```

mod anthropic;
mod call_stream;
mod error;
pub(crate) mod grammar;
mod handlers;
mod metrics;
mod openai;
mod request;
mod running;
mod tool_syntax;
mod tools;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

pub use error::ApiError;

use crate::engine::{Batcher, BatcherOpts, Engine};

/// How `cera serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOpts {
    /// Address to bind (default 127.0.0.1: this machine only).
    pub host: String,
    /// Port (0: any free port; the bound address is announced).
    pub port: u16,
    /// The model's id in `/v1/models` and answers; requests may name it or leave `model` out.
    pub model_id: String,
    /// Requests need `Authorization: Bearer KEY` (every route but `/health`).
    pub api_key: Option<String>,
    /// Origins allowed by CORS (`*` for any); empty: CORS off.
    pub cors: Vec<String>,
    /// Sequences running at once (the batcher's `max_seqs`).
    pub parallel: usize,
    /// Requests waiting beyond those; past `parallel + queue` in flight the answer is 429.
    pub queue: usize,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// The batcher's other sizes (KV budget, tokens per step, block size, prefix cache).
    pub batcher: BatcherOpts,
    /// Speculative decoding for requests that do not say (`None`: off); a request's
    /// `speculative` field overrides it.
    pub speculative: Option<crate::engine::Speculative>,
    /// With a draft model ([`Models::draft`]): its drafts stop at the first token it gives a
    /// probability below this (0: never).
    pub draft_p_min: f32,
}

/// What the server's loader gives: the model, and a draft model for speculative requests
/// (`{"speculative": {"type": "draft"}}`, or every request when
/// [`ServeOpts::speculative`] draws from it). An [`Engine`] alone converts into it. Cloning
/// is cheap (engines share their models).
#[derive(Clone)]
pub struct Models {
    /// The model that answers.
    pub target: Engine,
    /// Its draft model (the same vocabulary), if any.
    pub draft: Option<Engine>,
}

impl From<Engine> for Models {
    fn from(target: Engine) -> Models {
        Models { target, draft: None }
    }
}

impl ServeOpts {
    /// Defaults for a model called `model_id`: 127.0.0.1:8080, no key, no CORS, 16 parallel
    /// sequences, 64 queued requests, 16 MiB bodies.
    pub fn new(model_id: impl Into<String>) -> ServeOpts {
        ServeOpts {
            host: "127.0.0.1".into(),
            port: 8080,
            model_id: model_id.into(),
            api_key: None,
            cors: Vec::new(),
            parallel: 16,
            queue: 64,
            max_body: 16 << 20,
            batcher: BatcherOpts::default(),
            speculative: None,
            draft_p_min: 0.0,
        }
    }
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The model failed to load, or its batcher to start.
    #[error("{0}")]
    Load(String),
    /// Options out of range.
    #[error("{0}")]
    Usage(String),
    /// The runtime or the connection loop failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// The loaded model.
pub(crate) struct Ready {
    pub(crate) batcher: Batcher,
    pub(crate) created: u64,
    /// The structured-output compiler, built at the first request that needs it.
    pub(crate) grammars: OnceLock<Result<grammar::Grammars, String>>,
}

/// Counters for `/metrics`.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) generated_tokens: AtomicU64,
    pub(crate) cached_tokens: AtomicU64,
    pub(crate) cancelled: AtomicU64,
}

/// What every handler sees.
pub(crate) struct AppState {
    pub(crate) opts: ServeOpts,
    pub(crate) ready: OnceLock<Ready>,
    pub(crate) load_error: OnceLock<String>,
    pub(crate) counters: Counters,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) stopping: AtomicBool,
    pub(crate) next_id: AtomicU64,
}

pub(crate) type Shared = Arc<AppState>;

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl AppState {
    /// The loaded model, or 503.
    pub(crate) fn ready(&self) -> Result<&Ready, ApiError> {
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        match (self.ready.get(), self.load_error.get()) {
            (Some(r), _) => Ok(r),
            (None, Some(e)) => Err(ApiError::unavailable(format!("the model failed to load: {e}"))),
            (None, None) => Err(ApiError::unavailable("the model is loading")),
        }
    }
}

/// Holds one place of `parallel + queue` while a request runs.
pub(crate) struct Slot(Shared);

impl Slot {
    pub(crate) fn take(state: &Shared) -> Result<Slot, ApiError> {
        let limit = state.opts.parallel + state.opts.queue;
        let prev = state.in_flight.fetch_add(1, Ordering::SeqCst);
        if prev >= limit {
            state.in_flight.fetch_sub(1, Ordering::SeqCst);
            state.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::busy(limit));
        }
        Ok(Slot(state.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Constant-time comparison of the presented key.
fn key_matches(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

async fn auth(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.opts.api_key
        && req.method() != Method::OPTIONS
    {
        // OpenAI's `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY`.
        let headers = req.headers();
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        if !given.is_some_and(|g| key_matches(g.trim().as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

fn cors_layer(origins: &[String]) -> Result<Option<tower_http::cors::CorsLayer>, ServeError> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| HeaderValue::from_str(o).map_err(|_| ServeError::Usage(format!("--cors {o:?} is not a valid origin"))))
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(list)
    };
    Ok(Some(CorsLayer::new().allow_origin(allow).allow_methods([Method::GET, Method::POST]).allow_headers(Any)))
}

/// The chat page (`GET /`): one static file, no framework; it streams replies from
/// `/v1/chat/completions`, renders Markdown and code, keeps the conversation, and stops a reply
/// by aborting its request (the server then cancels the sequence).
async fn chat_page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("chat.html")).into_response()
}

/// The routes on `state`.
pub(crate) fn router(state: Shared) -> Result<Router, ServeError> {
    let protected = Router::new()
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/models", get(handlers::models))
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .route("/metrics", get(metrics::metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let mut app = Router::new()
        .route("/", get(chat_page))
        .route("/health", get(handlers::health))
        .merge(protected)
        .fallback(handlers::not_found)
        // Our own 413 (as JSON) comes from the handlers' body extraction at this limit.
        .layer(DefaultBodyLimit::max(state.opts.max_body))
        .with_state(state.clone());
    if let Some(cors) = cors_layer(&state.opts.cors)? {
        app = app.layer(cors);
    }
    Ok(app)
}

async fn shutdown_signal(state: Shared, note: tokio::sync::mpsc::UnboundedSender<String>, stop: impl Future<Output = ()>) {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
        _ = stop => {},
    }
    state.stopping.store(true, Ordering::SeqCst);
    let _ = note.send(format!("stopping: {} requests in flight finish first", state.in_flight.load(Ordering::SeqCst)));
}

/// Runs the server until SIGTERM or Ctrl-C: binds first (so `/health` answers 503 while the
/// model loads), then loads the model with `load` on another thread. `note` gets the lines for
/// the operator (the address, the model, the stop).
pub fn serve<M: Into<Models>>(
    opts: ServeOpts,
    load: impl FnOnce() -> Result<M, String> + Send + 'static,
    note: &mut dyn FnMut(&str),
) -> Result<(), ServeError> {
    serve_until(opts, load, note, std::future::pending())
}

/// [`serve`], which also stops (the same way: no new requests, those in flight finish) when
/// `stop` completes: a server run from a program of your own, such as `cera bench --http`.
/// `note` gets `listening on http://ADDR` first (with port 0, the port taken), then
/// `ready: ...` or `error: ...` once the model has loaded or failed to.
pub fn serve_until<M: Into<Models>>(
    opts: ServeOpts,
    load: impl FnOnce() -> Result<M, String> + Send + 'static,
    note: &mut dyn FnMut(&str),
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if opts.parallel == 0 {
        return Err(ServeError::Usage("--parallel must be at least 1".into()));
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("cera-serve").build()?;
    let batcher_opts = BatcherOpts { max_seqs: opts.parallel, ..opts.batcher };
    let addr = format!("{}:{}", opts.host, opts.port);
    let state: Shared = Arc::new(AppState {
        opts,
        ready: OnceLock::new(),
        load_error: OnceLock::new(),
        counters: Counters::default(),
        in_flight: AtomicUsize::new(0),
        stopping: AtomicBool::new(false),
        next_id: AtomicU64::new(0),
    });
    let app = router(state.clone())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
        let local: SocketAddr = listener.local_addr()?;
        note(&format!("listening on http://{local}"));
        let (st, tx_load) = (state.clone(), tx.clone());
        tokio::task::spawn_blocking(move || {
            let p_min = st.opts.draft_p_min;
            let loaded = load().and_then(|m| {
                let m: Models = m.into();
                match &m.draft {
                    None => m.target.batcher(batcher_opts),
                    Some(d) => m.target.batcher_with_draft(batcher_opts, d, p_min),
                }
                .map_err(|e| e.to_string())
            });
            match loaded {
                Ok(batcher) => {
                    let draft = batcher.draft_engine().map_or(String::new(), |d| format!(", drafts from {}", d.config().arch));
                    let msg = format!("ready: {} on {}, {} parallel sequences{draft}", st.opts.model_id, batcher.engine().device_name(), st.opts.parallel);
                    let _ = st.ready.set(Ready { batcher, created: unix_now(), grammars: OnceLock::new() });
                    let _ = tx_load.send(msg);
                }
                Err(e) => {
                    let _ = tx_load.send(format!("error: the model failed to load: {e}"));
                    let _ = st.load_error.set(e);
                }
            }
        });
        let server = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal(state.clone(), tx.clone(), stop));
        let mut server = std::pin::pin!(server.into_future());
        loop {
            tokio::select! {
                r = &mut server => break r.map_err(ServeError::Io),
                Some(line) = rx.recv() => note(&line),
            }
        }
    });
    while let Ok(line) = rx.try_recv() {
        note(&line);
    }
    // The batcher (and its thread) goes with the state.
    drop(state);
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    result
}

#[cfg(test)]
mod tests {
    use super::key_matches;

    #[test]
    fn keys_compare_whole() {
        assert!(key_matches(b"abc", b"abc"));
        assert!(!key_matches(b"abd", b"abc"));
        assert!(!key_matches(b"ab", b"abc"));
        assert!(!key_matches(b"", b"abc"));
    }
}

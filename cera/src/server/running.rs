//! One request as one batcher sequence: submitted with a sink that feeds a channel, its slot of
//! `parallel + queue` held, and cancelled when its handler or stream goes away.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::Event;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::{Shared, Slot};
use crate::engine::{Batcher, BoxSink, Canceller, EngineError, GenerateOpts, Generation, Prompt, TokenEvent};

/// What the batcher's thread sends a request's handler.
pub(crate) enum Msg {
    Token { id: u32, text: String, logprob: Option<f32>, top: Vec<(u32, f32)> },
    Done(Result<Generation, EngineError>),
}

/// Cancels the sequence when the handler or its stream goes away (a client that disconnected).
pub(crate) struct CancelOnDrop {
    canceller: Canceller,
    pub(crate) finished: bool,
    state: Shared,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.canceller.cancel();
            self.state.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The body, with our own 413 and 400.
pub(crate) fn body(b: Result<Bytes, BytesRejection>, state: &Shared) -> Result<Bytes, ApiError> {
    b.map_err(
        |e| if e.status() == StatusCode::PAYLOAD_TOO_LARGE { ApiError::too_large(state.opts.max_body) } else { ApiError::bad_request(None, e.body_text()) },
    )
}

/// A submitted request: its messages, its cancel guard, its place in the limit.
pub(crate) struct Running {
    pub(crate) rx: mpsc::UnboundedReceiver<Msg>,
    pub(crate) guard: CancelOnDrop,
    _slot: Slot,
}

impl Running {
    /// Takes a place (429 past the limit) and submits `tokens`; with `stream` each token comes
    /// as a [`Msg::Token`], and the result as [`Msg::Done`].
    pub(crate) fn start(state: &Shared, batcher: &Batcher, tokens: Vec<u32>, opts: &GenerateOpts, stream: bool) -> Result<Running, ApiError> {
        let slot = Slot::take(state)?;
        let (tx, rx) = mpsc::unbounded_channel::<Msg>();
        let sink: Option<BoxSink> = stream.then(|| {
            let tx = tx.clone();
            let f: BoxSink = Box::new(move |ev: &TokenEvent| {
                let _ = tx.send(Msg::Token { id: ev.id, text: ev.text.to_string(), logprob: ev.logprob, top: ev.top_logprobs.to_vec() });
            });
            f
        });
        let handle = batcher.submit(Prompt::Tokens(tokens), opts, sink)?;
        let guard = CancelOnDrop { canceller: handle.canceller(), finished: false, state: state.clone() };
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(Msg::Done(handle.wait()));
        });
        Ok(Running { rx, guard, _slot: slot })
    }

    /// Waits for the whole generation (the tokens' messages skipped) and counts it.
    pub(crate) async fn finish(mut self) -> Result<Generation, ApiError> {
        let g = loop {
            match self.rx.recv().await {
                Some(Msg::Done(r)) => break r?,
                Some(Msg::Token { .. }) => {}
                None => return Err(ApiError::internal("the batcher stopped")),
            }
        };
        self.guard.finished = true;
        account(&self.guard.state, &g);
        Ok(g)
    }
}

/// Counts a finished generation in the metrics.
pub(crate) fn account(state: &Shared, g: &Generation) {
    let c = &state.counters;
    c.prompt_tokens.fetch_add(g.prompt_tokens as u64, Ordering::Relaxed);
    c.generated_tokens.fetch_add(g.ids.len() as u64, Ordering::Relaxed);
    c.cached_tokens.fetch_add(g.reused as u64, Ordering::Relaxed);
}

/// How one API writes a streamed answer: the events of each message, and of a batcher that
/// went away before the end.
pub(crate) trait Answer: Unpin {
    /// The events of one message ([`Msg::Done`] is the last).
    fn on_msg(&mut self, m: Msg, out: &mut VecDeque<Event>);
    /// The events when the channel closed without a result.
    fn closed(&mut self, out: &mut VecDeque<Event>);
}

/// A streamed answer: a request's messages turned into server-sent events by an [`Answer`].
/// Dropped before the end (the client went away), it cancels its sequence.
pub(crate) struct EventStream<A> {
    run: Running,
    answer: A,
    queue: VecDeque<Event>,
    ended: bool,
}

impl<A: Answer> EventStream<A> {
    pub(crate) fn new(run: Running, answer: A) -> EventStream<A> {
        EventStream { run, answer, queue: VecDeque::new(), ended: false }
    }
}

impl<A: Answer> tokio_stream::Stream for EventStream<A> {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(e) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(e)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match this.run.rx.poll_recv(cx) {
                Poll::Ready(Some(m)) => {
                    if matches!(m, Msg::Done(_)) {
                        this.run.guard.finished = true;
                        this.ended = true;
                    }
                    this.answer.on_msg(m, &mut this.queue);
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    this.answer.closed(&mut this.queue);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

//! Progress on standard error while a model is fetched and loaded (indicatif), hidden when
//! standard error is not a terminal, so scripts and tests see nothing of it.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::engine::LoadProgress;

fn shown() -> bool {
    std::io::stderr().is_terminal()
}

/// A spinner with a message, ticking on its own (for work without a known size: a download
/// through pip).
pub fn spinner(message: String) -> ProgressBar {
    if !shown() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_message(message);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// A bar in bytes for loading the weights; feed it with [`LoadBar::update`].
pub struct LoadBar(ProgressBar);

impl LoadBar {
    /// A bar titled `message`.
    pub fn new(message: String) -> LoadBar {
        if !shown() {
            return LoadBar(ProgressBar::hidden());
        }
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr()).with_message(message);
        if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({elapsed})") {
            bar.set_style(style.progress_chars("=> "));
        }
        LoadBar(bar)
    }

    /// The executor's progress callback.
    pub fn update(&self, p: LoadProgress) {
        self.0.set_length(p.total);
        self.0.set_position(p.done);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}

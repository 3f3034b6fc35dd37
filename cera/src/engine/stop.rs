//! Stop strings matched across token boundaries: text is held back while it could still be the
//! start of a stop string, so a stop string is never emitted, not even in part.

/// What [`StopMatcher::push`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to emit now.
    pub emit: String,
    /// A stop string was completed: generation ends, and its text (and anything after it) is
    /// dropped.
    pub stopped: bool,
}

/// Holds back the tail of the generated text that is a prefix of some stop string.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Adds the next piece of decoded text.
    pub fn push(&mut self, piece: &str) -> StopStep {
        let mut emit = String::new();
        let stopped = self.push_into(piece, &mut emit);
        StopStep { emit, stopped }
    }

    /// [`Self::push`], appending the text safe to emit to `emit`; returns whether a stop string
    /// was completed. Allocates nothing once the held text's buffer has grown (beyond `emit`'s
    /// growth).
    pub fn push_into(&mut self, piece: &str, emit: &mut String) -> bool {
        self.held.push_str(piece);
        if self.stops.is_empty() {
            emit.push_str(&self.held);
            self.held.clear();
            return false;
        }
        // The earliest complete stop string ends generation.
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            emit.push_str(&self.held[..at]);
            self.held.clear();
            return true;
        }
        // Keep the longest suffix that is a proper prefix of a stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).rev().filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
            .filter(|p| self.held.ends_with(p))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        emit.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        false
    }

    /// The text held back now (a proper prefix of some stop string, possibly empty).
    pub fn held(&self) -> &str {
        &self.held
    }

    /// The text still held back, emitted when generation ends for another reason.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// [`Self::finish`], appending to `out` (the held buffer is kept).
    pub fn finish_into(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut out = String::new();
        for p in pieces {
            let s = m.push(p);
            out.push_str(&s.emit);
            if s.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_across_pieces_is_never_emitted() {
        assert_eq!(run(&["\nUser:"], &["Hello", "\nUs", "er:", " more"]), ("Hello".to_string(), true));
        assert_eq!(run(&["END"], &["abcE", "N", "Dxyz"]), ("abc".to_string(), true));
    }

    #[test]
    fn held_prefix_is_released_when_it_does_not_complete() {
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("go ST").emit, "go ");
        assert_eq!(m.push("ART").emit, "START");
        assert_eq!(run(&["STOP"], &["a S", "T"]), ("a ST".to_string(), false));
    }

    #[test]
    fn earliest_stop_wins_and_unicode_is_safe() {
        assert_eq!(run(&["bb", "ab"], &["xab", "b"]), ("x".to_string(), true));
        assert_eq!(run(&["é!"], &["café", "?"]), ("café?".to_string(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), false));
    }
}

//! The seam: where a continuation's text meets the partial text P the app already has. Fed the
//! continuation's text C as it arrives, [`Seam`] holds C's first characters back until it can
//! tell what C does at the seam, then lets the rest through as it comes.
//!
//! The rules (W: P's trailing whitespace, P' = P without it; V: C's leading whitespace, C' = C
//! without it; "word boundary": next to a character that is not alphanumeric):
//! 1. **Overlap.** C may repeat P's tail: the longest S such that P' ends with S and C' starts
//!    with S is dropped, when it is
//!    - at least [`LONG`] characters long, or,
//!    - in a continuation turn (not a prefill, which continues P' exactly and so repeats nothing
//!      by accident), S starts at a word boundary of P' and either ends at a word boundary of C'
//!      or the seam is inside a word (W and V both empty: the model rewrote the word it was cut
//!      in).
//!
//!    So a chance one-letter match ("pizza" + "a lot") eats nothing, and "on the" + " theater"
//!    stays two words. (In a script written without spaces every character is inside a word:
//!    only a long overlap is dropped.)
//! 2. **Whitespace** between P' and what follows is the app's W, then what C's whitespace V has
//!    beyond it. V starting with W adds the rest ("Hello\n" + "\n\nWorld" gives
//!    "Hello\n\nWorld"); V that W starts with adds nothing ("Hello " + " world" gives
//!    "Hello world": the space a prefill stripped is neither lost nor doubled); any other V adds
//!    nothing, unless it has a line break that W lacks: then it is kept whole (a paragraph break
//!    is not lost to a space). The same holds after a dropped overlap.
//! 3. **Disagreement** ([`SeamError`], the attempt failed, nothing of C spliced), with no overlap
//!    taken: C' restarts the answer (it starts with P's first [`RESTART`] characters, or all of a
//!    shorter P); or C' opens with a piece of P that is not its tail (its first [`PROBE`]
//!    characters, or all of a complete C of [`LONG`] or more, occur in P); or C restarts the
//!    answer after a preamble ("Sure! Here is the rest: The capital ..."): P's first [`RESTART`]
//!    characters (P of [`LONG`] or more) begin within C's first [`PREAMBLE`] characters.
//!
//! The hold ends as soon as C' is something P' does not contain and is long enough to hold a
//! preamble's restart (`PREAMBLE` characters and P's opening; nothing more for a P shorter than
//! [`LONG`]), at [`HOLD`] characters, or when C's text ends ([`Seam::finish`]).

use memchr::memmem;

/// The most characters of the continuation held back.
pub(crate) const HOLD: usize = 256;
/// An overlap this long is a repeat wherever it starts.
pub(crate) const LONG: usize = 16;
/// A continuation that opens with this much of P's opening restarted the answer.
pub(crate) const RESTART: usize = 24;
/// A continuation that opens with this much of P (not its tail) repeats it.
pub(crate) const PROBE: usize = 32;
/// A continuation whose first this many characters lead into P's opening restarted the answer
/// after a preamble.
pub(crate) const PREAMBLE: usize = 96;

/// How the continuation was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeamMode {
    /// The partial was given as the start of the answer (assistant prefill).
    Prefill,
    /// The partial was given in the conversation and the model asked to go on (a turn).
    Turn,
}

/// A continuation that does not agree with the partial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeamError {
    /// It starts the answer over.
    Restarted,
    /// It repeats a piece of the partial that is not its tail.
    Repeated,
}

/// The seam of one continuation (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct Seam {
    /// P'.
    partial: String,
    /// W.
    trailing: String,
    mode: SeamMode,
    /// C so far, while undecided.
    held: String,
    held_chars: usize,
    /// Characters held at least, to see a preamble's restart (0: P is too short to tell).
    window: usize,
    decided: bool,
}

impl Seam {
    pub(crate) fn new(partial: &str, mode: SeamMode) -> Seam {
        let trimmed = partial.trim_end();
        let window = opening_probe(trimmed).map_or(0, |p| PREAMBLE + p.chars().count());
        Seam {
            partial: trimmed.to_string(),
            trailing: partial[trimmed.len()..].to_string(),
            mode,
            held: String::new(),
            held_chars: 0,
            window,
            decided: false,
        }
    }

    /// Whether the seam is decided (everything after passes as it comes).
    pub(crate) fn decided(&self) -> bool {
        self.decided
    }

    /// Feeds the continuation's next text: what to send on now (empty while it is held).
    pub(crate) fn push(&mut self, text: &str) -> Result<String, SeamError> {
        if self.decided {
            return Ok(text.to_string());
        }
        self.held.push_str(text);
        self.held_chars += text.chars().count();
        let body = self.held.trim_start();
        let undecidable = body.is_empty() || memmem::find(self.partial.as_bytes(), body.as_bytes()).is_some();
        if self.held_chars < HOLD && (undecidable || self.held_chars < self.window) {
            return Ok(String::new());
        }
        self.decide(false)
    }

    /// The continuation's text is over: what of the held text to send.
    pub(crate) fn finish(&mut self) -> Result<String, SeamError> {
        if self.decided {
            return Ok(String::new());
        }
        self.decide(true)
    }

    fn decide(&mut self, complete: bool) -> Result<String, SeamError> {
        self.decided = true;
        let held = std::mem::take(&mut self.held);
        let drop = cut(&self.partial, &self.trailing, &held, self.mode, complete)?;
        Ok(held[drop..].to_string())
    }
}

/// How many bytes of the held continuation `c` to drop (see the module documentation).
fn cut(partial: &str, trailing: &str, c: &str, mode: SeamMode, complete: bool) -> Result<usize, SeamError> {
    let body = c.trim_start();
    let lead = &c[..c.len() - body.len()];
    if partial.is_empty() {
        return Ok(space(trailing, lead));
    }
    if let Some(k) = overlap(partial, trailing, lead, body, mode, complete) {
        let rest = &body[k..];
        let gap = &rest[..rest.len() - rest.trim_start().len()];
        return Ok(lead.len() + k + space(trailing, gap));
    }
    let opening = partial.trim_start();
    let same = common_chars(body, opening);
    if same > 0 && same >= RESTART.min(opening.chars().count()) {
        return Err(SeamError::Restarted);
    }
    let n = body.chars().count();
    let probe = match body.char_indices().nth(PROBE) {
        Some((at, _)) => Some(&body[..at]),
        None if n == PROBE || (complete && n >= LONG) => Some(body),
        None => None,
    };
    if probe.is_some_and(|p| memmem::find(partial.as_bytes(), p.as_bytes()).is_some()) {
        return Err(SeamError::Repeated);
    }
    if let Some(opening) = opening_probe(partial) {
        let limit = body
            .char_indices()
            .nth(PREAMBLE + opening.chars().count())
            .map_or(body.len(), |(at, _)| at);
        if memmem::find(&body.as_bytes()[..limit], opening.as_bytes()).is_some() {
            return Err(SeamError::Restarted);
        }
    }
    Ok(space(trailing, lead))
}

/// The longest overlap taken: its length in bytes of `body`.
fn overlap(partial: &str, trailing: &str, lead: &str, body: &str, mode: SeamMode, complete: bool) -> Option<usize> {
    let ends = body
        .char_indices()
        .map(|(i, c)| i + c.len_utf8())
        .take_while(|&k| k <= partial.len());
    let candidates: Vec<usize> = ends.collect();
    candidates.into_iter().rev().find(|&k| {
        let s = &body[..k];
        if !partial.ends_with(s) {
            return false;
        }
        if s.chars().count() >= LONG {
            return true;
        }
        if mode == SeamMode::Prefill {
            return false;
        }
        let before = partial[..partial.len() - k].chars().next_back();
        let starts = !before.is_some_and(char::is_alphanumeric) || !s.starts_with(char::is_alphanumeric);
        let ends = match body[k..].chars().next() {
            Some(next) => !next.is_alphanumeric() || !s.ends_with(char::is_alphanumeric),
            None => complete,
        };
        let in_a_word = trailing.is_empty() && lead.is_empty();
        starts && (ends || in_a_word)
    })
}

/// How many bytes of the continuation's whitespace `lead` to drop after the app's `trailing`.
fn space(trailing: &str, lead: &str) -> usize {
    if lead.starts_with(trailing) {
        trailing.len()
    } else if trailing.starts_with(lead) {
        lead.len()
    } else if lead.contains('\n') && !trailing.contains('\n') {
        0
    } else {
        lead.len()
    }
}

/// How many characters two texts share at their start.
/// P's opening a preamble's restart is told by: its first [`RESTART`] characters, when P has
/// [`LONG`] or more.
fn opening_probe(partial: &str) -> Option<&str> {
    let opening = partial.trim_start();
    if opening.chars().count() < LONG {
        return None;
    }
    let end = opening.char_indices().nth(RESTART).map_or(opening.len(), |(at, _)| at);
    Some(&opening[..end])
}

fn common_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The text a seam lets through for the continuation `pieces`.
    fn splice(partial: &str, mode: SeamMode, pieces: &[&str]) -> Result<String, SeamError> {
        let mut seam = Seam::new(partial, mode);
        let mut out = String::new();
        for p in pieces {
            out.push_str(&seam.push(p)?);
        }
        out.push_str(&seam.finish()?);
        Ok(out)
    }

    fn turn(partial: &str, c: &str) -> Result<String, SeamError> {
        splice(partial, SeamMode::Turn, &[c])
    }

    fn prefill(partial: &str, c: &str) -> Result<String, SeamError> {
        splice(partial, SeamMode::Prefill, &[c])
    }

    #[test]
    fn whitespace_at_the_seam_is_kept_exactly_once() {
        for mode in [SeamMode::Prefill, SeamMode::Turn] {
            let s = |p: &str, c: &str| splice(p, mode, &[c]).unwrap();
            assert_eq!(s("Hello", " world"), " world", "a leading space is kept");
            assert_eq!(s("Hello ", " world"), "world", "the stripped space is not doubled");
            assert_eq!(s("Hello ", "world"), "world", "nor lost");
            assert_eq!(s("Hello\n", "\n\nWorld"), "\nWorld", "the rest of a longer break");
            assert_eq!(s("Hello\n\n", "\nWorld"), "World", "a shorter break adds nothing");
            assert_eq!(s("Hello ", "\n\nWorld"), "\n\nWorld", "a paragraph break is not lost");
            assert_eq!(s("Hello\n", " World"), "World");
            assert_eq!(s("Hel", "lo world"), "lo world", "inside a word");
            assert_eq!(s("", " Hi"), " Hi", "no partial: as it came");
        }
    }

    #[test]
    fn a_repeated_tail_is_dropped_and_a_chance_match_is_not() {
        // The model repeats the last words, or the word it was cut in.
        assert_eq!(turn("The cat sat on the", " the mat.").unwrap(), " mat.");
        assert_eq!(turn("The cat sat on the ", "the mat.").unwrap(), "mat.");
        assert_eq!(turn("The cat sat on the", "sat on the mat.").unwrap(), " mat.");
        assert_eq!(turn("I would say hel", "hello world").unwrap(), "lo world");
        assert_eq!(turn("It is 42", "42.").unwrap(), ".");
        // Chance matches eat nothing.
        assert_eq!(turn("I like pizza", "a lot").unwrap(), "a lot", "not at a word start");
        assert_eq!(
            turn("I went to the", " theater").unwrap(),
            " theater",
            "not at a word end"
        );
        assert_eq!(
            turn("a cat ", "catalog").unwrap(),
            "catalog",
            "a whole word before a space"
        );
        // A prefill continues exactly: only a long overlap is a repeat.
        assert_eq!(prefill("The cat sat on the", " the mat").unwrap(), " the mat");
        assert_eq!(prefill("Step 1", "1 is next").unwrap(), "1 is next");
        let long = "the quick brown fox jumps";
        assert_eq!(
            prefill(&format!("So: {long}"), &format!("{long} over")).unwrap(),
            " over"
        );
        // Non-ASCII text is cut at character boundaries.
        assert_eq!(turn("Voilà, c'est ça", "ça marche").unwrap(), " marche");
        // Without spaces between words, only a long overlap is a repeat.
        assert_eq!(turn("日本語のテキ", "ストです").unwrap(), "ストです");
        assert_eq!(turn("日本語のテキ", "テキストです").unwrap(), "テキストです");
        let long = "これは十六文字以上の長い文のかけらです";
        assert_eq!(turn(&format!("はい、{long}"), &format!("{long}。")).unwrap(), "。");
    }

    #[test]
    fn a_continuation_that_disagrees_is_an_error() {
        let p = "The answer has three parts. First, the setup. Second, the";
        // It starts over (the five identical partials stitched together).
        assert_eq!(
            turn(p, "The answer has three parts. First, the setup."),
            Err(SeamError::Restarted)
        );
        assert_eq!(prefill("Hi", "Hi! How can I help?"), Err(SeamError::Restarted));
        // It repeats a piece that is not the tail.
        assert_eq!(
            turn(p, " has three parts. First, the setup. Second"),
            Err(SeamError::Repeated)
        );
        assert_eq!(
            turn(p, " First, the setup."),
            Err(SeamError::Repeated),
            "a short whole one"
        );
        // It starts over after a preamble, in one piece or many.
        let p = "The capital of France is";
        let c = "Sure! Here is the rest: The capital of France is Paris, on the Seine.";
        assert_eq!(turn(p, c), Err(SeamError::Restarted));
        let pieces: Vec<String> = c.chars().map(String::from).collect();
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(splice(p, SeamMode::Prefill, &pieces), Err(SeamError::Restarted));
        // Far enough in, the same words are the answer's own.
        let later = format!(
            " Paris.{} The capital of France is old.",
            " It is on the Seine.".repeat(6)
        );
        assert_eq!(turn(p, &later).unwrap(), later);
        // A continuation that only shares a word or two is fine.
        assert_eq!(turn(p, " consequences. The end.").unwrap(), " consequences. The end.");
    }

    #[test]
    fn the_hold_is_bounded_and_ends_as_soon_as_it_can() {
        let mut seam = Seam::new("Some words here", SeamMode::Turn);
        assert_eq!(seam.push(" wor").unwrap(), "", "P contains it: held");
        assert_eq!(seam.push("ld").unwrap(), " world", "P does not: decided");
        assert!(seam.decided());
        assert_eq!(seam.push(" and").unwrap(), " and");
        assert_eq!(seam.finish().unwrap(), "");
        // A continuation that keeps matching is held at most HOLD characters.
        let p = "ab ".repeat(200);
        let mut seam = Seam::new(&p, SeamMode::Turn);
        let mut out = String::new();
        let mut pushed = 0;
        while !seam.decided() {
            out.push_str(&seam.push("ab ").unwrap_or_default());
            pushed += 3;
        }
        assert!(pushed <= HOLD + 3, "{pushed}");
        // Whitespace only: held until something else comes.
        let mut seam = Seam::new("Hi", SeamMode::Turn);
        assert_eq!(seam.push("\n").unwrap(), "");
        assert_eq!(seam.push("\nthere").unwrap(), "\n\nthere");
    }

    /// Words with none a prefix of another and none starting with a repeated piece ("mama"):
    /// texts made of them split only where the text says.
    const WORDS: &[&str] = &[
        "river", "stone", "bright", "quietly", "maple", "over", "under", "north", "glass", "hum", "velvet", "copper",
        "drift", "lantern", "oak", "plum", "saddle", "tundra", "echo", "fjord", "garnet", "ivory", "jasper", "kite",
        "zebra", "wander", "yield", "xenon", "brisk", "clover", "dune", "ember", "flint", "grove", "harbor", "inlet",
        "jolt", "knoll", "ledge", "marsh", "été", "naïve", "日本",
    ];

    #[test]
    fn the_words_of_the_property_test_have_no_accidental_overlaps() {
        for (i, a) in WORDS.iter().enumerate() {
            for (j, b) in WORDS.iter().enumerate() {
                assert!(i == j || !b.starts_with(a), "{a} is a prefix of {b}");
            }
            for (at, _) in a.char_indices().skip(1) {
                assert!(!a[at..].starts_with(&a[..at]), "{a} starts with a repeated piece");
            }
        }
    }

    fn text() -> impl Strategy<Value = String> {
        (
            Just(WORDS.to_vec()).prop_shuffle(),
            2..30usize,
            proptest::collection::vec(0..3usize, 30),
        )
            .prop_map(|(words, n, seps)| {
                let mut t = String::new();
                for (k, w) in words.iter().take(n).enumerate() {
                    if k > 0 {
                        t.push_str([" ", "\n", ", "][seps[k]]);
                    }
                    t.push_str(w);
                }
                t
            })
    }

    /// The byte offsets of `t` at character boundaries, and those where a word starts.
    fn boundaries(t: &str) -> (Vec<usize>, Vec<usize>) {
        let all: Vec<usize> = (0..=t.len()).filter(|&i| t.is_char_boundary(i)).collect();
        let starts = all
            .iter()
            .copied()
            .filter(|&i| {
                let before = t[..i].chars().next_back();
                t[i..].starts_with(char::is_alphanumeric) && !before.is_some_and(char::is_alphanumeric)
            })
            .collect();
        (all, starts)
    }

    use crate::continuation::tests::pieces;

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// Any text T split into P + C, C starting anywhere at or before the split at a word
        /// start (repeating P's tail), arriving in any pieces: P + what the seam lets through
        /// is T.
        #[test]
        fn the_spliced_text_is_the_whole_text(
            t in text(),
            split in any::<usize>(),
            back in any::<usize>(),
            overlap in any::<bool>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let (all, starts) = boundaries(&t);
            let i = all[split % all.len()];
            let before: Vec<usize> = starts.iter().copied().filter(|&s| s <= i).collect();
            let j = if overlap && !before.is_empty() { before[back % before.len()] } else { i };
            let (p, c) = (&t[..i], &t[j..]);
            let parts = pieces(c, &cuts);
            let out = splice(p, SeamMode::Turn, &parts);
            prop_assert_eq!(out.map(|o| format!("{p}{o}")), Ok(t.clone()), "P={:?} C={:?}", p, c);
            if j == i {
                // A prefill's continuation (no repeat) joins the same way.
                let out = splice(p, SeamMode::Prefill, &parts);
                prop_assert_eq!(out.map(|o| format!("{p}{o}")), Ok(t.clone()), "P={:?} C={:?}", p, c);
            }
        }

        #[test]
        fn the_seam_never_panics(p in any::<String>(), c in any::<String>(), cuts in proptest::collection::vec(any::<usize>(), 0..4)) {
            let parts = pieces(&c, &cuts);
            for mode in [SeamMode::Prefill, SeamMode::Turn] {
                if let Ok(out) = splice(&p, mode, &parts) {
                    // What goes through is always a piece of the continuation's end.
                    prop_assert!(c.ends_with(&out), "{:?} {:?}", c, out);
                }
            }
        }
    }
}

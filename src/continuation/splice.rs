//! The splicer: a continuation's events rewritten into the app's stream. Each dialect's map
//! ([`anthropic::Map`], [`chat::Map`], [`responses::Map`]) turns one event into [`Out`]s; the
//! splicer runs the text of the continuation's first text block (its run) through the [`Seam`],
//! holding every event after the run's first text until the seam is decided, writes what goes to
//! the app, and keeps the app's [`Transcript`] current with it (so that a continuation cut in turn
//! is continued from what the app has).

use serde_json::Value;

use super::event::{encode, Data, Event};
use super::seam::{Seam, SeamMode};
use super::transcript::{sum, Spent, Transcript};
use super::{anthropic, chat, responses, Dialect, How, Out, SpliceError};
use crate::wire::usage::Usage;

#[derive(Debug)]
enum Map {
    Messages(anthropic::Map),
    Chat(chat::Map),
    Responses(Box<responses::Map>),
}

/// An event held while the seam is undecided.
#[derive(Debug)]
struct Held {
    name: String,
    value: Value,
    /// A text delta of the run (the first one carries what the seam lets through).
    text: bool,
}

/// Splices one continuation into the app's stream (see the module documentation).
#[derive(Debug)]
pub(crate) struct Splicer {
    /// What the app has, with what was sent to it.
    app: Transcript,
    how: How,
    seam: Option<Seam>,
    held: Vec<Held>,
    /// The continuation as it came: its usage, the characters it produced.
    own: Transcript,
    map: Map,
    /// The seam's comment was sent.
    marked: bool,
    done: bool,
}

impl Splicer {
    /// A splicer of the continuation asked for `how`, into the stream `app` describes, for the
    /// original `request` (its body).
    pub(crate) fn new(mut app: Transcript, how: How, request: &[u8]) -> Splicer {
        if how == How::Resume {
            // The same generation: its final usage counts the whole of it.
            app.reset_attempt();
        } else {
            app.close_attempt();
        }
        let mode = if how == How::Prefill {
            SeamMode::Prefill
        } else {
            SeamMode::Turn
        };
        let seam = (how != How::Resume).then(|| Seam::new(&app.text(), mode));
        let request = serde_json::from_slice::<Value>(request).unwrap_or_default();
        let map = match app.dialect {
            Dialect::Messages => Map::Messages(anthropic::Map::new(&app)),
            Dialect::Chat => Map::Chat(chat::Map::new(&app, &request)),
            Dialect::Responses => Map::Responses(Box::new(responses::Map::new(&app, how == How::Resume))),
        };
        Splicer {
            own: Transcript::new(app.dialect),
            app,
            how,
            seam,
            held: Vec::new(),
            map,
            marked: false,
            done: false,
        }
    }

    /// Feeds one whole event of the continuation: the bytes to send the app.
    pub(crate) fn feed(&mut self, event: &[u8]) -> Result<Vec<u8>, SpliceError> {
        if self.done {
            return Ok(Vec::new());
        }
        self.own.observe(event);
        let e = Event::parse(event);
        let outs = match &mut self.map {
            Map::Messages(m) => m.map(&e, event)?,
            Map::Chat(m) => m.map(&e, event)?,
            Map::Responses(m) => m.map(&e, event)?,
        };
        let mut bytes = Vec::new();
        for out in outs {
            self.process(out, &mut bytes)?;
        }
        Ok(bytes)
    }

    /// The continuation's body ended: the end of the app's stream when the continuation's end
    /// is known, else [`SpliceError::Cut`].
    pub(crate) fn finish(&mut self) -> Result<Vec<u8>, SpliceError> {
        if self.done {
            return Ok(Vec::new());
        }
        let ended = match &self.map {
            Map::Messages(m) => m.ended(),
            Map::Chat(m) => m.ended(),
            Map::Responses(_) => false,
        };
        if !ended {
            return Err(SpliceError::Cut);
        }
        let mut bytes = Vec::new();
        self.process(Out::RunEnd, &mut bytes)?;
        self.process(Out::Finish, &mut bytes)?;
        Ok(bytes)
    }

    /// Whether the app's stream has its end.
    #[cfg(test)]
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// Every attempt's tokens: the earlier ones (cut), and this one as it reported them.
    pub(crate) fn attempts(&self) -> Vec<Spent> {
        let mut all = self.app.spent().to_vec();
        all.push(Spent {
            usage: self.own.reported(),
            estimated: false,
        });
        all
    }

    /// The app's transcript, with what was spliced into its stream and this attempt as the one
    /// it reads: for the decision after this continuation failed or was cut.
    pub(crate) fn into_transcript(self) -> Transcript {
        let mut app = self.app;
        app.adopt_attempt(&self.own);
        app
    }

    /// The sum of every attempt's tokens.
    fn total(&self) -> Usage {
        self.attempts()
            .iter()
            .fold(Usage::default(), |acc, s| sum(acc, s.usage))
    }

    fn process(&mut self, out: Out, bytes: &mut Vec<u8>) -> Result<(), SpliceError> {
        match out {
            Out::Raw(raw) => self.write_raw(raw, bytes),
            Out::Event(name, value) if self.held.is_empty() => self.write(name, value, bytes),
            Out::Event(name, value) => self.held.push(Held {
                name,
                value,
                text: false,
            }),
            Out::Text(name, mut value, text) => {
                let Some(seam) = self.seam.as_mut() else {
                    self.set_text(&mut value, text);
                    self.write(name, value, bytes);
                    return Ok(());
                };
                let decided = seam.decided();
                let through = seam.push(&text)?;
                if decided {
                    if !through.is_empty() {
                        self.set_text(&mut value, through);
                        self.write(name, value, bytes);
                    }
                    return Ok(());
                }
                self.held.push(Held {
                    name,
                    value,
                    text: true,
                });
                if self.seam.as_ref().is_some_and(Seam::decided) {
                    self.flush(through, bytes);
                }
            }
            Out::RunEnd => {
                if let Some(seam) = self.seam.as_mut().filter(|s| !s.decided()) {
                    let through = seam.finish()?;
                    self.flush(through, bytes);
                }
            }
            Out::Finish => {
                let total = self.total();
                let outs = match &mut self.map {
                    Map::Messages(m) => m.finish(total),
                    Map::Chat(m) => m.finish(total),
                    Map::Responses(m) => m.finish(total, &self.app),
                };
                for out in outs {
                    self.process(out, bytes)?;
                }
                self.done = true;
            }
        }
        Ok(())
    }

    /// Sends what was held: the run's first text delta carrying `through`, the run's other
    /// deltas dropped (their text is in it), the rest as it came.
    fn flush(&mut self, through: String, bytes: &mut Vec<u8>) {
        let mut through = Some(through).filter(|t| !t.is_empty());
        let mut first = true;
        for mut held in std::mem::take(&mut self.held) {
            if held.text {
                if std::mem::take(&mut first) {
                    if let Some(text) = through.take() {
                        self.set_text(&mut held.value, text);
                        self.write(held.name, held.value, bytes);
                    }
                }
                continue;
            }
            self.write(held.name, held.value, bytes);
        }
    }

    fn set_text(&self, value: &mut Value, text: String) {
        self.app.dialect.api().set_text(value, text);
    }

    /// The comment that marks the seam (SDKs skip comments), before the first bytes sent.
    fn mark(&mut self, bytes: &mut Vec<u8>) {
        if !std::mem::replace(&mut self.marked, true) {
            bytes.extend_from_slice(format!(": rebound: continued ({})\n\n", self.how.as_str()).as_bytes());
        }
    }

    fn write(&mut self, name: String, mut value: Value, bytes: &mut Vec<u8>) {
        self.mark(bytes);
        if let Map::Responses(m) = &self.map {
            m.fill(&self.app, &mut value);
        }
        bytes.extend_from_slice(&encode(&name, &value));
        self.app.forwarded(&Event {
            name,
            data: Data::Json(value),
        });
    }

    fn write_raw(&mut self, raw: Vec<u8>, bytes: &mut Vec<u8>) {
        self.mark(bytes);
        self.app.forwarded(&Event::parse(&raw));
        bytes.extend_from_slice(&raw);
    }
}

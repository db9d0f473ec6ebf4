//! A model check of the idempotency protocol across replicas ([stateright]): every interleaving
//! of requests with one key, on replicas that crash, pause past their lease and resume, checked
//! exhaustively for the promises of docs/failure-modes.md.
//!
//! With the relay modelled ([`Protocol::chunks`] > 0), a response is that many chunks, produced
//! one at a time, and a follower reads them through the
//! owner's relay stream (`relay.rs`: data entries, then an end entry, in order; each `XADD`
//! atomic), and ends clean only on the end entry `complete`. A relay write that fails (its
//! replica cut off from Redis) stops that relay for good; a reader whose connection fails (Redis
//! restarted, its replica cut off) ends its followers with an abort (`Read::Failed`).
//!
//! The Redis scripts are atomic steps, written here as the Lua does them (`idem_begin_v4`,
//! `idem_complete_v2`, `idem_release_v2`, `idem_takeover_v1`); what a replica decides from a
//! script's reply is the product's own code: the begin reply is read by `redis_store::parse_begin`
//! and a dead owner's replica is named by `liveness::replica_of`. Time is not modelled: a live,
//! reachable owner renews its lease, so a lease lapses only under an owner that is paused or
//! dead, and a replica's liveness lapses only when it is paused or dead.

use std::collections::BTreeSet;

use redis::Value;
use stateright::{Checker, Expectation, Model, Property};

use super::liveness::{replica_of, Owner};
use super::redis_store::parse_begin;
use super::store::Begin;

/// How many times a client sends its request, at most (its first send and one retry).
const SENDS: u8 = 2;

/// A relay stream's end entry `complete` (data entries are the chunk's index).
const END_COMPLETE: u8 = 100;

/// A replica's state.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Node {
    Up,
    /// Stopped past its lease and its liveness (a GC pause, a frozen VM), then resumed.
    Paused,
    /// Running, Redis out of its reach (past its lease and its liveness): it serves what it holds
    /// to the end, and every script it runs fails.
    Cut,
    Crashed,
}

/// The record of the key in Redis.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Record {
    /// Claimed, not completed (`st` = `P`); else completed with `body` (`C`).
    pending: bool,
    /// The owner: (replica, claim).
    own: (u8, u8),
    body: u8,
}

/// A client's request, on the replica `at`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Req {
    /// Not sent yet, or to be sent again (it has been sent `sends` times).
    Idle { sends: u8 },
    /// Owns the key as `claim`, the provider not called yet.
    Claimed { at: u8, claim: u8, sends: u8 },
    /// The provider answers `resp`, of which `sent` chunks came; the completion is not written yet.
    Called {
        at: u8,
        claim: u8,
        resp: u8,
        sends: u8,
        sent: u8,
    },
    /// Follows the response of the owner `owner`: `read` entries of its relay stream read, the
    /// chunks it has as a mask (`have`); `broken` once its reader's connection failed.
    Following {
        at: u8,
        owner: (u8, u8),
        sends: u8,
        read: u8,
        have: u8,
        broken: bool,
    },
    /// The client got the response `Some(resp)`, or an error.
    Done(Option<u8>),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct State {
    record: Option<Record>,
    nodes: Vec<Node>,
    reqs: Vec<Req>,
    /// Provider calls made for the key.
    calls: u8,
    claims: u8,
    /// The bodies clients were given by a replay.
    replays: BTreeSet<u8>,
    /// The first response a completion stored.
    stored: Option<u8>,
    /// How many times one of docs/failure-modes.md's exceptions happened, each allowing one more
    /// provider call: a replica crashed holding a response it had not stored, a completion was lost to
    /// a replica cut off from Redis, a lease or a liveness lapsed under a replica that was only
    /// paused or cut off, or Redis forgot the key.
    exceptions: u8,
    /// Dead owners' keys taken over.
    takeovers: u8,
    pauses: u8,
    flushes: u8,
    /// Responses whose client went away mid-stream, still read to their end by their replica to
    /// be stored (`complete_on_disconnect`): (replica, claim, response, chunks sent).
    orphans: Vec<(u8, u8, u8, u8)>,
    /// The relay streams in Redis: (owner, entries, whether its relay still writes).
    streams: Vec<((u8, u8), Vec<u8>, bool)>,
    /// A follower ended clean without every chunk.
    partial_clean: bool,
    /// A follower ended clean, reading through the relay.
    relayed: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub(super) enum Action {
    Send(usize, u8),
    Call(usize),
    /// The owner's next chunk comes (and is relayed).
    Produce(usize),
    /// A follower reads its relay stream's next entry, or learns that its reader failed.
    Read(usize),
    Complete(usize),
    Fail(usize),
    Follow(usize),
    TakeOver(usize),
    Lapse,
    Crash(u8),
    Pause(u8),
    /// The replica loses Redis (a partition); `Resume` heals it.
    Cut(u8),
    Resume(u8),
    /// Redis restarts empty (or fails over to a replica that had not the key yet).
    Flush,
    /// The client of a response in flight goes away mid-stream, and will send again.
    Disconnect(usize),
    /// A response whose client went away is stored.
    CompleteOrphan(usize),
}

/// The protocol, or a variant of it known to be wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Variant {
    /// As the product does it.
    Product,
    /// `idem_complete` writes without checking that the caller still owns the key.
    CompleteWithoutOwnerCheck,
    /// A reader whose connection fails reconnects and reads on from the last entry it read
    /// (after Redis restarted empty: from the new stream's first entry).
    ReaderReadsOn,
}

/// `replicas` replicas and `requests` requests with one key, with at most `pauses` pauses or
/// cuts from Redis in all, and at most `flushes` restarts of Redis empty.
pub(super) struct Protocol {
    pub(super) replicas: u8,
    pub(super) requests: usize,
    pub(super) pauses: u8,
    pub(super) flushes: u8,
    /// Clients that go away mid-stream, at most, in all.
    pub(super) disconnects: u8,
    /// The chunks of a response, relayed to followers one by one; 0: the relay is not modelled
    /// (a follower waits for the record, then replays it).
    pub(super) chunks: u8,
    pub(super) variant: Variant,
}

/// Whether a request holds the claim `own` (it has not called the provider yet, or has not stored
/// the response).
fn held(state: &State, own: (u8, u8)) -> bool {
    state.orphans.iter().any(|(at, claim, ..)| (*at, *claim) == own)
        || state
            .reqs
            .iter()
            .any(|q| matches!(*q, Req::Claimed { at, claim, .. } | Req::Called { at, claim, .. } if (at, claim) == own))
}

/// The owner `own`'s relay writes `entry` (`XADD`): a write from a replica cut off from Redis
/// fails, and its relay stops for good; after Redis restarted empty, the write makes a new
/// stream.
fn relay(state: &mut State, own: (u8, u8), entry: u8) {
    let reachable = state.nodes[usize::from(own.0)] == Node::Up;
    match state.streams.iter_mut().find(|s| s.0 == own) {
        Some(stream) if stream.2 && reachable => stream.1.push(entry),
        Some(stream) => stream.2 = false,
        None if reachable => state.streams.push((own, vec![entry], true)),
        None => state.streams.push((own, Vec::new(), false)),
    }
}

/// The next entry of `owner`'s relay stream after `read` entries, if it is there.
fn entry(state: &State, owner: (u8, u8), read: u8) -> Option<u8> {
    let stream = state.streams.iter().find(|s| s.0 == owner)?;
    stream.1.get(usize::from(read)).copied()
}

/// A follower's client is answered with an error (an abort mid-stream, or no response), and
/// sends again while it may.
fn fail_follower(state: &mut State, i: usize) {
    if let Req::Following { sends, .. } = state.reqs[i] {
        state.reqs[i] = if sends < SENDS {
            Req::Idle { sends }
        } else {
            Req::Done(None)
        };
    }
}

/// Request `i` on replica `at` claims the key under a new claim (a begin, or a takeover).
fn claim(state: &mut State, (i, at): (usize, u8), sends: u8) {
    let claim = state.claims;
    state.claims += 1;
    state.record = Some(Record {
        pending: true,
        own: (at, claim),
        body: 0,
    });
    state.reqs[i] = Req::Claimed { at, claim, sends };
}

/// An owner token as the product mints them: `{replica}.{claim}`, each in hex.
fn token((replica, claim): (u8, u8)) -> Owner {
    Owner::new(format!("{:016x}.{:016x}", u64::from(replica) + 1, u64::from(claim) + 1))
}

/// The replica a token names, read by the product's `replica_of`.
fn replica_named(owner: (u8, u8)) -> Option<u8> {
    let token = token(owner);
    let hex = replica_of(token.as_str())?;
    u64::from_str_radix(hex, 16)
        .ok()
        .and_then(|n| u8::try_from(n.checked_sub(1)?).ok())
}

/// `idem_begin_v4`'s reply to a new claim by `owner` of the key in `record`.
fn begin_reply(record: Option<Record>) -> Vec<Value> {
    let word = |w: &str| Value::BulkString(w.as_bytes().to_vec());
    match record {
        None => vec![word("claimed")],
        Some(r) if r.pending => vec![word("in_progress"), Value::Int(1000), word(token(r.own).as_str())],
        Some(r) => vec![
            word("completed"),
            word(r#"{"status":200,"headers":[]}"#),
            Value::BulkString(vec![r.body]),
        ],
    }
}

impl Protocol {
    fn after_crash(state: &mut State, replica: u8) {
        // A response got and not yet stored is lost with the replica: the key runs again on the
        // client's retry (the documented exception: docs/failure-modes.md, "replica crash").
        state.exceptions += u8::from(
            state
                .reqs
                .iter()
                .any(|q| matches!(*q, Req::Called { at, .. } if at == replica))
                || state.orphans.iter().any(|(at, ..)| *at == replica),
        );
        state.orphans.retain(|(at, ..)| *at != replica);
        for stream in state.streams.iter_mut().filter(|s| s.0 .0 == replica) {
            stream.2 = false;
        }
        for req in &mut state.reqs {
            let (at, sends) = match *req {
                Req::Claimed { at, sends, .. } | Req::Called { at, sends, .. } | Req::Following { at, sends, .. } => {
                    (at, sends)
                }
                _ => continue,
            };
            if at == replica {
                // The client sees its connection reset, and sends again while it may.
                *req = if sends < SENDS {
                    Req::Idle { sends }
                } else {
                    Req::Done(None)
                };
            }
        }
    }

    fn send(&self, state: &mut State, (i, at): (usize, u8), sends: u8) {
        let sends = sends + 1;
        if state.nodes[usize::from(at)] == Node::Cut {
            // `on_store_error = "fail_closed"`: 503 `store_unavailable`, nothing sent upstream.
            state.reqs[i] = if sends < SENDS {
                Req::Idle { sends }
            } else {
                Req::Done(None)
            };
            return;
        }
        match parse_begin(begin_reply(state.record)) {
            Ok(Begin::Claimed) => claim(state, (i, at), sends),
            Ok(Begin::InProgress { owner, .. }) => {
                let own = state.record.map_or((0, 0), |r| r.own);
                assert_eq!(owner.as_str(), token(own).as_str());
                state.reqs[i] = Req::Following {
                    at,
                    owner: own,
                    sends,
                    read: 0,
                    have: 0,
                    broken: false,
                };
            }
            Ok(Begin::Completed(stored)) => {
                let body = stored.body.first().copied().unwrap_or(u8::MAX);
                state.replays.insert(body);
                state.reqs[i] = Req::Done(Some(body));
            }
            _ => state.reqs[i] = Req::Done(None),
        }
    }

    fn complete(&self, state: &mut State, i: usize) {
        let Req::Called { at, claim, resp, .. } = state.reqs[i] else {
            return;
        };
        if self.chunks > 0 {
            relay(state, (at, claim), END_COMPLETE);
        }
        self.store(state, (at, claim), resp);
        state.reqs[i] = Req::Done(Some(resp));
    }

    /// `idem_complete_v2` by the owner `(at, claim)` of the response `resp`.
    fn store(&self, state: &mut State, (at, claim): (u8, u8), resp: u8) {
        if state.nodes[usize::from(at)] == Node::Cut {
            // The completion cannot be written (`result="lost"`), and a retry elsewhere runs
            // again (docs/failure-modes.md, "cut off from Redis").
            state.exceptions += 1;
            return;
        }
        let ours = state.record.is_none_or(|r| r.own == (at, claim));
        let written = match self.variant {
            Variant::CompleteWithoutOwnerCheck => true,
            Variant::Product | Variant::ReaderReadsOn => ours && state.record.is_none_or(|r| r.pending),
        };
        if written {
            state.stored.get_or_insert(resp);
            state.record = Some(Record {
                pending: false,
                own: (at, claim),
                body: resp,
            });
        }
    }
}

impl Protocol {
    /// A fault, or what follows one (a lapse, a resume, an orphan's end): `None` when `action`
    /// does not apply to `state`.
    fn fault(&self, state: &mut State, action: Action) -> Option<()> {
        match action {
            Action::Lapse => {
                let owner = state.record.map(|r| usize::from(r.own.0))?;
                state.exceptions += u8::from(matches!(state.nodes[owner], Node::Paused | Node::Cut));
                state.record = None;
            }
            Action::Crash(r) => {
                state.nodes[usize::from(r)] = Node::Crashed;
                Protocol::after_crash(state, r);
            }
            Action::Pause(r) => {
                state.nodes[usize::from(r)] = Node::Paused;
                state.pauses += 1;
            }
            Action::Cut(r) => {
                state.nodes[usize::from(r)] = Node::Cut;
                state.pauses += 1;
                // Its readers' connections fail.
                for req in state.reqs.iter_mut().filter(|_| self.chunks > 0) {
                    if let Req::Following { at, broken, .. } = req {
                        *broken |= *at == r;
                    }
                }
            }
            Action::Resume(r) => state.nodes[usize::from(r)] = Node::Up,
            Action::Disconnect(i) => {
                let Req::Called {
                    at,
                    claim,
                    resp,
                    sends,
                    sent,
                } = state.reqs[i]
                else {
                    return None;
                };
                state.orphans.push((at, claim, resp, sent));
                state.reqs[i] = Req::Idle { sends };
            }
            Action::CompleteOrphan(k) => {
                // Read to its end (its chunks relayed as they come), then stored.
                let (at, claim, resp, sent) = state.orphans.remove(k);
                for chunk in sent..self.chunks {
                    relay(state, (at, claim), chunk);
                }
                if self.chunks > 0 {
                    relay(state, (at, claim), END_COMPLETE);
                }
                self.store(state, (at, claim), resp);
            }
            Action::Flush => {
                // The key is forgotten: a retry runs again (docs/failure-modes.md, "Redis
                // restarted empty"); what it stores next is the key's response from then on.
                state.exceptions += u8::from(state.record.is_some());
                state.record = None;
                state.stored = None;
                state.replays.clear();
                state.flushes += 1;
                // The relay streams are gone, and every reader's connection with them.
                state.streams.clear();
                for req in state.reqs.iter_mut().filter(|_| self.chunks > 0) {
                    if let Req::Following { read, broken, .. } = req {
                        match self.variant {
                            Variant::ReaderReadsOn => *read = 0,
                            _ => *broken = true,
                        }
                    }
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// Follower `i` reads the next entry of its owner's relay stream (or learns its reader failed).
    fn read(&self, state: &mut State, i: usize) {
        let Req::Following {
            owner,
            read,
            have,
            broken,
            ..
        } = state.reqs[i]
        else {
            return;
        };
        match entry(state, owner, read) {
            _ if broken => fail_follower(state, i),
            Some(END_COMPLETE) => {
                // A clean end: the follower's client has what it read.
                state.partial_clean |= have != (1 << self.chunks) - 1;
                state.relayed = true;
                state.reqs[i] = Req::Done(Some(0));
            }
            None => fail_follower(state, i),
            Some(chunk) => {
                if let Req::Following { read, have, .. } = &mut state.reqs[i] {
                    *read += 1;
                    *have |= 1 << chunk;
                }
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            record: None,
            nodes: vec![Node::Up; usize::from(self.replicas)],
            reqs: vec![Req::Idle { sends: 0 }; self.requests],
            calls: 0,
            claims: 0,
            replays: BTreeSet::new(),
            stored: None,
            exceptions: 0,
            takeovers: 0,
            pauses: 0,
            flushes: 0,
            orphans: Vec::new(),
            streams: Vec::new(),
            partial_clean: false,
            relayed: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let node = |r: u8| state.nodes[usize::from(r)];
        let up = |r: u8| node(r) == Node::Up;
        let running = |r: u8| matches!(node(r), Node::Up | Node::Cut);
        for (i, req) in state.reqs.iter().enumerate() {
            match *req {
                Req::Idle { sends } if sends < SENDS => {
                    actions.extend((0..self.replicas).filter(|r| running(*r)).map(|r| Action::Send(i, r)));
                }
                Req::Claimed { at, .. } if running(at) => actions.extend([Action::Call(i), Action::Fail(i)]),
                Req::Called { at, sends, sent, .. } if running(at) => {
                    actions.push(if sent < self.chunks {
                        Action::Produce(i)
                    } else {
                        Action::Complete(i)
                    });
                    if sends < SENDS && (state.orphans.len() as u8) < self.disconnects {
                        actions.push(Action::Disconnect(i));
                    }
                }
                Req::Following {
                    at,
                    owner,
                    read,
                    broken,
                    ..
                } if up(at) => {
                    let pending = state.record.is_some_and(|r| r.pending && r.own == owner);
                    if broken || entry(state, owner, read).is_some() {
                        // Its reader's next entry (a last look comes before any other decision),
                        // or its failure.
                        actions.push(Action::Read(i));
                    } else if !pending {
                        actions.push(Action::Follow(i));
                    } else if replica_named(owner).is_some_and(|r| !up(r)) {
                        // Its owner's replica stopped beating: a follower that has nothing yet may
                        // take the key over; one that has bytes is aborted.
                        actions.push(if read == 0 {
                            Action::TakeOver(i)
                        } else {
                            Action::Follow(i)
                        });
                    }
                }
                _ => {}
            }
        }
        // A lease lapses when its owner stops renewing it: the owner's replica is not up, or no
        // request holds the claim any more (a release that could not be written).
        if state
            .record
            .is_some_and(|r| r.pending && (!up(r.own.0) || !held(state, r.own)))
        {
            actions.push(Action::Lapse);
        }
        if state.flushes < self.flushes {
            actions.push(Action::Flush);
        }
        for (k, (at, ..)) in state.orphans.iter().enumerate() {
            if running(*at) {
                actions.push(Action::CompleteOrphan(k));
            }
        }
        for r in 0..self.replicas {
            match node(r) {
                Node::Up => {
                    actions.push(Action::Crash(r));
                    if state.pauses < self.pauses {
                        actions.extend([Action::Pause(r), Action::Cut(r)]);
                    }
                }
                Node::Paused | Node::Cut => actions.extend([Action::Resume(r), Action::Crash(r)]),
                Node::Crashed => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Send(i, at) => {
                let Req::Idle { sends } = state.reqs[i] else {
                    return None;
                };
                self.send(&mut state, (i, at), sends);
            }
            Action::Call(i) => {
                let Req::Claimed { at, claim, sends } = state.reqs[i] else {
                    return None;
                };
                state.calls += 1;
                state.reqs[i] = Req::Called {
                    at,
                    claim,
                    resp: 100 + state.calls,
                    sends,
                    sent: 0,
                };
            }
            Action::Produce(i) => {
                let Req::Called { at, claim, sent, .. } = &mut state.reqs[i] else {
                    return None;
                };
                let (own, chunk) = ((*at, *claim), *sent);
                *sent += 1;
                relay(&mut state, own, chunk);
            }
            Action::Read(i) => self.read(&mut state, i),
            Action::Complete(i) => self.complete(&mut state, i),
            Action::Fail(i) => {
                // Failed for good before any byte: the key is released (owner-checked).
                let Req::Claimed { at, claim, .. } = state.reqs[i] else {
                    return None;
                };
                let reachable = state.nodes[usize::from(at)] == Node::Up;
                if reachable && state.record.is_some_and(|r| r.pending && r.own == (at, claim)) {
                    state.record = None;
                }
                state.reqs[i] = Req::Done(None);
            }
            Action::Follow(i) => {
                let Req::Following { sends, read, .. } = state.reqs[i] else {
                    return None;
                };
                if read > 0 {
                    // Its reader had entries: the original ended without its end entry (released,
                    // taken over, or its replica dead): aborted.
                    fail_follower(&mut state, i);
                    return Some(state);
                }
                match state.record {
                    // The original completed: its response, as stored.
                    Some(r) if !r.pending => {
                        state.replays.insert(r.body);
                        state.reqs[i] = Req::Done(Some(r.body));
                    }
                    // Released, lapsed or taken over: the follower's request begins again.
                    _ => state.reqs[i] = Req::Idle { sends: sends - 1 },
                }
            }
            Action::TakeOver(i) => {
                let Req::Following { at, owner, sends, .. } = state.reqs[i] else {
                    return None;
                };
                let dead = usize::from(owner.0);
                state.exceptions += u8::from(matches!(state.nodes[dead], Node::Paused | Node::Cut));
                state.takeovers += 1;
                claim(&mut state, (i, at), sends);
            }
            fault => self.fault(&mut state, fault)?,
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one provider call per key, but for the documented exceptions",
                |_, s: &State| s.calls <= 1 + s.exceptions,
            ),
            Property::always(
                "a completed key keeps the response stored first, and replays it",
                |_, s: &State| {
                    let kept = s.record.is_none_or(|r| r.pending || Some(r.body) == s.stored);
                    kept && s.replays.iter().all(|b| Some(*b) == s.stored)
                },
            ),
            Property::always(
                "every key ends completed or released, every request answered",
                |m, s: &State| {
                    // Ended: nothing can happen any more but a fault (a crash, a pause, a cut, a
                    // flush).
                    let mut next = Vec::new();
                    m.actions(s, &mut next);
                    let fault =
                        |a: &Action| matches!(a, Action::Crash(_) | Action::Pause(_) | Action::Cut(_) | Action::Flush);
                    let all_down = s.nodes.iter().all(|n| *n == Node::Crashed);
                    !next.iter().all(fault)
                        || all_down
                        || (s.record.is_none_or(|r| !r.pending) && s.reqs.iter().all(|q| matches!(q, Req::Done(_))))
                },
            ),
            Property::always("no follower ends with a clean end on a partial body", |_, s: &State| {
                !s.partial_clean
            }),
            Property::sometimes("a replay", |_, s: &State| !s.replays.is_empty()),
            Property::sometimes(
                "a follower reads the whole response through the relay",
                |m, s: &State| s.relayed || m.chunks == 0,
            ),
            Property::sometimes("a takeover of a dead owner's key, then a replay", |_, s: &State| {
                s.takeovers >= 1 && !s.replays.is_empty() && s.calls == 1
            }),
        ]
    }
}

/// Checks `protocol` exhaustively; the names of the properties that failed (an `always` with a
/// counterexample, printed; a `sometimes` with no example).
pub(super) fn failures(protocol: Protocol) -> Vec<&'static str> {
    let properties: Vec<(&'static str, bool)> = protocol
        .properties()
        .iter()
        .map(|p| (p.name, matches!(p.expectation, Expectation::Sometimes)))
        .collect();
    let checker = protocol.checker().spawn_bfs().join();
    eprintln!(
        "{} states, {} unique",
        checker.state_count(),
        checker.unique_state_count()
    );
    properties
        .into_iter()
        .filter(|(name, sometimes)| {
            let found = checker.discovery(name);
            if let (Some(path), false) = (&found, sometimes) {
                eprintln!("{name}: {:?}", path.clone().into_actions());
            }
            found.is_some() != *sometimes
        })
        .map(|(name, _)| name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protocol(replicas: u8, requests: usize, chunks: u8, variant: Variant) -> Protocol {
        Protocol {
            replicas,
            requests,
            pauses: 1,
            flushes: 1,
            disconnects: 1,
            chunks,
            variant,
        }
    }

    #[test]
    fn two_replicas_and_two_requests_keep_every_promise() {
        assert_eq!(failures(protocol(2, 2, 0, Variant::Product)), Vec::<&str>::new());
    }

    #[test]
    fn a_completion_without_the_owner_check_is_found() {
        assert_eq!(
            failures(protocol(2, 2, 0, Variant::CompleteWithoutOwnerCheck)),
            vec!["a completed key keeps the response stored first, and replays it"]
        );
    }

    /// The relay: a follower reads the response as it is produced, and ends clean only with all
    /// of it, whatever crashes, pauses, cuts and Redis restarts come between.
    #[test]
    fn followers_read_the_relay_to_a_whole_end_or_an_abort() {
        let relayed = Protocol {
            disconnects: 0,
            ..protocol(2, 2, 1, Variant::Product)
        };
        assert_eq!(failures(relayed), Vec::<&str>::new());
    }

    #[test]
    fn a_reader_that_reads_on_after_redis_restarted_is_found() {
        let bad = Protocol {
            pauses: 0,
            disconnects: 0,
            ..protocol(2, 2, 1, Variant::ReaderReadsOn)
        };
        assert_eq!(
            failures(bad),
            vec!["no follower ends with a clean end on a partial body"]
        );
    }

    #[test]
    fn three_replicas_and_three_requests_keep_every_promise() {
        let product = Protocol {
            flushes: 0,
            disconnects: 0,
            ..protocol(3, 3, 0, Variant::Product)
        };
        assert_eq!(failures(product), Vec::<&str>::new());
    }
}

//! Fleet-wide limits and budgets (`[limits.NAME]`, docs/limits.md): the pure core.
//! No I/O, no clock reads (time is a parameter: unix milliseconds for windows, an `Instant` for
//! queue deadlines), no global randomness.
//! - [`key`]: a limit's `key` and the [`key::BucketKey`] a request falls in (hashed: no key value
//!   is ever kept or shown);
//! - [`window`]: the fixed windows a limit counts in (minute, UTC day, UTC calendar month);
//! - [`ledger`]: one replica's account of a bucket's requests, tokens or spend in the window,
//!   spent from a lease of the fleet's count ([`ledger::Pool`] is that count's contract), with
//!   the overshoot bound stated and proved there;
//! - [`concurrency`]: concurrent requests per bucket, from slots the fleet leases;
//! - [`fair_queue`]: the bounded weighted fair queue requests wait in over a limit;
//! - [`headers`]: the IETF `RateLimit-Policy` and `RateLimit` fields, and the tightest limit;
//! - [`prices`]: what a usage costs under `[prices]`, in micro-USD.
//!
//! It does not own: the configuration (`config` parses `[limits.NAME]` with [`key::KeySpec::parse`]),
//! how much a request reserves (its `max_tokens` and prompt, read by the pipeline), the Redis
//! scripts that keep the fleet's counts, the lease renewals' tasks, `redis_down`, the metrics or
//! the 429 `limit_exceeded` answer: the pipeline composes those from what is decided here.

// Parts the pipeline does not use yet (a stream charged as it flows, leases handed back, the
// fleet's counts the property tests model): docs/limits.md, "Not yet".
#![cfg_attr(not(test), allow(dead_code))]

pub(crate) mod aimd;
pub(crate) mod concurrency;
pub(crate) mod estimate;
pub(crate) mod fair_queue;
pub(crate) mod headers;
pub(crate) mod key;
pub(crate) mod ledger;
pub(crate) mod prices;
pub(crate) mod window;

#[cfg(test)]
mod tests {
    //! The ledger's overshoot bound, over a simulated fleet: replicas drawing leases from one
    //! [`Pool`] in any interleaving, with leases answered late, streams charged as they flow,
    //! settlements in later windows and unspent leases handed back.

    use std::collections::{BTreeMap, VecDeque};

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::ledger::{Lease, Ledger, Pool, Reservation, Reserve};
    use super::window::Period;

    const T0: u64 = 1_764_000_000_000;

    #[derive(Debug, Clone)]
    enum Op {
        /// A request asks for `amount` and will use `usage_pct` percent of it.
        Reserve {
            replica: usize,
            amount: u64,
            usage_pct: u64,
        },
        /// The oldest lease request of a replica is answered.
        Deliver {
            replica: usize,
        },
        Renew {
            replica: usize,
        },
        /// A stream in flight is charged part of what it has left to use (over 100: the count
        /// as it flows overshoots what the provider reports at the end).
        Charge {
            pick: usize,
            pct: u64,
        },
        Settle {
            pick: usize,
        },
        GiveBack {
            replica: usize,
        },
        Advance {
            ms: u64,
        },
    }

    fn op(replicas: usize, limit: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..replicas, 0..=limit + limit / 2, 0u64..=200)
                .prop_map(|(replica, amount, usage_pct)| Op::Reserve { replica, amount, usage_pct }),
            3 => (0..replicas).prop_map(|replica| Op::Deliver { replica }),
            1 => (0..replicas).prop_map(|replica| Op::Renew { replica }),
            2 => (any::<usize>(), 0u64..=150).prop_map(|(pick, pct)| Op::Charge { pick, pct }),
            3 => any::<usize>().prop_map(|pick| Op::Settle { pick }),
            1 => (0..replicas).prop_map(|replica| Op::GiveBack { replica }),
            1 => (0u64..40_000).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    struct InFlight {
        replica: usize,
        reservation: Reservation,
        usage: u64,
        charged: u64,
    }

    /// Per window: (the usage of the requests admitted in it, their excess).
    type Books = BTreeMap<u64, (u64, u64)>;

    struct Fleet {
        now: u64,
        pool: Pool,
        ledgers: Vec<Ledger>,
        asked: Vec<VecDeque<Lease>>,
        flying: Vec<InFlight>,
        books: Books,
    }

    impl Fleet {
        fn new(replicas: usize, limit: u64) -> Fleet {
            Fleet {
                now: T0,
                pool: Pool::new(limit),
                ledgers: (0..replicas)
                    .map(|_| Ledger::new(limit, Period::Minute, replicas as u32))
                    .collect(),
                asked: vec![VecDeque::new(); replicas],
                flying: Vec::new(),
                books: Books::new(),
            }
        }

        fn run(&mut self, op: Op) {
            let now = self.now;
            match op {
                Op::Reserve {
                    replica,
                    amount,
                    usage_pct,
                } => match self.ledgers[replica].try_reserve(now, amount) {
                    Reserve::Ok(reservation) => {
                        let usage = amount * usage_pct / 100;
                        let books = self.books.entry(reservation.window().index).or_default();
                        books.0 += usage;
                        books.1 += usage.saturating_sub(reservation.reserved());
                        self.flying.push(InFlight {
                            replica,
                            reservation,
                            usage,
                            charged: 0,
                        });
                    }
                    Reserve::NeedLease(lease) => self.asked[replica].push_back(lease),
                    Reserve::Over { retry_after_ms } => assert!(retry_after_ms > 0),
                },
                Op::Deliver { replica } => {
                    if let Some(lease) = self.asked[replica].pop_front() {
                        let grant = self.pool.lease(lease);
                        self.ledgers[replica].grant(now, grant);
                    }
                }
                Op::Renew { replica } => self.asked[replica].extend(self.ledgers[replica].renewal(now)),
                Op::Charge { pick, pct } if !self.flying.is_empty() => {
                    let at = pick % self.flying.len();
                    let f = &mut self.flying[at];
                    let more = f.usage.saturating_sub(f.charged) * pct / 100;
                    f.charged += more;
                    self.ledgers[f.replica].charge(now, &mut f.reservation, more);
                }
                Op::Settle { pick } if !self.flying.is_empty() => {
                    let f = self.flying.swap_remove(pick % self.flying.len());
                    self.settle(f);
                }
                Op::GiveBack { replica } => {
                    if let Some((window, spare)) = self.ledgers[replica].give_back(now) {
                        self.pool.give_back(window, spare);
                    }
                }
                Op::Advance { ms } => self.now += ms,
                Op::Charge { .. } | Op::Settle { .. } => {}
            }
        }

        fn settle(&mut self, f: InFlight) {
            let reserved = f.reservation.reserved();
            let settled = self.ledgers[f.replica].settle(self.now, f.reservation, f.usage);
            assert_eq!(settled.excess, f.usage.saturating_sub(reserved));
        }
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(512))]

        /// For every window, over the fleet: the usage of the requests admitted in it is at most
        /// the limit plus their excess (usage beyond reservation), whatever the interleaving.
        #[test]
        fn the_fleet_stays_within_the_limit_plus_the_excess(
            (replicas, limit, ops) in (1usize..=4, 1u64..=300)
                .prop_flat_map(|(n, limit)| (Just(n), Just(limit), vec(op(n, limit), 1..400)))
        ) {
            let mut fleet = Fleet::new(replicas, limit);
            for op in ops {
                fleet.run(op);
            }
            for f in std::mem::take(&mut fleet.flying) {
                fleet.settle(f);
            }
            for (window, (usage, excess)) in &fleet.books {
                prop_assert!(
                    usage <= &(limit + excess),
                    "window {window}: usage {usage} > limit {limit} + excess {excess}"
                );
            }
        }
    }

    /// The bound is reached: three replicas, a burst of streams that each use more than they
    /// reserved, all admitted before any is charged.
    #[test]
    fn a_burst_of_streams_overshoots_by_exactly_their_excess() {
        let mut fleet = Fleet::new(3, 240); // leases of 240 / (8 x 3) = 10
        for replica in 0..3 {
            for _ in 0..8 {
                fleet.run(Op::Reserve {
                    replica,
                    amount: 10,
                    usage_pct: 150,
                });
                fleet.run(Op::Deliver { replica });
                fleet.run(Op::Reserve {
                    replica,
                    amount: 10,
                    usage_pct: 150,
                });
            }
        }
        assert_eq!(fleet.flying.len(), 24, "the whole limit is reserved");
        fleet.run(Op::Reserve {
            replica: 0,
            amount: 1,
            usage_pct: 100,
        });
        fleet.run(Op::Deliver { replica: 0 });
        assert!(matches!(
            fleet.ledgers[0].try_reserve(fleet.now, 1),
            Reserve::Over { .. }
        ));
        let (usage, excess) = fleet.books[&Period::Minute.window(T0).index];
        assert_eq!((usage, excess), (360, 120));
        // Charged as they flow, the excess is on the books at once, and stops every later request.
        for pick in 0..24 {
            fleet.run(Op::Charge { pick, pct: 100 });
        }
        let overshoot: u64 = fleet.ledgers.iter().map(|l| l.overshoot(fleet.now)).sum();
        assert_eq!(overshoot, 120);
    }
}

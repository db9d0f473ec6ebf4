//! Which target the next attempt goes to, among those that can take it: pure, with the load and
//! the randomness passed in (a seeded RNG in tests).
//!
//! - `ordered`: the first available target in the route's order (`fallback` is this case).
//! - `weighted`: a random available target, each with probability weight / sum of weights.
//! - `least_loaded`: power of two choices (Mitzenmacher; linkerd's and Envoy's default): two
//!   distinct available targets drawn at random, the one with the lower cost taken, cost being
//!   the latency EWMA times (requests in flight + 1), as linkerd's peak-EWMA balancer scores
//!   endpoints. A target with no latency yet costs as the cheapest measured one, so a new or
//!   recovered target gets its share at once instead of being starved or flooded.

use rand::Rng;

use crate::config::Balance;

/// One target that can take the next attempt, as the chooser sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Candidate {
    /// Its index in the route's target list.
    pub(crate) index: usize,
    pub(crate) weight: f64,
    /// Requests of this route on this target right now (this replica).
    pub(crate) in_flight: u32,
    /// Latency EWMA to the response head, in microseconds; `None` before the first one.
    pub(crate) ewma_us: Option<f64>,
}

/// The candidate the next attempt goes to (`None` when there is none).
pub(crate) fn choose<R: Rng + ?Sized>(balance: Balance, candidates: &[Candidate], rng: &mut R) -> Option<usize> {
    match (balance, candidates) {
        (_, []) => None,
        (_, [only]) => Some(only.index),
        (Balance::Ordered, _) => candidates.iter().map(|c| c.index).min(),
        (Balance::Weighted, _) => Some(weighted(candidates, rng)),
        (Balance::LeastLoaded, _) => Some(two_choices(candidates, rng)),
    }
}

fn weighted<R: Rng + ?Sized>(candidates: &[Candidate], rng: &mut R) -> usize {
    let total: f64 = candidates.iter().map(|c| c.weight.max(0.0)).sum();
    if !(total > 0.0 && total.is_finite()) {
        return candidates[rng.random_range(0..candidates.len())].index;
    }
    let mut point = rng.random_range(0.0..total);
    for c in candidates {
        let w = c.weight.max(0.0);
        if point < w {
            return c.index;
        }
        point -= w;
    }
    // Rounding left the point past the last one.
    candidates[candidates.len() - 1].index
}

fn two_choices<R: Rng + ?Sized>(candidates: &[Candidate], rng: &mut R) -> usize {
    let n = candidates.len();
    let a = rng.random_range(0..n);
    // A second, distinct draw: one of the other n - 1.
    let b = (a + 1 + rng.random_range(0..n - 1)) % n;
    let unmeasured = candidates
        .iter()
        .filter_map(|c| c.ewma_us)
        .fold(f64::INFINITY, f64::min);
    let unmeasured = if unmeasured.is_finite() { unmeasured } else { 1.0 };
    let cost = |c: &Candidate| c.ewma_us.unwrap_or(unmeasured).max(1.0) * f64::from(c.in_flight.saturating_add(1));
    let (ca, cb) = (&candidates[a], &candidates[b]);
    if cost(cb) < cost(ca) {
        cb.index
    } else {
        ca.index
    }
}

/// The latency EWMA after one more observation: `alpha` of the new sample, the rest the old.
pub(crate) fn ewma(previous: Option<f64>, sample_us: f64, alpha: f64) -> f64 {
    match previous {
        None => sample_us,
        Some(p) => p + alpha * (sample_us - p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn c(index: usize, weight: f64, in_flight: u32, ewma_us: Option<f64>) -> Candidate {
        Candidate {
            index,
            weight,
            in_flight,
            ewma_us,
        }
    }

    fn picks(balance: Balance, candidates: &[Candidate], n: usize) -> Vec<usize> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts = vec![0; candidates.iter().map(|c| c.index).max().unwrap_or(0) + 1];
        for _ in 0..n {
            counts[choose(balance, candidates, &mut rng).unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn ordered_takes_the_first_available_in_route_order() {
        let mut rng = StdRng::seed_from_u64(1);
        let cs = [c(2, 1.0, 0, None), c(1, 1.0, 9, None), c(3, 5.0, 0, None)];
        assert_eq!(choose(Balance::Ordered, &cs, &mut rng), Some(1));
        assert_eq!(choose(Balance::Ordered, &[], &mut rng), None);
    }

    #[test]
    fn weighted_spreads_by_weight() {
        let counts = picks(Balance::Weighted, &[c(0, 3.0, 0, None), c(1, 1.0, 0, None)], 10_000);
        // 7,500 expected; a binomial standard deviation is about 43.
        assert!((7_300..=7_700).contains(&counts[0]), "{counts:?}");
        // A zero weight (filtered by validation, but never divided by) is never chosen.
        let counts = picks(Balance::Weighted, &[c(0, 0.0, 0, None), c(1, 1.0, 0, None)], 1_000);
        assert_eq!(counts, vec![0, 1_000]);
    }

    #[test]
    fn least_loaded_prefers_the_cheaper_and_still_spreads() {
        // Equal: an even spread.
        let even = picks(
            Balance::LeastLoaded,
            &[c(0, 1.0, 0, Some(100.0)), c(1, 1.0, 0, Some(100.0))],
            10_000,
        );
        assert!((4_700..=5_300).contains(&even[0]), "{even:?}");
        // Of two, the cheaper always wins: 10 in flight against none.
        let busy = picks(
            Balance::LeastLoaded,
            &[c(0, 1.0, 10, Some(100.0)), c(1, 1.0, 0, Some(100.0))],
            1_000,
        );
        assert_eq!(busy, vec![0, 1_000]);
        // Of three with one slow, the slow one is chosen only when drawn with... never: it loses
        // every pair it is in.
        let slow = picks(
            Balance::LeastLoaded,
            &[
                c(0, 1.0, 0, Some(5_000.0)),
                c(1, 1.0, 0, Some(100.0)),
                c(2, 1.0, 0, Some(100.0)),
            ],
            3_000,
        );
        assert_eq!(slow[0], 0, "{slow:?}");
        // An unmeasured target costs as the cheapest measured one: it gets its share.
        let fresh = picks(
            Balance::LeastLoaded,
            &[c(0, 1.0, 0, None), c(1, 1.0, 0, Some(100.0))],
            10_000,
        );
        assert!(fresh[0] > 4_000, "{fresh:?}");
    }

    #[test]
    fn ewma_moves_by_alpha() {
        assert_eq!(ewma(None, 50.0, 0.3), 50.0);
        assert!((ewma(Some(100.0), 200.0, 0.25) - 125.0).abs() < 1e-9);
    }
}

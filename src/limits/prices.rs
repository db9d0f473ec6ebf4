//! What a request's usage costs under `[prices]` (USD per million tokens, by model), in micro-USD:
//! the unit a spend limit (`usd_per_day`, `usd_per_month`) counts in.
//!
//! Prices are held as integers (micro-USD per million tokens, i.e. USD per token to 12 decimal
//! places), so that costs add up exactly; a cost is rounded up once, on the sum, to the next
//! micro-USD (a budget errs on the side of spending less). Decides: the arithmetic and what a
//! valid price is. Does not decide which model's price applies, nor how the providers' usage
//! objects map to [`Used`] (the pipeline reads them): here input, cached input and output do not
//! overlap.

use crate::wire::body::Used;

/// A price in micro-USD per million tokens (`2.5` USD per million is `2_500_000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate(u64);

/// The most a price may be: a million USD per million tokens.
const MAX_USD_PER_MILLION: f64 = 1e6;

impl Rate {
    /// A rate from USD per million tokens, to the micro-USD; negative, non-finite or absurd
    /// (over 1,000,000) prices are refused with what was expected.
    pub(crate) fn from_usd_per_million(usd: f64) -> Result<Rate, String> {
        if !usd.is_finite() || !(0.0..=MAX_USD_PER_MILLION).contains(&usd) {
            return Err(format!(
                "expected a price in USD per million tokens from 0 to 1000000, not {usd}"
            ));
        }
        Ok(Rate((usd * 1e6).round() as u64))
    }

    /// Micro-USD per million tokens.
    pub(crate) fn micros_per_million(self) -> u64 {
        self.0
    }
}

/// One model's prices (`{ input = 2.5, output = 10.0, cached_input = 1.25 }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Price {
    pub(crate) input: Rate,
    pub(crate) output: Rate,
    /// Cached input tokens' price; without one they cost as input.
    pub(crate) cached_input: Option<Rate>,
}

impl Price {
    /// What `usage` costs, in micro-USD, rounded up (saturating at `u64::MAX`).
    pub(crate) fn cost(&self, usage: Used) -> u64 {
        let cached = self.cached_input.unwrap_or(self.input);
        let sum = u128::from(usage.input) * u128::from(self.input.0)
            + u128::from(usage.cached_input) * u128::from(cached.0)
            + u128::from(usage.output) * u128::from(self.output.0);
        u64::try_from(sum.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// A spend limit in micro-USD (`usd_per_day = 100.0` is `100_000_000`), rounded down to the
/// micro-USD; negative or non-finite amounts are refused with what was expected.
pub(crate) fn usd_to_micros(usd: f64) -> Result<u64, String> {
    if !usd.is_finite() || usd < 0.0 || usd * 1e6 >= u64::MAX as f64 {
        return Err(format!("expected an amount of USD of 0 or more, not {usd}"));
    }
    Ok((usd * 1e6).floor() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt_4o() -> Price {
        Price {
            input: Rate::from_usd_per_million(2.5).unwrap(),
            output: Rate::from_usd_per_million(10.0).unwrap(),
            cached_input: Some(Rate::from_usd_per_million(1.25).unwrap()),
        }
    }

    #[test]
    fn a_usage_costs_its_tokens_at_their_prices() {
        let usage = Used {
            input: 1000,
            cached_input: 2000,
            output: 500,
        };
        // 1000 x 2.5 + 2000 x 1.25 + 500 x 10 micro-USD.
        assert_eq!(gpt_4o().cost(usage), 2_500 + 2_500 + 5_000);
        assert_eq!(gpt_4o().cost(Used::default()), 0);
    }

    #[test]
    fn cached_input_costs_as_input_without_its_own_price() {
        let mut p = gpt_4o();
        p.cached_input = None;
        let usage = Used {
            cached_input: 4,
            ..Used::default()
        };
        assert_eq!(p.cost(usage), 10);
    }

    #[test]
    fn costs_round_up_once_on_the_sum() {
        let p = Price {
            input: Rate::from_usd_per_million(0.15).unwrap(),
            output: Rate::from_usd_per_million(0.6).unwrap(),
            cached_input: None,
        };
        assert_eq!(p.input.micros_per_million(), 150_000);
        // 3 x 0.15 + 1 x 0.6 = 1.05 micro-USD: 2. (Rounding each part would make it 3.)
        let usage = Used {
            input: 3,
            cached_input: 0,
            output: 1,
        };
        assert_eq!(p.cost(usage), 2);
        assert_eq!(
            p.cost(Used {
                input: 20,
                ..Used::default()
            }),
            3
        );
    }

    #[test]
    fn large_usages_do_not_overflow() {
        let p = Price {
            input: Rate::from_usd_per_million(1e6).unwrap(),
            output: Rate::from_usd_per_million(1e6).unwrap(),
            cached_input: None,
        };
        let huge = Used {
            input: u64::MAX,
            cached_input: u64::MAX,
            output: u64::MAX,
        };
        assert_eq!(p.cost(huge), u64::MAX);
    }

    #[test]
    fn bad_prices_and_amounts_say_what_was_expected() {
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e7] {
            let err = Rate::from_usd_per_million(bad).unwrap_err();
            assert!(err.starts_with("expected a price in USD per million tokens"), "{err}");
        }
        assert_eq!(Rate::from_usd_per_million(0.0).unwrap().micros_per_million(), 0);
        assert_eq!(usd_to_micros(100.0), Ok(100_000_000));
        assert_eq!(usd_to_micros(0.0000015), Ok(1));
        assert!(usd_to_micros(-0.01)
            .unwrap_err()
            .starts_with("expected an amount of USD"));
        assert!(usd_to_micros(f64::NAN).is_err());
        assert!(usd_to_micros(1e20).is_err());
    }
}

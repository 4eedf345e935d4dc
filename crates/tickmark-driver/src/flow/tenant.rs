//! A tenant's weight in fair claiming (docs/flow_control.md, "Fair share
//! across tenants"): its events get slots in proportion to it.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// The largest weight (the schema's check says the same).
pub const MAX_WEIGHT: f64 = 1_000_000.0;

/// A weight a tenant can be given: a finite number above 0, at most
/// [`MAX_WEIGHT`]. A tenant without one has weight 1.
///
/// ```
/// use tickmark::flow::TenantWeight;
/// assert_eq!("2.5".parse::<TenantWeight>().unwrap().get(), 2.5);
/// assert!("0".parse::<TenantWeight>().is_err());
/// assert!("NaN".parse::<TenantWeight>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize)]
#[serde(transparent)]
pub struct TenantWeight(f64);

/// Why a weight was refused: a weight of 0 would stall the tenant, one that
/// is not a number cannot be compared.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WeightError {
    /// Not a number at all.
    #[error("`{0}` is not a number: give a tenant's weight as a number above 0, e.g. 2 or 0.5 (1 is every tenant's default)")]
    NotANumber(String),
    /// 0, negative, infinite, NaN, or above the largest weight.
    #[error("a tenant's weight must be above 0 and at most {MAX_WEIGHT} (got {0}): a weight of 0 would stall the tenant; give 1 for the default share, 0.1 for a tenth of it")]
    OutOfRange(f64),
}

impl TenantWeight {
    /// `weight`, if it is above 0 and at most [`MAX_WEIGHT`].
    pub fn new(weight: f64) -> Result<Self, WeightError> {
        if weight > 0.0 && weight <= MAX_WEIGHT {
            Ok(Self(weight))
        } else {
            Err(WeightError::OutOfRange(weight))
        }
    }

    /// The weight.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for TenantWeight {
    type Err = WeightError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let weight: f64 = text
            .trim()
            .parse()
            .map_err(|_| WeightError::NotANumber(text.to_owned()))?;
        Self::new(weight)
    }
}

impl fmt::Display for TenantWeight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_is_a_positive_finite_number_up_to_the_largest() {
        for good in ["1", "0.001", "3", "1000000"] {
            assert!(good.parse::<TenantWeight>().is_ok(), "{good}");
        }
        for bad in ["0", "-1", "-0", "NaN", "inf", "1000001", "1e999"] {
            assert!(
                matches!(bad.parse::<TenantWeight>(), Err(WeightError::OutOfRange(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            "heavy".parse::<TenantWeight>(),
            Err(WeightError::NotANumber(_))
        ));
    }
}

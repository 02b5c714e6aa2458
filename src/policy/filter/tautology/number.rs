//! Exact comparison of BSON numbers (Int32, Int64, Double, Decimal128), as mongod compares
//! them: by mathematical value, never through a lossy conversion. `2^53 + 1` as an Int64 is
//! greater than `2^53` as a double although `(2^53 + 1) as f64 == 2^53`.
//!
//! NaN is left out (`None`): mongod orders it below every number in sorts but the match
//! language and `$expr` give it special cases this prover does not model.

use std::cmp::Ordering;

use bson::{Decimal128, RawBsonRef};

/// A number operand.
#[derive(Debug, Clone, Copy)]
pub(super) enum Num {
    Int(i64),
    Double(f64),
    Decimal(Decimal128),
}

impl Num {
    /// The number in a BSON value, when it holds one.
    pub(super) fn of(v: RawBsonRef<'_>) -> Option<Num> {
        match v {
            RawBsonRef::Int32(n) => Some(Num::Int(i64::from(n))),
            RawBsonRef::Int64(n) => Some(Num::Int(n)),
            RawBsonRef::Double(f) => Some(Num::Double(f)),
            RawBsonRef::Decimal128(d) => Some(Num::Decimal(d)),
            _ => None,
        }
    }
}

/// A finite decimal `(-1)^neg * coef * 10^exp`, or an infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exact {
    Finite { neg: bool, coef: u128, exp: i32 },
    Inf { neg: bool },
}

/// 2^63, exactly, as a double.
const TWO_63: f64 = (1u64 << 63) as f64;

/// 10^34 - 1: the largest canonical Decimal128 coefficient.
const MAX_COEF: u128 = 9_999_999_999_999_999_999_999_999_999_999;

/// The value of a Decimal128 read from its BID encoding; `None` for NaN.
fn decimal(d: Decimal128) -> Option<Exact> {
    let b = d.bytes();
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(b.get(..8)?);
    hi.copy_from_slice(b.get(8..)?);
    let (lo, hi) = (u64::from_le_bytes(lo), u64::from_le_bytes(hi));
    let neg = hi >> 63 == 1;
    match (hi >> 58) & 0x1f {
        0x1f => return None,
        0x1e => return Some(Exact::Inf { neg }),
        _ => {}
    }
    let (exp, coef) = if (hi >> 61) & 0b11 == 0b11 {
        // The large-coefficient form is always above MAX_COEF: non-canonical, read as zero.
        (((hi >> 47) & 0x3fff) as i32, 0u128)
    } else {
        let c = (u128::from(hi & ((1u64 << 49) - 1)) << 64) | u128::from(lo);
        (
            ((hi >> 49) & 0x3fff) as i32,
            if c > MAX_COEF { 0 } else { c },
        )
    };
    Some(Exact::Finite {
        neg,
        coef,
        exp: exp - 6176,
    })
}

fn int(n: i64) -> Exact {
    Exact::Finite {
        neg: n < 0,
        coef: u128::from(n.unsigned_abs()),
        exp: 0,
    }
}

/// A double as an exact decimal when that is cheap: infinities, and integers below 2^63 in
/// magnitude. Other doubles (fractions, huge values) are `None` when compared with a decimal.
fn double(f: f64) -> Option<Exact> {
    if f.is_nan() {
        return None;
    }
    if f.is_infinite() {
        return Some(Exact::Inf { neg: f < 0.0 });
    }
    if f.fract() == 0.0 && f.abs() < TWO_63 {
        return Some(int(f as i64));
    }
    None
}

fn digits(mut c: u128) -> i32 {
    let mut n = 0;
    while c > 0 {
        c /= 10;
        n += 1;
    }
    n
}

/// Compares magnitudes `c1 * 10^e1` and `c2 * 10^e2`, both non-zero, each below 10^34.
fn cmp_magnitude(c1: u128, e1: i32, c2: u128, e2: i32) -> Ordering {
    let (d1, d2) = (digits(c1), digits(c2));
    match (d1 + e1).cmp(&(d2 + e2)) {
        Ordering::Equal => {}
        other => return other,
    }
    // Same order of magnitude: scale the shorter coefficient to the longer one's digit count
    // (at most 34 digits, so no overflow in u128).
    let (mut a, mut b) = (c1, c2);
    for _ in d1..d2 {
        a = a.saturating_mul(10);
    }
    for _ in d2..d1 {
        b = b.saturating_mul(10);
    }
    a.cmp(&b)
}

fn cmp_exact(a: Exact, b: Exact) -> Ordering {
    match (a, b) {
        (Exact::Inf { neg: x }, Exact::Inf { neg: y }) => y.cmp(&x),
        (Exact::Inf { neg }, _) => {
            if neg {
                Ordering::Less
            } else {
                Ordering::Greater
            }
        }
        (_, Exact::Inf { neg }) => {
            if neg {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        (
            Exact::Finite {
                neg: n1,
                coef: c1,
                exp: e1,
            },
            Exact::Finite {
                neg: n2,
                coef: c2,
                exp: e2,
            },
        ) => {
            // Zero has no sign in comparisons (-0 == 0).
            let s1 = if c1 == 0 {
                0
            } else if n1 {
                -1
            } else {
                1
            };
            let s2 = if c2 == 0 {
                0
            } else if n2 {
                -1
            } else {
                1
            };
            match s1.cmp(&s2) {
                Ordering::Equal if s1 == 0 => Ordering::Equal,
                Ordering::Equal => {
                    let m = cmp_magnitude(c1, e1, c2, e2);
                    if s1 < 0 {
                        m.reverse()
                    } else {
                        m
                    }
                }
                other => other,
            }
        }
    }
}

/// An Int64 against a double, exactly: the double's integer part fits an i64 whenever it is
/// below 2^63 in magnitude, and the fraction breaks a tie.
fn cmp_int_double(n: i64, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    if f >= TWO_63 {
        return Some(Ordering::Less);
    }
    if f < -TWO_63 {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    let ord = n.cmp(&(whole as i64));
    Some(match ord {
        Ordering::Equal => 0.0f64.partial_cmp(&(f - whole))?,
        other => other,
    })
}

/// The exact order of two numbers; `None` for NaN and for the decimal-against-fractional-
/// double cases not modelled here.
pub(super) fn compare(a: Num, b: Num) -> Option<Ordering> {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => Some(x.cmp(&y)),
        (Num::Double(x), Num::Double(y)) => x.partial_cmp(&y),
        (Num::Int(x), Num::Double(y)) => cmp_int_double(x, y),
        (Num::Double(x), Num::Int(y)) => cmp_int_double(y, x).map(Ordering::reverse),
        (Num::Decimal(x), Num::Decimal(y)) => Some(cmp_exact(decimal(x)?, decimal(y)?)),
        (Num::Decimal(x), Num::Int(y)) => Some(cmp_exact(decimal(x)?, int(y))),
        (Num::Int(x), Num::Decimal(y)) => Some(cmp_exact(int(x), decimal(y)?)),
        (Num::Decimal(x), Num::Double(y)) => Some(cmp_exact(decimal(x)?, double(y)?)),
        (Num::Double(x), Num::Decimal(y)) => Some(cmp_exact(double(x)?, decimal(y)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Num {
        Num::Decimal(s.parse().unwrap())
    }

    #[test]
    fn exact_comparisons() {
        let two53 = 9_007_199_254_740_992i64;
        assert_eq!(
            compare(Num::Int(two53 + 1), Num::Double(two53 as f64)),
            Some(Ordering::Greater)
        );
        assert_eq!(
            compare(Num::Int(two53), Num::Double(two53 as f64)),
            Some(Ordering::Equal)
        );
        assert_eq!(compare(Num::Int(1), Num::Double(1.5)), Some(Ordering::Less));
        assert_eq!(
            compare(Num::Int(-1), Num::Double(-1.5)),
            Some(Ordering::Greater)
        );
        assert_eq!(
            compare(Num::Int(i64::MAX), Num::Double(9.3e18)),
            Some(Ordering::Less)
        );
        assert_eq!(compare(dec("1.0"), Num::Int(1)), Some(Ordering::Equal));
        assert_eq!(compare(dec("0.1"), Num::Int(0)), Some(Ordering::Greater));
        assert_eq!(compare(dec("-0"), Num::Int(0)), Some(Ordering::Equal));
        assert_eq!(compare(dec("1E+3"), dec("999.9")), Some(Ordering::Greater));
        assert_eq!(compare(dec("-1E+3"), dec("-999.9")), Some(Ordering::Less));
        assert_eq!(
            compare(dec("9007199254740993"), Num::Double(two53 as f64)),
            Some(Ordering::Greater)
        );
        assert_eq!(
            compare(dec("Infinity"), Num::Int(i64::MAX)),
            Some(Ordering::Greater)
        );
        assert_eq!(compare(dec("NaN"), Num::Int(0)), None);
        assert_eq!(compare(dec("0.5"), Num::Double(0.5)), None);
        assert_eq!(compare(Num::Double(f64::NAN), Num::Int(0)), None);
    }
}

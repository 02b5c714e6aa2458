//! Data-driven coverage vectors: `policies/tests/filter/coverage.txt`.
//!
//! One vector per line, `Expected | filter`, where the filter is MongoDB Extended JSON v2
//! (canonical or relaxed) and `Expected` is `All`, `Conditioned` or `Unknown`. Blank lines
//! and lines starting with `#` are ignored.

use super::tautology::{coverage, Coverage};
use super::test_util::doc;

const VECTORS: &str = include_str!("../../../policies/tests/filter/coverage.txt");

#[test]
fn coverage_vectors() {
    let (mut total, mut all, mut failures) = (0, 0, Vec::new());
    for (n, line) in VECTORS.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((want, json)) = line.split_once('|') else {
            panic!("coverage.txt:{}: no `|` separator", n + 1);
        };
        let want = match want.trim() {
            "All" => Coverage::All,
            "Conditioned" => Coverage::Conditioned,
            "Unknown" => Coverage::Unknown,
            other => panic!("coverage.txt:{}: unknown expectation {other:?}", n + 1),
        };
        let got = coverage(&doc(json.trim()));
        if got != want {
            failures.push(format!(
                "coverage.txt:{}: {json} expected {want:?}, got {got:?}",
                n + 1
            ));
        }
        total += 1;
        all += usize::from(want == Coverage::All);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(total >= 40, "only {total} vectors");
    assert!(all * 2 >= total, "fewer than half of the vectors are All");
}

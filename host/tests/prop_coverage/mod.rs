//! Property tests that count what they exercised: a test tallies, per label, the cases that really
//! ran its checks (not refused or skipped), and asserts a floor afterwards, so a generator that
//! starts refusing everything fails the test instead of passing it vacuously.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeMap;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// How many cases exercised each label.
#[derive(Debug, Default)]
pub struct Tally {
    cases: RefCell<usize>,
    counts: RefCell<BTreeMap<String, usize>>,
}

impl Tally {
    /// Counts one case for `label`.
    pub fn hit(&self, label: &str) {
        *self
            .counts
            .borrow_mut()
            .entry(label.to_string())
            .or_default() += 1;
    }

    /// Cases counted for `label`.
    pub fn count(&self, label: &str) -> usize {
        self.counts.borrow().get(label).copied().unwrap_or(0)
    }

    /// Cases run in all.
    pub fn cases(&self) -> usize {
        *self.cases.borrow()
    }

    /// Asserts that `label` was exercised in at least `1 / fraction` of the cases.
    pub fn assert_floor(&self, label: &str, fraction: usize) {
        let (got, cases) = (self.count(label), self.cases());
        let floor = cases.div_ceil(fraction);
        assert!(
            got >= floor,
            "`{label}` was exercised in {got} of {cases} cases, below the floor of {floor} \
             (1/{fraction}): the generator refuses or skips too much; tally {:?}",
            self.counts.borrow()
        );
    }
}

/// Runs `test` on `cases` values of `strategy` with proptest's runner (random seed, shrinking, the
/// regressions file next to `source_file`, as `proptest!` does), panics on a failing case, and
/// returns what the test tallied.
pub fn run<S: Strategy>(
    source_file: &'static str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value, &Tally) -> Result<(), TestCaseError>,
) -> Tally {
    let mut runner = TestRunner::new(Config {
        cases,
        source_file: Some(source_file),
        ..Config::default()
    });
    let tally = Tally::default();
    let result = runner.run(&strategy, |value| {
        *tally.cases.borrow_mut() += 1;
        test(value, &tally)
    });
    if let Err(e) = result {
        panic!("{e}\n{runner}");
    }
    tally
}

//! The simulator in the test suite: the seeds that found real bugs stay
//! clean, a seed replays identically, every broken variant is caught, and a
//! short sweep of fresh seeds finds nothing. (CI also sweeps a different
//! range of seeds on each run: `.ci/run`, docs/simulation.md.)

use tickmark_sim::{run, run_with, Variant, Workload};

/// Seeds that find real bugs in tickmark with its fix reverted
/// (docs/simulation.md, "Found"). A seed names a schedule of this version of
/// the simulator: when its draws change, each is found again by reverting
/// the fix and sweeping (the first bug was found at seed 83, now 51). They
/// were found before the shops' syncs joined the workload, and run without
/// them ([`Workload::WithoutShops`]): the same schedules, draw for draw.
const REGRESSIONS: [(u64, &str); 4] = [
    (51, "a zombie started a step another worker had marked done"),
    (94, "a sequence check applied under a stale lease"),
    (
        206,
        "a transactional step started after its lease ran out while its transaction opened",
    ),
    (
        100038,
        "a retried mark was confirmed after its lease moved on, and its worker ran the next step",
    ),
];

#[test]
fn seeds_that_found_bugs_stay_clean() {
    for (seed, bug) in REGRESSIONS {
        let report =
            run_with(seed, Variant::Correct, Workload::WithoutShops).expect("the harness runs");
        assert!(
            report.violations.is_empty(),
            "seed {seed} ({bug}) fails again: {:?}",
            report.violations
        );
        assert!(
            report.invariants_checked > 50,
            "seed {seed} checked too little"
        );
    }
}

#[test]
fn a_seed_replays_with_the_same_trace() {
    let first = run(83, Variant::Correct).expect("the harness runs");
    let again = run(83, Variant::Correct).expect("the harness runs");
    assert!(
        first.trace.len() > 100,
        "a run does things: {} lines",
        first.trace.len()
    );
    assert_eq!(first.trace, again.trace);
    let other = run(84, Variant::Correct).expect("the harness runs");
    assert_ne!(first.digest, other.digest, "another seed is another run");
}

#[test]
fn every_broken_variant_is_caught_within_twenty_seeds() {
    for variant in Variant::BROKEN {
        let caught = (0..20).find_map(|seed| {
            let report = run(seed, variant).expect("the harness runs");
            report.violations.first().cloned().map(|v| (seed, v))
        });
        assert!(
            caught.is_some(),
            "{} was not caught in 20 seeds",
            variant.name()
        );
    }
}

#[test]
fn twenty_fresh_seeds_find_nothing() {
    for seed in 10_000..10_020 {
        let report = run(seed, Variant::Correct).expect("the harness runs");
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}\nreplay: scripts/simulate --seed {seed}",
            report.violations
        );
        assert!(
            report.faults.values().sum::<u64>() > 0,
            "seed {seed} injected no fault"
        );
    }
}

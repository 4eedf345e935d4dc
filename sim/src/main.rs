//! `tickmark-sim`: run seeds of the deterministic simulation and report.
//! `scripts/simulate --help` for the options; docs/simulation.md for what
//! is simulated.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use tickmark_sim::{run, run_with, Fault, RunReport, Variant, Workload};

/// Run the real engine under a seeded clock, scheduler and faults, and check
/// tickmark's guarantees after every run. A failing seed prints the command
/// that replays it exactly, trace and all.
#[derive(Debug, Parser)]
#[command(
    name = "scripts/simulate",
    version,
    after_help = "Examples:\n  \
        scripts/simulate --seeds 500 --from 1000   sweep seeds 1000..1500\n  \
        scripts/simulate --seed 1234               one seed, with its trace\n  \
        scripts/simulate --broken --seeds 50       each broken variant must be caught\n  \
        RUST_LOG=tickmark=debug scripts/simulate --seed 1234   the engine's logs too\n\n\
        A run takes about 0.28 s (debug build). What is simulated, what is real and\n\
        what is not covered: docs/simulation.md."
)]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed (the run takes `from`, `from + 1`, …).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run this one seed only, and print its trace.
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// The store variant: `correct`, or a deliberately broken one.
    #[arg(long, value_enum, default_value_t = Variant::Correct)]
    variant: Variant,
    /// Run `--seeds` seeds against each broken variant: report the first
    /// that caught it and how many did; fail if one is never caught.
    #[arg(long)]
    broken: bool,
    /// Run the first seed twice and fail unless both traces agree.
    #[arg(long)]
    check_replay: bool,
    /// With `--seed`: deliver no shops' syncs, as the simulator did before
    /// fair share joined it (the seeds in sim/tests/simulation.rs that found
    /// bugs then replay their schedules so).
    #[arg(long, requires = "seed")]
    without_shops: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        // The engine's own logs, for debugging a seed (times are real, not simulated).
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            // Colour only on a terminal: a log file or a pipe gets plain text.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .without_time()
            .with_ansi(std::io::stderr().is_terminal())
            .init();
    }
    if let Some(seed) = args.seed {
        let workload = if args.without_shops {
            Workload::WithoutShops
        } else {
            Workload::Everything
        };
        return replay(seed, args.variant, workload);
    }
    let mut ok = true;
    if args.check_replay {
        ok &= check_replay(args.from, args.variant);
    }
    if args.broken {
        for variant in Variant::BROKEN {
            ok &= catch(variant, args.from, args.seeds);
        }
    } else {
        ok &= sweep(args.from, args.seeds, args.variant);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn one(seed: u64, variant: Variant) -> Option<RunReport> {
    match run(seed, variant) {
        Ok(report) => Some(report),
        Err(error) => {
            eprintln!("seed {seed}: the harness failed: {error}");
            None
        }
    }
}

fn replay_command(seed: u64, variant: Variant) -> String {
    match variant {
        Variant::Correct => format!("scripts/simulate --seed {seed}"),
        _ => format!(
            "scripts/simulate --seed {seed} --variant {}",
            variant.name()
        ),
    }
}

/// Run seeds `from..from + seeds` and print the totals.
fn sweep(from: u64, seeds: u64, variant: Variant) -> bool {
    println!(
        "simulating seeds {from}..{} against the {} store",
        from + seeds,
        variant.name()
    );
    let started = Instant::now();
    let mut faults: BTreeMap<Fault, u64> = BTreeMap::new();
    let (mut runs, mut checks, mut events, mut failed) = (0u64, 0u64, 0usize, Vec::new());
    for seed in from..from + seeds {
        let Some(report) = one(seed, variant) else {
            failed.push(seed);
            continue;
        };
        runs += 1;
        checks += report.invariants_checked;
        events += report.events;
        for (fault, n) in &report.faults {
            *faults.entry(*fault).or_default() += n;
        }
        if !report.violations.is_empty() {
            println!("\nseed {seed}: {} violation(s):", report.violations.len());
            for violation in report.violations.iter().take(5) {
                println!("  {violation}");
            }
            println!("  replay: {}", replay_command(seed, variant));
            failed.push(seed);
        }
        if runs % 25 == 0 {
            println!("  {runs} runs, {:.0} s", started.elapsed().as_secs_f64());
        }
    }
    println!(
        "runs: {runs} (seeds {from}..{}), {events} events, in {:.1} s",
        from + seeds,
        started.elapsed().as_secs_f64()
    );
    println!("faults injected:");
    for (fault, n) in &faults {
        println!("  {:<32} {n}", fault.name());
    }
    println!("invariants checked: {checks}");
    if failed.is_empty() {
        println!("violations: none");
        true
    } else {
        println!("FAILED seeds: {failed:?}");
        false
    }
}

/// Run one seed and print its trace.
fn replay(seed: u64, variant: Variant, workload: Workload) -> ExitCode {
    let report = match run_with(seed, variant, workload) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("seed {seed}: the harness failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    for line in &report.trace {
        println!("{line}");
    }
    println!(
        "\nseed {seed} ({}): {} events, {:.1} s simulated, {} checks, trace digest {}",
        variant.name(),
        report.events,
        report.simulated.as_secs_f64(),
        report.invariants_checked,
        report.digest
    );
    if report.violations.is_empty() {
        println!("violations: none");
        ExitCode::SUCCESS
    } else {
        println!("violations:");
        for violation in &report.violations {
            println!("  {violation}");
        }
        ExitCode::FAILURE
    }
}

/// Run `seed` twice: the traces must be identical.
fn check_replay(seed: u64, variant: Variant) -> bool {
    let (Some(first), Some(second)) = (one(seed, variant), one(seed, variant)) else {
        return false;
    };
    let same = first.trace == second.trace;
    println!(
        "replay of seed {seed}: trace digests {} and {} ({} lines): {}",
        first.digest,
        second.digest,
        first.trace.len(),
        if same { "identical" } else { "DIFFERENT" }
    );
    if !same {
        if let Some(at) = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b)
        {
            println!(
                "  first difference at line {at}:\n    {}\n    {}",
                first.trace[at], second.trace[at]
            );
        }
    }
    same
}

/// Run seeds against a broken variant: it must be caught. Reports the first
/// seed that caught it and how many of the seeds did.
fn catch(variant: Variant, from: u64, seeds: u64) -> bool {
    let mut first: Option<(u64, String)> = None;
    let mut caught = 0;
    for seed in from..from + seeds {
        let Some(report) = one(seed, variant) else {
            return false;
        };
        if let Some(violation) = report.violations.first() {
            caught += 1;
            first.get_or_insert((seed, violation.clone()));
        }
    }
    match first {
        Some((seed, violation)) => {
            println!(
                "{}: caught by {caught} of {seeds} seeds; first after {} seed(s), at seed {seed}: {violation}\n  replay: {}",
                variant.name(),
                seed - from + 1,
                replay_command(seed, variant)
            );
            true
        }
        None => {
            println!("{}: NOT caught in {seeds} seeds", variant.name());
            false
        }
    }
}

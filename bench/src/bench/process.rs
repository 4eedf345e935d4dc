//! This process's CPU time and memory, from /proc (Linux).

use std::time::{Duration, Instant};

/// CPU time used by this process so far (user + system).
pub fn cpu_time() -> Duration {
    proc_stat("self").map_or(Duration::ZERO, |stat| ticks(stat.user + stat.system))
}

/// A process's fields of /proc/<pid>/stat that the benchmarks read.
pub struct ProcStat {
    /// The parent's process id.
    pub parent: u32,
    /// CPU time in user mode, in clock ticks.
    pub user: u64,
    /// CPU time in kernel mode, in clock ticks.
    pub system: u64,
    /// The CPU time (user + kernel) of its children that have exited and
    /// been waited for, in clock ticks.
    pub children: u64,
}

/// /proc/<pid>/stat of `pid` (a number, or `self`), if readable.
pub fn proc_stat(pid: &str) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit(')').next()?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(ProcStat {
        parent: u32::try_from(field(1)?).ok()?,
        user: field(11)?,
        system: field(12)?,
        children: field(13)? + field(14)?,
    })
}

/// Clock ticks as time: USER_HZ is 100 on every Linux this runs on.
pub fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 10)
}

/// Peak resident memory of this process, in MiB (VmHWM).
pub fn peak_rss_mb() -> f64 {
    status_kb("VmHWM:") / 1024.0
}

/// Current resident memory of this process, in MiB (VmRSS).
pub fn rss_mb() -> f64 {
    status_kb("VmRSS:") / 1024.0
}

fn status_kb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with(field))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

/// Measures the share of one core this process uses over a span.
pub struct CpuMeter {
    started: Instant,
    cpu: Duration,
}

impl CpuMeter {
    /// Start measuring.
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            cpu: cpu_time(),
        }
    }

    /// Percent of one core used since `start`.
    pub fn percent(&self) -> f64 {
        let wall = self.started.elapsed().as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        (cpu_time() - self.cpu).as_secs_f64() / wall * 100.0
    }
}

//! This process's CPU time and memory, from /proc (Linux).

use std::time::{Duration, Instant};

/// CPU time used by this process so far (user + system).
pub fn cpu_time() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return Duration::ZERO;
    };
    // Fields after the command name (which is in parentheses and may hold spaces).
    let Some(rest) = stat.rsplit(')').next() else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // USER_HZ is 100 on every Linux this runs on.
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

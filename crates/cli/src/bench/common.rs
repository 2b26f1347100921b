//! Pieces every benchmark shares: progress bars, latency summaries, CPU time.

use std::io::IsTerminal;
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over `total` operations, drawn only when stderr is a terminal.
pub fn progress(total: u64, label: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{prefix:>12} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
}

/// A latency histogram in nanoseconds, 1 ns to 100 s, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    // The bounds are constants inside hdrhistogram's accepted range.
    match Histogram::new_with_bounds(1, 100_000_000_000, 3) {
        Ok(h) => h,
        Err(e) => unreachable!("constant histogram bounds are valid: {e}"),
    }
}

/// Formats p50/p99/p999 of a nanosecond histogram in microseconds.
pub fn latency_summary(h: &Histogram<u64>) -> String {
    let us = |q: f64| Duration::from_nanos(h.value_at_quantile(q)).as_secs_f64() * 1e6;
    format!(
        "p50 {:.1} us, p99 {:.1} us, p999 {:.1} us, max {:.1} us",
        us(0.50),
        us(0.99),
        us(0.999),
        Duration::from_nanos(h.max()).as_secs_f64() * 1e6
    )
}

/// p50/p99/p999/max of a nanosecond histogram in microseconds, as a JSON object.
pub fn latency_json(h: &Histogram<u64>) -> serde_json::Value {
    let us = |ns: u64| Duration::from_nanos(ns).as_secs_f64() * 1e6;
    serde_json::json!({
        "p50_us": us(h.value_at_quantile(0.50)),
        "p99_us": us(h.value_at_quantile(0.99)),
        "p999_us": us(h.value_at_quantile(0.999)),
        "max_us": us(h.max()),
    })
}

/// CPU seconds (user + system) process `pid` (or `self`) used so far, from
/// `/proc/<pid>/stat` (at the kernel's 100 ticks per second).
pub fn cpu_secs(pid: &str) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("read /proc/{pid}/stat: {e}"))?;
    // Fields after the command name (which may hold spaces): state is the first;
    // utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let tick = |n: usize| -> Result<f64, String> {
        fields
            .get(n)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: no field {n}"))
    };
    Ok((tick(11)? + tick(12)?) / 100.0)
}

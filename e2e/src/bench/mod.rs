//! What the benchmark binaries share: percentiles, process memory, the
//! baselines every latency is divided by (`baseline`), the machine's load
//! (`load`) and the tables that print each figure over several runs with
//! its ratio (`table`).

pub mod baseline;
pub mod load;
pub mod table;

/// The operator's EC2 polling as in production (the tests' stack polls
/// every 300 ms and sweeps orphans every 2 s, so a test sees EC2 change
/// sooner; on this machine that polling kept the EC2 simulator busy on a
/// whole core, which a benchmark would measure as the operator's noise).
pub fn production_intervals() -> Vec<(String, String)> {
    [("HANGAR_DESCRIBE_INTERVAL_MS", "2000"), ("HANGAR_ORPHAN_SWEEP_SECONDS", "300")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec()
}

/// The `p` quantile (0.0–1.0) by nearest rank; 0 for no samples.
pub fn pct(v: Vec<u64>, p: f64) -> u64 {
    table::quantile(&v.into_iter().map(|x| x as f64).collect::<Vec<_>>(), p) as u64
}

/// Prints `what: n=… p50=… p90=… p99=… max=… unit`.
pub fn report(what: &str, unit: &str, v: &[u64]) {
    let q = |p| pct(v.to_vec(), p);
    println!("{what}: n={} p50={} p90={} p99={} max={} {unit}", v.len(), q(0.5), q(0.9), q(0.99), q(1.0));
}

/// Resident memory of a process, KiB (0 when it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// The highest resident memory a process has had, KiB (0 when gone).
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field).map(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()))?
        })
        .unwrap_or(0)
}

/// CPU time a process has used (user + system), seconds; 0 when gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after the command name (which may hold spaces) in brackets.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = [11, 12].iter().filter_map(|i| fields.get(*i)?.parse::<u64>().ok()).sum();
    // USER_HZ: 100 on Linux for x86_64 and arm64 alike.
    ticks as f64 / 100.0
}

/// How often `lifecycle-bench` and `commands-bench` repeat their
/// measured part unless told: a run has 100 samples of most figures, and
/// the pooled p99 two invocations are compared on needs several runs'.
pub const RUNS: usize = 5;

/// `--runs R` (default `default`): how many times a benchmark repeats its
/// measured part; the tables print the median over the runs.
pub fn runs_arg(default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--runs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(default)
}

/// The numeric positional arguments (not `--runs`'s value), in order.
pub fn numbers_arg() -> Vec<usize> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--runs" {
            i += 2;
            continue;
        }
        if let Ok(v) = args[i].parse() {
            out.push(v);
        }
        i += 1;
    }
    out
}

/// Wall-clock now, in nanoseconds since the epoch.
pub fn now_ns() -> i128 {
    k8s_openapi::jiff::Timestamp::now().as_nanosecond()
}

#[cfg(test)]
mod tests {
    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(super::pct(v.clone(), 0.5), 51);
        assert_eq!(super::pct(v, 0.99), 99);
        assert_eq!(super::pct(vec![], 0.5), 0);
    }
}

//! The machine's load, printed before and after a benchmark: a figure
//! taken while something else used the cores means something else.

use std::time::Instant;

/// The load average and the CPU counters at one moment.
pub struct MachineLoad {
    loadavg: String,
    busy_ticks: u64,
    total_ticks: u64,
    at: Instant,
}

impl MachineLoad {
    pub fn now() -> Self {
        let loadavg = std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into());
        let (busy_ticks, total_ticks) = cpu_ticks();
        MachineLoad { loadavg, busy_ticks, total_ticks, at: Instant::now() }
    }

    /// `load before: 0.12 0.30 0.41 (1/5/15 min), 2 cores`.
    pub fn print(&self, when: &str) {
        println!("machine load {when}: {} (1/5/15 min load average), {} cores", self.loadavg, cores());
    }

    /// Cores busy on average since `self` (user + system + steal …, all
    /// processes): the benchmark's own load plus anything else's.
    pub fn busy_cores_since(&self, later: &MachineLoad) -> f64 {
        let total = later.total_ticks.saturating_sub(self.total_ticks) as f64;
        if total == 0.0 {
            return 0.0;
        }
        later.busy_ticks.saturating_sub(self.busy_ticks) as f64 / total * cores() as f64
    }

    pub fn seconds_until(&self, later: &MachineLoad) -> f64 {
        later.at.duration_since(self.at).as_secs_f64()
    }
}

/// Prints the load after the run and the cores busy on average during it.
pub fn print_after(before: &MachineLoad) {
    let after = MachineLoad::now();
    after.print("after");
    println!(
        "cores busy on average during the run: {:.2} of {} ({:.0} s)",
        before.busy_cores_since(&after),
        cores(),
        before.seconds_until(&after)
    );
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// (busy, total) jiffies over all CPUs from /proc/stat's first line.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal …
    let total: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

//! Figures over several runs, each run with the baseline measured in it:
//! printed as the median over the runs of the figure, of its baseline and
//! of their ratio, the ratio of every run (how much they agree), and the
//! tail ratio over all runs' samples pooled.
//!
//! Why pooled: a run of 100–200 samples has its p99 in its two slowest
//! samples, and its baseline's p99 in a few slow round trips, so a p99
//! ratio of one run swings with whichever write met the apiserver's worst
//! moment (0.4 and 1.4 in two runs of the same build). Over R runs pooled
//! the p99 rests on R times as many samples, on both sides of the ratio;
//! it is the figure two `make bench` runs are compared on.

/// The `p` quantile (0.0–1.0) by nearest rank; 0 for no samples.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_unstable_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

pub fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

struct LatencyRun {
    n: usize,
    p50: f64,
    p99: f64,
    base_p50: f64,
    base_p99: f64,
    /// The run's samples and its baseline's, for the pooled quantiles.
    samples: Vec<f64>,
    baseline: Vec<f64>,
}

/// A figure of a table: what it is, what it is divided by, its target
/// (printed as is) and each run's measurement `R`.
struct Figure<R> {
    name: String,
    baseline: String,
    target: String,
    runs: Vec<R>,
}

/// A row of a table, as returned when it is declared.
#[derive(Clone, Copy)]
pub struct Row(usize);

fn declare<R>(rows: &mut Vec<Figure<R>>, name: &str, baseline: &str, target: &str) -> Row {
    rows.push(Figure { name: name.into(), baseline: baseline.into(), target: target.into(), runs: vec![] });
    Row(rows.len() - 1)
}

/// Latencies (ms) with their baseline round trips (ms).
#[derive(Default)]
pub struct LatencyTable {
    rows: Vec<Figure<LatencyRun>>,
}

impl LatencyTable {
    /// Declares a figure: `baseline` names what it is divided by; `target`
    /// is printed as is.
    pub fn row(&mut self, name: &str, baseline: &str, target: &str) -> Row {
        declare(&mut self.rows, name, baseline, target)
    }

    /// One run's samples of the figure and of its baseline.
    pub fn add(&mut self, row: Row, samples_ms: &[f64], baseline_ms: &[f64]) {
        self.rows[row.0].runs.push(LatencyRun {
            n: samples_ms.len(),
            p50: quantile(samples_ms, 0.5),
            p99: quantile(samples_ms, 0.99),
            base_p50: quantile(baseline_ms, 0.5),
            base_p99: quantile(baseline_ms, 0.99),
            samples: samples_ms.to_vec(),
            baseline: baseline_ms.to_vec(),
        });
    }

    /// The `p` quantile of every run's samples together, over the same
    /// quantile of every run's baseline together.
    fn pooled_ratio(runs: &[LatencyRun], p: f64) -> f64 {
        let all =
            |f: &dyn Fn(&LatencyRun) -> &Vec<f64>| runs.iter().flat_map(|r| f(r).iter().copied()).collect::<Vec<_>>();
        quantile(&all(&|r| &r.samples), p) / quantile(&all(&|r| &r.baseline), p).max(0.001)
    }

    pub fn print(&self) {
        println!(
            "| figure | p50 (ms) | p99 (ms) | samples per run | baseline | baseline p50 / p99 (ms) | p50 ÷ baseline p50 | p99 ÷ baseline p99 | p99 ratio per run | p50 / p99 ratio, runs pooled | target |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for r in &self.rows {
            let m = |f: &dyn Fn(&LatencyRun) -> f64| median(&r.runs.iter().map(f).collect::<Vec<_>>());
            let ratio99 = |x: &LatencyRun| x.p99 / x.base_p99.max(0.001);
            let per_run: Vec<String> = r.runs.iter().map(|x| format!("{:.1}", ratio99(x))).collect();
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {} | {:.1} / {:.1} | {:.1} | {:.1} | {} | {:.1} / {:.2} | {} |",
                r.name,
                m(&|x| x.p50),
                m(&|x| x.p99),
                m(&|x| x.n as f64),
                r.baseline,
                m(&|x| x.base_p50),
                m(&|x| x.base_p99),
                m(&|x| x.p50 / x.base_p50.max(0.001)),
                m(&ratio99),
                per_run.join(", "),
                Self::pooled_ratio(&r.runs, 0.5),
                Self::pooled_ratio(&r.runs, 0.99),
                r.target
            );
        }
    }
}

/// Throughputs (MB/s) with a baseline throughput (MB/s) of the same size.
#[derive(Default)]
pub struct ThroughputTable {
    rows: Vec<Figure<(f64, f64)>>,
}

impl ThroughputTable {
    pub fn row(&mut self, name: &str, baseline: &str, target: &str) -> Row {
        declare(&mut self.rows, name, baseline, target)
    }

    pub fn add(&mut self, row: Row, mbps: f64, baseline_mbps: f64) {
        self.rows[row.0].runs.push((mbps, baseline_mbps));
    }

    pub fn print(&self) {
        println!("| figure | MB/s | baseline | baseline MB/s | ÷ baseline | ratio per run | target |");
        println!("| --- | --- | --- | --- | --- | --- | --- |");
        for r in &self.rows {
            let ratios: Vec<f64> = r.runs.iter().map(|(v, b)| v / b.max(0.001)).collect();
            let per_run: Vec<String> = ratios.iter().map(|x| format!("{x:.2}")).collect();
            println!(
                "| {} | {:.0} | {} | {:.0} | {:.2} | {} | {} |",
                r.name,
                median(&r.runs.iter().map(|x| x.0).collect::<Vec<_>>()),
                r.baseline,
                median(&r.runs.iter().map(|x| x.1).collect::<Vec<_>>()),
                median(&ratios),
                per_run.join(", "),
                r.target
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_run_and_its_ratio() {
        let mut t = LatencyTable::default();
        let row = t.row("x", "PATCH", "");
        for k in [1.0, 3.0, 2.0] {
            let samples: Vec<f64> = (1..=100).map(|v| v as f64 * k).collect();
            t.add(row, &samples, &[10.0]);
        }
        let r = &t.rows[0];
        assert_eq!(median(&r.runs.iter().map(|x| x.p99).collect::<Vec<_>>()), 198.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_pooled_tail_rests_on_every_run() {
        let mut t = LatencyTable::default();
        let row = t.row("x", "PATCH", "");
        // Three runs of 100 samples 1..=100 ms; one run also had a 1 s
        // outlier. Its own p99 is 100, the pooled p99 is still 99.
        let base: Vec<f64> = (1..=100).map(|v| v as f64 / 10.0).collect();
        for outlier in [false, false, true] {
            let mut samples: Vec<f64> = (1..=100).map(|v| v as f64).collect();
            if outlier {
                samples[99] = 1000.0;
            }
            t.add(row, &samples, &base);
        }
        let pooled = LatencyTable::pooled_ratio(&t.rows[0].runs, 0.99);
        assert!((pooled - 10.0).abs() < 0.2, "pooled p99 ratio {pooled}");
        let median = LatencyTable::pooled_ratio(&t.rows[0].runs, 0.5);
        assert!((median - 10.0).abs() < 1e-9, "pooled p50 ratio {median}");
    }
}

//! Reading a Prometheus text exposition (what every component's `/metrics`
//! serves) in tests and benchmarks: one series' value, or a metric summed
//! over its label sets. `tests/metrics.rs` parses whole expositions with
//! `prometheus-parse`; these answer the one-number questions.

/// The value of `series`: a metric name alone (`hangar_ec2_throttled_total`)
/// or with its labels as exposed (`name{result="granted"}`).
pub fn value(text: &str, series: &str) -> Option<f64> {
    samples(text).find(|(s, _)| *s == series).map(|(_, v)| v)
}

/// Every series of `metric` added up; `None` when it has none, so a
/// misspelt name (or a counter without its `_total`) is not read as 0.
pub fn sum(text: &str, metric: &str) -> Option<f64> {
    samples(text)
        .filter(|(s, _)| s.strip_prefix(metric).is_some_and(|rest| rest.is_empty() || rest.starts_with('{')))
        .map(|(_, v)| v)
        .reduce(|a, b| a + b)
}

/// (series, value) of each sample line; comments and blank lines skipped.
pub fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(series, v)| Some((series.trim(), v.trim().parse().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x_total X.\n# TYPE x_total counter\nx_total{result=\"a\"} 2\nx_total{result=\"b\"} 3\nx_total_more 9\ny 1.5\n";

    #[test]
    fn one_series_or_a_metric_summed_over_labels() {
        assert_eq!(value(TEXT, "x_total{result=\"b\"}"), Some(3.0));
        assert_eq!(value(TEXT, "y"), Some(1.5));
        assert_eq!(value(TEXT, "x_total"), None, "no series without labels");
        assert_eq!(sum(TEXT, "x_total"), Some(5.0), "not x_total_more");
        assert_eq!(sum(TEXT, "x"), None, "a name is not a prefix");
    }
}

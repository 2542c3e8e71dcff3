//! The billing record of a session (ARCHITECTURE §3, the Hangar document's
//! hard stop and pause sections), as pure arithmetic over what the status
//! records: metered compute at the vCPU rate of the session's shape (its
//! idle part flagged apart), the storage of a paused session per started
//! hour, and a minimum charged once, when the instance first runs, which
//! covers the free hour.
//!
//! Decisions where the document leaves room, so every figure can be
//! computed by hand:
//! - the minimum covers the first hour of metered compute (the free hour);
//!   compute beyond it is charged at the metered rate, on top;
//! - while the session lives, compute is counted per started minute (what
//!   the credit is held for); at the end it is trued up to the second;
//! - the idle part is charged as compute is (it is part of it) and shown
//!   apart; the free hour is spent on busy time first;
//! - each pause is charged per started hour of its own, for the volume's
//!   size;
//! - money is whole cents, each figure rounded up; rates are in
//!   thousandths of a cent, so small hourly prices stay exact.

use hangar_crds::sandbox::{Attempt, AttemptEnd, Billing};

/// The operator's prices (chart values `operator.billing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prices {
    /// One vCPU for one hour of metered compute, in thousandths of a cent.
    pub vcpu_hour_millicents: i64,
    /// One GiB of a paused session's volume for one started hour, in
    /// thousandths of a cent.
    pub storage_gib_hour_millicents: i64,
    /// Charged once, when the instance first runs.
    pub minimum_charge_cents: i64,
    /// Metered compute the minimum covers.
    pub free_seconds: i64,
    /// The length of an hour: 3600, or less on a test's scaled clock.
    pub hour_seconds: i64,
}

impl Default for Prices {
    fn default() -> Self {
        Self {
            vcpu_hour_millicents: 6_000,
            storage_gib_hour_millicents: 14,
            minimum_charge_cents: 500,
            free_seconds: 3_600,
            hour_seconds: 3_600,
        }
    }
}

/// What a session used, read off its status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// vCPUs of the session's instance type.
    pub vcpus: i64,
    /// Size of the workspace volume.
    pub volume_gib: i64,
    /// Metered compute of all attempts.
    pub compute_seconds: i64,
    /// The idle part of it.
    pub idle_seconds: i64,
    /// The length of each pause (one still going: up to now or the end).
    pub pauses: Vec<i64>,
    /// Whether the instance has ever run.
    pub first_ran: bool,
    /// The hard stop, when set.
    pub stop_after_seconds: Option<i64>,
    /// The session is over: compute is trued up to the second.
    pub over: bool,
}

/// The pauses of a session, from its attempts: each runs from the end of
/// an attempt that paused to the start of the next attempt that ran (a
/// resume that failed to start does not end it), or to `until`.
pub fn pauses(attempts: &[Attempt], until: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut paused_since: Option<i64> = None;
    for a in attempts {
        if let (Some(since), Some(started)) = (paused_since, a.started_at.as_ref()) {
            out.push((started.0.as_second() - since).max(0));
            paused_since = None;
        }
        if a.end == Some(AttemptEnd::Paused)
            && let Some(ended) = &a.ended_at
        {
            paused_since = Some(ended.0.as_second());
        }
    }
    if let Some(since) = paused_since {
        out.push((until - since).max(0));
    }
    out
}

/// `numerator / denominator` thousandths of a cent as whole cents, rounded up.
fn cents(numerator: i128, denominator: i128) -> i64 {
    let d = denominator.max(1) * 1_000;
    i64::try_from((numerator.max(0) + d - 1) / d).unwrap_or(i64::MAX)
}

/// `seconds` rounded up to whole `unit`s, in seconds.
fn round_up(seconds: i64, unit: i64) -> i64 {
    let unit = unit.max(1);
    (seconds.max(0) + unit - 1) / unit * unit
}

/// The price of `seconds` of compute on `vcpus`, in whole cents.
fn compute_cents(p: &Prices, vcpus: i64, seconds: i64) -> i64 {
    cents(i128::from(seconds) * i128::from(vcpus) * i128::from(p.vcpu_hour_millicents), i128::from(p.hour_seconds))
}

/// The billing record for `usage` at `prices`.
pub fn record(prices: &Prices, usage: &Usage) -> Billing {
    let minute = (prices.hour_seconds / 60).max(1);
    let metered = |seconds: i64| if usage.over { seconds.max(0) } else { round_up(seconds, minute) };
    let billable = (usage.compute_seconds - prices.free_seconds).max(0);
    // The free hour goes to busy time first; what is left of it, to idle.
    let busy = (usage.compute_seconds - usage.idle_seconds).max(0);
    let idle_billable = (usage.idle_seconds - (prices.free_seconds - busy).max(0)).clamp(0, billable);
    let compute = compute_cents(prices, usage.vcpus, metered(billable));
    let idle = compute_cents(prices, usage.vcpus, metered(idle_billable)).min(compute);
    let compute_at_most_cents = usage
        .stop_after_seconds
        .map(|limit| compute_cents(prices, usage.vcpus, round_up(limit - prices.free_seconds, minute)));
    let storage_millicents: i128 = usage
        .pauses
        .iter()
        .map(|&p| {
            let hours = round_up(p, prices.hour_seconds) / prices.hour_seconds.max(1);
            i128::from(hours) * i128::from(usage.volume_gib) * i128::from(prices.storage_gib_hour_millicents)
        })
        .sum();
    let storage = cents(storage_millicents, 1);
    let minimum = if usage.first_ran { prices.minimum_charge_cents } else { 0 };
    Billing {
        compute_at_most_cents,
        minimum_charge_cents: Some(prices.minimum_charge_cents),
        compute_cents: Some(compute),
        idle_cents: Some(idle),
        storage_cents: Some(storage),
        total_cents: Some(minimum + compute + storage),
        trued_up: usage.over.then_some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// Round figures: 1 vCPU-hour = 60 cents, 1 GiB-hour = 1 cent.
    fn prices() -> Prices {
        Prices {
            vcpu_hour_millicents: 60_000,
            storage_gib_hour_millicents: 1_000,
            minimum_charge_cents: 500,
            free_seconds: 3_600,
            hour_seconds: 3_600,
        }
    }

    fn usage(compute: i64, idle: i64) -> Usage {
        Usage {
            vcpus: 2,
            volume_gib: 10,
            compute_seconds: compute,
            idle_seconds: idle,
            first_ran: true,
            ..Default::default()
        }
    }

    #[test]
    fn nothing_is_charged_before_the_instance_first_runs() {
        let b = record(&prices(), &Usage { vcpus: 2, ..Default::default() });
        assert_eq!((b.total_cents, b.compute_cents, b.minimum_charge_cents), (Some(0), Some(0), Some(500)));
    }

    #[test]
    fn within_the_free_hour_only_the_minimum_is_charged() {
        let b = record(&prices(), &Usage { over: true, ..usage(3_600, 600) });
        assert_eq!((b.compute_cents, b.idle_cents, b.total_cents), (Some(0), Some(0), Some(500)));
    }

    #[test]
    fn compute_beyond_the_free_hour_is_metered_per_minute_then_trued_up() {
        // 2 h 0 min 30 s on 2 vCPUs: 3630 s billable.
        let live = record(&prices(), &usage(7_230, 0));
        // Per started minute: 61 min × 2 vCPU × 1 cent/min = 122 cents.
        assert_eq!(live.compute_cents, Some(122));
        assert_eq!(live.trued_up, None);
        let over = record(&prices(), &Usage { over: true, ..usage(7_230, 0) });
        // To the second: 3630 s × 2 × 60/3600 = 121 cents.
        assert_eq!((over.compute_cents, over.total_cents, over.trued_up), (Some(121), Some(621), Some(true)));
    }

    #[test]
    fn the_idle_part_is_flagged_and_the_free_hour_goes_to_busy_time_first() {
        // 30 min busy, 2 h idle: the free hour takes the 30 busy minutes
        // and 30 idle ones; 90 idle minutes are charged.
        let b = record(&prices(), &Usage { over: true, ..usage(9_000, 7_200) });
        assert_eq!(b.compute_cents, Some(180), "90 min × 2 vCPU");
        assert_eq!(b.idle_cents, Some(180), "all of it idle");
        // Busy beyond the free hour: idle is all charged.
        let b = record(&prices(), &Usage { over: true, ..usage(9_000, 1_800) });
        assert_eq!((b.compute_cents, b.idle_cents), (Some(180), Some(60)));
    }

    #[test]
    fn each_pause_is_charged_per_started_hour_for_the_volume() {
        // 10 GiB: 1 cent per GiB-hour. 3 h exactly, 1 s, 61 min.
        let b = record(&prices(), &Usage { pauses: vec![10_800, 1, 3_660], ..usage(0, 0) });
        assert_eq!(b.storage_cents, Some((3 + 1 + 2) * 10));
        assert_eq!(b.total_cents, Some(500 + 60));
    }

    #[test]
    fn the_most_a_hard_stop_lets_compute_cost_counts_every_minute_to_it() {
        let b = record(&prices(), &Usage { stop_after_seconds: Some(7_230), ..usage(0, 0) });
        assert_eq!(b.compute_at_most_cents, Some(122), "61 minutes beyond the free hour on 2 vCPUs");
        // Never more than what the session can use: the trued-up compute at
        // the limit is within it.
        let at_limit = record(&prices(), &Usage { over: true, stop_after_seconds: Some(7_230), ..usage(7_230, 0) });
        assert!(at_limit.compute_cents <= at_limit.compute_at_most_cents);
        let none = record(&prices(), &Usage { stop_after_seconds: Some(3_600), ..usage(0, 0) });
        assert_eq!(none.compute_at_most_cents, Some(0), "a stop within the free hour");
    }

    #[test]
    fn small_rates_stay_exact_and_round_up_to_a_cent() {
        let p = Prices { vcpu_hour_millicents: 6_000, ..prices() };
        // 1 s beyond the free hour on 1 vCPU, trued up: 6000/3600 of a
        // thousandth of a cent, charged as one cent.
        let b = record(&p, &Usage { vcpus: 1, over: true, ..usage(3_601, 0) });
        assert_eq!(b.compute_cents, Some(1));
        // A week on 16 vCPUs does not overflow.
        let b = record(&p, &Usage { vcpus: 16, over: true, ..usage(604_800, 0) });
        assert_eq!(b.compute_cents, Some((604_800 - 3_600) * 16 * 6_000 / 3_600 / 1_000));
    }

    fn attempt(number: i64, started: Option<i64>, ended: Option<i64>, end: Option<AttemptEnd>) -> Attempt {
        let at = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        Attempt {
            number,
            cause: hangar_crds::sandbox::AttemptCause::Resume,
            started_at: started.map(at),
            ended_at: ended.map(at),
            end,
            compute_seconds: 0,
        }
    }

    #[test]
    fn a_pause_runs_from_a_paused_attempt_to_the_next_that_ran() {
        let attempts = [
            attempt(1, Some(0), Some(100), Some(AttemptEnd::Paused)),
            // A resume that did not start: still paused.
            attempt(2, None, Some(500), Some(AttemptEnd::StartFailed)),
            attempt(3, Some(1_000), Some(1_200), Some(AttemptEnd::Paused)),
        ];
        assert_eq!(pauses(&attempts, 5_000), [900, 3_800], "the second pause goes on to `until`");
        let running = [attempt(1, Some(0), Some(100), Some(AttemptEnd::Paused)), attempt(2, Some(160), None, None)];
        assert_eq!(pauses(&running, 5_000), [60]);
        assert!(pauses(&[attempt(1, Some(0), None, None)], 5_000).is_empty());
    }
}

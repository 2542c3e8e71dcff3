//! A dependency that does not answer yet (the apiserver, EC2, an object
//! store) is waited for with backoff, never a reason for a binary to exit.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

/// Runs `step` until it succeeds: 0.5 s, 1 s, 2 s … 30 s apart, jittered,
/// each failure logged with what was being tried.
pub async fn until_ok<T, E, F, Fut>(what: &str, step: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    until_ok_from(Duration::from_millis(500), what, step).await
}

/// [`until_ok`] with the first delay given (its tests wait milliseconds:
/// tokio's paused clock would need its `test-util` feature, which as a
/// dev-dependency changes tokio's features for the test build alone and so
/// compiles everything above tokio twice in `make test`).
async fn until_ok_from<T, E, F, Fut>(first_delay: Duration, what: &str, step: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(first_delay)
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times();
    let result = step
        .retry(backoff)
        .notify(|e: &E, next: Duration| {
            tracing::warn!(error = %e, retry_in_ms = next.as_millis() as u64, "could not {what} yet; not ready");
        })
        .await;
    match result {
        Ok(v) => v,
        Err(_) => unreachable!("retried without a limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_step_that_fails_twice_is_tried_until_it_succeeds() {
        let mut calls = 0;
        let value = until_ok_from(Duration::from_millis(1), "count", || {
            calls += 1;
            let n = calls;
            async move { if n < 3 { Err("not yet") } else { Ok(n) } }
        })
        .await;
        assert_eq!(value, 3);
    }
}

//! The EC2 node provider: one instance and one workspace volume per session,
//! found by tag before anything is created, with typed errors, jittered
//! retries on throttling and fallback across instance types and zones on
//! capacity errors.

pub mod error;
pub mod instances;
pub mod interruption_queue;
pub mod tags;
pub mod user_data;
pub mod volumes;
pub mod watcher;

use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;

pub use error::{Ec2Error, Ec2ErrorKind};

/// Counts of EC2 calls, for /metrics and the benchmark.
#[derive(Default, Debug)]
pub struct CallCounts {
    pub mutating: Counter,
    pub describe_instances: Counter,
    pub describe_other: Counter,
    pub throttled: Counter,
}

/// What the EC2 provider needs to know, and nothing else of the operator's
/// settings.
#[derive(Clone, Debug)]
pub struct Ec2Settings {
    pub region: String,
    /// Endpoint override (moto in local runs).
    pub endpoint: Option<String>,
    /// Tagged on everything launched; what the describes filter by.
    pub cluster_name: String,
    pub ami_id: String,
    pub security_groups: Vec<String>,
    /// Name or ARN of the instances' profile (their node role).
    pub instance_profile: Option<String>,
    pub volume_gib: i32,
    /// (zone, subnet) in the order launches try them.
    pub placements: Vec<(String, Option<String>)>,
}

#[derive(Clone)]
pub struct Ec2 {
    pub(crate) client: aws_sdk_ec2::Client,
    pub(crate) settings: Arc<Ec2Settings>,
    pub calls: Arc<CallCounts>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    Mutating,
    DescribeInstances,
    DescribeOther,
}

const MAX_THROTTLE_RETRIES: u32 = 8;

/// The AWS SDK configuration of one region, with the endpoint override of
/// local runs (moto), for every AWS client the operator makes.
pub fn sdk_config_loader(region: &str, endpoint: Option<&str>) -> aws_config::ConfigLoader {
    let loader =
        aws_config::defaults(aws_config::BehaviorVersion::latest()).region(aws_config::Region::new(region.to_owned()));
    match endpoint {
        Some(endpoint) => loader.endpoint_url(endpoint),
        None => loader,
    }
}

impl Ec2 {
    pub async fn new(settings: Ec2Settings) -> Self {
        let settings = Arc::new(settings);
        let config = sdk_config_loader(&settings.region, settings.endpoint.as_deref())
            // Our own loop retries throttling only (typed, counted,
            // jittered). The SDK's standard retry also retries
            // InsufficientInstanceCapacity (HTTP 500) on the same type: under
            // the fault proxy it launched the capacity-starved type on its
            // second try instead of falling back, and took 8–13 s where ours
            // took 5 s (docs/benchmarks.md).
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .connect_timeout(Duration::from_secs(5))
                    .build(),
            )
            .load()
            .await;
        Self { client: aws_sdk_ec2::Client::new(&config), settings, calls: Arc::default() }
    }

    /// Runs one EC2 call, retrying throttling with jittered backoff.
    pub(crate) async fn call<T, E, F, Fut>(
        &self,
        operation: &'static str,
        kind: CallKind,
        mut f: F,
    ) -> Result<T, Ec2Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<
                Output = Result<T, aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>>,
            >,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let mut attempt = 0;
        loop {
            let counter = match kind {
                CallKind::Mutating => &self.calls.mutating,
                CallKind::DescribeInstances => &self.calls.describe_instances,
                CallKind::DescribeOther => &self.calls.describe_other,
            };
            counter.inc();
            match f().await {
                Ok(v) => {
                    crate::failpoint::hit(&format!("after:{operation}"));
                    return Ok(v);
                }
                Err(e) => {
                    let err = match e.code() {
                        Some(code) => Ec2Error::classify(operation, Some(code), e.message()),
                        None => Ec2Error::classify(operation, Some("Transport"), Some(&error_chain(&e))),
                    };
                    if err.is(Ec2ErrorKind::Throttled) && attempt < MAX_THROTTLE_RETRIES {
                        self.calls.throttled.inc();
                        let delay = error::throttle_backoff(
                            attempt,
                            Duration::from_millis(100),
                            Duration::from_secs(10),
                            random_u64(),
                        );
                        tracing::warn!(operation, attempt, ?delay, "EC2 throttled; retrying");
                        tokio::time::sleep(delay).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(err);
                }
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// For backoff jitter; a failed random source only removes the jitter.
pub(crate) fn random_u64() -> u64 {
    u64::from_le_bytes(hangar_keys::random_bytes().unwrap_or_default())
}

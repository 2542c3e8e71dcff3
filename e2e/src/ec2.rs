//! An aws-sdk-ec2 client for the local moto endpoint (tests and the node
//! simulator), plus the lookups tests assert with.

use aws_sdk_ec2::types::{Filter, InstanceStateName};

pub const REGION: &str = "ap-southeast-2";

/// The SDK configuration for moto at `endpoint` (test credentials), for
/// every AWS client of the harness.
pub async fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    crate::install_crypto_provider();
    let creds = aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "hangar-e2e");
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint)
        .credentials_provider(creds)
        .load()
        .await
}

pub async fn client(endpoint: &str) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(&sdk_config(endpoint).await)
}

/// (instance id, state) of every instance tagged with this session.
pub async fn session_instances(ec2: &aws_sdk_ec2::Client, session_id: &str) -> Vec<(String, InstanceStateName)> {
    let out = ec2
        .describe_instances()
        .filters(Filter::builder().name("tag:hangar.dev/session-id").values(session_id).build())
        .send()
        .await
        .expect("DescribeInstances");
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| {
            (
                i.instance_id().unwrap_or_default().to_owned(),
                i.state().and_then(|s| s.name()).cloned().unwrap_or(InstanceStateName::Pending),
            )
        })
        .collect()
}

/// (volume id, state) of every workspace volume tagged with this session.
pub async fn session_volumes(ec2: &aws_sdk_ec2::Client, session_id: &str) -> Vec<(String, String)> {
    let out = ec2
        .describe_volumes()
        .filters(Filter::builder().name("tag:hangar.dev/session-id").values(session_id).build())
        .send()
        .await
        .expect("DescribeVolumes");
    out.volumes()
        .iter()
        .map(|v| {
            (v.volume_id().unwrap_or_default().to_owned(), v.state().map(|s| s.as_str().to_owned()).unwrap_or_default())
        })
        .collect()
}

//! EC2's own news of its instances, from the SQS queue EventBridge feeds:
//! spot interruption warnings and instance state-change notifications.
//!
//! A state change is taken as a reason to describe now, not as the state
//! itself: EventBridge may deliver late or out of order, and an old
//! "stopped" believed after a restart would interrupt a running session.
//! So a message makes the batched watcher describe at once (detection in
//! one DescribeInstances instead of one interval) and the truth still
//! comes from EC2. A spot warning has no describe equivalent: it is
//! recorded, so a stop that follows counts as an interruption even while
//! pausing.

use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::instances::InstanceState;
use super::watcher::InstanceWatcher;

/// What one EventBridge message says about one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// "EC2 Spot Instance Interruption Warning": reclaimed in two minutes.
    ReclaimWarning { instance_id: String },
    /// "EC2 Instance State-change Notification".
    StateChange { instance_id: String, state: InstanceState },
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "detail-type")]
    detail_type: String,
    #[serde(default)]
    source: String,
    detail: Detail,
}

#[derive(Deserialize)]
struct Detail {
    #[serde(rename = "instance-id")]
    instance_id: Option<String>,
    state: Option<String>,
}

/// Parses a message body; `None` for anything else (other detail types,
/// other sources, malformed bodies), which is dropped.
pub fn parse(body: &str) -> Option<Notice> {
    let e: Envelope = serde_json::from_str(body).ok()?;
    if e.source != "aws.ec2" {
        return None;
    }
    let instance_id = e.detail.instance_id?;
    match e.detail_type.as_str() {
        "EC2 Spot Instance Interruption Warning" => Some(Notice::ReclaimWarning { instance_id }),
        "EC2 Instance State-change Notification" => {
            let state = match e.detail.state?.as_str() {
                "pending" => InstanceState::Pending,
                "running" => InstanceState::Running,
                "stopping" => InstanceState::Stopping,
                "stopped" => InstanceState::Stopped,
                "shutting-down" => InstanceState::ShuttingDown,
                "terminated" => InstanceState::Terminated,
                _ => return None,
            };
            Some(Notice::StateChange { instance_id, state })
        }
        _ => None,
    }
}

pub async fn client(region: &str, endpoint: Option<&str>) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&super::sdk_config_loader(region, endpoint).load().await)
}

/// Long-polls the queue for ever; each message is acted on, then deleted
/// (also one that says nothing to hangar, so it does not come back).
pub async fn run(
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
    instances: InstanceWatcher,
    changed: mpsc::Sender<ObjectRef<hangar_crds::Sandbox>>,
) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let received =
            sqs.receive_message().queue_url(&queue_url).max_number_of_messages(10).wait_time_seconds(10).send().await;
        let messages = match received {
            Ok(out) => {
                backoff = Duration::from_millis(500);
                out.messages.unwrap_or_default()
            }
            Err(e) => {
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "interruption queue: receive failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        for m in messages {
            if let Some(notice) = m.body.as_deref().and_then(parse) {
                tracing::info!(?notice, "interruption queue");
                match &notice {
                    // The describe it brings forward wakes the Sandbox whose
                    // instance it shows changed.
                    Notice::StateChange { .. } => instances.request_refresh(),
                    // Nothing a describe shows: wake the Sandbox here.
                    Notice::ReclaimWarning { instance_id } => {
                        instances.warn_reclaim(instance_id);
                        if let Some(sandbox) = instances.sandbox_of_instance(instance_id) {
                            let _ = changed.try_send(sandbox);
                        }
                    }
                }
            }
            if let Some(handle) = m.receipt_handle
                && let Err(e) = sqs.delete_message().queue_url(&queue_url).receipt_handle(handle).send().await
            {
                // Delivered again later; acting on it twice is harmless.
                tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "interruption queue: delete failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes EventBridge delivers (AWS's documented examples).
    const WARNING: &str = r#"{"version":"0","id":"12345678-1234-1234-1234-123456789012",
        "detail-type":"EC2 Spot Instance Interruption Warning","source":"aws.ec2","account":"123456789012",
        "time":"2026-12-01T08:00:00Z","region":"ap-southeast-2",
        "resources":["arn:aws:ec2:ap-southeast-2a:instance/i-1234567890abcdef0"],
        "detail":{"instance-id":"i-1234567890abcdef0","instance-action":"stop"}}"#;
    const STATE: &str = r#"{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type":"EC2 Instance State-change Notification","source":"aws.ec2","account":"123456789012",
        "time":"2026-12-01T08:00:01Z","region":"ap-southeast-2",
        "resources":["arn:aws:ec2:ap-southeast-2:123456789012:instance/i-abcd1111"],
        "detail":{"instance-id":"i-abcd1111","state":"shutting-down"}}"#;

    #[test]
    fn parses_the_two_ec2_messages_and_drops_the_rest() {
        assert_eq!(parse(WARNING), Some(Notice::ReclaimWarning { instance_id: "i-1234567890abcdef0".into() }));
        assert_eq!(
            parse(STATE),
            Some(Notice::StateChange { instance_id: "i-abcd1111".into(), state: InstanceState::ShuttingDown })
        );
        let rebalance =
            WARNING.replace("EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation");
        assert_eq!(parse(&rebalance), None);
        assert_eq!(parse(&STATE.replace("aws.ec2", "custom.app")), None, "only EC2's own events");
        assert_eq!(parse(&STATE.replace("shutting-down", "exploded")), None);
        assert_eq!(parse("not json"), None);
    }
}

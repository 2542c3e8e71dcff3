//! The SQS queue EventBridge feeds with EC2's events, on moto: tests make
//! the queue and send the messages EventBridge would, in EventBridge's
//! shapes.

use serde_json::json;

pub async fn client(endpoint: &str) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&crate::ec2::sdk_config(endpoint).await)
}

/// Makes the queue; returns its URL.
pub async fn create_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> String {
    let out = sqs.create_queue().queue_name(name).send().await.expect("CreateQueue");
    out.queue_url.expect("queue url")
}

fn event(detail_type: &str, instance_id: &str, detail: serde_json::Value) -> String {
    json!({
        "version": "0",
        "id": format!("e2e-{}", k8s_openapi::jiff::Timestamp::now().as_nanosecond()),
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": "123456789012",
        "time": k8s_openapi::jiff::Timestamp::now().to_string(),
        "region": crate::ec2::REGION,
        "resources": [format!("arn:aws:ec2:{}:123456789012:instance/{instance_id}", crate::ec2::REGION)],
        "detail": detail,
    })
    .to_string()
}

/// "EC2 Instance State-change Notification" with `state` (e.g. `stopped`).
pub async fn send_state_change(sqs: &aws_sdk_sqs::Client, queue_url: &str, instance_id: &str, state: &str) {
    let body = event(
        "EC2 Instance State-change Notification",
        instance_id,
        json!({"instance-id": instance_id, "state": state}),
    );
    sqs.send_message().queue_url(queue_url).message_body(body).send().await.expect("SendMessage");
}

/// "EC2 Spot Instance Interruption Warning" (instance-action stop).
pub async fn send_reclaim_warning(sqs: &aws_sdk_sqs::Client, queue_url: &str, instance_id: &str) {
    let body = event(
        "EC2 Spot Instance Interruption Warning",
        instance_id,
        json!({"instance-id": instance_id, "instance-action": "stop"}),
    );
    sqs.send_message().queue_url(queue_url).message_body(body).send().await.expect("SendMessage");
}

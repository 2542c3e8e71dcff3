//! The scale benchmark's EC2 stub speaks EC2 as the AWS SDK expects it:
//! the operator's calls (launch by client token, the tag-filtered describe,
//! stop, start, terminate, the workspace volume's create, attach, detach
//! and delete) and EC2's refusals, each through the same SDK client the
//! operator uses.

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{
    Filter, InstanceStateName, InstanceType, Placement, ResourceType, Tag, TagSpecification, VolumeState, VolumeType,
};
use hangar_e2e::ec2::client;
use hangar_e2e::ec2_stub::{Ec2Stub, InstanceState};

fn tags(kind: ResourceType, session: &str) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .tags(Tag::builder().key("hangar.dev/session-id").value(session).build())
        .tags(Tag::builder().key("hangar.dev/cluster").value("bench").build())
        .build()
}

async fn state_of(ec2: &aws_sdk_ec2::Client, id: &str) -> InstanceStateName {
    let out = ec2.describe_instances().instance_ids(id).send().await.expect("describe");
    let i = &out.reservations()[0].instances()[0];
    i.state().and_then(|s| s.name()).cloned().expect("a state")
}

/// Describes until `id` is in `want`, within a deadline.
async fn wait_state(ec2: &aws_sdk_ec2::Client, id: &str, want: InstanceStateName) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while state_of(ec2, id).await != want {
        assert!(Instant::now() < deadline, "{id} never {want:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_stub_serves_an_instances_and_a_volumes_life_through_the_sdk() {
    let (stub, mut changes) = Ec2Stub::start(Duration::from_millis(50)).await.expect("stub");
    let ec2 = client(stub.endpoint()).await;

    let run = || {
        ec2.run_instances()
            .image_id("ami-0a1b2c3d4e5f60718")
            .instance_type(InstanceType::M7gLarge)
            .min_count(1)
            .max_count(1)
            .client_token("s1-1-1")
            .placement(Placement::builder().availability_zone("ap-southeast-2a").build())
            .tag_specifications(tags(ResourceType::Instance, "s1"))
            .send()
    };
    let first = run().await.expect("RunInstances");
    let instance = &first.instances()[0];
    let id = instance.instance_id().expect("an id").to_owned();
    assert_eq!(instance.state().and_then(|s| s.name()), Some(&InstanceStateName::Pending));
    assert!(instance.tags().iter().any(|t| t.key() == Some("hangar.dev/session-id") && t.value() == Some("s1")));
    // The same client token: the same instance, not a second one.
    let again = run().await.expect("RunInstances again");
    assert_eq!(again.instances()[0].instance_id(), Some(id.as_str()));
    wait_state(&ec2, &id, InstanceStateName::Running).await;

    // The cluster-wide describe by tag finds it; another session's does not.
    let by_tag = |key: &str, value: &str| Filter::builder().name(format!("tag:{key}")).values(value).build();
    let found = ec2.describe_instances().filters(by_tag("hangar.dev/cluster", "bench")).send().await.unwrap();
    assert_eq!(found.reservations().len(), 1);
    let other = ec2.describe_instances().filters(by_tag("hangar.dev/session-id", "s2")).send().await.unwrap();
    assert!(other.reservations().is_empty());

    // The workspace volume: created, attached (a second attach refused as
    // in use), found by tag and attachment.
    let vol = ec2
        .create_volume()
        .availability_zone("ap-southeast-2a")
        .size(20)
        .volume_type(VolumeType::Gp3)
        .encrypted(true)
        .tag_specifications(tags(ResourceType::Volume, "s1"))
        .send()
        .await
        .expect("CreateVolume");
    let vol_id = vol.volume_id().expect("a volume id").to_owned();
    ec2.attach_volume().volume_id(&vol_id).instance_id(&id).device("/dev/sdf").send().await.expect("attach");
    let twice = ec2.attach_volume().volume_id(&vol_id).instance_id(&id).device("/dev/sdf").send().await;
    assert_eq!(twice.unwrap_err().into_service_error().meta().code(), Some("VolumeInUse"));
    let vols = ec2.describe_volumes().filters(by_tag("hangar.dev/session-id", "s1")).send().await.unwrap();
    let v = &vols.volumes()[0];
    assert_eq!(v.state(), Some(&VolumeState::InUse));
    assert_eq!(v.attachments()[0].instance_id(), Some(id.as_str()));

    // Stop, a refused start while stopping, start, terminate.
    let stop = ec2.stop_instances().instance_ids(&id).send().await.expect("stop");
    assert_eq!(stop.stopping_instances()[0].current_state().and_then(|s| s.name()), Some(&InstanceStateName::Stopping));
    let early = ec2.start_instances().instance_ids(&id).send().await;
    assert_eq!(early.unwrap_err().into_service_error().meta().code(), Some("IncorrectInstanceState"));
    wait_state(&ec2, &id, InstanceStateName::Stopped).await;
    ec2.start_instances().instance_ids(&id).send().await.expect("start");
    wait_state(&ec2, &id, InstanceStateName::Running).await;
    let term = ec2.terminate_instances().instance_ids(&id).send().await.expect("terminate");
    assert_eq!(
        term.terminating_instances()[0].current_state().and_then(|s| s.name()),
        Some(&InstanceStateName::ShuttingDown)
    );
    wait_state(&ec2, &id, InstanceStateName::Terminated).await;
    // The data volume outlives its instance, detached; then it is deleted.
    let vols = ec2.describe_volumes().volume_ids(&vol_id).send().await.unwrap();
    assert_eq!(vols.volumes()[0].state(), Some(&VolumeState::Available));
    ec2.delete_volume().volume_id(&vol_id).send().await.expect("delete");
    let gone = ec2.delete_volume().volume_id(&vol_id).send().await;
    assert_eq!(gone.unwrap_err().into_service_error().meta().code(), Some("InvalidVolume.NotFound"));
    let unknown = ec2.terminate_instances().instance_ids("i-0000000000000dead").send().await;
    assert_eq!(unknown.unwrap_err().into_service_error().meta().code(), Some("InvalidInstanceID.NotFound"));

    // Every state the instance reached, in order, for the light nodes.
    let mut seen = Vec::new();
    while let Ok(c) = changes.try_recv() {
        assert_eq!(c.instance_id, id);
        seen.push(c.state);
    }
    use InstanceState::*;
    assert_eq!(seen, [Pending, Running, Stopping, Stopped, Pending, Running, ShuttingDown, Terminated]);
    assert_eq!(stub.calls()["RunInstances"], 2);
}

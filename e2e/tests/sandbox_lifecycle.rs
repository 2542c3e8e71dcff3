//! A session's lifecycle end to end: real apiserver, moto EC2, the operator
//! process and the node simulator running real workers.
//! launch → running → pause (instance stopped, volume kept) → resume (same
//! instance, attempt 2 cause resume, workspace files intact) → end
//! (instance terminated, volume deleted, key destroyed, finalizer gone).

use std::time::{Duration, Instant};

use aws_sdk_ec2::types::InstanceStateName;
use hangar_crds::{AttemptCause, AttemptEnd, Phase, Sandbox};
use hangar_e2e::ec2::{client as ec2_client, session_instances, session_volumes};
use hangar_e2e::registry::{Image, Manifest};
use hangar_e2e::sessions::{self, DEADLINE, ensure_namespace as namespace, phase};
use hangar_e2e::shared_stack;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

fn sandbox(name: &str, mode: &str) -> Sandbox {
    sessions::sandbox(name, mode, json!({}))
}

async fn wait_for(api: &Api<Sandbox>, name: &str, what: &str, pred: impl Fn(&Sandbox) -> bool) -> Sandbox {
    sessions::wait_for(shared_stack(), api, name, what, pred).await
}

use sessions::set_state;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_pause_resume_end_on_the_same_instance() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    namespace(&client, "lifecycle").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "lifecycle");
    let ec2 = ec2_client(&stack.moto.endpoint()).await;

    api.create(&PostParams::default(), &sandbox("box", "commands")).await.unwrap();
    let s = wait_for(&api, "box", "running", |s| phase(s) == Some(Phase::Running)).await;
    let session = s.uid().unwrap();
    let status = s.status.clone().unwrap();
    let instance = status.instance_id.clone().expect("instance id");
    let volume = status.volume_id.clone().expect("volume id");
    // The simulator names each node after its instance.
    assert_eq!(status.node_name.as_deref(), Some(instance.as_str()), "a running session names its node");
    assert_eq!(status.attempt, Some(1));
    assert_eq!(status.attempts[0].cause, AttemptCause::Launch);
    assert!(s.finalizers().contains(&"hangar.dev/session".to_owned()));
    assert_eq!(session_instances(&ec2, &session).await, vec![(instance.clone(), InstanceStateName::Running)]);
    assert_eq!(session_volumes(&ec2, &session).await.len(), 1);
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready condition");
    assert_eq!(ready.status, "True");

    // A file in the workspace before the pause.
    let workspace = stack.sim.volume_dir(&volume);
    std::fs::write(workspace.join("notes.txt"), b"written in attempt 1\n").unwrap();

    set_state(&api, "box", "Paused").await.unwrap();
    let s = wait_for(&api, "box", "paused", |s| phase(s) == Some(Phase::Paused)).await;
    let status = s.status.unwrap();
    assert_eq!(session_instances(&ec2, &session).await, vec![(instance.clone(), InstanceStateName::Stopped)]);
    assert_eq!(session_volumes(&ec2, &session).await.len(), 1, "the volume is kept while paused");
    assert_eq!(status.attempts[0].end, Some(AttemptEnd::Paused));
    let pause = status.pause.expect("pause progress");
    assert!(pause.workspace_closed_at.is_some(), "the worker reported the workspace closed");
    assert!(!pause.forced, "stopped after the report, not by the 90 s fallback");

    set_state(&api, "box", "Running").await.unwrap();
    let s = wait_for(&api, "box", "running again", |s| phase(s) == Some(Phase::Running)).await;
    let status = s.status.unwrap();
    assert_eq!(status.instance_id.as_deref(), Some(instance.as_str()), "resume starts the same instance");
    assert_eq!(status.attempt, Some(2));
    assert_eq!(status.attempts[1].cause, AttemptCause::Resume);
    assert_eq!(std::fs::read(workspace.join("notes.txt")).unwrap(), b"written in attempt 1\n");
    assert_eq!(session_instances(&ec2, &session).await.len(), 1, "no second instance");

    set_state(&api, "box", "Ended").await.unwrap();
    let s = wait_for(&api, "box", "ended", |s| phase(s) == Some(Phase::Ended)).await;
    let status = s.status.clone().unwrap();
    assert_eq!(status.stop_reason.as_deref(), Some("cancelled"));
    let steps: Vec<&str> = status.reset.iter().map(|r| r.step.as_str()).collect();
    assert_eq!(steps, hangar_e2e::sessions::RESET_STEPS);
    assert_eq!(status.attempts[1].end, Some(AttemptEnd::SessionEnded));
    assert_eq!(session_instances(&ec2, &session).await, vec![(instance, InstanceStateName::Terminated)]);
    assert!(session_volumes(&ec2, &session).await.iter().all(|(_, state)| state == "deleted"), "volume deleted");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "hangar-system");
    assert!(secrets.get_opt(&format!("hangar-session-key-{session}")).await.unwrap().is_none(), "key destroyed");
    // The worker's node account goes with the instance, and its binding in
    // the session's namespace.
    let mine = kube::api::ListParams::default().labels(&format!("hangar.dev/session-id={session}"));
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), "hangar-system");
    assert!(accounts.list(&mine).await.unwrap().items.is_empty(), "node account deleted");
    let ns = s.namespace().unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> = Api::namespaced(client.clone(), &ns);
    assert!(bindings.list(&mine).await.unwrap().items.is_empty(), "its binding deleted");
    let s = wait_for(&api, "box", "without finalizer", |s| s.finalizers().is_empty()).await;
    assert_eq!(phase(&s), Some(Phase::Ended));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_in_mode_agent_is_refused_and_changes_nothing() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    namespace(&client, "agent-pause").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "agent-pause");
    api.create(&PostParams::default(), &sandbox("agent", "agent")).await.unwrap();
    let before = wait_for(&api, "agent", "running", |s| phase(s) == Some(Phase::Running)).await;

    let err = set_state(&api, "agent", "Paused").await.expect_err("pause of mode agent must be refused");
    assert!(err.to_string().contains("sandbox_pause_unavailable"), "{err}");
    let after = api.get("agent").await.unwrap();
    assert_eq!(after.spec, before.spec);
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(phase(&after), Some(Phase::Running));

    // Deleting the Sandbox ends the session and releases everything.
    api.delete("agent", &Default::default()).await.unwrap();
    let start = Instant::now();
    while api.get_opt("agent").await.unwrap().is_some() {
        assert!(start.elapsed() < DEADLINE, "deleted Sandbox still present:\n{}", stack.operator().log_tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ec2 = ec2_client(&stack.moto.endpoint()).await;
    let session = before.uid().unwrap();
    assert!(session_instances(&ec2, &session).await.iter().all(|(_, s)| *s == InstanceStateName::Terminated));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_orphan_sweep_removes_instances_and_volumes_whose_session_is_gone() {
    use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
    let stack = shared_stack();
    let ec2 = ec2_client(&stack.moto.endpoint()).await;
    let ghost = "00000000-dead-4000-8000-000000000000";
    let tags = |r: ResourceType, role: bool| {
        let mut b = TagSpecification::builder()
            .resource_type(r)
            .tags(Tag::builder().key("hangar.dev/session-id").value(ghost).build())
            .tags(Tag::builder().key("hangar.dev/cluster").value("hangar-local").build());
        if role {
            b = b.tags(Tag::builder().key("hangar.dev/role").value("workspace").build());
        }
        b.build()
    };
    ec2.run_instances()
        .image_id("ami-0a1b2c3d4e5f60718")
        .instance_type(InstanceType::T4gSmall)
        .min_count(1)
        .max_count(1)
        .tag_specifications(tags(ResourceType::Instance, false))
        .send()
        .await
        .unwrap();
    ec2.create_volume()
        .availability_zone("ap-southeast-2a")
        .size(1)
        .tag_specifications(tags(ResourceType::Volume, true))
        .send()
        .await
        .unwrap();
    // An untagged instance is not hangar's and must survive.
    let foreign = ec2.run_instances().image_id("ami-0a1b2c3d4e5f60718").min_count(1).max_count(1).send().await.unwrap();
    let foreign_id = foreign.instances()[0].instance_id().unwrap().to_owned();

    let start = Instant::now();
    loop {
        let instances = session_instances(&ec2, ghost).await;
        let volumes = session_volumes(&ec2, ghost).await;
        let gone = instances.iter().all(|(_, s)| *s == InstanceStateName::Terminated)
            && volumes.iter().all(|(_, s)| s == "deleted");
        if gone {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "orphans left: {instances:?} {volumes:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let foreign_state = ec2.describe_instances().instance_ids(&foreign_id).send().await.unwrap();
    let state = foreign_state.reservations()[0].instances()[0].state().unwrap().name().unwrap().clone();
    assert_eq!(state, InstanceStateName::Running, "untagged instances are left alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_resolves_to_its_image_and_an_unknown_one_is_refused() {
    use hangar_crds::SandboxTemplate;
    use k8s_openapi::api::core::v1::Pod;
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    namespace(&client, "templates").await;
    let built = Manifest::of("linux", "arm64", &[("etc/python-dev", b"python-dev 2.0\n")]);
    let image = &stack.registry.push(&Image::single("templates/python-dev", built));
    let template = hangar_e2e::templates::sign(hangar_e2e::templates::template("python-dev", "2.0", image, None));
    Api::<SandboxTemplate>::all(client.clone()).create(&PostParams::default(), &template).await.unwrap();
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "templates");
    let from_template =
        sessions::sandbox("templated", "commands", json!({"image": null, "template": "python-dev@2.0"}));
    api.create(&PostParams::default(), &from_template).await.unwrap();
    wait_for(&api, "templated", "running", |s| phase(s) == Some(Phase::Running)).await;
    let pod = Api::<Pod>::namespaced(client.clone(), "templates").get("hangar-agent-templated").await.unwrap();
    assert_eq!(pod.spec.unwrap().containers[0].image.as_deref(), Some(image.as_str()));

    // An unknown template is refused at admission: no session, no instance.
    let unknown = sessions::sandbox("untemplated", "commands", json!({"image": null, "template": "nope@1.0"}));
    let err = api.create(&PostParams::default(), &unknown).await.unwrap_err();
    assert!(err.to_string().contains("template_not_registered"), "{err}");
    assert!(api.get_opt("untemplated").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_exit_ends_a_session_in_mode_agent_with_its_code() {
    let stack = shared_stack();
    let client = stack.cp.client().await.unwrap();
    namespace(&client, "agent-exit").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "agent-exit");
    let ec2 = ec2_client(&stack.moto.endpoint()).await;
    // An agent that works a moment and exits 3; one that cannot start.
    let working =
        sessions::sandbox("worker", "agent", json!({"command": ["sh", "-c", "sleep 1; echo done > out.txt; exit 3"]}));
    let missing = sessions::sandbox("missing", "agent", json!({"command": ["no-such-agent-binary"]}));
    api.create(&PostParams::default(), &working).await.unwrap();
    api.create(&PostParams::default(), &missing).await.unwrap();
    for (name, code) in [("worker", 3), ("missing", 127)] {
        let s = wait_for(&api, name, "ended", |s| phase(s) == Some(Phase::Ended)).await;
        let status = s.status.clone().unwrap();
        assert_eq!(status.exit_code, Some(code), "{name}: the agent's exit code");
        if name == "missing" {
            // Never ran: a clear reason (the supervisor's termination
            // message), and no outcome.
            let reason = status.stop_reason.clone().unwrap_or_default();
            assert!(
                reason.starts_with("agent_start_failed: cannot start the agent no-such-agent-binary"),
                "{name}: {reason}"
            );
            assert_eq!(status.outcome, None, "{name}");
        } else {
            assert_eq!(status.stop_reason.as_deref(), Some("agent_exited"), "{name}");
            assert_eq!(status.outcome.as_deref(), Some("completed"), "{name}");
        }
        let steps: Vec<&str> = status.reset.iter().map(|r| r.step.as_str()).collect();
        assert_eq!(steps, hangar_e2e::sessions::RESET_STEPS, "{name}");
        let session = s.uid().unwrap();
        assert!(
            session_instances(&ec2, &session).await.iter().all(|(_, st)| *st == InstanceStateName::Terminated),
            "{name}: its instance is terminated"
        );
    }
    // The exit codes reached the session only through the agent Pod's
    // container state (what a kubelet reports; the reset then deletes it).
}

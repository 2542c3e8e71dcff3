//! The agent Pod of a session: bound to the session's node, tolerating its
//! taint, the workspace at /workspace, the in-sandbox supervisor as the
//! entrypoint of the agent container.

use std::collections::BTreeMap;

use hangar_crds::{Mode, Sandbox};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostPathVolumeSource, Pod, PodSpec, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::labels::{SESSION_LABEL, SESSION_TAINT};

/// Where the worker mounts the opened workspace on the node.
pub const HOST_WORKSPACE: &str = "/var/lib/hangar/workspace";
/// Where the worker and the supervisor share their Unix socket.
pub const HOST_SOCKET_DIR: &str = "/var/run/hangar";
pub const SUPERVISOR: &str = "/hangar/supervisor";

pub fn pod_name(sandbox: &str) -> String {
    format!("hangar-agent-{sandbox}")
}

/// Whether `pod` is the agent Pod this operator made for the session whose
/// Sandbox has uid `session_id`: its controller is that Sandbox. A Pod
/// someone else created under the same name is never taken for it.
pub fn is_ours(pod: &Pod, session_id: &str) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.kind == "Sandbox" && r.uid == session_id)
}

pub fn build(sandbox: &Sandbox, session_id: &str, node_name: &str, image: &str) -> Pod {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let spec = &sandbox.spec;
    let mode = match spec.mode {
        Mode::Agent => "agent",
        Mode::Commands => "commands",
    };
    let mut args =
        vec!["--mode".to_owned(), mode.to_owned(), "--socket".to_owned(), format!("{HOST_SOCKET_DIR}/supervisor.sock")];
    if spec.mode == Mode::Agent && !spec.command.is_empty() {
        args.push("--".into());
        args.extend(spec.command.iter().cloned());
    }
    let hardened = SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
        ..Default::default()
    };
    let mut containers = vec![Container {
        name: "agent".into(),
        image: Some(image.to_owned()),
        command: Some(vec![SUPERVISOR.into()]),
        args: Some(args),
        working_dir: Some("/workspace".into()),
        volume_mounts: Some(vec![
            VolumeMount { name: "workspace".into(), mount_path: "/workspace".into(), ..Default::default() },
            VolumeMount { name: "supervisor".into(), mount_path: HOST_SOCKET_DIR.into(), ..Default::default() },
        ]),
        security_context: Some(hardened.clone()),
        ..Default::default()
    }];
    for c in &spec.companions {
        containers.push(Container {
            name: c.name.clone(),
            image: Some(c.image.clone()),
            security_context: Some(hardened.clone()),
            ..Default::default()
        });
    }
    let host_path =
        |path: &str| HostPathVolumeSource { path: path.to_owned(), type_: Some("DirectoryOrCreate".into()) };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&name)),
            namespace: sandbox.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (SESSION_LABEL.to_owned(), name.clone()),
                ("app.kubernetes.io/managed-by".to_owned(), "hangar".to_owned()),
                ("app.kubernetes.io/component".to_owned(), "agent".to_owned()),
            ])),
            owner_references: sandbox.controller_owner_ref(&()).map(|r| vec![r]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node_name.to_owned()),
            // The agent holds no credentials: no ServiceAccount token.
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some(if spec.mode == Mode::Agent { "Never" } else { "Always" }.into()),
            tolerations: Some(vec![Toleration {
                key: Some(SESSION_TAINT.into()),
                operator: Some("Equal".into()),
                value: Some(session_id.to_owned()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]),
            containers,
            volumes: Some(vec![
                Volume { name: "workspace".into(), host_path: Some(host_path(HOST_WORKSPACE)), ..Default::default() },
                Volume { name: "supervisor".into(), host_path: Some(host_path(HOST_SOCKET_DIR)), ..Default::default() },
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_pod_is_bound_tainted_and_credential_free() {
        let sandbox: Sandbox = serde_yaml::from_str(
            r#"
apiVersion: hangar.dev/v1alpha1
kind: Sandbox
metadata: {name: box, namespace: team-a, uid: 0c5e-uid}
spec:
  mode: agent
  image: r/a@sha256:0000000000000000000000000000000000000000000000000000000000000000
  command: [python3, agent.py]
  companions: [{name: db, image: "r/db@sha256:1111111111111111111111111111111111111111111111111111111111111111"}]
"#,
        )
        .unwrap();
        let pod = build(&sandbox, "sess-1", "ip-10-0-0-1", "r/a@sha256:00");
        let spec = pod.spec.clone().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("ip-10-0-0-1"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.tolerations.unwrap()[0].value.as_deref(), Some("sess-1"));
        let agent = &spec.containers[0];
        assert_eq!(agent.command.as_deref(), Some(&[SUPERVISOR.to_owned()][..]));
        assert_eq!(agent.args.as_ref().unwrap()[4..], ["--", "python3", "agent.py"]);
        assert_eq!(spec.containers[1].name, "db");
        assert_eq!(pod.metadata.owner_references.as_ref().unwrap()[0].uid, "0c5e-uid");
        assert!(is_ours(&pod, "0c5e-uid"));
        assert!(!is_ours(&pod, "another-session"), "owned by another Sandbox");
        let mut squatter = pod.clone();
        squatter.metadata.owner_references = None;
        assert!(!is_ours(&squatter, "0c5e-uid"), "a Pod created by someone else under the agent's name");
    }
}

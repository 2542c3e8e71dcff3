//! The agent Pod of a session: bound to the session's node, tolerating its
//! taint, the workspace at /workspace, the in-sandbox supervisor as the
//! entrypoint of the agent container, and the tenant's attached Secrets as
//! read-only Secret volumes (the node's kubelet reads them; hangar never
//! holds their values). They are optional: a Secret deleted while the
//! session was paused is simply absent when its containers start again,
//! and the node keeps them in memory only, so a pause drops them.

use std::collections::BTreeMap;

use hangar_crds::{Mode, Sandbox};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, HostPathVolumeSource, Pod, PodSpec, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::labels::{SESSION_LABEL, SESSION_TAINT};

/// Where the worker mounts the opened workspace on the node.
pub const HOST_WORKSPACE: &str = "/var/lib/hangar/workspace";
/// Where the worker and the supervisor share their Unix socket.
pub const HOST_SOCKET_DIR: &str = "/var/run/hangar";
/// Where the agent container runs the supervisor from, and the directory
/// hangar's supervisor image installs it into.
pub const SUPERVISOR: &str = "/hangar/supervisor";
const SUPERVISOR_DIR: &str = "/hangar";
/// The volume the supervisor is installed into (when hangar's supervisor
/// image is configured), mounted at `SUPERVISOR_DIR`.
const SUPERVISOR_BIN_VOLUME: &str = "hangar-supervisor";
/// Where hangar's supervisor image keeps the binary.
const SUPERVISOR_IN_ITS_IMAGE: &str = "/usr/local/bin/hangar-supervisor";

/// The volume of the `i`th attachment.
pub fn attachment_volume(i: usize) -> String {
    format!("attachment-{i}")
}

pub fn pod_name(sandbox: &str) -> String {
    format!("hangar-agent-{sandbox}")
}

/// Says (once per pass that finds it) that a Pod someone else created
/// holds the agent Pod's name: the session waits until the name is free.
pub fn warn_foreign(pod_name: &str) {
    tracing::warn!(pod = %pod_name, "a Pod hangar did not create holds the agent Pod's name");
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

/// `supervisor_image`: hangar's supervisor image; an init container from it
/// installs the supervisor into an emptyDir the agent container runs it
/// from (read-only there, so code in the sandbox cannot replace it). None:
/// the agent image carries it at `SUPERVISOR`. `node_root`: the directory
/// on the node the host paths are under (`/` on a real node).
pub fn build(
    sandbox: &Sandbox,
    session_id: &str,
    node_name: &str,
    image: &str,
    supervisor_image: Option<&str>,
    node_root: &str,
) -> Pod {
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
            VolumeMount {
                name: "workspace".into(),
                mount_path: "/workspace".into(),
                // The worker mounts the decrypted volume there after the
                // container may have started (and again at each resume).
                mount_propagation: Some("HostToContainer".into()),
                ..Default::default()
            },
            VolumeMount { name: "supervisor".into(), mount_path: HOST_SOCKET_DIR.into(), ..Default::default() },
        ]),
        security_context: Some(hardened.clone()),
        ..Default::default()
    }];
    let mut init_containers = Vec::new();
    let mut supervisor_volume = Vec::new();
    if let Some(supervisor_image) = supervisor_image {
        let mount = |read_only| VolumeMount {
            name: SUPERVISOR_BIN_VOLUME.into(),
            mount_path: SUPERVISOR_DIR.into(),
            read_only: Some(read_only),
            ..Default::default()
        };
        containers[0].volume_mounts.get_or_insert_with(Vec::new).push(mount(true));
        init_containers.push(Container {
            name: "install-supervisor".into(),
            image: Some(supervisor_image.to_owned()),
            command: Some(vec![SUPERVISOR_IN_ITS_IMAGE.into(), "--install".into(), SUPERVISOR.into()]),
            volume_mounts: Some(vec![mount(false)]),
            security_context: Some(SecurityContext { read_only_root_filesystem: Some(true), ..hardened.clone() }),
            ..Default::default()
        });
        supervisor_volume.push(Volume {
            name: SUPERVISOR_BIN_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        });
    }
    for c in &spec.companions {
        containers.push(Container {
            name: c.name.clone(),
            image: Some(c.image.clone()),
            security_context: Some(hardened.clone()),
            ..Default::default()
        });
    }
    let mut attachment_volumes = Vec::new();
    for (i, a) in spec.attachments.iter().enumerate() {
        let volume = attachment_volume(i);
        for c in containers.iter_mut().filter(|c| c.name == "agent" || a.companions.contains(&c.name)) {
            c.volume_mounts.get_or_insert_with(Vec::new).push(VolumeMount {
                name: volume.clone(),
                mount_path: a.destination.clone(),
                read_only: Some(true),
                ..Default::default()
            });
        }
        attachment_volumes.push(Volume {
            name: volume,
            secret: Some(SecretVolumeSource {
                secret_name: Some(a.secret_name.clone()),
                optional: Some(true),
                default_mode: Some(0o400),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let host_path = |path: &str| HostPathVolumeSource {
        path: format!("{}{path}", node_root.trim_end_matches('/')),
        type_: Some("DirectoryOrCreate".into()),
    };
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
            init_containers: (!init_containers.is_empty()).then_some(init_containers),
            volumes: Some(
                [
                    Volume {
                        name: "workspace".into(),
                        host_path: Some(host_path(HOST_WORKSPACE)),
                        ..Default::default()
                    },
                    Volume {
                        name: "supervisor".into(),
                        host_path: Some(host_path(HOST_SOCKET_DIR)),
                        ..Default::default()
                    },
                ]
                .into_iter()
                .chain(supervisor_volume)
                .chain(attachment_volumes)
                .collect(),
            ),
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
        let pod = build(&sandbox, "sess-1", "ip-10-0-0-1", "r/a@sha256:00", None, "/");
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
        assert!(spec.init_containers.is_none(), "no supervisor image: the agent image carries the supervisor");
        let host_paths = |pod: &Pod| -> Vec<String> {
            pod.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.host_path.clone())
                .map(|h| h.path)
                .collect()
        };
        assert_eq!(host_paths(&pod), [HOST_WORKSPACE, HOST_SOCKET_DIR]);
        let rooted = build(&sandbox, "sess-1", "ip-10-0-0-1", "r/a@sha256:00", None, "/nodes/n1/");
        assert_eq!(host_paths(&rooted), ["/nodes/n1/var/lib/hangar/workspace", "/nodes/n1/var/run/hangar"]);
    }

    #[test]
    fn supervisor_image_installs_the_supervisor_read_only_for_the_agent() {
        let sandbox: Sandbox = serde_yaml::from_str(
            "{apiVersion: hangar.dev/v1alpha1, kind: Sandbox, metadata: {name: b, namespace: t, uid: u}, \
             spec: {mode: commands, image: 'r/a@sha256:00', tenant: acme}}",
        )
        .unwrap();
        let spec = build(&sandbox, "u", "n", "r/a@sha256:00", Some("r/hangar/supervisor@sha256:55"), "/").spec.unwrap();
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.image.as_deref(), Some("r/hangar/supervisor@sha256:55"));
        assert_eq!(init.command.as_ref().unwrap()[1..], ["--install", SUPERVISOR]);
        let mount_of = |c: &Container| {
            c.volume_mounts.iter().flatten().find(|m| m.name == SUPERVISOR_BIN_VOLUME).cloned().unwrap()
        };
        assert_eq!(mount_of(init).read_only, Some(false));
        let agent = &spec.containers[0];
        assert_eq!(agent.command.as_deref(), Some(&[SUPERVISOR.to_owned()][..]));
        assert!(SUPERVISOR.starts_with(&format!("{}/", mount_of(agent).mount_path)));
        assert_eq!(mount_of(agent).read_only, Some(true), "code in the sandbox cannot replace its supervisor");
        let volume = spec.volumes.unwrap().into_iter().find(|v| v.name == SUPERVISOR_BIN_VOLUME).unwrap();
        assert!(volume.empty_dir.is_some() && volume.host_path.is_none(), "per Pod, nothing shared on the node");
    }

    #[test]
    fn attachments_reach_the_agent_and_only_the_companions_that_ask() {
        let sandbox: Sandbox = serde_yaml::from_str(
            r#"
apiVersion: hangar.dev/v1alpha1
kind: Sandbox
metadata: {name: box, namespace: team-a, uid: u}
spec:
  mode: commands
  image: r/a@sha256:00
  tenant: acme
  companions:
  - {name: db, image: "r/db@sha256:11"}
  - {name: cache, image: "r/c@sha256:22"}
  attachments:
  - {secretName: api-key, destination: /run/secrets/api}
  - {secretName: db-password, destination: /run/secrets/db, companions: [db]}
"#,
        )
        .unwrap();
        let spec = build(&sandbox, "u", "n", "r/a@sha256:00", None, "/").spec.unwrap();
        let mounts = |name: &str| -> Vec<(String, Option<bool>)> {
            let c = spec.containers.iter().find(|c| c.name == name).unwrap();
            c.volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.name.starts_with("attachment-"))
                .map(|m| (m.mount_path.clone(), m.read_only))
                .collect()
        };
        let ro = Some(true);
        assert_eq!(mounts("agent"), [("/run/secrets/api".to_owned(), ro), ("/run/secrets/db".to_owned(), ro)]);
        assert_eq!(mounts("db"), [("/run/secrets/db".to_owned(), ro)]);
        assert!(mounts("cache").is_empty(), "a companion that did not ask gets nothing");
        let volumes = spec.volumes.unwrap();
        let secret = volumes.iter().find(|v| v.name == attachment_volume(1)).unwrap().secret.clone().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("db-password"));
        assert_eq!(secret.optional, Some(true), "a Secret deleted while paused is not attached at resume");
    }
}

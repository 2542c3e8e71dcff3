//! What the watch caches keep of a Node and of an agent Pod: the fields a
//! pass reads, and nothing else.
//!
//! At 5,000 sessions the operator caches 5,000 Nodes and 5,000 agent Pods
//! beside the Sandboxes and Leases, and a cached object costs several
//! times its JSON as typed Rust values. A Node's status (its images, its
//! system info, capacity, addresses) and a Pod's whole spec are read by no
//! pass here, so they are dropped as each event arrives, before the
//! reflector stores it. Nothing cached is written back whole: the Node is
//! changed by a merge patch of its labels, annotations and taints (the
//! taints come from here, so they are kept), and an agent Pod is only
//! ever created, read for its owner and its agent container's state, and
//! deleted. A reader of a new field adds it here; the tests below hold
//! every current reader to the same answer on a trimmed object.

use hangar_runtime::controllers::lean;
use k8s_openapi::api::core::v1::{ContainerStatus, Node, NodeSpec, NodeStatus, Pod, PodStatus};

/// Keeps a Node's metadata (its name, labels, annotations), its
/// providerID and taints, and its Ready condition.
pub fn node(node: &mut Node) {
    lean(node);
    if let Some(spec) = node.spec.as_mut() {
        *spec = NodeSpec { provider_id: spec.provider_id.take(), taints: spec.taints.take(), ..Default::default() };
    }
    if let Some(status) = node.status.as_mut() {
        let ready = status.conditions.take().map(|all| all.into_iter().filter(|c| c.type_ == "Ready").collect());
        *status = NodeStatus { conditions: ready, ..Default::default() };
    }
}

/// Keeps an agent Pod's metadata (its labels and owner) and of its status
/// the phase and each container's name and state.
pub fn agent_pod(pod: &mut Pod) {
    lean(pod);
    pod.spec = None;
    if let Some(status) = pod.status.as_mut() {
        let containers = status.container_statuses.take().map(|all| {
            all.into_iter().map(|c| ContainerStatus { name: c.name, state: c.state, ..Default::default() }).collect()
        });
        *status = PodStatus { phase: status.phase.take(), container_statuses: containers, ..Default::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::observe::{agent_state, node_prepared, ready_condition, termination_message};
    use crate::node::agent_pod::is_ours;
    use crate::node::labels::instance_of_provider_id;
    use serde_json::json;

    /// A Node as a kubelet (or kwok) reports it, with a session's labels,
    /// taint and annotation on it.
    fn session_node(ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {
                "name": "ip-10-0-0-7", "uid": "n-uid", "resourceVersion": "42",
                "labels": {"hangar.dev/session": "s1", "kubernetes.io/arch": "arm64"},
                "annotations": {"karpenter.sh/do-not-disrupt": "true", "node.alpha.kubernetes.io/ttl": "0"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {
                "providerID": "aws:///ap-southeast-2a/i-0123456789abcdef0",
                "podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"],
                "taints": [{"key": "hangar.dev/session", "value": "sess-1", "effect": "NoSchedule"}],
            },
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                    {"type": "Ready", "status": ready, "reason": "KubeletReady", "message": "kubelet is posting ready status"},
                ],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.7"}, {"type": "Hostname", "address": "ip-10-0-0-7"}],
                "allocatable": {"cpu": "2", "memory": "7Gi", "pods": "110"},
                "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "images": [{"names": ["registry.example/agent@sha256:aaaa", "registry.example/agent:v1"], "sizeBytes": 123456789}],
                "nodeInfo": {
                    "architecture": "arm64", "bootID": "b", "containerRuntimeVersion": "containerd://2.1.0",
                    "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.35.0", "machineID": "m",
                    "operatingSystem": "linux", "osImage": "Bottlerocket", "systemUUID": "u",
                },
            },
        }))
        .expect("node")
    }

    /// An agent Pod as the apiserver returns it once its agent ended.
    fn agent(terminated: bool) -> Pod {
        let state = if terminated {
            json!({"terminated": {"exitCode": 3, "reason": "Error", "message": "agent: out of budget"}})
        } else {
            json!({"running": {"startedAt": "2026-12-06T10:00:00Z"}})
        };
        serde_json::from_value(json!({
            "metadata": {
                "name": "s1-agent", "namespace": "team-a", "uid": "p-uid",
                "labels": {"app.kubernetes.io/managed-by": "hangar", "hangar.dev/session": "s1"},
                "ownerReferences": [{"apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox", "name": "s1",
                                     "uid": "sess-1", "controller": true}],
            },
            "spec": {
                "nodeName": "ip-10-0-0-7",
                "containers": [{"name": "agent", "image": "registry.example/agent@sha256:aaaa",
                                "env": [{"name": "HANGAR_MODE", "value": "agent"}]}],
                "volumes": [{"name": "workspace", "hostPath": {"path": "/var/lib/hangar/workspace"}}],
            },
            "status": {
                "phase": if terminated { "Failed" } else { "Running" },
                "hostIP": "10.0.0.7", "podIP": "10.244.0.5",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [
                    {"name": "agent", "image": "registry.example/agent@sha256:aaaa", "imageID": "sha256:aaaa",
                     "ready": !terminated, "restartCount": 0, "state": state},
                    {"name": "companion", "image": "c", "imageID": "c", "ready": true, "restartCount": 0,
                     "state": {"running": {}}},
                ],
            },
        }))
        .expect("pod")
    }

    fn json_len<T: serde::Serialize>(v: &T) -> usize {
        serde_json::to_vec(v).expect("json").len()
    }

    #[test]
    fn every_reader_of_a_node_answers_the_same_on_the_trimmed_node() {
        for ready in ["True", "False", "Unknown"] {
            let full = session_node(ready);
            let mut trimmed = full.clone();
            node(&mut trimmed);
            assert_eq!(ready_condition(&trimmed), ready_condition(&full));
            assert_eq!(node_prepared(&trimmed, "s1", "sess-1"), node_prepared(&full, "s1", "sess-1"));
            assert!(node_prepared(&trimmed, "s1", "sess-1"));
            let provider = |n: &Node| n.spec.as_ref().and_then(|s| s.provider_id.clone());
            assert_eq!(provider(&trimmed).as_deref().and_then(instance_of_provider_id), Some("i-0123456789abcdef0"));
            assert_eq!(trimmed.metadata.labels, full.metadata.labels);
            assert_eq!(trimmed.metadata.annotations, full.metadata.annotations);
            assert_eq!(trimmed.spec.as_ref().and_then(|s| s.taints.clone()), full.spec.and_then(|s| s.taints));
            let status = trimmed.status.as_ref().expect("status");
            assert!(status.images.is_none() && status.node_info.is_none() && status.addresses.is_none());
            assert_eq!(status.conditions.as_ref().map(Vec::len), Some(1), "only Ready");
            assert!(trimmed.metadata.managed_fields.is_none());
            assert!(json_len(&trimmed) < json_len(&session_node(ready)));
        }
    }

    #[test]
    fn every_reader_of_an_agent_pod_answers_the_same_on_the_trimmed_pod() {
        for terminated in [false, true] {
            let full = agent(terminated);
            let mut trimmed = full.clone();
            agent_pod(&mut trimmed);
            assert_eq!(agent_state(&trimmed), agent_state(&full));
            assert_eq!(termination_message(&trimmed), termination_message(&full));
            assert!(is_ours(&trimmed, "sess-1") && !is_ours(&trimmed, "sess-2"));
            assert_eq!(trimmed.metadata.labels, full.metadata.labels);
            assert!(trimmed.spec.is_none());
            let status = trimmed.status.as_ref().expect("status");
            assert!(status.conditions.is_none() && status.pod_ip.is_none());
            assert!(json_len(&trimmed) < json_len(&full));
        }
        assert_eq!(
            termination_message(&{
                let mut p = agent(true);
                agent_pod(&mut p);
                p
            })
            .as_deref(),
            Some("agent: out of budget")
        );
    }
}

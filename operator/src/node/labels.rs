//! What a session's node carries: Karpenter-compatible labels (so existing
//! nodeAffinity rules keep working), the session taint and the
//! do-not-disrupt annotation. Never Karpenter's ownership keys
//! (`karpenter.sh/nodepool`): Karpenter would garbage-collect the instance.

use std::collections::BTreeMap;

use crate::settings::shape_of;

pub const SESSION_LABEL: &str = "hangar.dev/session";
pub const SESSION_NAMESPACE_LABEL: &str = "hangar.dev/session-namespace";
pub use hangar_crds::worker_identity::{BINDING_NAMESPACE_LABEL, BINDING_SESSION_LABEL, SESSION_TAINT};
pub const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// The facts a node's labels are made from.
#[derive(Clone, Debug)]
pub struct NodeFacts<'a> {
    pub session_name: &'a str,
    pub session_namespace: &'a str,
    pub session_id: &'a str,
    pub instance_type: &'a str,
    pub zone: &'a str,
    pub region: &'a str,
}

pub fn labels(f: &NodeFacts) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        l.insert(k.to_owned(), v);
    };
    put("kubernetes.io/arch", "arm64".into());
    put("kubernetes.io/os", "linux".into());
    put("node.kubernetes.io/instance-type", f.instance_type.into());
    put("topology.kubernetes.io/zone", f.zone.into());
    put("topology.kubernetes.io/region", f.region.into());
    put("karpenter.sh/capacity-type", "on-demand".into());
    if let Some((family, size)) = f.instance_type.split_once('.') {
        put("karpenter.k8s.aws/instance-family", family.into());
        put("karpenter.k8s.aws/instance-size", size.into());
    }
    if let Some((cpu, mem_gib)) = shape_of(f.instance_type) {
        put("karpenter.k8s.aws/instance-cpu", cpu.to_string());
        // Karpenter labels memory in MiB.
        put("karpenter.k8s.aws/instance-memory", (mem_gib * 1024).to_string());
    }
    put(SESSION_LABEL, f.session_name.into());
    put(SESSION_NAMESPACE_LABEL, f.session_namespace.into());
    l
}

/// The binding the worker trusts: labels its kubelet cannot change. Never
/// in the user data: NodeRestriction refuses a kubelet that registers with
/// them, so the operator adds them when it prepares the node.
pub fn binding_labels(f: &NodeFacts) -> BTreeMap<String, String> {
    BTreeMap::from([
        (BINDING_SESSION_LABEL.to_owned(), f.session_name.to_owned()),
        (BINDING_NAMESPACE_LABEL.to_owned(), f.session_namespace.to_owned()),
    ])
}

pub fn annotations() -> BTreeMap<String, String> {
    BTreeMap::from([(DO_NOT_DISRUPT.to_owned(), "true".to_owned())])
}

/// `aws:///<zone>/<instance-id>`, as the AWS cloud provider sets it.
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// The instance id of a `providerID`, if it is an AWS one.
pub fn instance_of_provider_id(provider_id: &str) -> Option<&str> {
    provider_id.strip_prefix("aws:///")?.rsplit('/').next().filter(|id| id.starts_with("i-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> NodeFacts<'static> {
        NodeFacts {
            session_name: "dev-box",
            session_namespace: "team-a",
            session_id: "3f0c",
            instance_type: "m7g.large",
            zone: "ap-southeast-2a",
            region: "ap-southeast-2",
        }
    }

    #[test]
    fn karpenter_compatible_without_ownership_keys() {
        let l = labels(&facts());
        assert_eq!(l["kubernetes.io/arch"], "arm64");
        assert_eq!(l["karpenter.k8s.aws/instance-family"], "m7g");
        assert_eq!(l["karpenter.k8s.aws/instance-size"], "large");
        assert_eq!(l["karpenter.k8s.aws/instance-cpu"], "2");
        assert_eq!(l["karpenter.k8s.aws/instance-memory"], "8192");
        assert_eq!(l["hangar.dev/session"], "dev-box");
        // The binding is where a kubelet cannot write it, and not among the
        // labels a kubelet registers with.
        assert!(l.keys().all(|k| !k.contains("node-restriction.kubernetes.io")));
        let b = binding_labels(&facts());
        assert_eq!(b["hangar.node-restriction.kubernetes.io/session"], "dev-box");
        assert_eq!(b["hangar.node-restriction.kubernetes.io/session-namespace"], "team-a");
        assert!(!l.contains_key("karpenter.sh/nodepool"));
        assert!(l.keys().all(|k| !k.starts_with("karpenter.sh/") || k == "karpenter.sh/capacity-type"));
        assert_eq!(annotations()["karpenter.sh/do-not-disrupt"], "true");
    }

    #[test]
    fn provider_ids_round_trip() {
        let id = provider_id("ap-southeast-2a", "i-0abc");
        assert_eq!(id, "aws:///ap-southeast-2a/i-0abc");
        assert_eq!(instance_of_provider_id(&id), Some("i-0abc"));
        assert_eq!(instance_of_provider_id("kind://docker/x"), None);
    }
}

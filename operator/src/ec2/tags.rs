//! EC2 tags: how a crashed operator finds what it already launched, and how
//! the orphan sweep knows what is hangar's. No Karpenter tags, ever.

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};

pub const SESSION_ID: &str = "hangar.dev/session-id";
pub const CLUSTER: &str = "hangar.dev/cluster";
pub const NAMESPACE: &str = "hangar.dev/namespace";
pub const SANDBOX: &str = "hangar.dev/sandbox";
/// On volumes: `workspace` marks the session's workspace volume.
pub const ROLE: &str = "hangar.dev/role";

pub struct SessionTags<'a> {
    pub cluster: &'a str,
    pub session_id: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

impl SessionTags<'_> {
    pub fn pairs(&self) -> Vec<(String, String)> {
        vec![
            (SESSION_ID.into(), self.session_id.into()),
            (CLUSTER.into(), self.cluster.into()),
            (format!("kubernetes.io/cluster/{}", self.cluster), "owned".into()),
            (NAMESPACE.into(), self.namespace.into()),
            (SANDBOX.into(), self.name.into()),
            ("Name".into(), format!("hangar-{}-{}", self.namespace, self.name)),
        ]
    }

    pub fn spec(&self, resource: ResourceType, extra: &[(&str, &str)]) -> TagSpecification {
        let mut b = TagSpecification::builder().resource_type(resource);
        for (k, v) in self.pairs() {
            b = b.tags(Tag::builder().key(k).value(v).build());
        }
        for (k, v) in extra {
            b = b.tags(Tag::builder().key(*k).value(*v).build());
        }
        b.build()
    }
}

pub fn tag<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter().find(|t| t.key() == Some(key)).and_then(|t| t.value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_tags_follow_the_design_and_never_karpenter_ones() {
        let t = SessionTags { cluster: "prod", session_id: "s-1", namespace: "team-a", name: "box" };
        let pairs = t.pairs();
        let get = |k: &str| pairs.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.as_str());
        assert_eq!(get("hangar.dev/session-id"), Some("s-1"));
        assert_eq!(get("hangar.dev/cluster"), Some("prod"));
        assert_eq!(get("kubernetes.io/cluster/prod"), Some("owned"));
        assert_eq!(get("Name"), Some("hangar-team-a-box"));
        assert!(pairs.iter().all(|(k, _)| !k.starts_with("karpenter.")));
    }
}

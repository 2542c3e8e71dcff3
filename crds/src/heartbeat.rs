//! The worker's heartbeat Lease: the one object through which a node's
//! worker reports to the operator (renewals, which attempt it serves, and
//! that it closed the workspace for a pause). Both sides use these names.

/// The heartbeat Lease of the worker on node `node_name`, in the
/// operator's namespace. Named by node, not by session: a worker's identity
/// carries its node's name, and the admission policy lets it write this
/// Lease only, so no node can renew, fake or close another session's.
pub fn lease_name(node_name: &str) -> String {
    format!("hangar-node-{node_name}")
}

/// The session the worker serves (the operator trusts a Lease only for
/// the session running on that node, and only if this names it).
pub const SESSION_ID: &str = "hangar.dev/session-id";

/// Which attempt the worker holding the Lease serves.
pub const ATTEMPT: &str = "hangar.dev/attempt";
/// Set to the attempt number once that attempt's workspace is closed.
pub const WORKSPACE_CLOSED: &str = "hangar.dev/workspace-closed";
/// RFC 3339 time the workspace was closed (for the pause latency figures).
pub const WORKSPACE_CLOSED_AT: &str = "hangar.dev/workspace-closed-at";
/// `<namespace>/<name>` of the Sandbox, so a Lease change maps to it.
pub const SANDBOX: &str = "hangar.dev/sandbox";
/// The worker renews at least this often.
pub const RENEW_SECONDS: u64 = 10;

/// What the worker serves, as its heartbeat says it.
#[derive(Clone, Debug)]
pub struct Beat<'a> {
    pub node: &'a str,
    pub session_id: &'a str,
    /// `<namespace>/<name>` of the Sandbox.
    pub namespace: &'a str,
    pub name: &'a str,
    pub attempt: i64,
    /// The attempt whose workspace is closed, and when it closed.
    pub closed: Option<(i64, k8s_openapi::jiff::Timestamp)>,
}

/// The heartbeat as a server-side apply body (renewed now): one builder,
/// so every writer of the Lease says the same fields the same way.
pub fn lease_apply(beat: &Beat<'_>) -> serde_json::Value {
    use std::collections::BTreeMap;

    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    let mut annotations = BTreeMap::from([
        (ATTEMPT.to_owned(), beat.attempt.to_string()),
        (SANDBOX.to_owned(), format!("{}/{}", beat.namespace, beat.name)),
        (SESSION_ID.to_owned(), beat.session_id.to_owned()),
    ]);
    if let Some((a, at)) = beat.closed {
        annotations.insert(WORKSPACE_CLOSED.to_owned(), a.to_string());
        annotations.insert(WORKSPACE_CLOSED_AT.to_owned(), at.to_string());
    }
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(beat.node)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(beat.node.to_owned()),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            lease_duration_seconds: Some(60),
            ..Default::default()
        }),
    };
    let mut body = serde_json::to_value(&lease).expect("a Lease serialises");
    body["apiVersion"] = "coordination.k8s.io/v1".into();
    body["kind"] = "Lease".into();
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_names_its_node_session_and_closed_attempt() {
        let at = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let beat =
            Beat { node: "i-1", session_id: "u-1", namespace: "ns", name: "s", attempt: 3, closed: Some((3, at)) };
        let body = lease_apply(&beat);
        assert_eq!(body["kind"], "Lease");
        assert_eq!(body["metadata"]["name"], "hangar-node-i-1");
        assert_eq!(body["spec"]["holderIdentity"], "i-1");
        let a = &body["metadata"]["annotations"];
        assert_eq!(a[SESSION_ID], "u-1");
        assert_eq!(a[ATTEMPT], "3");
        assert_eq!(a[SANDBOX], "ns/s");
        assert_eq!(a[WORKSPACE_CLOSED], "3");
        assert_eq!(a[WORKSPACE_CLOSED_AT], at.to_string());
        let open = lease_apply(&Beat { closed: None, ..beat });
        assert!(open["metadata"]["annotations"].get(WORKSPACE_CLOSED).is_none());
    }
}

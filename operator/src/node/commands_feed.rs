//! The commands a session node reads (`hangar_crds::node_commands`): the
//! worker holds no read right on Commands, so it asks here, as its node's
//! account, and is answered with the numbered commands of the one session
//! bound to its node, from this operator's watch cache. A long-poll: the
//! answer comes at once when the caller's version is behind, else at the
//! session's next command change, which the Command watch pushes here
//! (`Changes`), never by polling.
//!
//! Who asks is proven by the token of its node's account, checked with a
//! TokenReview (cached briefly): the account names the node
//! (`hangar-node-<node>`), the node must be the session's current node,
//! and a token bound to a Node must be bound to that one. Every refusal
//! looks the same to the caller.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hangar_crds::node_commands::{NodeCommands, NodeCommandsQuery, REFUSED, WAIT_SECONDS};
use hangar_crds::{Command, Sandbox};
use hangar_runtime::delegated_auth::{Caller, DelegatedAuth};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use kube::ResourceExt;
use kube::api::Api;
use tokio::sync::watch;

use crate::context::Context;

/// The claim a token bound to a Node carries.
const NODE_NAME_CLAIM: &str = "authentication.kubernetes.io/node-name";
/// How long a caller's right to a session is reused.
const GRANT_FOR: Duration = Duration::from_secs(10);

/// Per session, a counter the Command watch bumps on every change of one
/// of its commands; waiting readers watch their session's.
#[derive(Default)]
pub struct Changes {
    sessions: Mutex<HashMap<(String, String), watch::Sender<u64>>>,
}

impl Changes {
    /// A command of `namespace`/`sandbox` was added, changed or removed.
    pub fn changed(&self, namespace: &str, sandbox: &str) {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(&(namespace.to_owned(), sandbox.to_owned())) {
            tx.send_modify(|n| *n += 1);
        }
        // Sessions nobody waits on any more are forgotten.
        if map.len() > 256 {
            map.retain(|_, tx| tx.receiver_count() > 0);
        }
    }

    /// Every session's commands may have changed (the watch listed anew).
    pub fn changed_all(&self) {
        for tx in self.sessions.lock().unwrap_or_else(|p| p.into_inner()).values() {
            tx.send_modify(|n| *n += 1);
        }
    }

    fn subscribe(&self, namespace: &str, sandbox: &str) -> watch::Receiver<u64> {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((namespace.to_owned(), sandbox.to_owned())).or_insert_with(|| watch::channel(0).0).subscribe()
    }
}

/// The node a node account's username names, if it is one of this
/// operator's (`system:serviceaccount:<system>:hangar-node-<node>`).
pub fn node_of_account<'a>(user: &'a str, system_namespace: &str) -> Option<&'a str> {
    let account = user.strip_prefix("system:serviceaccount:")?.strip_prefix(system_namespace)?.strip_prefix(':')?;
    account.strip_prefix(hangar_crds::worker_identity::account_name("").as_str()).filter(|n| !n.is_empty())
}

/// Whether `caller` may read the commands of `sandbox`: it is the account
/// of the session's current node, and a token bound to a Node is bound to
/// that node.
pub fn may_read(caller: &Caller, system_namespace: &str, sandbox: &Sandbox) -> bool {
    let Some(node) = node_of_account(&caller.user, system_namespace) else {
        return false;
    };
    let current = sandbox.status.as_ref().and_then(|s| s.node_name.as_deref());
    let bound_elsewhere = caller.extra.get(NODE_NAME_CLAIM).is_some_and(|names| names.iter().any(|n| n != node));
    current == Some(node) && !bound_elsewhere
}

/// The session's commands as a node sees them: those numbered for this
/// session (bound by its uid), by name; and their version.
pub fn session_commands<'a>(
    all: impl Iterator<Item = &'a Command>,
    namespace: &str,
    sandbox: &str,
    session_id: &str,
) -> NodeCommands {
    let mut commands: Vec<Command> = all
        .filter(|c| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.spec.sandbox == sandbox
                && c.status.as_ref().and_then(|s| s.sandbox_uid.as_deref()) == Some(session_id)
        })
        .cloned()
        .collect();
    commands.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for c in &commands {
        (c.metadata.name.as_deref(), c.metadata.resource_version.as_deref()).hash(&mut h);
    }
    NodeCommands { version: format!("{}-{:016x}", commands.len(), h.finish()), commands }
}

/// A caller (token user) and the session it asks for (namespace, name).
type GrantKey = (String, String, String);

/// The node service's handler for [`hangar_crds::node_commands::PATH`].
pub struct CommandsFeed {
    ctx: Arc<Context>,
    auth: Arc<DelegatedAuth>,
    /// (token user, namespace, sandbox) → the session id it may read, and
    /// since when.
    grants: Mutex<HashMap<GrantKey, (Instant, String)>>,
}

impl CommandsFeed {
    pub fn new(ctx: Arc<Context>, auth: Arc<DelegatedAuth>) -> Self {
        Self { auth, ctx, grants: Mutex::default() }
    }

    pub async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>> {
        let query: Option<NodeCommandsQuery> = req.uri().query().and_then(|q| serde_urlencoded::from_str(q).ok());
        let Some(query) = query else {
            return crate::workspace_keys::error(StatusCode::BAD_REQUEST, "bad_request");
        };
        let caller = match crate::workspace_keys::caller_of(&self.auth, &req, REFUSED).await {
            Ok(c) => c,
            Err(refused) => return refused,
        };
        let session_id = match self.grant(&caller, &query).await {
            Ok(Some(id)) => id,
            Ok(None) => {
                self.ctx.metrics.node_commands_refused.inc();
                tracing::warn!(user = %caller.user, namespace = %query.namespace, sandbox = %query.sandbox,
                    "node commands refused: not the session's node");
                return crate::workspace_keys::error(StatusCode::FORBIDDEN, REFUSED);
            }
            Err(e) => {
                tracing::warn!(error = %e, "node commands: could not read the session");
                return crate::workspace_keys::error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
            }
        };
        let mut changes = self.ctx.commands_feed.subscribe(&query.namespace, &query.sandbox);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(WAIT_SECONDS);
        loop {
            let now = session_commands(
                self.ctx.commands.state().iter().map(|c| &**c),
                &query.namespace,
                &query.sandbox,
                &session_id,
            );
            if query.after.as_deref() != Some(now.version.as_str()) {
                return crate::workspace_keys::json(StatusCode::OK, &now);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                _ => return crate::workspace_keys::json(StatusCode::OK, &now),
            }
        }
    }

    /// The session id `caller` may read the commands of, if any.
    async fn grant(&self, caller: &Caller, query: &NodeCommandsQuery) -> Result<Option<String>, kube::Error> {
        let key = (caller.user.clone(), query.namespace.clone(), query.sandbox.clone());
        if let Some((at, id)) = self.grants.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned()
            && at.elapsed() < GRANT_FOR
        {
            return Ok(Some(id));
        }
        let system = &self.ctx.settings.system_namespace;
        // Only a node account makes the operator read a Sandbox.
        if node_of_account(&caller.user, system).is_none() {
            return Ok(None);
        }
        let sandboxes: Api<Sandbox> = Api::namespaced(self.ctx.client.clone(), &query.namespace);
        let Some(sandbox) = sandboxes.get_opt(&query.sandbox).await? else {
            return Ok(None);
        };
        if !may_read(caller, system, &sandbox) {
            return Ok(None);
        }
        let id = sandbox.uid().unwrap_or_default();
        let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
        if grants.len() > 4096 {
            grants.retain(|_, (at, _)| at.elapsed() < GRANT_FOR);
        }
        grants.insert(key, (Instant::now(), id.clone()));
        Ok(Some(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn caller(user: &str, bound_to: Option<&str>) -> Caller {
        let extra = bound_to.map(|n| BTreeMap::from([(NODE_NAME_CLAIM.to_owned(), vec![n.to_owned()])]));
        Caller { user: user.into(), uid: None, groups: vec![], extra: extra.unwrap_or_default() }
    }

    fn sandbox_on(node: Option<&str>) -> Sandbox {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "box", "namespace": "t", "uid": "s1"},
            "spec": {"mode": "commands", "image": "r/i@sha256:00", "tenant": "t"},
            "status": {"nodeName": node},
        }))
        .unwrap()
    }

    fn command(name: &str, sandbox: &str, uid: Option<&str>, rv: &str) -> Command {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "hangar.dev/v1alpha1", "kind": "Command",
            "metadata": {"name": name, "namespace": "t", "resourceVersion": rv},
            "spec": {"sandbox": sandbox, "argv": ["true"]},
            "status": {"sandboxUid": uid},
        }))
        .unwrap()
    }

    #[test]
    fn only_the_account_of_the_sessions_current_node_reads() {
        let on_a = sandbox_on(Some("node-a"));
        let sys = "hangar-system";
        assert!(may_read(&caller("system:serviceaccount:hangar-system:hangar-node-node-a", None), sys, &on_a));
        assert!(may_read(
            &caller("system:serviceaccount:hangar-system:hangar-node-node-a", Some("node-a")),
            sys,
            &on_a
        ));
        // Another node's account; the right account with a token bound to
        // another node; an account of another namespace; the worker's own
        // account; a tenant; a session with no node.
        assert!(!may_read(&caller("system:serviceaccount:hangar-system:hangar-node-node-b", None), sys, &on_a));
        assert!(!may_read(
            &caller("system:serviceaccount:hangar-system:hangar-node-node-a", Some("node-b")),
            sys,
            &on_a
        ));
        assert!(!may_read(&caller("system:serviceaccount:tenant:hangar-node-node-a", None), sys, &on_a));
        assert!(!may_read(&caller("system:serviceaccount:hangar-system:hangar-worker", None), sys, &on_a));
        assert!(!may_read(&caller("alice", None), sys, &on_a));
        assert!(!may_read(&caller("system:serviceaccount:hangar-system:hangar-node-", None), sys, &sandbox_on(None)));
        assert_eq!(node_of_account("system:serviceaccount:hangar-system:hangar-node-", sys), None);
    }

    #[test]
    fn a_node_sees_its_sessions_numbered_commands_and_a_new_version_on_any_change() {
        let all = [
            command("a", "box", Some("s1"), "1"),
            command("b", "box", None, "2"),         // not numbered yet
            command("c", "box", Some("s0"), "3"),   // an earlier session of the name
            command("d", "other", Some("s2"), "4"), // another session in the namespace
        ];
        let seen = session_commands(all.iter(), "t", "box", "s1");
        let names: Vec<_> = seen.commands.iter().map(|c| c.name_any()).collect();
        assert_eq!(names, ["a"]);
        let changed = [command("a", "box", Some("s1"), "5")];
        assert_ne!(session_commands(changed.iter(), "t", "box", "s1").version, seen.version);
        let more = [command("a", "box", Some("s1"), "1"), command("e", "box", Some("s1"), "6")];
        assert_ne!(session_commands(more.iter(), "t", "box", "s1").version, seen.version);
        assert_eq!(session_commands(all.iter(), "t", "box", "s1").version, seen.version);
    }
}

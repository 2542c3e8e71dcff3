//! Writes made as the caller, never as the gateway: Kubernetes
//! impersonation of the member it authenticated, or of a session token's
//! own identity (`hangar:token:<namespace>:<name>` in group
//! `hangar:session-tokens`). RBAC, the audit log and admission all see who
//! sent each command, and the admission webhook holds a token's writes to
//! its scopes.

use hangar_core::tokens::scope;
use hangar_crds::SessionToken;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::auth::Caller;
use crate::error::ApiError;

/// The identity a write is made as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acting {
    pub user: String,
    pub groups: Vec<String>,
}

const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

impl Acting {
    /// A member, with only the groups the gateway may pass on (`allowed`):
    /// a ServiceAccount is impersonated as itself, and the apiserver gives
    /// it its own groups.
    pub fn member(caller: &Caller, allowed: &[String]) -> Self {
        let groups = if caller.user.starts_with(SERVICE_ACCOUNT_PREFIX) {
            Vec::new()
        } else {
            caller.groups.iter().filter(|g| allowed.contains(g)).cloned().collect()
        };
        Self { user: caller.user.clone(), groups }
    }

    /// The groups to authorise the member with (SubjectAccessReview), so
    /// the decision is about the identity the writes are made as: a
    /// ServiceAccount's own groups, else the groups passed on.
    pub fn review_groups(&self, caller: &Caller) -> Vec<String> {
        if caller.user.starts_with(SERVICE_ACCOUNT_PREFIX) { caller.groups.clone() } else { self.groups.clone() }
    }

    /// A session token's identity.
    pub fn token(token: &SessionToken) -> Self {
        Self {
            user: scope::identity(&token.namespace().unwrap_or_default(), &token.name_any()),
            groups: vec![scope::GROUP.to_owned()],
        }
    }

    fn stamp(&self, mut req: http::Request<Vec<u8>>) -> Result<http::Request<Vec<u8>>, ApiError> {
        let headers = req.headers_mut();
        let value =
            |v: &str| http::HeaderValue::from_str(v).map_err(|_| ApiError::internal("an identity that is no header"));
        headers.insert("Impersonate-User", value(&self.user)?);
        for g in &self.groups {
            headers.append("Impersonate-Group", value(g)?);
        }
        Ok(req)
    }

    /// Creates `object` in `namespace` as this identity.
    pub async fn create<K>(&self, client: &kube::Client, namespace: &str, object: &K) -> Result<K, ApiError>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    {
        Ok(self.create_raw(client, namespace, object).await?)
    }

    /// The same, with the apiserver's error as it came (to tell
    /// AlreadyExists apart).
    pub async fn create_raw<K>(&self, client: &kube::Client, namespace: &str, object: &K) -> Result<K, kube::Error>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    {
        let request = kube::core::Request::new(K::url_path(&(), Some(namespace)));
        let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
        let req = request.create(&PostParams::default(), body).map_err(kube::Error::BuildRequest)?;
        let req = self.stamp(req).map_err(|e| kube::Error::Service(e.message.into()))?;
        client.request::<K>(req).await
    }

    /// Merge-patches `name` in `namespace` as this identity.
    pub async fn patch<K>(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<K, ApiError>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
    {
        let request = kube::core::Request::new(K::url_path(&(), Some(namespace)));
        let req = request
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(client.request::<K>(self.stamp(req)?).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(user: &str, groups: &[&str]) -> Caller {
        Caller {
            user: user.into(),
            uid: None,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: Default::default(),
        }
    }

    #[test]
    fn only_listed_groups_pass_and_never_masters_by_default() {
        let allowed = vec!["devs".to_owned()];
        let a = Acting::member(&caller("alice", &["devs", "system:masters", "system:authenticated"]), &allowed);
        assert_eq!(a, Acting { user: "alice".into(), groups: vec!["devs".into()] });
        let sa = Acting::member(&caller("system:serviceaccount:t:m", &["system:serviceaccounts", "devs"]), &allowed);
        assert!(sa.groups.is_empty(), "a ServiceAccount gets its groups from the apiserver");
    }
}

//! A JSON document kept in a ConfigMap, read and written by compare-and-swap
//! (the resourceVersion read is the write's precondition), so writers on
//! several replicas never lose each other's changes: a lost race reads
//! again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::kube_ext::{ignore_not_found, is_already_exists, is_conflict};

/// The data key the document is kept under.
pub const KEY: &str = "document.json";

/// A document as read, with the version a write must start from.
#[derive(Clone, Debug)]
pub struct Read<T> {
    pub document: T,
    /// `None`: the ConfigMap does not exist yet (the write creates it).
    resource_version: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("ConfigMap {name} does not hold a valid document: {source}")]
    Invalid {
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads document `name` (the default value when there is none yet).
pub async fn read<T: DeserializeOwned + Default>(api: &Api<ConfigMap>, name: &str) -> Result<Read<T>, DocumentError> {
    let Some(cm) = api.get_opt(name).await? else {
        return Ok(Read { document: T::default(), resource_version: None });
    };
    let document = match cm.data.as_ref().and_then(|d| d.get(KEY)) {
        Some(text) => {
            serde_json::from_str(text).map_err(|source| DocumentError::Invalid { name: name.to_owned(), source })?
        }
        None => T::default(),
    };
    Ok(Read { document, resource_version: cm.metadata.resource_version })
}

/// Writes `next` over the version `read` came from, and returns it as
/// read back (with its new version); `Ok(None)` when the document changed
/// (or was created) since, and nothing was written.
pub async fn write<T: Serialize + Clone>(
    api: &Api<ConfigMap>,
    name: &str,
    labels: BTreeMap<String, String>,
    read: &Read<T>,
    next: &T,
) -> Result<Option<Read<T>>, kube::Error> {
    let text = serde_json::to_string(next).expect("a document serialises");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            resource_version: read.resource_version.clone(),
            ..Default::default()
        },
        data: Some([(KEY.to_owned(), text)].into()),
        ..Default::default()
    };
    let written = match &read.resource_version {
        None => api.create(&PostParams::default(), &cm).await,
        Some(_) => api.replace(name, &PostParams::default(), &cm).await,
    };
    match written {
        Ok(cm) => Ok(Some(Read { document: next.clone(), resource_version: cm.metadata.resource_version })),
        Err(e) if is_conflict(&e) || is_already_exists(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Deletes document `name`; absent is fine.
pub async fn delete(api: &Api<ConfigMap>, name: &str) -> Result<(), kube::Error> {
    ignore_not_found(api.delete(name, &DeleteParams::default()).await)?;
    Ok(())
}

//! The orphan sweep: a tagged instance or workspace volume whose session no
//! longer exists (its Sandbox is gone) is terminated or deleted.

use std::collections::HashSet;

use hangar_crds::Sandbox;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::ec2::Ec2;
use crate::error::Result;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub instances: Vec<String>,
    pub volumes: Vec<String>,
}

/// Sessions are listed *after* EC2 is described, so anything described
/// belongs to a Sandbox that existed then; missing now means deleted.
pub async fn sweep(ec2: &Ec2, client: &kube::Client) -> Result<Swept> {
    let instances = ec2.describe_cluster_instances().await?;
    let volumes = ec2.describe_cluster_volumes().await?;
    let sandboxes: Api<Sandbox> = Api::all(client.clone());
    let live: HashSet<String> =
        sandboxes.list_metadata(&ListParams::default()).await?.items.iter().filter_map(|s| s.uid()).collect();
    let mut swept = Swept::default();
    for i in instances.iter().filter(|i| !i.state.is_gone()) {
        if i.session_id.as_ref().is_some_and(|s| !live.contains(s)) {
            tracing::warn!(instance = %i.id, session = ?i.session_id, "terminating an orphaned instance");
            ec2.terminate(&i.id).await?;
            swept.instances.push(i.id.clone());
        }
    }
    for v in volumes {
        if v.session_id.as_ref().is_some_and(|s| !live.contains(s)) {
            tracing::warn!(volume = %v.id, session = ?v.session_id, "deleting an orphaned workspace volume");
            if v.attached_to.is_some() && !v.available {
                ec2.detach(&v.id).await?;
            } else {
                ec2.delete_volume(&v.id).await?;
            }
            swept.volumes.push(v.id);
        }
    }
    Ok(swept)
}

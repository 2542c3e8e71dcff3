//! Session instances as real nodes: each running hangar instance in the EC2
//! endpoint becomes a `RealNode` named by its instance id, with its
//! providerID, so the operator binds it to its session and the worker
//! DaemonSet and the agent Pod run on it as real Pods. A stopped or
//! terminated instance loses its node (kubelet, containerd and every Pod
//! process end at once, as in a power-off).
//!
//! The instance proves itself to the operator's key service with the
//! identity document its metadata service serves: one endpoint, started
//! before the install so that the chart's worker environment can name it
//! (`worker.extraEnv`). All nodes here share the host paths under one
//! `nodeRoot` (a shared mount), so one session node runs at a time.

use std::collections::HashMap;
use std::path::PathBuf;

use aws_sdk_ec2::types::{Filter, InstanceStateName};

use crate::control_plane::ControlPlane;
use crate::error::{HarnessError, Result};
use crate::imds::{IdentityAuthority, Imds, InstanceIdentity};
use crate::process::RunDir;
use crate::real_node::{NodeSpec, RealNode, make_shared_mount, unmount_under};
use crate::registry::Registry;

pub struct RealSessionNodes {
    nodes: HashMap<String, RealNode>,
    /// The session node's instance metadata service (on 127.0.0.1: the
    /// worker runs in the node's network).
    pub imds: Imds,
    pub authority: IdentityAuthority,
    ec2: aws_sdk_ec2::Client,
    root: RunDir,
}

impl Drop for RealSessionNodes {
    fn drop(&mut self) {
        self.nodes.clear();
        unmount_under(&self.root.path);
    }
}

impl RealSessionNodes {
    /// `authority` signs the identity documents (the chart's
    /// `operator.workspaceKeys.identityCertificate` is its certificate).
    pub async fn new(ec2_endpoint: &str, authority: IdentityAuthority) -> Result<Self> {
        let root = RunDir::new("hangar-node")?;
        make_shared_mount(&root.path)?;
        let imds = Imds::start().await.map_err(crate::error::io("start the metadata service"))?;
        Ok(Self { nodes: HashMap::new(), imds, authority, ec2: crate::ec2::client(ec2_endpoint).await, root })
    }

    /// The release's `nodeRoot`: where every session node keeps hangar's
    /// host paths (`var/lib/hangar`, `var/run/hangar`).
    pub fn node_root(&self) -> PathBuf {
        self.root.path.clone()
    }

    pub fn node(&self, instance_id: &str) -> Option<&RealNode> {
        self.nodes.get(instance_id)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &RealNode> {
        self.nodes.values()
    }

    /// One pass over EC2: a node for each running instance that has none
    /// (started here, Ready when this returns), none for the others.
    pub async fn follow(&mut self, cp: &ControlPlane, registry: &Registry) -> Result<()> {
        let out = self
            .ec2
            .describe_instances()
            .filters(Filter::builder().name("tag-key").values("hangar.dev/cluster").build())
            .send()
            .await
            .map_err(|e| HarnessError::Ec2(Box::new(e.into())))?;
        let mut running = Vec::new();
        for r in out.reservations() {
            for i in r.instances() {
                let Some(id) = i.instance_id() else { continue };
                if i.state().and_then(|s| s.name()) == Some(&InstanceStateName::Running) {
                    running.push(id.to_owned());
                    if !self.nodes.contains_key(id) {
                        let zone = i.placement().and_then(|p| p.availability_zone()).unwrap_or_default();
                        let document = InstanceIdentity::of(r.owner_id(), i).document();
                        let signature = self.authority.sign(&document)?;
                        self.imds.serve(document, signature);
                        let spec = NodeSpec {
                            name: id.to_owned(),
                            provider_id: Some(format!("aws:///{zone}/{id}")),
                            ..Default::default()
                        };
                        let node = tokio::task::block_in_place(|| RealNode::start(cp, registry, &spec))?;
                        self.nodes.insert(id.to_owned(), node);
                    }
                }
            }
        }
        let gone: Vec<String> = self.nodes.keys().filter(|id| !running.contains(id)).cloned().collect();
        for id in gone {
            // Stopping a node waits on its processes: off the runtime.
            let node = self.nodes.remove(&id);
            tokio::task::block_in_place(|| drop(node));
        }
        Ok(())
    }
}

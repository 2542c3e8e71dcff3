//! hangar on real nodes, as `make up NODE=real` and the whole-session test
//! run it (`docs/real-node.md`): the control plane with its controllers,
//! the loopback registry, moto, a system node where Helm installs every
//! hangar component from hangar's own images, and a real session node for
//! each running instance in moto.

use crate::control_plane::ControlPlane;
use crate::error::Result;
use crate::imds::IdentityAuthority;
use crate::moto::Moto;
use crate::real_node::{NodeSpec, RealNode};
use crate::registry::Registry;
use crate::release::{self, Installed};
use crate::session_nodes::RealSessionNodes;

/// The parts, in the order they stop (fields drop in declaration order):
/// the session nodes, the system node, then what they used.
pub struct RealStack {
    pub sessions: RealSessionNodes,
    /// The node hangar's own Pods run on.
    pub node: RealNode,
    pub installed: Installed,
    pub moto: Moto,
    pub registry: Registry,
    pub cp: ControlPlane,
}

impl RealStack {
    /// Starts everything on `cp` (a `Mode::Cluster` control plane without
    /// the CRDs: the chart installs them) and installs hangar; returns when
    /// every component is Ready. Needs a multi-threaded runtime.
    pub async fn start(cp: ControlPlane) -> Result<Self> {
        let registry = Registry::start(cp.dir(), None)?;
        let moto = Moto::start(Some(cp.dir()))?;
        let authority = IdentityAuthority::generate(&cp.dir().join("pki"), "regional-identity")?;
        let sessions = RealSessionNodes::new(&moto.endpoint(), authority).await?;
        let spec = NodeSpec { name: "hangar-system-0".into(), ..Default::default() };
        let node = tokio::task::block_in_place(|| RealNode::start(&cp, &registry, &spec))?;
        let installed =
            tokio::task::block_in_place(|| release::install(&cp, &registry, &node, &moto.endpoint(), Some(&sessions)))
                .inspect_err(|_| eprintln!("hangar's Pods:\n{}", node.container_logs("hangar-", 20)))?;
        Ok(Self { sessions, node, installed, moto, registry, cp })
    }

    /// One step of EC2 → nodes: each running instance has its node, a
    /// stopped one none.
    pub async fn follow(&mut self) -> Result<()> {
        self.sessions.follow(&self.cp, &self.registry).await
    }

    /// Pushes `image` to the loopback registry; its reference by digest.
    pub fn push(&self, image: &crate::registry::Image) -> String {
        tokio::task::block_in_place(|| self.registry.push(image))
    }
}

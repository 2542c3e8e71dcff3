//! Session instances: find by tag, launch (with capacity fallback), stop,
//! start, terminate.

use aws_sdk_ec2::primitives::DateTime;
use aws_sdk_ec2::types::{
    Filter, HttpTokensState, IamInstanceProfileSpecification, Instance, InstanceMetadataOptionsRequest,
    InstanceStateName, InstanceType, Placement, ResourceType, ShutdownBehavior,
};
use base64::Engine;

use super::tags::{self, SessionTags};
use super::{CallKind, Ec2, Ec2Error, Ec2ErrorKind};

pub use hangar_core::session::instance::InstanceState;

fn state_from_sdk(s: Option<&InstanceStateName>) -> InstanceState {
    match s {
        Some(InstanceStateName::Running) => InstanceState::Running,
        Some(InstanceStateName::Stopping) => InstanceState::Stopping,
        Some(InstanceStateName::Stopped) => InstanceState::Stopped,
        Some(InstanceStateName::ShuttingDown) => InstanceState::ShuttingDown,
        Some(InstanceStateName::Terminated) => InstanceState::Terminated,
        _ => InstanceState::Pending,
    }
}

/// What the operator knows of one instance.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceView {
    pub id: String,
    pub state: InstanceState,
    pub instance_type: String,
    pub zone: String,
    pub session_id: Option<String>,
    pub namespace: Option<String>,
    pub sandbox: Option<String>,
    pub launched_at: Option<i64>,
}

impl InstanceView {
    pub(crate) fn from_sdk(i: &Instance) -> Option<Self> {
        Some(Self {
            id: i.instance_id()?.to_owned(),
            state: state_from_sdk(i.state().and_then(|s| s.name())),
            instance_type: i.instance_type().map(|t| t.as_str().to_owned()).unwrap_or_default(),
            zone: i.placement().and_then(|p| p.availability_zone()).unwrap_or_default().to_owned(),
            session_id: tags::tag(i.tags(), tags::SESSION_ID).map(str::to_owned),
            namespace: tags::tag(i.tags(), tags::NAMESPACE).map(str::to_owned),
            sandbox: tags::tag(i.tags(), tags::SANDBOX).map(str::to_owned),
            launched_at: i.launch_time().map(DateTime::secs),
        })
    }
}

/// Everything a launch needs besides the operator's settings.
pub struct LaunchRequest<'a> {
    pub tags: SessionTags<'a>,
    pub attempt: i64,
    pub instance_types: Vec<String>,
    /// User data for a given (instance type, zone): the node labels differ.
    pub user_data: &'a (dyn Fn(&str, &str) -> String + Sync),
}

impl Ec2 {
    /// Instances tagged with this session that are not terminated.
    pub async fn find_session_instances(&self, session_id: &str) -> Result<Vec<InstanceView>, Ec2Error> {
        let out = self
            .call("DescribeInstances", CallKind::DescribeInstances, || {
                self.client
                    .describe_instances()
                    .filters(Filter::builder().name(format!("tag:{}", tags::SESSION_ID)).values(session_id).build())
                    .filters(
                        Filter::builder()
                            .name(format!("tag:{}", tags::CLUSTER))
                            .values(&self.settings.cluster_name)
                            .build(),
                    )
                    .send()
            })
            .await?;
        Ok(out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter_map(InstanceView::from_sdk)
            .filter(|i| !i.state.is_gone())
            .collect())
    }

    /// One instance as EC2 shows it now, for the workspace key hand-over:
    /// its state, session tag, owner and the start of its current boot.
    /// `None` when EC2 does not know it (a filter, so an unknown id is an
    /// empty answer, not an error).
    pub async fn describe_for_identity(
        &self,
        instance_id: &str,
    ) -> Result<Option<hangar_core::workspace_key::InstanceNow>, Ec2Error> {
        let out = self
            .call("DescribeInstances", CallKind::DescribeInstances, || {
                self.client
                    .describe_instances()
                    .filters(Filter::builder().name("instance-id").values(instance_id).build())
                    .send()
            })
            .await?;
        Ok(out.reservations().iter().find_map(|r| {
            let i = r.instances().iter().find(|i| i.instance_id() == Some(instance_id))?;
            Some(hangar_core::workspace_key::InstanceNow {
                running: i.state().and_then(|s| s.name()) == Some(&InstanceStateName::Running),
                session_id: tags::tag(i.tags(), tags::SESSION_ID).map(str::to_owned),
                owner_account: r.owner_id().map(str::to_owned),
                launch_time: i.launch_time().map(DateTime::secs),
            })
        }))
    }

    /// Every instance of this cluster (one paginated call), for the watcher
    /// and the orphan sweep.
    pub async fn describe_cluster_instances(&self) -> Result<Vec<InstanceView>, Ec2Error> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .call("DescribeInstances", CallKind::DescribeInstances, || {
                    self.client
                        .describe_instances()
                        .filters(
                            Filter::builder()
                                .name(format!("tag:{}", tags::CLUSTER))
                                .values(&self.settings.cluster_name)
                                .build(),
                        )
                        .set_next_token(token.clone())
                        .send()
                })
                .await?;
            all.extend(out.reservations().iter().flat_map(|r| r.instances()).filter_map(InstanceView::from_sdk));
            match out.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                _ => return Ok(all),
            }
        }
    }

    /// A new instance for the session. The caller has already looked for
    /// one by tag (the instance watcher's view, described by tag at start-up
    /// and kept current); capacity errors move on to the next instance type,
    /// then the next zone; configuration errors stop at once.
    pub async fn launch(&self, req: &LaunchRequest<'_>) -> Result<InstanceView, Ec2Error> {
        let placements = self.settings.placements.clone();
        let mut last: Option<Ec2Error> = None;
        let mut index = 0;
        for (zone, subnet) in &placements {
            for instance_type in &req.instance_types {
                index += 1;
                match self.run_instance(req, instance_type, zone, subnet.as_deref(), index).await {
                    Ok(view) => return Ok(view),
                    Err(e) if e.is(Ec2ErrorKind::InsufficientCapacity) => {
                        tracing::warn!(%instance_type, %zone, error = %e, "no capacity; trying the next type or zone");
                        last = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            Ec2Error::classify(
                "RunInstances",
                Some("InsufficientInstanceCapacity"),
                Some("no instance type or zone configured"),
            )
        }))
    }

    async fn run_instance(
        &self,
        req: &LaunchRequest<'_>,
        instance_type: &str,
        zone: &str,
        subnet: Option<&str>,
        index: usize,
    ) -> Result<InstanceView, Ec2Error> {
        let user_data = base64::engine::general_purpose::STANDARD.encode((req.user_data)(instance_type, zone));
        // Same session, attempt and choice → same token: a retried call after
        // a lost response cannot launch twice on real EC2. (moto ignores it,
        // which is why launch() looks by tag first.)
        let client_token = format!("{}-{}-{}", req.tags.session_id, req.attempt, index);
        let out = self
            .call("RunInstances", CallKind::Mutating, || {
                self.client
                    .run_instances()
                    .image_id(&self.settings.ami_id)
                    .instance_type(InstanceType::from(instance_type))
                    .min_count(1)
                    .max_count(1)
                    .client_token(&client_token)
                    .placement(Placement::builder().availability_zone(zone).build())
                    .set_subnet_id(subnet.map(str::to_owned))
                    .set_security_group_ids(
                        (!self.settings.security_groups.is_empty()).then(|| self.settings.security_groups.clone()),
                    )
                    .user_data(&user_data)
                    .set_iam_instance_profile(self.settings.instance_profile.as_deref().map(|p| {
                        let b = IamInstanceProfileSpecification::builder();
                        if p.starts_with("arn:") { b.arn(p) } else { b.name(p) }.build()
                    }))
                    .instance_initiated_shutdown_behavior(ShutdownBehavior::Stop)
                    // IMDSv2 only, one hop: a process on the node reaches
                    // the instance's metadata, a Pod (one hop further) does
                    // not, so no sandbox reaches the instance credentials.
                    .metadata_options(
                        InstanceMetadataOptionsRequest::builder()
                            .http_tokens(HttpTokensState::Required)
                            .http_put_response_hop_limit(1)
                            .build(),
                    )
                    .tag_specifications(req.tags.spec(ResourceType::Instance, &[]))
                    .send()
            })
            .await?;
        let view = out.instances().first().and_then(InstanceView::from_sdk).ok_or_else(|| {
            Ec2Error::classify("RunInstances", Some("EmptyResponse"), Some("no instance in the response"))
        })?;
        tracing::info!(instance = %view.id, %instance_type, %zone, "RunInstances");
        Ok(view)
    }

    /// The state each call reports the instance is now in (e.g. `stopping`),
    /// so the cache does not claim the old state until the next describe.
    /// A normal stop (never `Force`: the OS shuts down cleanly).
    pub async fn stop(&self, instance_id: &str) -> Result<InstanceState, Ec2Error> {
        let out = self
            .call("StopInstances", CallKind::Mutating, || {
                self.client.stop_instances().instance_ids(instance_id).force(false).send()
            })
            .await?;
        Ok(changed_state(out.stopping_instances(), InstanceState::Stopping))
    }

    pub async fn start(&self, instance_id: &str) -> Result<InstanceState, Ec2Error> {
        let out = self
            .call("StartInstances", CallKind::Mutating, || {
                self.client.start_instances().instance_ids(instance_id).send()
            })
            .await?;
        Ok(changed_state(out.starting_instances(), InstanceState::Pending))
    }

    /// Terminating a terminated or unknown instance is success: it is gone.
    pub async fn terminate(&self, instance_id: &str) -> Result<InstanceState, Ec2Error> {
        match self
            .call("TerminateInstances", CallKind::Mutating, || {
                self.client.terminate_instances().instance_ids(instance_id).send()
            })
            .await
        {
            Err(e) if e.is(Ec2ErrorKind::NotFound) => Ok(InstanceState::Terminated),
            Err(e) => Err(e),
            Ok(out) => Ok(changed_state(out.terminating_instances(), InstanceState::ShuttingDown)),
        }
    }
}

fn changed_state(changes: &[aws_sdk_ec2::types::InstanceStateChange], default: InstanceState) -> InstanceState {
    changes.first().and_then(|c| c.current_state()).map(|s| state_from_sdk(s.name())).unwrap_or(default)
}

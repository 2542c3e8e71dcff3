//! The session's workspace volume: its own EBS volume, encrypted, found by
//! tag before it is created.

use aws_sdk_ec2::types::{Filter, ResourceType, Volume, VolumeState, VolumeType};

use super::tags::{self, SessionTags};
use super::{CallKind, Ec2, Ec2Error, Ec2ErrorKind};

pub const WORKSPACE: &str = "workspace";
pub const DEVICE: &str = "/dev/sdf";

#[derive(Clone, Debug, PartialEq)]
pub struct VolumeView {
    pub id: String,
    pub zone: String,
    pub available: bool,
    pub attached_to: Option<String>,
    pub session_id: Option<String>,
}

impl VolumeView {
    fn from_sdk(v: &Volume) -> Option<Self> {
        Some(Self {
            id: v.volume_id()?.to_owned(),
            zone: v.availability_zone().unwrap_or_default().to_owned(),
            available: v.state() == Some(&VolumeState::Available),
            attached_to: v
                .attachments()
                .iter()
                .find(|a| a.state().map(|s| s.as_str() != "detached").unwrap_or(true))
                .and_then(|a| a.instance_id())
                .map(str::to_owned),
            session_id: tags::tag(v.tags(), tags::SESSION_ID).map(str::to_owned),
        })
    }
}

impl Ec2 {
    async fn describe_volumes(&self, filters: Vec<Filter>) -> Result<Vec<VolumeView>, Ec2Error> {
        let out = self
            .call("DescribeVolumes", CallKind::DescribeOther, || {
                self.client.describe_volumes().set_filters(Some(filters.clone())).send()
            })
            .await?;
        Ok(out
            .volumes()
            .iter()
            .filter(|v| !matches!(v.state(), Some(VolumeState::Deleted) | Some(VolumeState::Deleting)))
            .filter_map(VolumeView::from_sdk)
            .collect())
    }

    pub async fn find_workspace_volume(&self, session_id: &str) -> Result<Option<VolumeView>, Ec2Error> {
        Ok(self
            .describe_volumes(vec![
                Filter::builder().name(format!("tag:{}", tags::SESSION_ID)).values(session_id).build(),
                Filter::builder().name(format!("tag:{}", tags::ROLE)).values(WORKSPACE).build(),
            ])
            .await?
            .into_iter()
            .next())
    }

    pub async fn describe_cluster_volumes(&self) -> Result<Vec<VolumeView>, Ec2Error> {
        self.describe_volumes(vec![
            Filter::builder().name(format!("tag:{}", tags::CLUSTER)).values(&self.settings.cluster_name).build(),
            Filter::builder().name(format!("tag:{}", tags::ROLE)).values(WORKSPACE).build(),
        ])
        .await
    }

    /// Creates the workspace volume (encrypted, in the instance's zone).
    /// Only after `find_workspace_volume` found none by tag in the same
    /// pass: that find is what keeps a retried pass from making a second.
    pub async fn create_workspace_volume(&self, tags: &SessionTags<'_>, zone: &str) -> Result<VolumeView, Ec2Error> {
        let out = self
            .call("CreateVolume", CallKind::Mutating, || {
                self.client
                    .create_volume()
                    .availability_zone(zone)
                    .size(self.settings.volume_gib)
                    .volume_type(VolumeType::Gp3)
                    .encrypted(true)
                    .tag_specifications(tags.spec(ResourceType::Volume, &[(tags::ROLE, WORKSPACE)]))
                    .send()
            })
            .await?;
        let id = out.volume_id().unwrap_or_default().to_owned();
        tracing::info!(volume = %id, %zone, "CreateVolume");
        Ok(VolumeView {
            id,
            zone: zone.to_owned(),
            available: true,
            attached_to: None,
            session_id: Some(tags.session_id.to_owned()),
        })
    }

    pub async fn attach(&self, volume_id: &str, instance_id: &str) -> Result<(), Ec2Error> {
        self.call("AttachVolume", CallKind::Mutating, || {
            self.client.attach_volume().volume_id(volume_id).instance_id(instance_id).device(DEVICE).send()
        })
        .await
        .map(|_| ())
    }

    pub async fn detach(&self, volume_id: &str) -> Result<(), Ec2Error> {
        match self
            .call("DetachVolume", CallKind::Mutating, || {
                self.client.detach_volume().volume_id(volume_id).force(true).send()
            })
            .await
        {
            Err(e) if e.is(Ec2ErrorKind::NotFound) || e.is(Ec2ErrorKind::IncorrectState) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Deleting a deleted volume is success.
    pub async fn delete_volume(&self, volume_id: &str) -> Result<(), Ec2Error> {
        match self
            .call("DeleteVolume", CallKind::Mutating, || self.client.delete_volume().volume_id(volume_id).send())
            .await
        {
            Err(e) if e.is(Ec2ErrorKind::NotFound) => Ok(()),
            other => other.map(|_| ()),
        }
    }
}

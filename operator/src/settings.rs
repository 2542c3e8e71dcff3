//! Operator configuration: flags, each with an environment variable, as the
//! Helm chart passes them.

use std::time::Duration;

use clap::Parser;
use hangar_crds::Size;

#[derive(Parser, Debug, Clone)]
#[command(name = "hangar-operator", version, about = "Runs hangar sandbox sessions on dedicated arm64 EC2 nodes")]
pub struct Settings {
    /// Name of the cluster the instances join (EC2 tags, user data).
    #[arg(long, env = "HANGAR_CLUSTER_NAME", default_value = "hangar-local")]
    pub cluster_name: String,
    /// The cluster's API endpoint, written into the instances' user data.
    #[arg(long, env = "HANGAR_CLUSTER_ENDPOINT", default_value = "https://127.0.0.1:6443")]
    pub cluster_endpoint: String,
    /// The cluster's CA bundle (base64 PEM), written into the user data.
    #[arg(long, env = "HANGAR_CLUSTER_CA", default_value = "")]
    pub cluster_ca: String,
    /// Service CIDR of the cluster, for nodeadm.
    #[arg(long, env = "HANGAR_CLUSTER_CIDR", default_value = "10.96.0.0/16")]
    pub cluster_cidr: String,
    #[arg(long, env = "AWS_REGION", default_value = "ap-southeast-2")]
    pub aws_region: String,
    /// EC2 endpoint override (moto in local runs).
    #[arg(long, env = "HANGAR_EC2_ENDPOINT")]
    pub ec2_endpoint: Option<String>,
    /// arm64 AL2023 AMI the sessions boot.
    #[arg(long, env = "HANGAR_AMI_ID", default_value = "ami-0a1b2c3d4e5f60718")]
    pub ami_id: String,
    /// Subnet per zone, `zone=subnet-id`, repeatable; tried in order.
    #[arg(long = "subnet", env = "HANGAR_SUBNETS", value_delimiter = ',', value_parser = parse_pair)]
    pub subnets: Vec<(String, String)>,
    #[arg(long = "security-group", env = "HANGAR_SECURITY_GROUPS", value_delimiter = ',')]
    pub security_groups: Vec<String>,
    /// The instance profile (name or ARN) session instances run with: the
    /// node role they join the cluster as (docs/install-eks.md). Passing it
    /// needs `iam:PassRole` on that role only.
    #[arg(long, env = "HANGAR_INSTANCE_PROFILE")]
    pub instance_profile: Option<String>,
    /// Instance types of a size, `size=type1/type2`, repeatable; tried in order.
    #[arg(long = "instance-types", env = "HANGAR_INSTANCE_TYPES", value_delimiter = ',', value_parser = parse_pair)]
    pub instance_types: Vec<(String, String)>,
    /// Workspace volume size in GiB.
    #[arg(long, env = "HANGAR_VOLUME_GIB", default_value_t = 20)]
    pub volume_gib: i32,
    /// Namespace of the operator's own Leases (leader election, heartbeats).
    #[arg(long, env = "POD_NAMESPACE", default_value = "hangar-system")]
    pub system_namespace: String,
    /// The ClusterRole the workers' per-node accounts are bound to in their
    /// session's namespace (the chart's `<release>-session-worker`).
    #[arg(long, env = "HANGAR_SESSION_WORKER_ROLE", default_value = "hangar-session-worker")]
    pub session_worker_role: String,
    /// Serve only these namespaces (comma-separated); empty: all.
    #[arg(long, env = "HANGAR_WATCH_NAMESPACES", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    #[arg(long, env = "HANGAR_LEADER_ELECT", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    #[arg(long, default_value = "hangar-system")]
    pub leader_election_namespace: String,
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// The leader renews this long after its last renewal at the latest
    /// (it renews `lease - renew-deadline` seconds before the Lease expires).
    #[arg(long, default_value_t = 10)]
    pub renew_deadline_seconds: u64,
    /// Identity in leader election.
    #[arg(long, env = "POD_NAME", default_value = "hangar-operator")]
    pub pod_name: String,
    /// Seconds to wait for the worker's workspace-closed report before
    /// stopping the instance anyway.
    #[arg(long, env = "HANGAR_PAUSE_GRACE_SECONDS", default_value_t = 90)]
    pub pause_grace_seconds: u64,
    /// A heartbeat older than this does not count as the worker reporting.
    #[arg(long, env = "HANGAR_HEARTBEAT_STALE_SECONDS", default_value_t = 30)]
    pub heartbeat_stale_seconds: u64,
    /// How often one DescribeInstances call refreshes every session's instance.
    #[arg(long, env = "HANGAR_DESCRIBE_INTERVAL_MS", default_value_t = 2000)]
    pub describe_interval_ms: u64,
    /// How often tagged instances and volumes without a session are removed.
    #[arg(long, env = "HANGAR_ORPHAN_SWEEP_SECONDS", default_value_t = 300)]
    pub orphan_sweep_seconds: u64,
    /// File holding the organisation key (32 bytes, base64) that seals
    /// session keys. Unset: a key is generated and kept in a Secret.
    #[arg(long, env = "HANGAR_ORG_KEY_FILE")]
    pub org_key_file: Option<std::path::PathBuf>,
    /// Address of the health server (/healthz, /readyz; plain HTTP).
    #[arg(long, env = "HANGAR_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: String,
    #[command(flatten)]
    pub metrics: hangar_runtime::admin::MetricsArgs,
    /// Serve `/debug/samples` (raw latency samples keyed by session, for the
    /// benchmark). Off by default: it names every tenant's sessions.
    #[arg(long, env = "HANGAR_DEBUG_SAMPLES", default_value_t = false, action = clap::ArgAction::Set)]
    pub debug_samples: bool,
    /// The output store (`s3://bucket` or a local directory, as the
    /// gateway's): the operator keeps the signed session certificates there.
    #[arg(long, env = "HANGAR_OUTPUT_STORE", default_value = "/var/lib/hangar/output")]
    pub output_store: String,
    #[arg(long, env = "HANGAR_OUTPUT_S3_REGION", default_value = "us-east-1")]
    pub output_s3_region: String,
    /// Overrides the S3 endpoint (a local S3 in tests).
    #[arg(long, env = "HANGAR_OUTPUT_S3_ENDPOINT")]
    pub output_s3_endpoint: Option<String>,
    /// Secret (in the operator's namespace) with the session certificate
    /// signing key: `key-id`, `signing-key` (base64 Ed25519 PKCS#8),
    /// `public-key`. Made with a new key when absent; replace it to rotate.
    #[arg(long, env = "HANGAR_CERTIFICATE_SIGNING_SECRET", default_value = "hangar-certificate-signing")]
    pub certificate_signing_secret: String,
    /// Length of one retention "day" in seconds (86400). Tests scale the
    /// retention clock down with it.
    #[arg(long, env = "HANGAR_RETENTION_DAY_SECONDS", default_value_t = 86400)]
    pub retention_day_seconds: u64,
    /// How long one second of the idle clock lasts, in milliseconds (1000;
    /// tests scale `idleTimeoutSeconds` and the 30 s attach window down).
    #[arg(long, env = "HANGAR_IDLE_SECOND_MILLIS", default_value_t = 1000)]
    pub idle_second_millis: u64,
    /// How long one second of `stopAfterSeconds` lasts, in milliseconds
    /// (1000; tests scale the hard stop down). Compute is metered in real
    /// seconds either way.
    #[arg(long, env = "HANGAR_STOP_AFTER_SECOND_MILLIS", default_value_t = 1000)]
    pub stop_after_second_millis: u64,
    /// Billing: one vCPU for one hour of metered compute, in thousandths
    /// of a cent (6000: 6 cents).
    #[arg(long, env = "HANGAR_PRICE_VCPU_HOUR_MILLICENTS", default_value_t = 6_000)]
    pub price_vcpu_hour_millicents: i64,
    /// Billing: one GiB of a paused session's volume for one started hour,
    /// in thousandths of a cent.
    #[arg(long, env = "HANGAR_PRICE_STORAGE_GIB_HOUR_MILLICENTS", default_value_t = 14)]
    pub price_storage_gib_hour_millicents: i64,
    /// Billing: charged once, when a session's instance first runs (A$5.00).
    #[arg(long, env = "HANGAR_MINIMUM_CHARGE_CENTS", default_value_t = 500)]
    pub minimum_charge_cents: i64,
    /// Billing: metered compute the minimum covers (the free hour).
    #[arg(long, env = "HANGAR_FREE_COMPUTE_SECONDS", default_value_t = 3_600)]
    pub free_compute_seconds: i64,
    /// Billing: the length of an hour in seconds (3600; tests scale the
    /// storage hours and rates down with it).
    #[arg(long, env = "HANGAR_BILLING_HOUR_SECONDS", default_value_t = 3_600)]
    pub billing_hour_seconds: i64,
    /// The longest a session stays paused before it ends (7 days).
    #[arg(long, env = "HANGAR_MAX_PAUSE_SECONDS", default_value_t = 7 * 86_400)]
    pub max_pause_seconds: u64,
    /// A worker silent this long while its instance runs is lost: the
    /// session is interrupted and its instance stopped and started again.
    #[arg(long, env = "HANGAR_WORKER_LOST_SECONDS", default_value_t = 60)]
    pub worker_lost_seconds: u64,
    /// How long an interrupted session waits to run again before it ends
    /// `outcome_unknown` (30 min).
    #[arg(long, env = "HANGAR_RECOVERY_WINDOW_SECONDS", default_value_t = 1800)]
    pub recovery_window_seconds: u64,
    /// How often StartInstances is asked again for an interrupted session
    /// while EC2 has no capacity.
    #[arg(long, env = "HANGAR_RECOVERY_RETRY_SECONDS", default_value_t = 30)]
    pub recovery_retry_seconds: u64,
    /// SQS queue that EventBridge feeds with EC2 spot interruption warnings
    /// and instance state-change notifications. Unset: EC2 state comes from
    /// the batched DescribeInstances alone.
    #[arg(long, env = "HANGAR_INTERRUPTION_QUEUE_URL")]
    pub interruption_queue_url: Option<String>,
    /// SQS endpoint override (moto in local runs).
    #[arg(long, env = "HANGAR_SQS_ENDPOINT")]
    pub sqs_endpoint: Option<String>,
    /// Where to reach a registry host, `host=url`, repeatable (like
    /// containerd's mirrors): images keep their names, the preflight reads
    /// them from `url`. `http://` only for a loopback registry.
    /// hangar's supervisor image (by digest). When set, each agent Pod gets
    /// an init container from it that puts the supervisor into a volume the
    /// agent container runs it from, so a tenant's image needs nothing of
    /// hangar's; unset, the image must carry it at `/hangar/supervisor`.
    #[arg(long, env = "HANGAR_SUPERVISOR_IMAGE")]
    pub supervisor_image: Option<String>,
    /// The directory on session nodes that holds hangar's node-local paths
    /// (`/var/lib/hangar/workspace`, `/var/run/hangar` under it): the
    /// agent Pod's host paths, the same the worker DaemonSet mounts.
    #[arg(long, env = "HANGAR_NODE_ROOT", default_value = "/")]
    pub node_root: String,
    #[arg(long = "registry-endpoint", env = "HANGAR_REGISTRY_ENDPOINTS", value_delimiter = ',', value_parser = parse_pair)]
    pub registry_endpoints: Vec<(String, String)>,
    /// A `kubernetes.io/dockerconfigjson` Secret in the operator's namespace
    /// with credentials for the registries the preflight reads; read at
    /// each check, so a rotated Secret is used at once.
    #[arg(long, env = "HANGAR_REGISTRY_CREDENTIALS_SECRET")]
    pub registry_credentials_secret: Option<String>,
    /// An image preflight that cannot reach its registry for this long
    /// fails the session (`preflight_registry_unreachable`).
    #[arg(long, env = "HANGAR_PREFLIGHT_TIMEOUT_SECONDS", default_value_t = 600)]
    pub preflight_timeout_seconds: u64,
    /// Public keys trusted to sign template releases, `name=<base64
    /// Ed25519 public key>`, repeatable (`hangar-template keygen` makes a
    /// pair).
    #[arg(long = "template-key", env = "HANGAR_TEMPLATE_KEYS", value_delimiter = ',', value_parser = parse_pair)]
    pub template_keys: Vec<(String, String)>,
    /// Who may ask the leader for command admission decisions and announce
    /// ends (the node service's `/v1/admission/...` routes): the admission
    /// webhook's username(s), e.g.
    /// `system:serviceaccount:hangar-system:hangar-webhook`.
    #[arg(long = "admission-caller", env = "HANGAR_ADMISSION_CALLERS", value_delimiter = ',')]
    pub admission_callers: Vec<String>,
    /// Where the node service listens (TLS): the workers of the session
    /// nodes ask it for their session's key and commands, the admission
    /// webhook for command admission decisions. Unset: no service, and
    /// workers and the webhook wait for one.
    #[arg(long, env = "HANGAR_WORKSPACE_KEY_LISTEN")]
    pub workspace_key_listen: Option<String>,
    /// The key service's serving certificate and key (PEM files).
    #[arg(long, env = "HANGAR_WORKSPACE_KEY_TLS_CERT")]
    pub workspace_key_tls_cert: Option<std::path::PathBuf>,
    #[arg(long, env = "HANGAR_WORKSPACE_KEY_TLS_KEY")]
    pub workspace_key_tls_key: Option<std::path::PathBuf>,
    /// The region's AWS certificate for instance identity documents (the
    /// `rsa2048` one, PEM file): the only key a worker's document is
    /// checked against.
    #[arg(long, env = "HANGAR_INSTANCE_IDENTITY_CERTIFICATE")]
    pub instance_identity_certificate: Option<std::path::PathBuf>,
    #[arg(long)]
    pub print_settings: bool,
}

fn parse_pair(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

impl Settings {
    /// Instance types for a size, in fallback order. Defaults are Graviton.
    pub fn instance_types_for(&self, size: Size) -> Vec<String> {
        let key = size_name(size);
        let configured: Vec<String> = self
            .instance_types
            .iter()
            .filter(|(s, _)| s == key)
            .flat_map(|(_, v)| v.split('/').map(str::to_owned))
            .collect();
        if !configured.is_empty() {
            return configured;
        }
        match size {
            Size::Tiny => vec!["t4g.small".into()],
            Size::Small => vec!["m7g.large".into(), "m6g.large".into()],
            Size::Medium => vec!["m7g.xlarge".into(), "m6g.xlarge".into()],
            Size::Large => vec!["m7g.2xlarge".into(), "m6g.2xlarge".into()],
        }
    }

    /// (zone, subnet) pairs in fallback order; without configuration, the
    /// region's `a` zone and the default subnet.
    pub fn placements(&self) -> Vec<(String, Option<String>)> {
        if self.subnets.is_empty() {
            return vec![(format!("{}a", self.aws_region), None)];
        }
        self.subnets.iter().map(|(z, s)| (z.clone(), Some(s.clone()))).collect()
    }

    /// The billing record's prices (`docs/billing.md`).
    pub fn prices(&self) -> hangar_core::billing::Prices {
        hangar_core::billing::Prices {
            vcpu_hour_millicents: self.price_vcpu_hour_millicents,
            storage_gib_hour_millicents: self.price_storage_gib_hour_millicents,
            minimum_charge_cents: self.minimum_charge_cents,
            free_seconds: self.free_compute_seconds,
            hour_seconds: self.billing_hour_seconds.max(1),
        }
    }

    /// One second of `stopAfterSeconds`.
    pub fn stop_after_second(&self) -> Duration {
        Duration::from_millis(self.stop_after_second_millis.max(1))
    }

    /// One second of the idle clock.
    pub fn idle_second(&self) -> Duration {
        Duration::from_millis(self.idle_second_millis.max(1))
    }

    pub fn pause_grace(&self) -> Duration {
        Duration::from_secs(self.pause_grace_seconds)
    }

    pub fn describe_interval(&self) -> Duration {
        Duration::from_millis(self.describe_interval_ms)
    }
}

pub fn size_name(size: Size) -> &'static str {
    match size {
        Size::Tiny => "tiny",
        Size::Small => "small",
        Size::Medium => "medium",
        Size::Large => "large",
    }
}

/// vCPUs and memory of the Graviton types hangar uses (for node labels and
/// `status.memoryGiB`). Unknown types report nothing rather than a guess.
pub fn shape_of(instance_type: &str) -> Option<(u32, u32)> {
    let size = instance_type.split('.').nth(1)?;
    let family = instance_type.split('.').next()?;
    let (cpu, mem_per_cpu) = match size {
        "medium" => (1, 4),
        "large" => (2, 4),
        "xlarge" => (4, 4),
        "2xlarge" => (8, 4),
        "4xlarge" => (16, 4),
        "small" if family.starts_with('t') => (2, 1),
        _ => return None,
    };
    let mem_per_cpu = if family.starts_with('c') {
        mem_per_cpu / 2
    } else if family.starts_with('r') {
        mem_per_cpu * 2
    } else {
        mem_per_cpu
    };
    Some((cpu, cpu * mem_per_cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_types_fall_back_to_graviton_defaults() {
        let s = Settings::parse_from(["op", "--instance-types", "small=c7g.large/c6g.large"]);
        assert_eq!(s.instance_types_for(Size::Small), ["c7g.large", "c6g.large"]);
        assert_eq!(s.instance_types_for(Size::Tiny), ["t4g.small"]);
        assert_eq!(shape_of("m7g.large"), Some((2, 8)));
        assert_eq!(shape_of("c7g.xlarge"), Some((4, 8)));
        assert_eq!(shape_of("t4g.small"), Some((2, 2)));
    }
}

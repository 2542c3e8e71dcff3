//! A fast EC2 endpoint for the scale benchmark: the part of the EC2 Query
//! API hangar calls (instances and workspace volumes), held in memory.
//! moto answers a cluster-wide DescribeInstances in time that grows with
//! every instance it holds; at 5,000 sessions that, not hangar, would be
//! measured. The same protocol as EC2 (a form-encoded POST, an XML answer
//! whose root names the action), so the operator runs against it
//! unchanged.
//!
//! Instances move through EC2's states: `pending` → `running`, `stopping`
//! → `stopped`, `shutting-down` → `terminated`, each after `transition`.
//! `RunInstances` is idempotent on its client token, as EC2's is. Every
//! state an instance reaches is sent to the `changes` receiver (the light
//! nodes start and stop from it).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

const XMLNS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";
const OWNER: &str = "123456789012";

/// The phase machine's instance states (EC2's), with EC2's name and code.
pub use hangar_core::session::instance::InstanceState;

trait OnTheWire {
    fn name(self) -> &'static str;
    fn code(self) -> u16;
    /// Where a state in transition ends.
    fn settled(self) -> Self;
}

impl OnTheWire for InstanceState {
    fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::ShuttingDown => "shutting-down",
            Self::Terminated => "terminated",
        }
    }

    fn code(self) -> u16 {
        match self {
            Self::Pending => 0,
            Self::Running => 16,
            Self::ShuttingDown => 32,
            Self::Terminated => 48,
            Self::Stopping => 64,
            Self::Stopped => 80,
        }
    }

    fn settled(self) -> Self {
        match self {
            Self::Pending => Self::Running,
            Self::Stopping => Self::Stopped,
            Self::ShuttingDown => Self::Terminated,
            s => s,
        }
    }
}

/// An instance reached a state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub instance_id: String,
    pub zone: String,
    pub tags: BTreeMap<String, String>,
    pub state: InstanceState,
}

struct Instance {
    id: String,
    instance_type: String,
    zone: String,
    tags: BTreeMap<String, String>,
    state: InstanceState,
    since: Instant,
    launch_time: String,
}

struct Volume {
    id: String,
    zone: String,
    size: String,
    tags: BTreeMap<String, String>,
    attached_to: Option<String>,
}

struct Ec2State {
    transition: Duration,
    instances: BTreeMap<String, Instance>,
    by_token: HashMap<String, String>,
    volumes: BTreeMap<String, Volume>,
    next_id: u64,
    calls: BTreeMap<String, u64>,
    changes: mpsc::UnboundedSender<Change>,
}

/// The error EC2 answers with: its code and a message.
struct Ec2Error(&'static str, String);

type Params = HashMap<String, String>;

impl Ec2State {
    fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:017x}", self.next_id)
    }

    /// Moves `id` on if its transition is over; sends the state it reached.
    fn settle_one(&mut self, id: &str, now: Instant) {
        let Some(i) = self.instances.get_mut(id) else { return };
        if i.state.settled() != i.state && now.duration_since(i.since) >= self.transition {
            i.state = i.state.settled();
            i.since = now;
            let _ = self.changes.send(change(i));
        }
    }

    fn settle_all(&mut self, now: Instant) {
        let moving: Vec<String> =
            self.instances.values().filter(|i| i.state.settled() != i.state).map(|i| i.id.clone()).collect();
        for id in moving {
            self.settle_one(&id, now);
        }
    }

    fn set_state(&mut self, id: &str, state: InstanceState) {
        if let Some(i) = self.instances.get_mut(id) {
            i.state = state;
            i.since = Instant::now();
            let _ = self.changes.send(change(i));
        }
    }

    fn handle(&mut self, p: &Params) -> Result<String, Ec2Error> {
        let action = p.get("Action").cloned().unwrap_or_default();
        *self.calls.entry(action.clone()).or_default() += 1;
        self.settle_all(Instant::now());
        let body = match action.as_str() {
            "RunInstances" => self.run_instances(p)?,
            "DescribeInstances" => self.describe_instances(p),
            "StopInstances" => self.change_instances(p, Op::Stop)?,
            "StartInstances" => self.change_instances(p, Op::Start)?,
            "TerminateInstances" => self.change_instances(p, Op::Terminate)?,
            "CreateVolume" => self.create_volume(p),
            "DescribeVolumes" => self.describe_volumes(p),
            "AttachVolume" => self.attach_volume(p)?,
            "DetachVolume" => self.detach_volume(p)?,
            "DeleteVolume" => self.delete_volume(p)?,
            other => return Err(Ec2Error("InvalidAction", format!("the stub does not serve {other:?}"))),
        };
        Ok(format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?><{action}Response xmlns=\"{XMLNS}\"><requestId>{}</requestId>{body}</{action}Response>",
            self.next_id
        ))
    }

    fn run_instances(&mut self, p: &Params) -> Result<String, Ec2Error> {
        let token = p.get("ClientToken").cloned();
        if let Some(id) = token.as_ref().and_then(|t| self.by_token.get(t)).cloned() {
            let i = &self.instances[&id];
            return Ok(reservation(i));
        }
        let instance_type = p.get("InstanceType").cloned().unwrap_or_else(|| "m7g.large".into());
        let zone = p.get("Placement.AvailabilityZone").cloned().unwrap_or_else(|| "ap-southeast-2a".into());
        let id = self.new_id("i");
        let i = Instance {
            id: id.clone(),
            instance_type,
            zone,
            tags: tags_for(p, "instance"),
            state: InstanceState::Pending,
            since: Instant::now(),
            launch_time: now_iso(),
        };
        let _ = self.changes.send(change(&i));
        let out = reservation(&i);
        self.instances.insert(id.clone(), i);
        if let Some(t) = token {
            self.by_token.insert(t, id);
        }
        Ok(out)
    }

    fn describe_instances(&self, p: &Params) -> String {
        let filters = filters(p);
        let ids = numbered(p, "InstanceId");
        let mut out = String::from("<reservationSet>");
        for i in self.instances.values() {
            if !ids.is_empty() && !ids.contains(&i.id) {
                continue;
            }
            let fields = |name: &str| -> Option<String> {
                match name {
                    "instance-id" => Some(i.id.clone()),
                    "instance-state-name" => Some(i.state.name().to_owned()),
                    "availability-zone" => Some(i.zone.clone()),
                    n => n.strip_prefix("tag:").and_then(|k| i.tags.get(k).cloned()),
                }
            };
            if filters.iter().all(|(name, values)| fields(name).is_some_and(|v| values.contains(&v))) {
                out.push_str(&reservation_item(i));
            }
        }
        out.push_str("</reservationSet>");
        out
    }

    fn change_instances(&mut self, p: &Params, op: Op) -> Result<String, Ec2Error> {
        let ids = numbered(p, "InstanceId");
        let mut out = String::from("<instancesSet>");
        for id in &ids {
            let Some(i) = self.instances.get(id) else {
                return Err(Ec2Error("InvalidInstanceID.NotFound", format!("The instance ID '{id}' does not exist")));
            };
            let before = i.state;
            use InstanceState::*;
            let after = match (op, before) {
                (Op::Stop, Running | Pending) => Stopping,
                (Op::Stop, Stopping | Stopped) => before,
                (Op::Start, Stopped) => Pending,
                (Op::Start, Pending | Running) => before,
                (Op::Terminate, ShuttingDown | Terminated) => before,
                (Op::Terminate, _) => ShuttingDown,
                _ => {
                    return Err(Ec2Error(
                        "IncorrectInstanceState",
                        format!("The instance '{id}' is not in a state from which it can be {op:?}ed"),
                    ));
                }
            };
            if after != before {
                self.set_state(id, after);
                if op == Op::Start
                    && let Some(i) = self.instances.get_mut(id)
                {
                    i.launch_time = now_iso();
                }
            }
            if op == Op::Terminate {
                // A data volume attached after launch outlives its instance.
                for v in self.volumes.values_mut().filter(|v| v.attached_to.as_deref() == Some(id)) {
                    v.attached_to = None;
                }
            }
            out.push_str(&format!(
                "<item><instanceId>{id}</instanceId><currentState><code>{}</code><name>{}</name></currentState>\
                 <previousState><code>{}</code><name>{}</name></previousState></item>",
                after.code(),
                after.name(),
                before.code(),
                before.name()
            ));
        }
        out.push_str("</instancesSet>");
        Ok(out)
    }

    fn create_volume(&mut self, p: &Params) -> String {
        let id = self.new_id("vol");
        let v = Volume {
            id: id.clone(),
            zone: p.get("AvailabilityZone").cloned().unwrap_or_default(),
            size: p.get("Size").cloned().unwrap_or_else(|| "20".into()),
            tags: tags_for(p, "volume"),
            attached_to: None,
        };
        let out = format!(
            "<volumeId>{id}</volumeId><size>{}</size><availabilityZone>{}</availabilityZone><status>available</status>\
             <createTime>{}</createTime><volumeType>gp3</volumeType><encrypted>true</encrypted>{}",
            xml(&v.size),
            xml(&v.zone),
            now_iso(),
            tag_set(&v.tags)
        );
        self.volumes.insert(id, v);
        out
    }

    fn describe_volumes(&self, p: &Params) -> String {
        let filters = filters(p);
        let ids = numbered(p, "VolumeId");
        let mut out = String::from("<volumeSet>");
        for v in self.volumes.values() {
            if !ids.is_empty() && !ids.contains(&v.id) {
                continue;
            }
            let fields = |name: &str| -> Option<String> {
                match name {
                    "volume-id" => Some(v.id.clone()),
                    "attachment.instance-id" => v.attached_to.clone(),
                    "availability-zone" => Some(v.zone.clone()),
                    n => n.strip_prefix("tag:").and_then(|k| v.tags.get(k).cloned()),
                }
            };
            if !filters.iter().all(|(name, values)| fields(name).is_some_and(|x| values.contains(&x))) {
                continue;
            }
            let (status, attachments) = match &v.attached_to {
                Some(i) => (
                    "in-use",
                    format!(
                        "<item><volumeId>{}</volumeId><instanceId>{i}</instanceId><device>/dev/sdf</device>\
                         <status>attached</status><deleteOnTermination>false</deleteOnTermination></item>",
                        v.id
                    ),
                ),
                None => ("available", String::new()),
            };
            out.push_str(&format!(
                "<item><volumeId>{}</volumeId><size>{}</size><availabilityZone>{}</availabilityZone>\
                 <status>{status}</status><attachmentSet>{attachments}</attachmentSet><volumeType>gp3</volumeType>\
                 <encrypted>true</encrypted>{}</item>",
                v.id,
                xml(&v.size),
                xml(&v.zone),
                tag_set(&v.tags)
            ));
        }
        out.push_str("</volumeSet>");
        out
    }

    fn volume(&mut self, p: &Params) -> Result<&mut Volume, Ec2Error> {
        let id = p.get("VolumeId").cloned().unwrap_or_default();
        self.volumes
            .get_mut(&id)
            .ok_or_else(|| Ec2Error("InvalidVolume.NotFound", format!("The volume '{id}' does not exist.")))
    }

    fn attach_volume(&mut self, p: &Params) -> Result<String, Ec2Error> {
        let instance = p.get("InstanceId").cloned().unwrap_or_default();
        let device = p.get("Device").cloned().unwrap_or_else(|| "/dev/sdf".into());
        if !self.instances.contains_key(&instance) {
            return Err(Ec2Error("InvalidInstanceID.NotFound", format!("The instance ID '{instance}' does not exist")));
        }
        let v = self.volume(p)?;
        if v.attached_to.is_some() {
            return Err(Ec2Error("VolumeInUse", format!("{} is already attached to an instance", v.id)));
        }
        v.attached_to = Some(instance.clone());
        Ok(format!(
            "<volumeId>{}</volumeId><instanceId>{instance}</instanceId><device>{}</device><status>attaching</status>",
            v.id,
            xml(&device)
        ))
    }

    fn detach_volume(&mut self, p: &Params) -> Result<String, Ec2Error> {
        let v = self.volume(p)?;
        let Some(instance) = v.attached_to.take() else {
            return Err(Ec2Error("IncorrectState", format!("Volume '{}' is in the 'available' state.", v.id)));
        };
        Ok(format!(
            "<volumeId>{}</volumeId><instanceId>{instance}</instanceId><device>/dev/sdf</device><status>detaching</status>",
            v.id
        ))
    }

    fn delete_volume(&mut self, p: &Params) -> Result<String, Ec2Error> {
        let v = self.volume(p)?;
        if v.attached_to.is_some() {
            return Err(Ec2Error("VolumeInUse", format!("Volume {} is currently attached", v.id)));
        }
        let id = v.id.clone();
        self.volumes.remove(&id);
        Ok("<return>true</return>".into())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Stop,
    Start,
    Terminate,
}

fn change(i: &Instance) -> Change {
    Change { instance_id: i.id.clone(), zone: i.zone.clone(), tags: i.tags.clone(), state: i.state }
}

fn reservation(i: &Instance) -> String {
    format!(
        "<reservationId>r-{}</reservationId><ownerId>{OWNER}</ownerId><groupSet/><instancesSet>{}</instancesSet>",
        &i.id[2..],
        instance_item(i)
    )
}

fn reservation_item(i: &Instance) -> String {
    format!("<item>{}</item>", reservation(i))
}

fn instance_item(i: &Instance) -> String {
    format!(
        "<item><instanceId>{}</instanceId><imageId>ami-0a1b2c3d4e5f60718</imageId><instanceState><code>{}</code>\
         <name>{}</name></instanceState><instanceType>{}</instanceType><launchTime>{}</launchTime>\
         <placement><availabilityZone>{}</availabilityZone></placement><architecture>arm64</architecture>{}</item>",
        i.id,
        i.state.code(),
        i.state.name(),
        xml(&i.instance_type),
        i.launch_time,
        xml(&i.zone),
        tag_set(&i.tags)
    )
}

fn tag_set(tags: &BTreeMap<String, String>) -> String {
    let mut out = String::from("<tagSet>");
    for (k, v) in tags {
        out.push_str(&format!("<item><key>{}</key><value>{}</value></item>", xml(k), xml(v)));
    }
    out.push_str("</tagSet>");
    out
}

/// `Name.1`, `Name.2`, … in order.
fn numbered(p: &Params, name: &str) -> Vec<String> {
    (1..).map_while(|n| p.get(&format!("{name}.{n}")).cloned()).collect()
}

/// `Filter.N.Name` with its `Filter.N.Value.M`.
fn filters(p: &Params) -> Vec<(String, Vec<String>)> {
    (1..)
        .map_while(|n| {
            let name = p.get(&format!("Filter.{n}.Name"))?.clone();
            Some((name, numbered(p, &format!("Filter.{n}.Value"))))
        })
        .collect()
}

/// The tags of the `TagSpecification` for `resource`.
fn tags_for(p: &Params, resource: &str) -> BTreeMap<String, String> {
    let mut tags = BTreeMap::new();
    for n in 1.. {
        let Some(kind) = p.get(&format!("TagSpecification.{n}.ResourceType")) else { break };
        if kind != resource {
            continue;
        }
        for m in 1.. {
            let Some(key) = p.get(&format!("TagSpecification.{n}.Tag.{m}.Key")) else { break };
            let value = p.get(&format!("TagSpecification.{n}.Tag.{m}.Value")).cloned().unwrap_or_default();
            tags.insert(key.clone(), value);
        }
    }
    tags
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn now_iso() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("{}", now.strftime("%Y-%m-%dT%H:%M:%S.000Z"))
}

fn error_response(e: Ec2Error) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error>\
         </Errors><RequestID>stub</RequestID></Response>",
        e.0,
        xml(&e.1)
    );
    (StatusCode::BAD_REQUEST, [("content-type", "text/xml")], body).into_response()
}

async fn serve_action(AxumState(state): AxumState<Arc<Mutex<Ec2State>>>, body: Bytes) -> Response {
    let params: Params = form_urlencoded::parse(&body).into_owned().collect();
    let result = state.lock().unwrap_or_else(|p| p.into_inner()).handle(&params);
    match result {
        Ok(xml) => ([("content-type", "text/xml")], xml).into_response(),
        Err(e) => error_response(e),
    }
}

/// The running stub: its endpoint, the changes it makes, its call counts.
pub struct Ec2Stub {
    endpoint: String,
    state: Arc<Mutex<Ec2State>>,
    server: tokio::task::JoinHandle<()>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Ec2Stub {
    /// Serves on a free loopback port; each transition takes `transition`.
    pub async fn start(transition: Duration) -> std::io::Result<(Self, mpsc::UnboundedReceiver<Change>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(Mutex::new(Ec2State {
            transition,
            instances: BTreeMap::new(),
            by_token: HashMap::new(),
            volumes: BTreeMap::new(),
            next_id: 0,
            calls: BTreeMap::new(),
            changes: tx,
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let app = axum::Router::new().route("/", axum::routing::post(serve_action)).with_state(state.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        // Transitions end on time whether or not anyone describes.
        let ticking = state.clone();
        let ticker = tokio::spawn(async move {
            let mut every =
                tokio::time::interval(Duration::from_millis(20).min(transition.max(Duration::from_millis(1))));
            loop {
                every.tick().await;
                ticking.lock().unwrap_or_else(|p| p.into_inner()).settle_all(Instant::now());
            }
        });
        Ok((Self { endpoint, state, server, ticker }, rx))
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Calls served so far, by action.
    pub fn calls(&self) -> BTreeMap<String, u64> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).calls.clone()
    }

    /// Instances by state name (for the benchmark's checks).
    pub fn instances_by_state(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for i in self.state.lock().unwrap_or_else(|p| p.into_inner()).instances.values() {
            *out.entry(i.state.name()).or_default() += 1;
        }
        out
    }
}

impl Drop for Ec2Stub {
    fn drop(&mut self) {
        self.server.abort();
        self.ticker.abort();
    }
}

//! Baselines measured in the same run as the figures they divide: an
//! apiserver PATCH round trip, an EC2 (moto) call, and the operator's own
//! kind of write (a server-side apply of a Sandbox-shaped status, and the
//! time until a watch shows it), sampled all through the benchmark by a
//! probe beside it (so they carry the same load); and a local disk write
//! and read of the same size as the output figure. A figure's ratio to its
//! baseline means the same on a faster or a busier machine; its absolute
//! time does not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::Filter;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// Round trips in microseconds.
#[derive(Default, Clone, Debug)]
pub struct RoundTrips {
    /// A merge PATCH of a ConfigMap, sent and answered.
    pub apiserver_patch_us: Vec<u64>,
    /// DescribeInstances filtered by a tag, as the operator asks (about
    /// once every `EC2_CALL_EVERY`).
    pub ec2_call_us: Vec<u64>,
    /// A server-side apply of a running session's status, over its
    /// resourceVersion, to a copy of the Sandbox CRD in a group no
    /// controller watches: the write that ends a pass, less its watchers.
    pub status_apply_us: Vec<u64>,
    /// From sending that apply to the probe's own watch showing it: what
    /// any write takes to reach a watcher (a worker's Lease reaching the
    /// operator).
    pub write_to_watch_us: Vec<u64>,
}

impl RoundTrips {
    /// The samples taken since `earlier` (an older copy of the same probe).
    pub fn since(&self, earlier: &RoundTrips) -> RoundTrips {
        fn after(now: &[u64], then: &[u64]) -> Vec<u64> {
            now[then.len().min(now.len())..].to_vec()
        }
        RoundTrips {
            apiserver_patch_us: after(&self.apiserver_patch_us, &earlier.apiserver_patch_us),
            ec2_call_us: after(&self.ec2_call_us, &earlier.ec2_call_us),
            status_apply_us: after(&self.status_apply_us, &earlier.status_apply_us),
            write_to_watch_us: after(&self.write_to_watch_us, &earlier.write_to_watch_us),
        }
    }

    /// One line naming every baseline with its p50 and p99 (ms).
    pub fn summary(&self) -> String {
        let q = |v: &[u64], p| crate::bench::table::quantile(&us_to_ms(v), p);
        let both = |what: &str, v: &[u64]| format!("{what} p50 {:.1} ms p99 {:.1} ms", q(v, 0.5), q(v, 0.99));
        [
            both("apiserver PATCH (ConfigMap, merge)", &self.apiserver_patch_us),
            both("EC2 call (moto DescribeInstances by tag)", &self.ec2_call_us),
            both("status apply (Sandbox-shaped CRD, SSA)", &self.status_apply_us),
            both("status apply → seen by a watch", &self.write_to_watch_us),
        ]
        .join("; ")
    }

    /// One PATCH and one status apply of the same probe tick: two
    /// apiserver writes, one after the other, at the same moment.
    pub fn patch_then_apply_us(&self) -> Vec<u64> {
        self.apiserver_patch_us.iter().zip(&self.status_apply_us).map(|(a, b)| a + b).collect()
    }

    /// One PATCH and one status apply until a watch shows it, of the same
    /// probe tick: two writes, the second reaching a watcher.
    pub fn patch_then_watched_us(&self) -> Vec<u64> {
        self.apiserver_patch_us.iter().zip(&self.write_to_watch_us).map(|(a, b)| a + b).collect()
    }

    /// These samples and `other`'s together (two windows of one run).
    pub fn and(mut self, other: &RoundTrips) -> RoundTrips {
        self.apiserver_patch_us.extend(&other.apiserver_patch_us);
        self.ec2_call_us.extend(&other.ec2_call_us);
        self.status_apply_us.extend(&other.status_apply_us);
        self.write_to_watch_us.extend(&other.write_to_watch_us);
        self
    }
}

/// Samples every round trip every `every` until `finish`.
pub struct Probe {
    stop: Arc<AtomicBool>,
    samples: Arc<std::sync::Mutex<RoundTrips>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The probe's period: ten round trips of each apiserver kind a second.
/// A step of 100 sessions (27 s) or of 240 paced commands (24 s) then
/// gives its p99 two to three hundred baseline samples a run, so a pooled
/// p99 does not rest on a few slow round trips.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);

const PROBE_OBJECT: &str = "hangar-bench-baseline";
/// A group no controller watches, for the copy of the Sandbox CRD.
const PROBE_GROUP: &str = "bench.hangar.dev";
/// How often a probe tick also times an EC2 call, whatever the tick.
const EC2_CALL_EVERY: Duration = Duration::from_secs(1);
/// How long the probe waits for its watch to show its write.
const WATCH_DEADLINE: Duration = Duration::from_secs(10);

impl Probe {
    /// Starts probing with objects in `namespace` (made here) and the EC2
    /// endpoint `ec2`.
    pub async fn start(client: kube::Client, ec2: aws_sdk_ec2::Client, namespace: &str, every: Duration) -> Probe {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), namespace);
        let cm = serde_json::from_value(json!({"metadata": {"name": PROBE_OBJECT}})).expect("configmap");
        if let Err(e) = cms.create(&PostParams::default(), &cm).await {
            assert!(matches!(&e, kube::Error::Api(a) if a.code == 409), "create the probe's ConfigMap: {e}");
        }
        let sandboxes: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &install_probe_crd(&client).await);
        let created = match sandboxes.get_opt(PROBE_OBJECT).await.expect("read the probe's Sandbox") {
            Some(s) => s,
            None => {
                let s: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": format!("{PROBE_GROUP}/v1alpha1"), "kind": "Sandbox",
                    "metadata": {"name": PROBE_OBJECT},
                    "spec": {"mode": "commands", "image": crate::sessions::TEST_IMAGE},
                }))
                .expect("probe sandbox");
                sandboxes.create(&PostParams::default(), &s).await.expect("create the probe's Sandbox")
            }
        };
        // The newest resourceVersion the probe's watch has shown.
        let (seen_tx, seen_rx) = tokio::sync::watch::channel(0u128);
        let watch = tokio::spawn({
            let sandboxes = sandboxes.clone();
            async move {
                let config = watcher::Config::default().fields(&format!("metadata.name={PROBE_OBJECT}"));
                let mut events = std::pin::pin!(watcher(sandboxes, config).touched_objects());
                while let Some(event) = events.next().await {
                    if let Some(rv) = event.ok().and_then(|o| o.metadata.resource_version?.parse::<u128>().ok()) {
                        seen_tx.send_if_modified(|seen| {
                            let newer = rv > *seen;
                            *seen = (*seen).max(rv);
                            newer
                        });
                    }
                }
            }
        });
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(std::sync::Mutex::new(RoundTrips::default()));
        let task = tokio::spawn({
            let (stop, samples) = (stop.clone(), samples.clone());
            async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut version = created.metadata.resource_version;
                let ec2_every = (EC2_CALL_EVERY.as_millis() / every.as_millis().max(1)).max(1) as u64;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    i += 1;
                    let patch = json!({"data": {"tick": i.to_string()}});
                    let t = Instant::now();
                    let patched = cms.patch(PROBE_OBJECT, &PatchParams::default(), &Patch::Merge(&patch)).await;
                    let patch_us = t.elapsed().as_micros() as u64;
                    // The EC2 call once a second: moto answers it in Python
                    // over every instance it holds (60–80 ms of a core under
                    // the benchmark's load), and one per tick would be a
                    // load of the probe's own making.
                    let described = if (i - 1).is_multiple_of(ec2_every) {
                        let t = Instant::now();
                        let out = ec2
                            .describe_instances()
                            .filters(
                                Filter::builder().name("tag:hangar.dev/session-id").values("baseline-probe").build(),
                            )
                            .send()
                            .await;
                        out.map(|_| Some(t.elapsed().as_micros() as u64))
                    } else {
                        Ok(None)
                    };
                    let applied = apply_status(&sandboxes, version.as_deref(), i).await;
                    // Over the version it stored, or (after a failure) none.
                    version = applied.as_ref().ok().and_then(|(stored, ..)| stored.metadata.resource_version.clone());
                    if let Err(e) = &patched {
                        tracing::warn!(error = %e, "baseline probe: PATCH failed");
                    }
                    if let Err(e) = &described {
                        tracing::warn!(error = %e, "baseline probe: EC2 call failed");
                    }
                    // A failed call is not a round trip: skip the tick.
                    let (Ok(_), Ok(ec2_us), Ok((_, apply_us, sent))) = (patched, described, applied) else { continue };
                    let Some(rv) = version.as_deref().and_then(|v| v.parse::<u128>().ok()) else { continue };
                    let mut seen = seen_rx.clone();
                    if tokio::time::timeout(WATCH_DEADLINE, seen.wait_for(|s| *s >= rv)).await.is_err() {
                        tracing::warn!("baseline probe: the watch did not show the status apply");
                        continue;
                    }
                    let watched_us = sent.elapsed().as_micros() as u64;
                    let mut s = samples.lock().unwrap_or_else(|p| p.into_inner());
                    s.apiserver_patch_us.push(patch_us);
                    s.ec2_call_us.extend(ec2_us);
                    s.status_apply_us.push(apply_us);
                    s.write_to_watch_us.push(watched_us);
                }
            }
        });
        Probe { stop, samples, tasks: vec![task, watch] }
    }

    /// Everything sampled so far (the probe goes on).
    pub fn snapshot(&self) -> RoundTrips {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub async fn finish(mut self) -> RoundTrips {
        self.stop.store(true, Ordering::Relaxed);
        let watch = self.tasks.pop();
        for t in self.tasks {
            let _ = t.await;
        }
        if let Some(w) = watch {
            w.abort();
        }
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The Sandbox CRD, schema and all, under the probe's group, Established.
async fn install_probe_crd(client: &kube::Client) -> ApiResource {
    let mut crd = hangar_crds::manifests::all()
        .expect("the CRDs")
        .into_iter()
        .find(|m| m.crd.spec.names.kind == "Sandbox")
        .expect("the Sandbox CRD")
        .crd;
    crd.spec.group = PROBE_GROUP.into();
    // Not found by `kubectl get sbx` or a category beside the real ones.
    crd.spec.names.short_names = None;
    crd.spec.names.categories = None;
    let name = format!("{}.{PROBE_GROUP}", crd.spec.names.plural);
    crd.metadata.name = Some(name.clone());
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(&name, &PatchParams::apply("hangar-bench").force(), &Patch::Apply(&crd))
        .await
        .expect("install the probe's CRD");
    let established = await_condition(crds, &name, conditions::is_crd_established());
    tokio::time::timeout(Duration::from_secs(30), established)
        .await
        .expect("the probe's CRD Established in 30 s")
        .expect("watch the probe's CRD");
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(PROBE_GROUP, "v1alpha1", "Sandbox"),
        &crd.spec.names.plural,
    )
}

/// One status write as the operator makes it (server-side apply, forced,
/// over `version`) of a running session's status, `tick` changing its
/// billing and conditions so every write is stored. Returns the stored
/// object, the round trip (µs) and when the write was sent.
async fn apply_status(
    api: &Api<DynamicObject>,
    version: Option<&str>,
    tick: u64,
) -> Result<(DynamicObject, u64, Instant), kube::Error> {
    let at =
        serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()))
            .expect("a time");
    let status = json!({
        "sessionId": "00000000-0000-4000-8000-000000000000", "phase": "running", "attempt": 1,
        "attempts": [{"number": 1, "cause": "launch", "startedAt": at, "computeSeconds": tick}],
        "instanceId": "i-0123456789abcdef0", "volumeId": "vol-0123456789abcdef0",
        "nodeName": "ip-10-0-0-1.ap-southeast-2.compute.internal", "instanceType": "m7g.large",
        "zone": "ap-southeast-2a", "memoryGiB": 8, "volumeAttached": true, "computeSeconds": tick,
        "billing": {"minimumChargeCents": 1, "computeCents": tick, "storageCents": 0, "totalCents": tick + 1},
        "commands": {"total": tick % 100, "unfinished": 0, "running": 0},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": format!("tick {tick}"),
            "lastTransitionTime": at, "observedGeneration": 1}],
        "observedGeneration": 1,
    });
    // Every field is one the operator writes: it survives the round trip
    // through the operator's own type.
    let typed: hangar_crds::SandboxStatus = serde_json::from_value(status.clone()).expect("a Sandbox status");
    assert_eq!(serde_json::to_value(typed).expect("serialises"), status, "a Sandbox status as the operator writes it");
    let patch = json!({
        "apiVersion": format!("{PROBE_GROUP}/v1alpha1"), "kind": "Sandbox",
        "metadata": {"resourceVersion": version}, "status": status,
    });
    let sent = Instant::now();
    let stored = api
        .patch_status(PROBE_OBJECT, &PatchParams::apply("hangar-operator").force(), &Patch::Apply(&patch))
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "baseline probe: status apply failed"))?;
    Ok((stored, sent.elapsed().as_micros() as u64, sent))
}

/// Writes `bytes` to a file in the temporary directory (8 MiB at a time,
/// then fsync) and reads it back: (write, read) in MB/s. The floor for
/// storing and reading back output of that size on this machine's disk.
pub fn disk_write_read_mbps(bytes: u64) -> (f64, f64) {
    use std::io::{Read, Write};
    const BLOCK: usize = 8 << 20;
    let dir = crate::process::RunDir::new("hangar-bench-disk").expect("temporary directory");
    let path = dir.path.join("baseline");
    let block = vec![0u8; BLOCK];
    let started = Instant::now();
    let mut f = std::fs::File::create(&path).expect("create");
    let mut left = bytes;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        f.write_all(&block[..n]).expect("write");
        left -= n as u64;
    }
    f.sync_all().expect("fsync");
    drop(f);
    let write = bytes as f64 / 1e6 / started.elapsed().as_secs_f64();
    // Read from the disk, not from the page cache the write left (root
    // only; elsewhere the figure is the cache's, and says so).
    let dropped = std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok();
    if !dropped {
        eprintln!("bench: could not drop the page cache; the disk read baseline is the cache's");
    }
    let started = Instant::now();
    let mut f = std::fs::File::open(&path).expect("open");
    let mut buf = vec![0u8; BLOCK];
    let mut read = 0u64;
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        read += n as u64;
    }
    assert_eq!(read, bytes, "read back what was written");
    (write, bytes as f64 / 1e6 / started.elapsed().as_secs_f64())
}

/// Microseconds to (fractional) milliseconds.
pub fn us_to_ms(v: &[u64]) -> Vec<f64> {
    v.iter().map(|us| *us as f64 / 1000.0).collect()
}

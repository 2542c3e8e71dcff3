//! Baselines measured in the same run as the figures they divide: an
//! apiserver PATCH round trip and an EC2 (moto) call, sampled all through
//! the benchmark by a probe beside it (so they carry the same load), and a
//! local disk write and read of the same size as the output figure. A
//! figure's ratio to its baseline means the same on a faster or a busier
//! machine; its absolute time does not.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::Filter;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Round trips in microseconds.
#[derive(Default, Clone, Debug)]
pub struct RoundTrips {
    /// A merge PATCH of a ConfigMap, sent and answered.
    pub apiserver_patch_us: Vec<u64>,
    /// DescribeInstances filtered by a tag, as the operator asks.
    pub ec2_call_us: Vec<u64>,
}

impl RoundTrips {
    /// The samples taken since `earlier` (an older copy of the same probe).
    pub fn since(&self, earlier: &RoundTrips) -> RoundTrips {
        RoundTrips {
            apiserver_patch_us: self.apiserver_patch_us
                [earlier.apiserver_patch_us.len().min(self.apiserver_patch_us.len())..]
                .to_vec(),
            ec2_call_us: self.ec2_call_us[earlier.ec2_call_us.len().min(self.ec2_call_us.len())..].to_vec(),
        }
    }

    /// One PATCH followed by one EC2 call, per probe tick: the least a
    /// step that writes the apiserver and calls EC2 can take.
    pub fn patch_then_ec2_us(&self) -> Vec<u64> {
        self.apiserver_patch_us.iter().zip(&self.ec2_call_us).map(|(a, b)| a + b).collect()
    }
}

/// Samples both round trips every `every` until `finish`.
pub struct Probe {
    stop: Arc<AtomicBool>,
    samples: Arc<std::sync::Mutex<RoundTrips>>,
    task: tokio::task::JoinHandle<()>,
}

const PROBE_OBJECT: &str = "hangar-bench-baseline";

impl Probe {
    /// Starts probing with a ConfigMap in `namespace` (made here) and the
    /// EC2 endpoint `ec2`.
    pub async fn start(client: kube::Client, ec2: aws_sdk_ec2::Client, namespace: &str, every: Duration) -> Probe {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, namespace);
        let cm = serde_json::from_value(json!({"metadata": {"name": PROBE_OBJECT}})).expect("configmap");
        if let Err(e) = cms.create(&PostParams::default(), &cm).await {
            assert!(matches!(&e, kube::Error::Api(a) if a.code == 409), "create the probe's ConfigMap: {e}");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(std::sync::Mutex::new(RoundTrips::default()));
        let task = tokio::spawn({
            let (stop, samples) = (stop.clone(), samples.clone());
            async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    i += 1;
                    let patch = json!({"data": {"tick": i.to_string()}});
                    let t = Instant::now();
                    let patched = cms.patch(PROBE_OBJECT, &PatchParams::default(), &Patch::Merge(&patch)).await;
                    let patch_us = t.elapsed().as_micros() as u64;
                    let t = Instant::now();
                    let described = ec2
                        .describe_instances()
                        .filters(Filter::builder().name("tag:hangar.dev/session-id").values("baseline-probe").build())
                        .send()
                        .await;
                    let ec2_us = t.elapsed().as_micros() as u64;
                    // A failed call is not a round trip: skip the pair.
                    if patched.is_ok() && described.is_ok() {
                        let mut s = samples.lock().unwrap_or_else(|p| p.into_inner());
                        s.apiserver_patch_us.push(patch_us);
                        s.ec2_call_us.push(ec2_us);
                    }
                }
            }
        });
        Probe { stop, samples, task }
    }

    /// Everything sampled so far (the probe goes on).
    pub fn snapshot(&self) -> RoundTrips {
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub async fn finish(self) -> RoundTrips {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.samples.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
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

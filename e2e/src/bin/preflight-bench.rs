//! Image preflight benchmark (release build; `make bench`): the operator's
//! preflight against the loopback OCI registry, cold (the manifest, the
//! index's arm64 entry, the config and every layer's size read from the
//! registry) and cached (the result looked up by image), as a session's
//! reconcile asks for it.
//!
//! `preflight-bench [N] [LAYERS]`: N images (default 50), each an index of
//! linux/amd64 and linux/arm64 whose arm64 image has LAYERS layers
//! (default 8).

use std::time::{Duration, Instant};

use hangar_e2e::bench::{pct, report};
use hangar_e2e::process::RunDir;
use hangar_e2e::registry::{Blob, Image, Manifest, REGISTRY_HOST, Registry, config, sha256};
use hangar_operator::images::preflights::{Lookup, Preflights};
use hangar_operator::images::registry::Registries;
use kube::runtime::reflector::ObjectRef;
use oci_client::secrets::RegistryAuth;

fn image(i: usize, layers: usize) -> Image {
    let arm_layers: Vec<Blob> = (0..layers)
        .map(|l| {
            Blob::new(
                "application/vnd.oci.image.layer.v1.tar+gzip",
                format!("image {i} layer {l}").repeat(512).into_bytes(),
            )
        })
        .collect();
    let diff_ids: Vec<String> = arm_layers.iter().map(|b| sha256(&b.bytes)).collect();
    let arm = Manifest { config: config("linux", "arm64", &diff_ids), layers: arm_layers };
    let amd = Manifest::of("linux", "amd64", &[("etc/i", format!("{i}").as_bytes())]);
    Image::Index {
        repository: format!("bench/image-{i}"),
        entries: vec![("linux".into(), "amd64".into(), amd), ("linux".into(), "arm64".into(), arm)],
    }
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(50);
    let layers = args.get(1).copied().unwrap_or(8);
    let dir = RunDir::new("hangar-preflight-bench").expect("run dir");
    let registry = Registry::start(&dir.path, None).expect("registry");
    let images: Vec<String> = (0..n).map(|i| registry.push(&image(i, layers))).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async move {
        let endpoints = [(REGISTRY_HOST.to_owned(), registry.endpoint())];
        // Cold: each image read from the registry once.
        let registries = Registries::new(&endpoints).expect("registries");
        let mut cold = Vec::new();
        for image in &images {
            let t = Instant::now();
            let verdict = registries.check(image, &RegistryAuth::Anonymous).await.expect("reachable");
            cold.push(t.elapsed().as_micros() as u64);
            assert!(verdict.is_ok(), "{image}: {verdict:?}");
        }
        // Cached: the operator's cache, filled by its background checks.
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        let unused = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let cache = Preflights::new(Registries::new(&endpoints).unwrap(), unused, None, tx, Default::default());
        let who = ObjectRef::new("bench").within("bench");
        cache.start(&images, who.clone());
        for _ in 0..images.len() {
            tokio::time::timeout(Duration::from_secs(60), rx.recv()).await.expect("a check ended");
        }
        let mut cached = Vec::new();
        for _ in 0..20 {
            for image in &images {
                let t = Instant::now();
                let found = cache.lookup(image, &who);
                cached.push(t.elapsed().as_nanos() as u64);
                assert!(matches!(found, Lookup::Done(Ok(_))), "{image}: {found:?}");
            }
        }
        println!(
            "image preflight, {n} images (index of amd64 + arm64, {layers} layers), loopback registry, release build:"
        );
        let (c50, k50) = (pct(cold.clone(), 0.5) * 1000, pct(cached.clone(), 0.5).max(1));
        report("  cold (registry reads)", "µs", &cold);
        report("  cached (lookup by image)", "ns", &cached);
        println!("  ratio cold/cached at p50: {}", c50 / k50);
    });
    drop(dir);
}

//! The Helm chart rendered with no cluster: `helm lint` and `helm
//! template` as the chart tests and the image tests run them.

use std::process::{Command, Output};

use serde::Deserialize;

use crate::build::go_binary;
use crate::paths::repo_root;

/// The chart's directory.
pub fn chart() -> String {
    repo_root().join("charts/hangar").display().to_string()
}

/// What a command printed, stdout then stderr.
pub fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `helm <args>` with no cluster (lint, template), its homes in a
/// per-process temporary directory.
pub fn helm(args: &[&str]) -> Output {
    let dir = std::env::temp_dir().join(format!("hangar-helm-home-{}", std::process::id()));
    Command::new(go_binary("helm").expect("helm"))
        .args(args)
        .env("HELM_CACHE_HOME", dir.join("cache"))
        .env("HELM_CONFIG_HOME", dir.join("config"))
        .env("HELM_DATA_HOME", dir.join("data"))
        .output()
        .expect("run helm")
}

/// `helm template` of the chart into `hangar-system` with `extra` flags;
/// one YAML value per rendered object.
pub fn render(extra: &[&str]) -> Vec<serde_yaml::Value> {
    let chart = chart();
    let mut args = vec!["template", "hangar", chart.as_str(), "-n", "hangar-system"];
    args.extend_from_slice(extra);
    let out = helm(&args);
    assert!(out.status.success(), "helm template: {}", text(&out));
    serde_yaml::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The rendered object of `kind` named `name` (in namespace `ns`, if given).
pub fn find<'a>(
    docs: &'a [serde_yaml::Value],
    kind: &str,
    name: &str,
    ns: Option<&str>,
) -> Option<&'a serde_yaml::Value> {
    docs.iter().find(|d| {
        d["kind"].as_str() == Some(kind)
            && d["metadata"]["name"].as_str() == Some(name)
            && (ns.is_none() || d["metadata"]["namespace"].as_str() == ns)
    })
}

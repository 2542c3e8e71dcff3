//! The user data that joins a session's instance to the cluster: an AL2023
//! `nodeadm` NodeConfig in a MIME multipart document, with the session's
//! labels and taint registered by the kubelet itself (so nothing else can be
//! scheduled there in the window before the operator labels the node).

use std::collections::BTreeMap;

use crate::node::labels::SESSION_TAINT;

pub struct JoinConfig<'a> {
    pub cluster_name: &'a str,
    pub api_server_endpoint: &'a str,
    pub certificate_authority: &'a str,
    pub cidr: &'a str,
    pub session_id: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

const BOUNDARY: &str = "//hangar-nodeadm//";

/// The worker's spool on the node's own disk (the chart's
/// `HANGAR_SPOOL_DIR`): the worker writes there, in the file
/// `HARD_STOP_FILE_NAME`, when this attempt reaches `stopAfterSeconds`
/// (Unix seconds). A unit
/// from the user data powers the instance off then — a stop, by the
/// instance-initiated shutdown behaviour — so neither a lost operator nor a
/// lost worker can let a session overrun its limit. The unit clears it at
/// each boot: a resumed attempt gets its own deadline.
const NODE_SPOOL_DIR: &str = "/var/lib/hangar/spool";

pub fn render(c: &JoinConfig) -> String {
    let hard_stop_file = format!("{NODE_SPOOL_DIR}/{}", hangar_crds::sandbox::HARD_STOP_FILE_NAME);
    let labels = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    format!(
        "MIME-Version: 1.0\r
Content-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\r
\r
--{BOUNDARY}\r
Content-Type: application/node.eks.aws\r
\r
---
apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: {name}
    apiServerEndpoint: {endpoint}
    certificateAuthority: {ca}
    cidr: {cidr}
  kubelet:
    config:
      registerWithTaints:
      - key: {SESSION_TAINT}
        value: {session}
        effect: NoSchedule
    flags:
    - --node-labels={labels}
\r
--{BOUNDARY}\r
Content-Type: text/cloud-config; charset=\"us-ascii\"\r
\r
#cloud-config
write_files:
- path: /etc/systemd/system/hangar-hard-stop.service
  content: |
    [Unit]
    Description=hangar hard stop: power off when the session's compute limit comes
    [Service]
    ExecStartPre=/usr/bin/rm -f {hard_stop_file}
    ExecStart=/usr/bin/bash -c 'while sleep 1; do t=$(cat {hard_stop_file} 2>/dev/null) || continue; [ -n \"$t\" ] && [ \"$(date +%%s)\" -ge \"$t\" ] && exec systemctl poweroff; done'
    Restart=always
    [Install]
    WantedBy=multi-user.target
runcmd:
- [systemctl, enable, --now, hangar-hard-stop.service]
\r
--{BOUNDARY}--\r
",
        name = c.cluster_name,
        endpoint = c.api_server_endpoint,
        ca = c.certificate_authority,
        cidr = c.cidr,
        session = c.session_id,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::labels::{NodeFacts, labels};

    /// Golden file: set UPDATE_GOLDEN=1 to rewrite after a deliberate change.
    #[test]
    fn user_data_matches_the_golden_file() {
        let labels = labels(&NodeFacts {
            session_name: "dev-box",
            session_namespace: "team-a",
            session_id: "6d0f7a52-1111-4c1e-9a53-0c8f3b2a9e10",
            instance_type: "m7g.large",
            zone: "ap-southeast-2a",
            region: "ap-southeast-2",
        });
        let rendered = render(&JoinConfig {
            cluster_name: "prod-eks",
            api_server_endpoint: "https://ABCDEF.gr7.ap-southeast-2.eks.amazonaws.com",
            certificate_authority: "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t",
            cidr: "10.100.0.0/16",
            session_id: "6d0f7a52-1111-4c1e-9a53-0c8f3b2a9e10",
            labels: &labels,
        });
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/user-data.mime");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &rendered).unwrap();
        }
        let golden = std::fs::read_to_string(&path).expect("golden file (UPDATE_GOLDEN=1 writes it)");
        assert_eq!(rendered, golden);
        // The NodeConfig part is YAML that nodeadm can read.
        let part = rendered.split("\r\n\r\n").nth(2).unwrap().split("\r\n--").next().unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(part).unwrap();
        assert_eq!(doc["kind"].as_str(), Some("NodeConfig"));
        assert_eq!(doc["spec"]["kubelet"]["config"]["registerWithTaints"][0]["effect"].as_str(), Some("NoSchedule"));
    }
}

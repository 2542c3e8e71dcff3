//! The EC2 and S3 endpoint: `moto_server` from PyPI, on loopback.

use std::process::Command;
use std::time::Duration;

use crate::build::moto_server;
use crate::error::Result;
use crate::process::{ChildProcess, RunDir, free_port, http_get, http_request, wait_until};

pub struct Moto {
    process: ChildProcess,
    pub port: u16,
    _dir: Option<RunDir>,
}

impl Moto {
    /// Starts moto with its log in `log_dir` (a fresh temporary directory
    /// when `None`).
    pub fn start(log_dir: Option<&std::path::Path>) -> Result<Self> {
        let bin = moto_server()?;
        let (dir, log) = match log_dir {
            Some(d) => (None, d.join("moto.log")),
            None => {
                let d = RunDir::new("hangar-moto")?;
                let log = d.path.join("moto.log");
                (Some(d), log)
            }
        };
        let port = free_port();
        // The venv's python runs moto's server through our launcher, which
        // makes moto's tag lookup linear (see the script).
        let python = bin.with_file_name("python3");
        let mut cmd = Command::new(python);
        cmd.arg(crate::paths::repo_root().join("e2e/scripts/moto_server.py"));
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut process = ChildProcess::spawn("moto_server", cmd, &log)?;
        wait_until("moto_server", &mut process, Duration::from_secs(60), || {
            http_get(port, "/moto-api/").is_ok_and(|(s, _)| s == 200)
        })?;
        // moto loads each service's backend on its first call (EC2 took
        // 38 s on a cold machine): wait until EC2 and S3 really answer, so
        // nothing started after this meets a silent endpoint.
        for service in ["ec2", "s3"] {
            wait_until(&format!("moto_server {service}"), &mut process, Duration::from_secs(180), || {
                service_answers(port, service)
            })?;
        }
        Ok(Self { process, port, _dir: dir })
    }

    /// `Err` with its log tail when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.process.check_alive()
    }

    /// The endpoint override for aws-sdk clients.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// An `Authorization` header for a raw request to `service`: moto routes a
/// request by the service named in its credential scope and does not
/// check the signature.
pub fn auth_header(service: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=0"
    )
}

/// Creates S3 bucket `bucket` in the moto at `endpoint`
/// (`http://127.0.0.1:<port>`).
pub fn create_bucket(endpoint: &str, bucket: &str) -> Result<()> {
    let port = endpoint.rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok());
    let port = port.ok_or_else(|| crate::error::HarnessError::Command {
        command: format!("PUT /{bucket}"),
        stderr: format!("{endpoint} is not a loopback moto"),
    })?;
    let (status, body) = http_request(port, "PUT", &format!("/{bucket}"), &[("Authorization", &auth_header("s3"))])
        .map_err(crate::error::io("create a bucket"))?;
    if status != 200 {
        return Err(crate::error::HarnessError::Command { command: format!("PUT /{bucket}"), stderr: body });
    }
    Ok(())
}

/// One cheap read of `service` (EC2 DescribeRegions, S3 ListBuckets).
fn service_answers(port: u16, service: &str) -> bool {
    let auth = auth_header(service);
    let path = match service {
        "ec2" => "/?Action=DescribeRegions&Version=2016-11-15",
        _ => "/",
    };
    http_request(port, "GET", path, &[("Authorization", &auth)]).is_ok_and(|(status, _)| status == 200)
}

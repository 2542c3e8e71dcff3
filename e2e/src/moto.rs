//! The EC2 and S3 endpoint: `moto_server` from PyPI, on loopback.

use std::process::Command;
use std::time::Duration;

use crate::build::moto_server;
use crate::error::Result;
use crate::process::{ChildProcess, RunDir, free_port, http_get, wait_until};

pub struct Moto {
    // Held for its Drop, which stops moto.
    _process: ChildProcess,
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
        let mut cmd = Command::new(bin);
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        let mut process = ChildProcess::spawn("moto_server", cmd, &log)?;
        wait_until("moto_server", &mut process, Duration::from_secs(60), || {
            http_get(port, "/moto-api/").is_ok_and(|(s, _)| s == 200)
        })?;
        Ok(Self { _process: process, port, _dir: dir })
    }

    /// The endpoint override for aws-sdk clients.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

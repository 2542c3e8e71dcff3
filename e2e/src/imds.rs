//! The instance metadata service of a simulated node, as much of it as a
//! worker reads: IMDSv2 (a PUT for a session token, then GETs carrying it)
//! serving the instance identity document and its `rsa2048` signature.
//!
//! The signature is made by an [`IdentityAuthority`], a test stand-in for
//! the region's AWS certificate, with the `openssl cms` command: an
//! implementation of PKCS#7 signing independent of the verifier under
//! test (`hangar_keys::instance_identity`). Tests that act as an attacker
//! sign documents of their own with it, or with another authority.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::error::{HarnessError, Result, io};

/// A self-signed RSA-2048 certificate and its key, standing for AWS's
/// regional certificate.
#[derive(Clone, Debug)]
pub struct IdentityAuthority {
    pub cert: PathBuf,
    key: PathBuf,
}

fn openssl(what: &str, cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd.output().map_err(io(format!("openssl ({what})")))?;
    if !out.status.success() {
        return Err(HarnessError::NotReady {
            what: format!("openssl {what}"),
            seconds: 0,
            log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(out.stdout)
}

impl IdentityAuthority {
    /// Makes `<dir>/<name>.crt` and `<dir>/<name>.key`.
    pub fn generate(dir: &Path, name: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io("identity authority dir"))?;
        let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        openssl(
            "req -x509",
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj"])
                .arg(format!("/O=hangar tests/CN={name}"))
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        )?;
        Ok(Self { cert, key })
    }

    pub fn cert_pem(&self) -> String {
        std::fs::read_to_string(&self.cert).expect("the authority's certificate")
    }

    /// The `rsa2048` signature of `document`, as IMDS serves it (base64 of
    /// the DER SignedData, the document inside, SHA-256, signed
    /// attributes, no certificates).
    pub fn sign(&self, document: &str) -> Result<String> {
        use std::io::Write;
        use std::process::Stdio;
        let mut child = Command::new("openssl")
            .args(["cms", "-sign", "-binary", "-nodetach", "-md", "sha256", "-nocerts", "-outform", "DER"])
            .arg("-signer")
            .arg(&self.cert)
            .arg("-inkey")
            .arg(&self.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("openssl cms -sign"))?;
        child.stdin.take().expect("stdin").write_all(document.as_bytes()).map_err(io("openssl stdin"))?;
        let out = child.wait_with_output().map_err(io("openssl cms -sign"))?;
        if !out.status.success() {
            return Err(HarnessError::NotReady {
                what: "openssl cms -sign".into(),
                seconds: 0,
                log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let der = out.stdout;
        use base64::Engine;
        Ok(base64::engine::general_purpose::STANDARD.encode(der))
    }
}

/// The fields of an identity document, for one boot of one instance.
#[derive(Clone, Debug)]
pub struct InstanceIdentity {
    pub instance_id: String,
    pub region: String,
    pub account_id: String,
    pub availability_zone: String,
    pub instance_type: String,
    pub image_id: String,
    /// RFC 3339, seconds: when this boot entered `pending`.
    pub pending_time: String,
}

impl InstanceIdentity {
    /// This boot's identity of an instance as DescribeInstances shows it
    /// (`owner`: its reservation's owner).
    pub fn of(owner: Option<&str>, i: &aws_sdk_ec2::types::Instance) -> Self {
        let zone = i.placement().and_then(|p| p.availability_zone()).unwrap_or_default();
        Self {
            instance_id: i.instance_id().unwrap_or_default().to_owned(),
            region: zone[..zone.len().saturating_sub(1)].to_owned(),
            account_id: owner.unwrap_or_default().to_owned(),
            availability_zone: zone.to_owned(),
            instance_type: i.instance_type().map(|t| t.as_str().to_owned()).unwrap_or_default(),
            image_id: i.image_id().unwrap_or_default().to_owned(),
            pending_time: i
                .launch_time()
                .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t.secs()).ok())
                .map(|t| t.to_string())
                .unwrap_or_default(),
        }
    }

    /// The identity of `instance_id` now, from the EC2 endpoint at
    /// `endpoint` (the stack's, so the launch time is the latest start's).
    pub async fn describe(endpoint: &str, instance_id: &str) -> Self {
        let ec2 = crate::ec2::client(endpoint).await;
        let out = ec2.describe_instances().instance_ids(instance_id).send().await.expect("describe the instance");
        let r = out.reservations().first().expect("a reservation");
        Self::of(r.owner_id(), r.instances().first().expect("the instance"))
    }

    /// The document as IMDS prints it (keys sorted, `" : "`).
    pub fn document(&self) -> String {
        format!(
            "{{\n  \"accountId\" : \"{}\",\n  \"architecture\" : \"arm64\",\n  \"availabilityZone\" : \"{}\",\n  \"imageId\" : \"{}\",\n  \"instanceId\" : \"{}\",\n  \"instanceType\" : \"{}\",\n  \"pendingTime\" : \"{}\",\n  \"privateIp\" : \"10.0.0.10\",\n  \"region\" : \"{}\",\n  \"version\" : \"2017-09-30\"\n}}",
            self.account_id,
            self.availability_zone,
            self.image_id,
            self.instance_id,
            self.instance_type,
            self.pending_time,
            self.region
        )
    }
}

/// What the metadata service of one node serves now.
type Served = Arc<Mutex<Option<(String, String)>>>;

/// One node's metadata service on 127.0.0.1 (a task of the runtime it is
/// started on; it ends when dropped).
pub struct Imds {
    pub port: u16,
    served: Served,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Imds {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Imds {
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let served: Served = Arc::default();
        let tokens: Arc<Mutex<HashSet<String>>> = Arc::default();
        let s = served.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else { continue };
                let (served, tokens) = (s.clone(), tokens.clone());
                tokio::spawn(async move {
                    let Ok((head, _)) = crate::ec2_faults::read_request(&mut sock).await else { return };
                    let (status, body) = answer(&head, &served, &tokens);
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        Ok(Self { port, served, task })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What this boot's document and signature are.
    pub fn serve(&self, document: String, signature: String) {
        *self.served.lock().expect("imds") = Some((document, signature));
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
}

/// IMDSv2: a token for a PUT with a TTL header, 401 for a GET without a
/// token it issued.
fn answer(head: &str, served: &Served, tokens: &Mutex<HashSet<String>>) -> (&'static str, String) {
    let mut line = head.lines().next().unwrap_or_default().split(' ');
    let (method, path) = (line.next().unwrap_or_default(), line.next().unwrap_or_default());
    if method == "PUT" && path == "/latest/api/token" {
        if header(head, "X-aws-ec2-metadata-token-ttl-seconds").is_none() {
            return ("400 Bad Request", String::new());
        }
        use base64::Engine;
        let token =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(hangar_keys::random_bytes::<24>().expect("random"));
        tokens.lock().expect("tokens").insert(token.clone());
        return ("200 OK", token);
    }
    if method != "GET" {
        return ("405 Method Not Allowed", String::new());
    }
    if !header(head, "X-aws-ec2-metadata-token").is_some_and(|t| tokens.lock().expect("tokens").contains(t)) {
        return ("401 Unauthorized", String::new());
    }
    let served = served.lock().expect("imds").clone();
    match (path, served) {
        ("/latest/dynamic/instance-identity/document", Some((doc, _))) => ("200 OK", doc),
        ("/latest/dynamic/instance-identity/rsa2048", Some((_, sig))) => ("200 OK", sig),
        _ => ("404 Not Found", String::new()),
    }
}

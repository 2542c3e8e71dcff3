//! A loopback proxy in front of moto that injects EC2 API errors
//! (throttling, capacity, bad configuration) for the calls a test names,
//! and forwards everything else. It records every call it sees.
//!
//! It also plays EC2's in-between states, which moto skips (its stop,
//! start and terminate are instant): with a transition delay, an instance
//! reads `pending` after RunInstances or StartInstances, `stopping` after
//! StopInstances and `shutting-down` after TerminateInstances in every
//! DescribeInstances through the proxy, for that long.
//!
//! And it plays what EC2 does to `launchTime` at a start, which moto does
//! not: after a StartInstances, the instance's launch time is that start's
//! (the identity document's `pendingTime` of the new boot matches it).
//!
//! And EC2's idempotent RunInstances, which moto skips (it stores the
//! ClientToken and ignores it): a RunInstances with a token already
//! answered gets that first answer, the same instance, as on EC2. A
//! launch retried by an operator restarted while its first call was in
//! flight then finds its instance, as it would in AWS.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::process::free_port;

/// Answer the next `times` calls of `action` whose form body contains every
/// string of `body_contains` with EC2 error `code` and HTTP `status`.
#[derive(Clone, Debug)]
pub struct Fault {
    pub action: &'static str,
    pub body_contains: Vec<String>,
    pub code: &'static str,
    pub status: u16,
    pub times: usize,
}

/// One call the proxy saw: its action, the error injected (if any), the
/// request body and when it arrived.
#[derive(Clone, Debug)]
pub struct Seen {
    pub action: String,
    pub injected: Option<&'static str>,
    pub body: String,
    pub at: std::time::Instant,
}

/// Instance id → (state name, state code, until) while in transition.
type Transitions = Arc<Mutex<HashMap<String, (&'static str, u16, Instant)>>>;
/// Instance id → the launch time of its latest start (EC2's format).
type Boots = Arc<Mutex<HashMap<String, String>>>;
/// RunInstances ClientToken → its first successful answer. Held across a
/// launch, so a second call with the token waits for the first's answer.
type ClientTokens = Arc<tokio::sync::Mutex<HashMap<String, Vec<u8>>>>;
/// The instances a state-changing call named or made, not yet taken by
/// whoever watches EC2 through the proxy.
pub type TouchedInstances = Arc<Mutex<std::collections::BTreeSet<String>>>;

/// What every connection's handler shares.
#[derive(Clone)]
struct ProxyState {
    upstream: u16,
    faults: Arc<Mutex<Vec<Fault>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// How long instances spend in each in-between state (zero: none).
    delay: Duration,
    transitions: Transitions,
    boots: Boots,
    touched: TouchedInstances,
    client_tokens: ClientTokens,
}

pub struct FaultProxy {
    pub port: u16,
    faults: Arc<Mutex<Vec<Fault>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    touched: TouchedInstances,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl FaultProxy {
    pub fn start(upstream_port: u16) -> Self {
        Self::start_with_transitions(upstream_port, Duration::ZERO)
    }

    /// A proxy whose instances spend `delay` in each in-between state.
    pub fn start_with_transitions(upstream_port: u16, delay: Duration) -> Self {
        let port = free_port();
        let state = ProxyState {
            upstream: upstream_port,
            faults: Arc::default(),
            seen: Arc::default(),
            delay,
            transitions: Arc::default(),
            boots: Arc::default(),
            touched: Arc::default(),
            client_tokens: Arc::default(),
        };
        let (faults, seen, touched) = (state.faults.clone(), state.seen.clone(), state.touched.clone());
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("ec2-fault-proxy".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind fault proxy");
                    let _ = ready_tx.send(());
                    loop {
                        tokio::select! {
                            accepted = listener.accept() => {
                                let Ok((sock, _)) = accepted else { continue };
                                tokio::spawn(handle(sock, state.clone()));
                            }
                            _ = &mut stopped => return,
                        }
                    }
                });
            })
            .expect("proxy thread");
        let _ = ready_rx.recv();
        Self { port, faults, seen, touched, stop: Some(stop), thread: Some(thread) }
    }

    /// The instances each state-changing call named (or, for RunInstances,
    /// made), once its answer is back: a watcher that takes them
    /// before it describes describes just those again.
    pub fn touched_instances(&self) -> TouchedInstances {
        self.touched.clone()
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn inject(&self, fault: Fault) {
        self.faults.lock().expect("faults").push(fault);
    }

    /// How many calls of each action arrived since `since`.
    pub fn calls_since(&self, since: Instant) -> std::collections::BTreeMap<String, usize> {
        let mut by_action = std::collections::BTreeMap::new();
        for s in self.seen.lock().expect("seen").iter().filter(|s| s.at >= since) {
            *by_action.entry(s.action.clone()).or_insert(0) += 1;
        }
        by_action
    }

    /// Calls seen whose body contains `marker`.
    pub fn seen(&self, marker: &str) -> Vec<Seen> {
        self.seen.lock().expect("seen").iter().filter(|s| s.body.contains(marker)).cloned().collect()
    }
}

pub(crate) async fn read_request(sock: &mut TcpStream) -> std::io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok((head, body))
}

async fn handle(mut sock: TcpStream, state: ProxyState) {
    let ProxyState { upstream, faults, seen, delay, transitions, boots, touched, client_tokens } = state;
    let Ok((head, body)) = read_request(&mut sock).await else { return };
    let text = String::from_utf8_lossy(&body).into_owned();
    let action = text.split('&').find_map(|kv| kv.strip_prefix("Action=")).unwrap_or_default().to_owned();
    let injected = {
        let mut faults = faults.lock().expect("faults");
        faults
            .iter_mut()
            .find(|f| f.times > 0 && f.action == action && f.body_contains.iter().all(|m| text.contains(m.as_str())))
            .map(|f| {
                f.times -= 1;
                (f.code, f.status)
            })
    };
    seen.lock().expect("seen").push(Seen {
        action: action.clone(),
        injected: injected.map(|i| i.0),
        body: text.clone(),
        at: std::time::Instant::now(),
    });
    if let Some((code, status)) = injected {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>injected by the hangar test proxy</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
        );
        let resp = format!(
            "HTTP/1.1 {status} Injected\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
            xml.len()
        );
        let _ = sock.write_all(resp.as_bytes()).await;
        return;
    }
    let token = (action == "RunInstances")
        .then(|| text.split('&').find_map(|kv| kv.strip_prefix("ClientToken=")).map(str::to_owned))
        .flatten();
    let mut answered = match &token {
        Some(_) => Some(client_tokens.lock().await),
        None => None,
    };
    if let (Some(t), Some(answers)) = (&token, &answered)
        && let Some(first) = answers.get(t)
    {
        let _ = sock.write_all(first).await;
        return;
    }
    // Forward, one request per connection.
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
    let head: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .filter(|l| !l.is_empty())
        .map(|l| format!("{l}\r\n"))
        .collect();
    let _ = up.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes()).await;
    let _ = up.write_all(&body).await;
    let mut resp = Vec::new();
    let _ = up.read_to_end(&mut resp).await;
    if !action.starts_with("Describe") {
        touched.lock().expect("touched").extend(instances_named(&action, &text, &resp));
    }
    if let (Some(t), Some(answers)) = (token, answered.as_mut())
        && ok_response(&resp).is_some()
    {
        answers.insert(t, resp.clone());
    }
    drop(answered);
    resp = launch_times(&action, &text, resp, &boots);
    if !delay.is_zero() {
        resp = in_between_states(&action, &text, resp, delay, &transitions);
    }
    let _ = sock.write_all(&resp).await;
}

/// Records the launch time a successful StartInstances gives its
/// instances, and shows it in DescribeInstances answers.
fn launch_times(action: &str, request: &str, resp: Vec<u8>, boots: &Boots) -> Vec<u8> {
    let Some((head, body)) = ok_response(&resp) else { return resp };
    let mut b = boots.lock().expect("boots");
    if action == "StartInstances" {
        let now = k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.000Z").to_string();
        for id in instance_ids(request) {
            b.insert(id.to_owned(), now.clone());
        }
        return resp;
    }
    if action != "DescribeInstances" || b.is_empty() {
        return resp;
    }
    let mut body = body;
    for (id, at) in b.iter() {
        body = rewrite_item(&body, id, "launchTime", at);
    }
    with_body(&head, &body)
}

/// The instances a call names (`InstanceId`, `InstanceId.N`) and, for
/// RunInstances, those its answer made.
fn instances_named(action: &str, request: &str, resp: &[u8]) -> Vec<String> {
    let mut ids: Vec<String> = instance_ids(request).map(str::to_owned).collect();
    if action == "RunInstances" {
        ids.extend(instances_made(&String::from_utf8_lossy(resp)).map(str::to_owned));
    }
    ids
}

/// The instance ids of a RunInstances answer.
fn instances_made(body: &str) -> impl Iterator<Item = &str> {
    body.split("<instanceId>").skip(1).filter_map(|r| r.split_once("</instanceId>")).map(|r| r.0)
}

/// The instance ids a request's form body names: `InstanceId.N` (Stop,
/// Start, Terminate) or `InstanceId` (AttachVolume).
fn instance_ids(request: &str) -> impl Iterator<Item = &str> {
    request
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "InstanceId" || k.starts_with("InstanceId."))
        .map(|(_, v)| v)
}

/// The head and body of a 200 answer.
fn ok_response(resp: &[u8]) -> Option<(String, String)> {
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&resp[..split]).into_owned();
    head.starts_with("HTTP/1.1 200").then(|| (head, String::from_utf8_lossy(&resp[split + 4..]).into_owned()))
}

/// The answer with a new body (and its length).
fn with_body(head: &str, body: &str) -> Vec<u8> {
    let head: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("content-length:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// Records the transition a successful mutating call starts, and shows the
/// ones under way in a DescribeInstances answer.
fn in_between_states(
    action: &str,
    request: &str,
    resp: Vec<u8>,
    delay: Duration,
    transitions: &Transitions,
) -> Vec<u8> {
    let Some((head, body)) = ok_response(&resp) else { return resp };
    let until = Instant::now() + delay;
    let mut t = transitions.lock().expect("transitions");
    t.retain(|_, (_, _, u)| *u > Instant::now());
    let state = match action {
        "StopInstances" => Some(("stopping", 64)),
        "StartInstances" => Some(("pending", 0)),
        "TerminateInstances" => Some(("shutting-down", 32)),
        _ => None,
    };
    if let Some((name, code)) = state {
        for id in instance_ids(request) {
            t.insert(id.to_owned(), (name, code, until));
        }
        return resp;
    }
    if action == "RunInstances" {
        for id in instances_made(&body) {
            t.insert(id.to_owned(), ("pending", 0, until));
        }
        return resp;
    }
    if action != "DescribeInstances" || t.is_empty() {
        return resp;
    }
    let mut body = body;
    for (id, (name, code, _)) in t.iter() {
        body = rewrite_item(&body, id, "instanceState", &format!("<code>{code}</code><name>{name}</name>"));
    }
    with_body(&head, &body)
}

/// Replaces what `<tag>` holds in the named instance's item of a
/// DescribeInstances body (the first such element after its id).
fn rewrite_item(body: &str, id: &str, tag: &str, inner: &str) -> String {
    let mut out = body.to_owned();
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let Some(at) = out.find(&format!("<instanceId>{id}</instanceId>")) else { return out };
    let Some(start) = out[at..].find(&open).map(|i| at + i + open.len()) else { return out };
    let Some(end) = out[start..].find(&close).map(|i| start + i) else { return out };
    out.replace_range(start..end, inner);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_instance_shows_its_in_between_state() {
        let body = "<item><instanceId>i-1</instanceId><instanceState><code>80</code><name>stopped</name></instanceState></item>\
                    <item><instanceId>i-2</instanceId><instanceState><code>16</code><name>running</name></instanceState></item>";
        let out = rewrite_item(body, "i-1", "instanceState", "<code>64</code><name>stopping</name>");
        assert!(out.contains("<instanceId>i-1</instanceId><instanceState><code>64</code><name>stopping</name>"));
        assert!(out.contains("<instanceId>i-2</instanceId><instanceState><code>16</code><name>running</name>"));
    }

    #[test]
    fn a_state_changing_call_names_the_instances_it_touched() {
        let attach = "Action=AttachVolume&Device=%2Fdev%2Fsdf&InstanceId=i-1&VolumeId=vol-1";
        assert_eq!(instances_named("AttachVolume", attach, b""), ["i-1"]);
        let stop = "Action=StopInstances&InstanceId.1=i-2&InstanceId.2=i-3";
        assert_eq!(instances_named("StopInstances", stop, b""), ["i-2", "i-3"]);
        let made = b"<instancesSet><item><instanceId>i-4</instanceId></item><item><instanceId>i-5</instanceId></item>";
        assert_eq!(instances_named("RunInstances", "Action=RunInstances&MinCount=2", made), ["i-4", "i-5"]);
        assert!(instances_named("CreateVolume", "Action=CreateVolume&Size=1", b"").is_empty());
    }
}

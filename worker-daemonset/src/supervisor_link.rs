//! The worker's end of the supervisor socket: connects (and reconnects,
//! the supervisor starts with the agent container, maybe after the worker),
//! hands every line it reads to the command runner, and writes requests.
//! A request written while the link is down fails; the runner sends what
//! matters again when the next hello arrives.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{Mutex, mpsc};

use hangar_supervisor_protocol::{Hello, Sequenced, ToSupervisor};

#[derive(Debug)]
pub enum Incoming {
    /// A new connection: the supervisor's boot and the ids it knows.
    Hello(Hello),
    Message(Sequenced),
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("the supervisor is not connected")]
    NotConnected,
    #[error("supervisor socket: {0}")]
    Io(#[from] std::io::Error),
}

#[derive(Clone)]
pub struct SupervisorLink {
    write: Arc<Mutex<Option<OwnedWriteHalf>>>,
}

impl SupervisorLink {
    /// Starts the reader; what it reads arrives on the returned channel.
    pub fn start(socket: PathBuf) -> (Self, mpsc::Receiver<Incoming>) {
        let (tx, rx) = mpsc::channel(1024);
        let link = Self { write: Arc::default() };
        tokio::spawn(read_loop(socket, link.write.clone(), tx));
        (link, rx)
    }

    pub async fn send(&self, msg: &ToSupervisor) -> Result<(), LinkError> {
        let mut guard = self.write.lock().await;
        let w = guard.as_mut().ok_or(LinkError::NotConnected)?;
        let mut line = serde_json::to_vec(msg).expect("serialisable");
        line.push(b'\n');
        if let Err(e) = w.write_all(&line).await {
            *guard = None;
            return Err(e.into());
        }
        Ok(())
    }

    /// Drops the connection: the supervisor will deliver every message not
    /// acknowledged again on the next one (used when processing failed).
    pub async fn reset(&self) {
        if let Some(mut w) = self.write.lock().await.take() {
            let _ = w.shutdown().await;
        }
    }
}

async fn read_loop(socket: PathBuf, write: Arc<Mutex<Option<OwnedWriteHalf>>>, tx: mpsc::Sender<Incoming>) {
    let mut waited = false;
    loop {
        let stream = match UnixStream::connect(&socket).await {
            Ok(s) => s,
            Err(e) => {
                if !waited {
                    tracing::info!(socket = %socket.display(), error = %e, "waiting for the supervisor");
                    waited = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        waited = false;
        let (read, w) = stream.into_split();
        *write.lock().await = Some(w);
        let mut lines = BufReader::new(read).lines();
        let mut first = true;
        while let Ok(Some(line)) = lines.next_line().await {
            let incoming = if first {
                first = false;
                serde_json::from_str(&line).map(Incoming::Hello)
            } else {
                serde_json::from_str(&line).map(Incoming::Message)
            };
            match incoming {
                Ok(m) => {
                    if tx.send(m).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable supervisor message; reconnecting");
                    break;
                }
            }
        }
        write.lock().await.take();
        tracing::info!("supervisor connection closed; reconnecting");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

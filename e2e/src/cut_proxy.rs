//! A TCP forwarder on loopback whose open connections a test can cut at
//! once (a client that must survive a dropped connection: `hangar exec`).
//! TLS passes through untouched.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct CutProxy {
    pub port: u16,
    cut: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    cut_open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CutProxy {
    /// Forwards 127.0.0.1:<port> to 127.0.0.1:`target`.
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (cut, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let cut_open = Arc::new(AtomicUsize::new(0));
        let (tx, n, c) = (cut.clone(), accepted.clone(), cut_open.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                n.fetch_add(1, Ordering::SeqCst);
                let mut cuts = tx.subscribe();
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", target)).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = cuts.changed() => { c.fetch_add(1, Ordering::SeqCst); }
                    }
                    // Dropped here: both sockets close mid-stream.
                });
            }
        });
        Self { port, cut, accepted, cut_open, task }
    }

    /// Drops every connection open now.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections that were open when a cut came.
    pub fn cut_open(&self) -> usize {
        self.cut_open.load(Ordering::SeqCst)
    }
}

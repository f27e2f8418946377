//! A TCP proxy in front of the API server that can hold what its clients send: while held,
//! a request a process sends reaches the API server only when the proxy lets go, so a test
//! can keep that process's requests in flight for as long as it needs (the API server's
//! answers, and watch events, still flow back). The API server behind it is the real one,
//! and the bytes are the process's own TLS: the proxy reads nothing of them.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; it stops when dropped.
pub struct HeldProxy {
    addr: String,
    held: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
    kubeconfig: PathBuf,
    _dir: crate::Scratch,
}

impl HeldProxy {
    /// A proxy to the API server of `kubeconfig` (its first cluster), letting everything
    /// through; [`HeldProxy::kubeconfig`] is `kubeconfig` through the proxy.
    pub async fn in_front_of(kubeconfig: &Path) -> Result<Self> {
        let mut config: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(kubeconfig)?)?;
        let server = config["clusters"][0]["cluster"]["server"]
            .as_str()
            .context("kubeconfig has a server")?;
        let upstream = server
            .strip_prefix("https://")
            .context("an https:// server")?
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let (held, _) = watch::channel(false);
        let on_hold = held.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue; // the client sees its connection close
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(forward(
                    client_read,
                    server_write,
                    Some(on_hold.subscribe()),
                ));
                tokio::spawn(forward(server_read, client_write, None));
            }
        });
        // The API server's certificate names 127.0.0.1, so TLS verifies through the proxy as
        // without it.
        for cluster in config["clusters"]
            .as_sequence_mut()
            .context("kubeconfig has clusters")?
        {
            cluster["cluster"]["server"] = format!("https://{addr}").into();
        }
        let dir = crate::Scratch::new("held-proxy")?;
        let path = dir.join("kubeconfig");
        std::fs::write(&path, serde_yaml::to_string(&config)?)?;
        Ok(Self {
            addr,
            held,
            accept,
            kubeconfig: path,
            _dir: dir,
        })
    }

    /// From now on, nothing a client sends goes on to the API server.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// What was held, and everything after it, goes on.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// The kubeconfig it was started for, with this proxy as its server.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `host:port` of the proxy.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for HeldProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`; with `held`, each chunk waits while the proxy holds.
async fn forward(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(held) = held.as_mut()
            && held.wait_for(|held| !held).await.is_err()
        {
            break;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

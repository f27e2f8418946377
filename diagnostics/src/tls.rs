//! The metrics listener's TLS: the certificate of `--metrics-cert-dir` or a self-signed one,
//! and a listener whose handshakes run beside the accept loop.

use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::server::TlsStream;

/// A handshake not done by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many handshakes at once: a connection beyond it is closed unanswered, so
/// that slow or half-open clients cannot hold unbounded memory and tasks (a scraper retries).
pub(crate) const MAX_HANDSHAKES: usize = 32;

/// The server configuration: `tls.crt` and `tls.key` of `cert_dir`, else a self-signed
/// certificate for `localhost`, `127.0.0.1` and `::1` (scrapers of a self-signed endpoint
/// skip verification, as with controller-runtime's). TLS 1.2 and 1.3 on ring; HTTP/1.1.
pub(crate) fn server_config(cert_dir: Option<&Path>) -> anyhow::Result<Arc<ServerConfig>> {
    let (chain, key) = match cert_dir {
        Some(dir) => read_pair(dir)?,
        None => self_signed()?,
    };
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the metrics certificate and key do not form a usable pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn read_pair(dir: &Path) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let chain = CertificateDer::pem_file_iter(&crt)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| {
            format!(
                "reading the certificate {} (--metrics-cert-dir)",
                crt.display()
            )
        })?;
    anyhow::ensure!(
        !chain.is_empty(),
        "{} holds no certificate (--metrics-cert-dir)",
        crt.display()
    );
    let key = PrivateKeyDer::from_pem_file(&key).with_context(|| {
        format!(
            "reading the private key {} (--metrics-cert-dir)",
            key.display()
        )
    })?;
    Ok((chain, key))
}

fn self_signed() -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    let made =
        rcgen::generate_simple_self_signed(names).context("making a self-signed certificate")?;
    let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
    Ok((vec![made.cert.der().clone()], key.into()))
}

/// Accepts TCP connections and hands over those whose TLS handshake succeeded; a slow or
/// failed handshake holds up no other connection.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub(crate) fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> Self {
        let local = tcp.local_addr().expect("a bound listener has an address");
        let acceptor = TlsAcceptor::from(config);
        let (tx, ready) = mpsc::channel(64);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors, say: wait rather than spin.
                        tracing::warn!(%error, "Accepting a metrics connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "Too many TLS handshakes on the metrics port; closed");
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => {
                            tracing::debug!(%peer, %error, "TLS handshake failed on the metrics port")
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out on the metrics port")
                        }
                    }
                });
            }
        });
        Self { ready, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop ended: nothing will come again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_made_and_a_missing_cert_dir_is_named() {
        server_config(None).expect("a self-signed configuration");
        let dir = std::env::temp_dir().join(format!("diagnostics-none-{}", std::process::id()));
        let error = format!("{:#}", server_config(Some(&dir)).unwrap_err());
        assert!(
            error.contains("tls.crt") && error.contains("--metrics-cert-dir"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_connection_beyond_the_handshake_cap_is_closed_at_once() {
        use tokio::io::AsyncReadExt as _;
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let _listener = TlsListener::new(tcp, server_config(None).unwrap());
        // Clients that never say hello hold every handshake slot (until HANDSHAKE_TIMEOUT).
        let mut silent = Vec::new();
        for _ in 0..MAX_HANDSHAKES {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        // Accepted after them (the accept loop takes connections in order), the next one
        // finds no slot and is closed: its read ends long before a handshake would time out.
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(HANDSHAKE_TIMEOUT / 2, extra.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the connection beyond the cap was kept: {read:?}"
        );
    }
}

//! HTTPS: the server's certificate and key from PEM files (`[server] tls_cert`, `tls_key`),
//! reloaded when either file changes, so a renewed certificate (cert-manager, certbot) is
//! served from the next connection on without a restart. A renewal that cannot be read is
//! logged and the certificate in use is kept.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Where the certificate chain and its private key are (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The certificate in use and the files' modification times it was read at.
pub(crate) struct Tls {
    files: TlsFiles,
    current: Mutex<(Option<(SystemTime, SystemTime)>, TlsAcceptor)>,
}

fn modified(files: &TlsFiles) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(&files.cert)?, m(&files.key)?))
}

/// A server configuration from the files: HTTP/1.1, TLS 1.2 and 1.3, no client certificates.
fn config(files: &TlsFiles) -> Result<ServerConfig, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|c| c.collect::<Result<_, _>>())
        .map_err(|e| format!("tls_cert {}: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls_cert {}: no certificate in it",
            files.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("tls_key {}: {e}", files.key.display()))?;
    let mut cfg =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                format!(
                    "tls_cert {} and tls_key {}: {e}",
                    files.cert.display(),
                    files.key.display()
                )
            })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

impl Tls {
    /// Read the files; an error names the file and the problem (the server does not start).
    pub(crate) fn load(files: TlsFiles) -> Result<Tls, String> {
        let cfg = config(&files)?;
        Ok(Tls {
            current: Mutex::new((modified(&files), TlsAcceptor::from(Arc::new(cfg)))),
            files,
        })
    }

    /// The acceptor for a new connection: the files are read again when either changed since.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let now = modified(&self.files);
        if now.is_some() && now != cur.0 {
            match config(&self.files) {
                Ok(cfg) => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                    *cur = (now, TlsAcceptor::from(Arc::new(cfg)));
                }
                Err(e) => {
                    // Likely half written: keep serving the old one and look again next time.
                    tracing::warn!(error = %e, "TLS certificate changed but cannot be read; keeping the one in use");
                }
            }
        }
        cur.1.clone()
    }
}

/// A connection, plain or over TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

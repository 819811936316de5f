//! TLS for the kubelet server: the serving certificate, the client CA, the rustls server
//! configuration, and the accept loop that hands each request its connection's client
//! certificates.
//!
//! Upstream: `cmd/kubelet/app/server.go` `InitializeTLS` and `client-go/util/cert`
//! `GenerateSelfSignedCertKey`. Without `tlsCertFile`/`tlsPrivateKeyFile` the kubelet uses
//! `<certDir>/kubelet.crt|key`, generating a self-signed pair when they cannot be read and
//! reusing them after. With `clientCAFile` it *requests* a client certificate
//! (`tls.RequestClientCert`) and names the CA's subjects in the handshake, but verifies
//! nothing there: the x509 authenticator verifies the chain per request, so a certificate from
//! another CA gets `401 Unauthorized`, not a failed handshake. [`DeferredClientCertVerifier`]
//! does the same with rustls (it still checks that the client holds the certificate's key).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio::net::TcpListener;
use tower::ServiceExt;

/// The file names upstream gives the self-signed pair under the certificate directory.
pub const SELF_SIGNED_CERT_FILE: &str = "kubelet.crt";
/// See [`SELF_SIGNED_CERT_FILE`].
pub const SELF_SIGNED_KEY_FILE: &str = "kubelet.key";

/// Upstream's `maxAge` of a self-signed serving certificate (one year).
const SELF_SIGNED_VALIDITY: time::Duration = time::Duration::days(365);

/// What went wrong setting TLS up; each names the operation and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Only one of `tlsCertFile` and `tlsPrivateKeyFile` was given.
    #[error("tlsCertFile and tlsPrivateKeyFile go together: only {given} was given")]
    HalfConfigured {
        /// The one that was given.
        given: &'static str,
    },
    /// A file could not be read.
    #[error("reading {what} {path}")]
    Read {
        /// What the file is (`tlsCertFile`, `clientCAFile`, ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A PEM file held nothing usable.
    #[error("parsing {what} {path}")]
    Pem {
        /// What the file is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate file held no certificate.
    #[error("{what} {path} holds no certificate")]
    NoCertificate {
        /// What the file is.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The self-signed pair could not be generated.
    #[error("generating the self-signed serving certificate for {host}")]
    Generate {
        /// The host it was for.
        host: String,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// The self-signed pair could not be written.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// rustls refused the client CA bundle.
    #[error("building the client certificate verifier from {path}")]
    ClientCa {
        /// The `clientCAFile`.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// A certificate of the client CA bundle is not a usable trust anchor.
    #[error("adding a CA of {path}")]
    BadCa {
        /// The `clientCAFile`.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the configuration (a key that does not match the certificate, ...).
    #[error("building the TLS server configuration")]
    Config(#[source] rustls::Error),
}

/// The TLS settings, with the kubelet's configuration names.
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// `tlsCertFile` (`--tls-cert-file`): the serving certificate, then its intermediates.
    pub tls_cert_file: Option<PathBuf>,
    /// `tlsPrivateKeyFile` (`--tls-private-key-file`).
    pub tls_private_key_file: Option<PathBuf>,
    /// Where the self-signed pair lives without the two files above (upstream's `--cert-dir`,
    /// `<root>/pki`).
    pub cert_dir: PathBuf,
    /// The host the self-signed certificate is for (upstream: the hostname; here the node name).
    pub host: String,
    /// More subject alternative names for the self-signed certificate (the node's IPs).
    pub extra_ips: Vec<IpAddr>,
}

/// Where the serving certificate came from (logged, and what a test asserts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertificateSource {
    /// `tlsCertFile`/`tlsPrivateKeyFile`.
    Configured,
    /// The self-signed pair under the certificate directory, generated by an earlier start.
    SelfSignedReused,
    /// The self-signed pair, generated now.
    SelfSignedGenerated,
}

/// A certificate chain and its key, ready for rustls.
#[derive(Debug)]
pub struct ServingCertificate {
    /// The leaf, then what the file holds after it.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
    /// The files it was read from.
    pub cert_file: PathBuf,
    /// See `cert_file`.
    pub key_file: PathBuf,
    /// Where it came from.
    pub source: CertificateSource,
}

impl ServingCertificate {
    /// The configured pair, or the self-signed one (generated when it cannot be read).
    /// Upstream: `InitializeTLS` (without `serverTLSBootstrap`).
    pub fn resolve(settings: &TlsSettings) -> Result<Self, TlsError> {
        let (cert_file, key_file, source) =
            match (&settings.tls_cert_file, &settings.tls_private_key_file) {
                (Some(cert), Some(key)) => {
                    (cert.clone(), key.clone(), CertificateSource::Configured)
                }
                (Some(_), None) => {
                    return Err(TlsError::HalfConfigured {
                        given: "tlsCertFile",
                    });
                }
                (None, Some(_)) => {
                    return Err(TlsError::HalfConfigured {
                        given: "tlsPrivateKeyFile",
                    });
                }
                (None, None) => {
                    let (cert, key, source) = ensure_self_signed(settings)?;
                    (cert, key, source)
                }
            };
        let chain = read_certificates("tlsCertFile", &cert_file)?;
        let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|source| match source {
            rustls::pki_types::pem::Error::Io(source) => TlsError::Read {
                what: "tlsPrivateKeyFile",
                path: key_file.clone(),
                source,
            },
            source => TlsError::Pem {
                what: "tlsPrivateKeyFile",
                path: key_file.clone(),
                source,
            },
        })?;
        Ok(Self {
            chain,
            key,
            cert_file,
            key_file,
            source,
        })
    }
}

/// `<cert_dir>/kubelet.crt|key`: reused when both can be read (upstream's `canReadCertAndKey`;
/// no check of their dates or names, as upstream), else generated and written (the key 0600).
fn ensure_self_signed(
    settings: &TlsSettings,
) -> Result<(PathBuf, PathBuf, CertificateSource), TlsError> {
    let cert_file = settings.cert_dir.join(SELF_SIGNED_CERT_FILE);
    let key_file = settings.cert_dir.join(SELF_SIGNED_KEY_FILE);
    if std::fs::File::open(&cert_file).is_ok() && std::fs::File::open(&key_file).is_ok() {
        return Ok((cert_file, key_file, CertificateSource::SelfSignedReused));
    }
    let (cert_pem, key_pem) = generate_self_signed(&settings.host, &settings.extra_ips)?;
    std::fs::create_dir_all(&settings.cert_dir).map_err(|source| TlsError::Write {
        path: settings.cert_dir.clone(),
        source,
    })?;
    write_atomically(&cert_file, cert_pem.as_bytes(), 0o644)?;
    write_atomically(&key_file, key_pem.as_bytes(), 0o600)?;
    tracing::info!(cert = %cert_file.display(), "generated a self-signed serving certificate");
    Ok((cert_file, key_file, CertificateSource::SelfSignedGenerated))
}

/// A serving certificate for `host` signed by a CA made for it, as PEM (the leaf then the CA)
/// and its key. Upstream: `GenerateSelfSignedCertKeyWithFixtures`: CA `<host>-ca@<unix>`,
/// leaf `<host>@<unix>`, valid from an hour ago for a year, `serverAuth`, the host as an IP or
/// DNS SAN. Deviations: ECDSA P-256 keys, not RSA 2048 (ring generates no RSA keys); the leaf
/// also names `localhost`, `127.0.0.1` and `extra_ips` (the node's addresses), so that a client
/// given the CA can verify it by any of them (upstream names the host only).
pub fn generate_self_signed(
    host: &str,
    extra_ips: &[IpAddr],
) -> Result<(String, String), TlsError> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let fail = |source| TlsError::Generate {
        host: host.to_owned(),
        source,
    };
    let now = time::OffsetDateTime::now_utc();
    let unix = now.unix_timestamp();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + SELF_SIGNED_VALIDITY;

    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{host}-ca@{unix}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(fail)?;
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name
        .push(DnType::CommonName, format!("{host}@{unix}"));
    leaf.key_usages = vec![
        KeyUsagePurpose::KeyEncipherment,
        KeyUsagePurpose::DigitalSignature,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let mut ips: Vec<IpAddr> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    match host.parse::<IpAddr>() {
        Ok(ip) => ips.push(ip),
        Err(_) => names.push(host.to_owned()),
    }
    names.push("localhost".to_owned());
    ips.push(IpAddr::from([127, 0, 0, 1]));
    ips.extend(extra_ips.iter().copied());
    names.dedup();
    let mut seen = Vec::new();
    ips.retain(|ip| {
        let new = !seen.contains(ip);
        seen.push(*ip);
        new
    });
    for name in names {
        leaf.subject_alt_names
            .push(SanType::DnsName(name.try_into().map_err(fail)?));
    }
    for ip in ips {
        leaf.subject_alt_names.push(SanType::IpAddress(ip));
    }
    let cert = leaf.signed_by(&key, &issuer).map_err(fail)?;
    Ok((
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    ))
}

fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(fail)?;
    file.write_all(contents).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// The certificates of a PEM file, in order (`what` names the file in errors).
pub fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |source| match source {
        rustls::pki_types::pem::Error::Io(source) => TlsError::Read {
            what,
            path: path.to_owned(),
            source,
        },
        source => TlsError::Pem {
            what,
            path: path.to_owned(),
            source,
        },
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_owned(),
        });
    }
    Ok(chain)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How often the client CA file is re-read (upstream's `DynamicFileCAContent` resyncs each
/// minute; it also watches the file, which a minute's poll stands in for here).
pub const CLIENT_CA_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// The CAs of `clientCAFile`: what the handshake names, and what the x509 authenticator
/// verifies a client's chain against (for client authentication, at the time of the request).
/// Clones share one bundle, which [`ClientCa::reload_if_changed`] replaces when the file
/// changes (upstream: `dynamiccertificates.NewDynamicCAContentFromFile`; the handshake's
/// names stay those read at start, as upstream's `tls.Config.ClientCAs`).
#[derive(Debug, Clone)]
pub struct ClientCa {
    loaded: Arc<std::sync::RwLock<LoadedCa>>,
    path: PathBuf,
}

#[derive(Debug)]
struct LoadedCa {
    verifier: Arc<dyn ClientCertVerifier>,
    pem: Vec<u8>,
}

impl ClientCa {
    /// Reads the bundle. Upstream: `certutil.NewPool(clientCAFile)`.
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            loaded: Arc::new(std::sync::RwLock::new(Self::read(path)?)),
            path: path.to_owned(),
        })
    }

    fn read(path: &Path) -> Result<LoadedCa, TlsError> {
        let pem = std::fs::read(path).map_err(|source| TlsError::Read {
            what: "clientCAFile",
            path: path.to_owned(),
            source,
        })?;
        let mut roots = RootCertStore::empty();
        for cert in read_certificates("clientCAFile", path)? {
            roots.add(cert).map_err(|source| TlsError::BadCa {
                path: path.to_owned(),
                source,
            })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|source| TlsError::ClientCa {
                path: path.to_owned(),
                source,
            })?;
        Ok(LoadedCa { verifier, pem })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.loaded
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .verifier
            .clone()
    }

    /// Re-reads the file; `true` when its content changed and the new bundle is in use. A
    /// file that cannot be read or parsed leaves the last good bundle in use (upstream keeps
    /// it too) and is the error.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let pem = std::fs::read(&self.path).map_err(|source| TlsError::Read {
            what: "clientCAFile",
            path: self.path.clone(),
            source,
        })?;
        if pem == self.loaded.read().unwrap_or_else(|p| p.into_inner()).pem {
            return Ok(false);
        }
        let fresh = Self::read(&self.path)?;
        *self.loaded.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        tracing::info!(path = %self.path.display(), "reloaded the client CA bundle");
        Ok(true)
    }

    /// Re-reads the file every `interval` from now, forever (spawn it; call it within a tokio
    /// runtime).
    pub fn reload_periodically(self, interval: Duration) -> impl Future<Output = ()> + Send {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        async move {
            loop {
                ticks.tick().await;
                if let Err(error) = self.reload_if_changed() {
                    tracing::warn!(error = %error, source = ?std::error::Error::source(&error),
                    "reloading the client CA bundle; the last good one stays in use");
                }
            }
        }
    }

    /// Verifies `chain` (the leaf first) for client authentication now, against the bundle in
    /// use. Upstream: `x509.Authenticator.AuthenticateRequest` (`Verify` with
    /// `ExtKeyUsageClientAuth`; the rest of the chain as intermediates).
    pub fn verify(&self, chain: &[CertificateDer<'_>]) -> Result<(), rustls::Error> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err(rustls::Error::NoCertificatesPresented);
        };
        self.verifier()
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map(|_| ())
    }
}

/// Requests a client certificate (naming the CA's subjects), checks that the client holds its
/// key, and leaves the chain's verification to the x509 authenticator, per request, as
/// upstream's `tls.RequestClientCert` does.
#[derive(Debug)]
pub struct DeferredClientCertVerifier {
    inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for DeferredClientCertVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Deferred: `ClientCa::verify` runs in the authenticator (a 401, not a failed handshake).
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The rustls server configuration: the serving certificate; with a client CA, a client
/// certificate requested (not required, verified per request). ALPN offers `http/1.1` only
/// (deviation: upstream also offers h2; the streaming endpoints need HTTP/1.1 upgrades).
pub fn server_config(
    cert: ServingCertificate,
    client_ca: Option<&ClientCa>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(Arc::new(DeferredClientCertVerifier {
            inner: ca.verifier(),
        })),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(cert.chain, cert.key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client certificates of the request's connection (the leaf first; empty without one),
/// put in every request's extensions by [`serve`].
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Upstream's `MaxHeaderBytes` (1 MiB).
const MAX_HEADER_BYTES: usize = 1 << 20;

/// Upstream's `IdleTimeout` (90 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How [`serve`] serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The TLS configuration ([`server_config`]).
    pub tls: Arc<ServerConfig>,
    /// How long a connection may wait for (the whole head of) its next request; then it is
    /// closed. Upstream's `IdleTimeout` is 90 s; its `ReadTimeout` (4 h) also bounds a head
    /// read: here the idle timeout bounds both (deviation: hyper has one header-read timer,
    /// started when the connection waits for a request). An upgraded connection (exec,
    /// attach, port-forward) is no longer HTTP and has its own idle rule.
    pub idle_timeout: Duration,
}

impl ServeOptions {
    /// `tls` with upstream's idle timeout.
    pub fn new(tls: Arc<ServerConfig>) -> Self {
        Self {
            tls,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// Accepts TLS connections on `listener` and serves `service` on each (HTTP/1.1, with
/// upgrades, heads of at most 1 MiB), each request carrying its connection's
/// [`PeerCertificates`], until `shutdown` completes; connections already accepted run to
/// their end. A failed handshake or connection is logged and dropped.
pub async fn serve<S>(
    listener: TcpListener,
    options: ServeOptions,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()>
where
    S: tower::Service<Request<Body>, Response = Response, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(options.tls);
    let idle_timeout = options.idle_timeout;
    tokio::pin!(shutdown);
    loop {
        let (tcp, remote) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::warn!(%error, "accepting a connection on the kubelet server");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let service = service.clone();
        tokio::spawn(async move {
            // A client that never finishes its handshake holds a task no longer than an idle
            // connection would (upstream: the server's read deadline covers the handshake).
            let tls = match tokio::time::timeout(idle_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%remote, %error, "TLS handshake on the kubelet server");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%remote, "TLS handshake on the kubelet server timed out");
                    return;
                }
            };
            let peer = PeerCertificates(Arc::new(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .map(|chain| chain.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            ));
            let per_request =
                hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let mut request = request.map(Body::new);
                    request.extensions_mut().insert(peer.clone());
                    let (method, path) =
                        (request.method().clone(), request.uri().path().to_owned());
                    let started = tokio::time::Instant::now();
                    let response = service.clone().oneshot(request);
                    async move {
                        let response = response.await?;
                        log_request(remote, &method, &path, response.status(), started.elapsed());
                        Ok::<_, Infallible>(response)
                    }
                });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .max_buf_size(MAX_HEADER_BYTES)
                .timer(TokioTimer::new())
                .header_read_timeout(idle_timeout)
                .serve_connection(TokioIo::new(tls), per_request)
                .with_upgrades()
                .await
            {
                tracing::debug!(%remote, %error, "serving a kubelet server connection");
            }
        });
    }
}

/// One line per request (upstream: `httplog`, at verbosity 3; its errors reach the log):
/// an error answer at info, the others at debug. The path only: a query may carry a command.
fn log_request(
    remote: std::net::SocketAddr,
    method: &http::Method,
    path: &str,
    status: http::StatusCode,
    elapsed: Duration,
) {
    let status = status.as_u16();
    if status >= 400 {
        tracing::info!(%remote, %method, path, status, ?elapsed, "kubelet server request refused or failed");
    } else {
        tracing::debug!(%remote, %method, path, status, ?elapsed, "kubelet server request");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::Layer;

    use super::*;
    use crate::auth::fake::{FakeAccessReviewer, FakeTokenReviewer};
    use crate::auth::{
        Admitted, AuthLayer, AuthSettings, KubeletAuth, KubeletAuthentication,
        KubeletAuthorization, Reviewers,
    };
    use crate::test_pki::{ClientCert, TestCa};

    fn settings(dir: &Path) -> TlsSettings {
        TlsSettings {
            cert_dir: dir.join("pki"),
            host: "node-a".to_owned(),
            extra_ips: vec![IpAddr::from([10, 88, 0, 1])],
            ..TlsSettings::default()
        }
    }

    /// Upstream's `InitializeTLS` without the two files: `<certDir>/kubelet.crt|key`
    /// generated once (the key 0600), then reused as they are.
    #[test]
    fn the_self_signed_certificate_is_generated_under_the_cert_dir_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let first = ServingCertificate::resolve(&settings(dir.path())).unwrap();
        assert_eq!(first.source, CertificateSource::SelfSignedGenerated);
        assert_eq!(first.cert_file, dir.path().join("pki/kubelet.crt"));
        assert_eq!(first.key_file, dir.path().join("pki/kubelet.key"));
        let mode = std::fs::metadata(&first.key_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(first.chain.len(), 2, "the leaf, then its CA");

        use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
        let (_, leaf) = X509Certificate::from_der(first.chain[0].as_ref()).unwrap();
        let cn = leaf
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap();
        assert!(cn.starts_with("node-a@"), "{cn}");
        let (_, ca) = X509Certificate::from_der(first.chain[1].as_ref()).unwrap();
        let ca_cn = ca
            .subject()
            .iter_common_name()
            .next()
            .unwrap()
            .as_str()
            .unwrap();
        assert!(ca_cn.starts_with("node-a-ca@"), "{ca_cn}");
        assert_eq!(leaf.issuer(), ca.subject());
        let sans: Vec<String> = leaf
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::DNSName(d) => d.to_string(),
                GeneralName::IPAddress(ip) => format!("{ip:?}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            sans,
            ["node-a", "localhost", "[127, 0, 0, 1]", "[10, 88, 0, 1]"]
        );
        let validity = leaf.validity();
        let days = (validity.not_after.timestamp() - validity.not_before.timestamp()) / 86_400;
        assert_eq!(days, 365, "a year (and the hour before now)");

        let cert_pem = std::fs::read(&first.cert_file).unwrap();
        let second = ServingCertificate::resolve(&settings(dir.path())).unwrap();
        assert_eq!(second.source, CertificateSource::SelfSignedReused);
        assert_eq!(second.chain, first.chain);
        assert_eq!(std::fs::read(&second.cert_file).unwrap(), cert_pem);
    }

    #[test]
    fn the_configured_files_are_used_and_one_alone_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = generate_self_signed("elsewhere", &[]).unwrap();
        std::fs::write(dir.path().join("serving.crt"), cert).unwrap();
        std::fs::write(dir.path().join("serving.key"), key).unwrap();
        let mut configured = settings(dir.path());
        configured.tls_cert_file = Some(dir.path().join("serving.crt"));
        configured.tls_private_key_file = Some(dir.path().join("serving.key"));
        let resolved = ServingCertificate::resolve(&configured).unwrap();
        assert_eq!(resolved.source, CertificateSource::Configured);
        assert!(!dir.path().join("pki").exists(), "nothing generated");

        configured.tls_private_key_file = None;
        assert!(matches!(
            ServingCertificate::resolve(&configured),
            Err(TlsError::HalfConfigured {
                given: "tlsCertFile"
            })
        ));
        configured.tls_cert_file = Some(dir.path().join("missing.crt"));
        configured.tls_private_key_file = Some(dir.path().join("serving.key"));
        let error = ServingCertificate::resolve(&configured).unwrap_err();
        assert!(
            matches!(
                error,
                TlsError::Read {
                    what: "tlsCertFile",
                    ..
                }
            ),
            "{error:?}"
        );
    }

    /// One GET over a real TLS connection on loopback; the status line and the body.
    async fn get(
        addr: std::net::SocketAddr,
        server_ca: &[CertificateDer<'static>],
        client: Option<&ClientCert>,
    ) -> (String, String) {
        let mut roots = RootCertStore::empty();
        for cert in server_ca {
            roots.add(cert.clone()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            Some(client) => builder
                .with_client_auth_cert(client.chain.clone(), client.key.clone_key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = connector.connect(name, tcp).await.unwrap();
        tls.write_all(b"GET /pods HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = String::new();
        tls.read_to_string(&mut response).await.unwrap();
        let status = response.lines().next().unwrap_or_default().to_owned();
        let body = response
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        (status, body)
    }

    /// Through a real TLS connection on loopback: the self-signed serving certificate
    /// verifies for `localhost` against its CA; a client certificate of the client CA is its
    /// user; one of another CA, or none, is `401 Unauthorized` after a completed handshake.
    #[tokio::test]
    async fn a_client_certificate_over_a_real_tls_connection() {
        let dir = tempfile::tempdir().unwrap();
        let client_ca = TestCa::new("client-ca");
        let ca_file = client_ca.write(dir.path(), "client-ca.crt");
        let serving = ServingCertificate::resolve(&settings(dir.path())).unwrap();
        let server_ca = vec![serving.chain[1].clone()];

        let access = Arc::new(FakeAccessReviewer::default());
        access.allow("alice", "get", "pods");
        let auth = KubeletAuth::new(AuthSettings {
            node_name: "node-a".to_owned(),
            authentication: KubeletAuthentication {
                x509: crate::auth::X509Authentication {
                    client_ca_file: Some(ca_file),
                },
                ..KubeletAuthentication::default()
            },
            authorization: KubeletAuthorization::default(),
            reviewers: Reviewers::Api {
                tokens: Arc::new(FakeTokenReviewer::default()),
                access: access.clone(),
            },
        })
        .unwrap();
        let config = server_config(serving, auth.client_ca()).unwrap();
        let app = AuthLayer::new(Arc::new(auth)).layer(axum::Router::new().route(
            "/pods",
            axum::routing::get(
                |axum::Extension(admitted): axum::Extension<Admitted>| async move {
                    format!("pods for {}", admitted.user.name)
                },
            ),
        ));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, ServeOptions::new(config), app, async {
            stopped.await.ok();
        }));

        let alice = client_ca.client("alice", Some("devs"));
        let (status, body) = get(addr, &server_ca, Some(&alice)).await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        assert!(body.contains("pods for alice"), "{body}");

        let other = TestCa::new("other-ca").client("alice", Some("devs"));
        let (status, body) = get(addr, &server_ca, Some(&other)).await;
        assert_eq!(status, "HTTP/1.1 401 Unauthorized");
        assert!(body.contains("Unauthorized"), "{body}");

        let (status, _) = get(addr, &server_ca, None).await;
        assert_eq!(status, "HTTP/1.1 401 Unauthorized");

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    /// `clientCAFile` re-read each minute: a rotated bundle takes effect without a restart; a
    /// broken one leaves the last good one in use.
    #[tokio::test(start_paused = true)]
    async fn the_client_ca_file_is_reloaded_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (TestCa::new("old-ca"), TestCa::new("new-ca"));
        let path = old.write(dir.path(), "client-ca.crt");
        let ca = ClientCa::load(&path).unwrap();
        let (by_old, by_new) = (old.client("alice", None), new.client("alice", None));
        assert!(ca.verify(&by_old.chain).is_ok());
        assert!(ca.verify(&by_new.chain).is_err());
        assert!(!ca.reload_if_changed().unwrap(), "unchanged");

        let task = tokio::spawn(ca.clone().reload_periodically(CLIENT_CA_RELOAD_INTERVAL));
        new.write(dir.path(), "client-ca.crt");
        tokio::time::advance(CLIENT_CA_RELOAD_INTERVAL - Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(ca.verify(&by_new.chain).is_err(), "not before the minute");
        tokio::time::advance(Duration::from_secs(1)).await;
        tokio::task::yield_now().await;
        assert!(
            ca.verify(&by_new.chain).is_ok(),
            "the new bundle after a minute"
        );
        assert!(ca.verify(&by_old.chain).is_err());

        std::fs::write(&path, "not a certificate").unwrap();
        assert!(ca.reload_if_changed().is_err());
        assert!(
            ca.verify(&by_new.chain).is_ok(),
            "the last good bundle stays"
        );
        task.abort();
    }

    /// A connection that sends no request is closed after the idle timeout (upstream's
    /// `IdleTimeout`; 90 s by default, short here): the client reads the end of the stream.
    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let serving = ServingCertificate::resolve(&settings(dir.path())).unwrap();
        let server_ca = serving.chain[1].clone();
        let options = ServeOptions {
            tls: server_config(serving, None).unwrap(),
            idle_timeout: Duration::from_millis(200),
        };
        assert_eq!(
            ServeOptions::new(options.tls.clone()).idle_timeout,
            Duration::from_secs(90)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(serve(listener, options, app, std::future::pending()));

        let mut roots = RootCertStore::empty();
        roots.add(server_ca).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap();
        let mut rest = Vec::new();
        // Ends (EOF or a reset) only when the server closes the connection; the minute is a
        // safety net against a hang, not a measure.
        let read = tokio::time::timeout(Duration::from_secs(60), tls.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the server closes the idle connection");
        assert!(rest.is_empty(), "nothing was asked, nothing answered");
        server.abort();
    }

    /// A client that connects and never sends its TLS hello holds the connection no longer
    /// than the idle timeout (upstream: the server's read deadline bounds the handshake).
    #[tokio::test]
    async fn a_connection_that_never_handshakes_is_closed_after_the_idle_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let serving = ServingCertificate::resolve(&settings(dir.path())).unwrap();
        let options = ServeOptions {
            tls: server_config(serving, None).unwrap(),
            idle_timeout: Duration::from_millis(200),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        let server = tokio::spawn(serve(listener, options, app, std::future::pending()));

        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut rest = Vec::new();
        // The minute is a safety net against a hang, not a measure.
        let read = tokio::time::timeout(Duration::from_secs(60), tcp.read_to_end(&mut rest)).await;
        assert!(
            read.is_ok(),
            "the server closes a connection that never handshakes"
        );
        assert!(rest.is_empty(), "nothing was sent");
        server.abort();
    }
}

//! TLS for every connection pgjet opens: libpq sessions (`sslmode`, `sslrootcert`, `sslcert`,
//! `sslkey`) and HTTPS object stores (`repo-storage-ca-file`, `repo-storage-verify-tls`). This
//! module reads the PEM files, builds the rustls client configuration (ring provider) and
//! decides whether a server's certificate is trusted; callers only say what to trust
//! ([`ServerTrust`]) and which names to check ([`NameCheck`]). It also tells a TLS failure apart
//! from other connection failures, by the `rustls::Error` in an error's source chain
//! ([`failure_in`]).
//!
//! # Which server certificates are accepted
//!
//! With [`ServerTrust::File`] or [`ServerTrust::System`]:
//!
//! 1. The chain rustls-webpki builds from the server's certificate, through the certificates
//!    the server sent, to a certificate of the trust file (or the system's CAs) decides, as in
//!    any rustls client: signatures, validity periods, basic constraints, key purposes.
//! 2. **A trusted certificate presented as the server's own.** When that chain is refused and
//!    the server's end-entity certificate is byte for byte (DER) one of the trust file's
//!    certificates, it is accepted although webpki refuses it — typically because it is a CA
//!    certificate (`CA:TRUE`) used as an end entity, which every self-signed certificate made
//!    by `openssl req -x509` is (PostgreSQL's documented recipe, "Creating Certificates" in
//!    "Secure TCP/IP Connections with SSL"). Its validity period is still checked, as are its
//!    critical extensions and extended key usage (as webpki does for an end entity), the host
//!    name where the mode checks names (step 3), and the server's signature over the
//!    handshake with the certificate's key. This is what OpenSSL does: a self-signed
//!    certificate found in the trust store is a trust anchor, and with
//!    `X509_V_FLAG_PARTIAL_CHAIN` (curl's default since 7.68) any certificate found there
//!    is, even when it is the leaf (OpenSSL's `X509_verify_cert`, crypto/x509/x509_vfy.c); so
//!    libpq (`sslrootcert=server.crt`) and `curl --cacert server.crt` accept such a server.
//!    Only certificates named in a trust file count: never the system's CAs.
//! 3. The host name, by the [`NameCheck`]: for libpq the certificate's subjectAltName of the
//!    host's kind (DNS name or IP address), else its subject's first CN, as libpq does
//!    (`pq_verify_peer_name_matches_certificate_name` in
//!    src/interfaces/libpq/fe-secure-common.c); for object stores the subjectAltName only, as
//!    rustls, Go and the AWS SDKs do.
//!
//! Everything else keeps webpki's verdict: a certificate signed by a CA not in the trust file,
//! an expired one, one for another host, a CA certificate used as the server's own that is not
//! itself in the trust file. A refusal names the certificate and why (see [`Refusal`]).
//! X.509 version 1 server certificates (what `openssl x509 -req` without `-extfile` gives
//! with OpenSSL 3.0) are refused: rustls-webpki parses only version 3 end entities.
//!
//! [`ServerTrust::Any`] (libpq `sslmode=require` without a root certificate,
//! `repo-storage-verify-tls=n`) encrypts without authenticating, as libpq and curl `-k` do;
//! the handshake signatures are still checked.
use crate::error::tls::Refusal;
use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use x509_cert::der::oid::{AssociatedOid, ObjectIdentifier};
use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::{
    BasicConstraints, CrlDistributionPoints, ExtendedKeyUsage, KeyUsage, NameConstraints,
    SubjectAltName,
};

/// The subject attribute commonName (RFC 4519, 2.5.4.3).
const OID_CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

/// Extended key usage id-kp-serverAuth (RFC 5280, 4.2.1.12).
const OID_SERVER_AUTH: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.1");

/// Extended key usage anyExtendedKeyUsage (RFC 5280, 4.2.1.12).
const OID_ANY_EKU: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37.0");

/// Which names of the server's certificate must match the host connected to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameCheck {
    /// None (libpq `sslmode=verify-ca`, or `require` with a root certificate file).
    Off,
    /// The subjectAltName entries of the host's kind (RFC 6125): object stores.
    SubjectAltName,
    /// The subjectAltName entries of the host's kind; when the certificate has none of that
    /// kind, the subject's first commonName (exactly, or `*.rest` matching one label), as
    /// libpq does for `sslmode=verify-full` (src/interfaces/libpq/fe-secure-common.c).
    SubjectAltNameOrCommonName,
}

/// Which server certificates a connection accepts (see the module's doc for the rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTrust {
    /// Any: encryption without authentication (handshake signatures are still checked).
    Any,
    /// Certificates that lead to one in the PEM file `path`, or are one of them.
    File { path: PathBuf, names: NameCheck },
    /// Certificates that lead to one of the system's CAs (rustls-native-certs: the OpenSSL
    /// locations, `SSL_CERT_FILE`, `SSL_CERT_DIR`), names by subjectAltName.
    System,
}

/// A client certificate (PEM, the chain leaf first) and its private key (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The ring provider every TLS connection of pgjet uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads every certificate of the PEM file `path`.
///
/// Errors: [`Error::Config`] naming the file when it cannot be read, holds a malformed PEM
/// block, or holds no certificate.
pub fn read_pem_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let unreadable = |e: rustls::pki_types::pem::Error| {
        Error::Config(format!("cannot read certificates from {}", path.display())).because(e)
    };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(unreadable)?
        .collect::<std::result::Result<_, _>>()
        .map_err(unreadable)?;
    if certs.is_empty() {
        return Err(Error::Config(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// Reads the first private key (PKCS#1, PKCS#8 or SEC1) of the PEM file `path`.
///
/// Errors: [`Error::Config`] naming the file.
pub fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        Error::Config(format!("cannot read the TLS client key {}", path.display())).because(e)
    })
}

/// The system's CA certificates (rustls-native-certs).
///
/// Errors: [`Error::Config`] when none is found.
fn system_roots() -> Result<Vec<CertificateDer<'static>>> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!("system CA certificates: {e}");
    }
    if found.certs.is_empty() {
        return Err(Error::Config(
            "no system CA certificates found: install ca-certificates, or name a CA file".into(),
        ));
    }
    Ok(found.certs)
}

/// Builds a rustls client configuration (ring provider, TLS 1.2 and 1.3) that accepts the
/// server certificates `trust` says and presents `identity` when the server asks for a
/// client certificate. ALPN is left empty for the caller to set.
///
/// Errors: [`Error::Config`] naming the file for unreadable or malformed certificate and key
/// files, or a key that does not match its certificate.
pub fn client_config(
    trust: &ServerTrust,
    identity: Option<&ClientIdentity>,
) -> Result<rustls::ClientConfig> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config("TLS set-up failed".into()).because(e))?;
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        ServerTrust::Any => Arc::new(NoVerifier(provider)),
        ServerTrust::File { path, names } => {
            let certs = read_pem_certs(path)?;
            Arc::new(TrustVerifier::new(
                &certs,
                certs.clone(),
                *names,
                path.display().to_string(),
                provider,
            )?)
        }
        ServerTrust::System => Arc::new(TrustVerifier::new(
            &system_roots()?,
            Vec::new(),
            NameCheck::SubjectAltName,
            "the system's CA certificates".into(),
            provider,
        )?),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match identity {
        Some(id) => {
            let chain = read_pem_certs(&id.cert)?;
            let key = read_private_key(&id.key)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                Error::Config(format!("bad TLS client certificate {}", id.cert.display()))
                    .because(e)
            })
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

/// The verifier of [`ServerTrust::File`] and [`ServerTrust::System`] (the module's rule).
#[derive(Debug)]
struct TrustVerifier {
    roots: rustls::RootCertStore,
    /// The trust file's certificates, accepted as the server's own (empty for the system's).
    pinned: Vec<CertificateDer<'static>>,
    names: NameCheck,
    /// Where the roots come from, for messages: the file's path or "the system's CA
    /// certificates".
    source: String,
    provider: Arc<CryptoProvider>,
}

impl TrustVerifier {
    fn new(
        roots: &[CertificateDer<'static>],
        pinned: Vec<CertificateDer<'static>>,
        names: NameCheck,
        source: String,
        provider: Arc<CryptoProvider>,
    ) -> Result<TrustVerifier> {
        let mut store = rustls::RootCertStore::empty();
        for c in roots {
            // One bad certificate among the system's is skipped, as rustls-native-certs users
            // do; in a file the user named it is an error.
            if let Err(e) = store.add(c.clone()) {
                if pinned.is_empty() {
                    tracing::debug!("system CA certificate skipped: {e}");
                } else {
                    return Err(Error::Config(format!("bad certificate in {source}")).because(e));
                }
            }
        }
        if store.is_empty() {
            return Err(Error::Config(format!("no usable certificate in {source}")));
        }
        Ok(TrustVerifier {
            roots: store,
            pinned,
            names,
            source,
            provider,
        })
    }

    fn is_pinned(&self, end_entity: &CertificateDer<'_>) -> bool {
        self.pinned
            .iter()
            .any(|p| p.as_ref() == end_entity.as_ref())
    }

    /// The whole decision of the module's rule for `end_entity` at `now`.
    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        now: UnixTime,
    ) -> std::result::Result<(), rustls::Error> {
        let chain = ParsedCertificate::try_from(end_entity).and_then(|parsed| {
            rustls::client::verify_server_cert_signed_by_trust_anchor(
                &parsed,
                &self.roots,
                intermediates,
                now,
                self.provider.signature_verification_algorithms.all,
            )
            .map(|()| parsed)
        });
        let parsed = match chain {
            Ok(parsed) => parsed,
            Err(_) if self.is_pinned(end_entity) => {
                check_as_own_certificate(end_entity, now)?;
                ParsedCertificate::try_from(end_entity)
                    .map_err(|e| explain(end_entity, e, &self.source))?
            }
            Err(e) => return Err(explain(end_entity, e, &self.source)),
        };
        check_name(end_entity, &parsed, server_name, self.names)
    }
}

impl ServerCertVerifier for TrustVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.verify(end_entity, intermediates, server_name, now)
            .map(|()| ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Encryption without authentication ([`ServerTrust::Any`]): any certificate is accepted;
/// the server's handshake signatures are still checked against its certificate's key.
#[derive(Debug)]
struct NoVerifier(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerifier {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A certificate of the trust file presented as the server's own: what webpki would still
/// check of an end entity whose issuer is trusted: the validity period at `now`, no critical
/// extension webpki does not know (basic constraints, key usage, extended key usage,
/// subjectAltName, name constraints, CRL distribution points), and an extended key usage,
/// when present, that allows TLS servers.
fn check_as_own_certificate(
    end_entity: &CertificateDer<'_>,
    now: UnixTime,
) -> std::result::Result<(), rustls::Error> {
    let cert = x509_cert::Certificate::from_der(end_entity.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let tbs = &cert.tbs_certificate;
    let not_before = UnixTime::since_unix_epoch(tbs.validity.not_before.to_unix_duration());
    let not_after = UnixTime::since_unix_epoch(tbs.validity.not_after.to_unix_duration());
    if now.as_secs() < not_before.as_secs() {
        return Err(CertificateError::NotValidYetContext {
            time: now,
            not_before,
        }
        .into());
    }
    if now.as_secs() > not_after.as_secs() {
        return Err(CertificateError::ExpiredContext {
            time: now,
            not_after,
        }
        .into());
    }
    let known = [
        BasicConstraints::OID,
        KeyUsage::OID,
        ExtendedKeyUsage::OID,
        SubjectAltName::OID,
        NameConstraints::OID,
        CrlDistributionPoints::OID,
    ];
    for ext in tbs.extensions.iter().flatten() {
        if ext.critical && !known.contains(&ext.extn_id) {
            return Err(CertificateError::UnhandledCriticalExtension.into());
        }
        if ext.extn_id == ExtendedKeyUsage::OID {
            let eku = ExtendedKeyUsage::from_der(ext.extn_value.as_bytes())
                .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
            if !eku
                .0
                .iter()
                .any(|p| *p == OID_SERVER_AUTH || *p == OID_ANY_EKU)
            {
                return Err(CertificateError::InvalidPurpose.into());
            }
        }
    }
    Ok(())
}

/// Checks the host name as `names` says, on a certificate whose chain (or pinning) passed.
fn check_name(
    end_entity: &CertificateDer<'_>,
    parsed: &ParsedCertificate<'_>,
    server_name: &ServerName<'_>,
    names: NameCheck,
) -> std::result::Result<(), rustls::Error> {
    if names == NameCheck::Off {
        return Ok(());
    }
    let err = match rustls::client::verify_server_name(parsed, server_name) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if names == NameCheck::SubjectAltName {
        return Err(err);
    }
    let facts = match x509_cert::Certificate::from_der(end_entity.as_ref()) {
        Ok(cert) => NameFacts::of(&cert),
        Err(_) => return Err(err),
    };
    let is_ip = matches!(server_name, ServerName::IpAddress(_));
    let has_san_of_kind = if is_ip {
        facts.has_ip_san
    } else {
        facts.has_dns_san
    };
    let host = server_name.to_str();
    match &facts.common_name {
        Some(cn) if !has_san_of_kind && libpq_name_matches(cn, &host) => Ok(()),
        Some(cn) if !has_san_of_kind => Err(match err {
            rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                expected,
                mut presented,
            }) => {
                presented.push(format!("CN={}", String::from_utf8_lossy(cn)));
                CertificateError::NotValidForNameContext {
                    expected,
                    presented,
                }
                .into()
            }
            other => other,
        }),
        _ => Err(err),
    }
}

/// What the name check needs of a certificate beyond webpki's subjectAltName match.
struct NameFacts {
    has_dns_san: bool,
    has_ip_san: bool,
    /// The raw bytes of the subject's first commonName, as libpq compares them.
    common_name: Option<Vec<u8>>,
}

impl NameFacts {
    fn of(cert: &x509_cert::Certificate) -> NameFacts {
        let tbs = &cert.tbs_certificate;
        let (mut has_dns_san, mut has_ip_san) = (false, false);
        for ext in tbs.extensions.iter().flatten() {
            if ext.extn_id == SubjectAltName::OID {
                if let Ok(san) = SubjectAltName::from_der(ext.extn_value.as_bytes()) {
                    for n in &san.0 {
                        match n {
                            GeneralName::DnsName(_) => has_dns_san = true,
                            GeneralName::IpAddress(_) => has_ip_san = true,
                            _ => {}
                        }
                    }
                }
            }
        }
        let common_name = tbs
            .subject
            .0
            .iter()
            .flat_map(|rdn| rdn.0.iter())
            .find(|atv| atv.oid == OID_CN)
            .map(|atv| atv.value.value().to_vec());
        NameFacts {
            has_dns_san,
            has_ip_san,
            common_name,
        }
    }
}

/// libpq's match of a certificate name against the host (`pq_verify_peer_name_matches_
/// certificate_name` and `wildcard_certificate_match`, src/interfaces/libpq/
/// fe-secure-common.c): no embedded NUL; equal ignoring ASCII case, or `*.rest` where `rest`
/// ends the host (ignoring case) and the part the `*` stands for holds no dot.
pub fn libpq_name_matches(name: &[u8], host: &str) -> bool {
    if name.contains(&0) {
        return false;
    }
    let host = host.as_bytes();
    if name.eq_ignore_ascii_case(host) {
        return true;
    }
    if name.len() < 3 || name[0] != b'*' || name[1] != b'.' || name.len() > host.len() {
        return false;
    }
    let suffix = &name[1..];
    let start = host.len() - suffix.len();
    host[start..].eq_ignore_ascii_case(suffix) && !host[..start].contains(&b'.')
}

/// Puts a name on webpki's refusal `e` of `end_entity` where webpki's own is vague (an
/// unknown issuer, a CA certificate as end entity, a version 1 certificate); other errors
/// are returned as they are.
fn explain(end_entity: &CertificateDer<'_>, e: rustls::Error, source: &str) -> rustls::Error {
    let Ok(cert) = x509_cert::Certificate::from_der(end_entity.as_ref()) else {
        return e;
    };
    let tbs = &cert.tbs_certificate;
    let subject = tbs.subject.to_string();
    let is_ca = tbs
        .extensions
        .iter()
        .flatten()
        .filter(|x| x.extn_id == BasicConstraints::OID)
        .any(|x| {
            BasicConstraints::from_der(x.extn_value.as_bytes())
                .map(|b| b.ca)
                .unwrap_or(false)
        });
    let refusal = match &e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            Refusal::UnknownIssuer {
                subject,
                issuer: tbs.issuer.to_string(),
                source: source.to_string(),
            }
        }
        rustls::Error::InvalidCertificate(
            CertificateError::Other(_) | CertificateError::BadEncoding,
        ) if tbs.version == x509_cert::Version::V1 => Refusal::Version1 { subject },
        rustls::Error::InvalidCertificate(CertificateError::Other(_)) if is_ca => {
            Refusal::CaNotTrusted {
                self_signed: tbs.subject == tbs.issuer,
                subject,
                source: source.to_string(),
            }
        }
        _ => return e,
    };
    CertificateError::Other(rustls::OtherError(Arc::new(refusal))).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::tls::{failure_in, reason, TlsFailure};
    use std::process::Command;

    /// Runs a shell command in `dir` (certificates are made with the openssl command line,
    /// as a user would).
    fn sh(dir: &Path, cmd: &str) {
        let out = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(dir)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn cert(dir: &Path, name: &str) -> CertificateDer<'static> {
        read_pem_certs(&dir.join(name)).unwrap().remove(0)
    }

    fn verifier(dir: &Path, trust: &str, names: NameCheck) -> TrustVerifier {
        let certs = read_pem_certs(&dir.join(trust)).unwrap();
        TrustVerifier::new(&certs, certs.clone(), names, trust.into(), provider()).unwrap()
    }

    fn at(secs_from_now: i64) -> UnixTime {
        let now = UnixTime::now().as_secs() as i64;
        UnixTime::since_unix_epoch(std::time::Duration::from_secs((now + secs_from_now) as u64))
    }

    fn name(s: &str) -> ServerName<'static> {
        ServerName::try_from(s.to_string()).unwrap()
    }

    /// PostgreSQL's documented recipes ("Creating Certificates"): a self-signed server
    /// certificate (CA:TRUE, CN only), a root CA and a leaf it signs (made version 3 with an
    /// extension file), another CA, and version 1 and subjectAltName variants.
    fn pki() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        let q = "2>/dev/null";
        sh(p, &format!("openssl req -new -x509 -days 365 -nodes -text -out self.crt -keyout self.key -subj /CN=db.example.com {q}"));
        sh(p, &format!("openssl req -new -x509 -days 365 -nodes -text -out selfsan.crt -keyout selfsan.key -subj /CN=ignored -addext subjectAltName=DNS:db.example.com,IP:127.0.0.1 {q}"));
        sh(p, &format!("openssl req -new -x509 -days 365 -nodes -text -out root.crt -keyout root.key -subj /CN=root.example.com {q}"));
        sh(p, &format!("openssl req -new -x509 -days 365 -nodes -text -out other.crt -keyout other.key -subj /CN=other.example.com {q}"));
        sh(p, &format!("openssl req -new -nodes -text -out leaf.csr -keyout leaf.key -subj /CN=*.example.com {q}"));
        std::fs::write(p.join("v3.ext"), "basicConstraints=CA:FALSE\n").unwrap();
        sh(p, &format!("openssl x509 -req -in leaf.csr -days 365 -CA root.crt -CAkey root.key -CAcreateserial -extfile v3.ext -out leaf.crt {q}"));
        sh(p, &format!("openssl x509 -req -in leaf.csr -days 365 -CA root.crt -CAkey root.key -CAcreateserial -out leafv1.crt {q}"));
        d
    }

    #[test]
    fn trust_file_certificates_as_the_servers_own() {
        let d = pki();
        let p = d.path();
        let own = cert(p, "self.crt");
        let full = verifier(p, "self.crt", NameCheck::SubjectAltNameOrCommonName);
        // The self-signed CA:TRUE certificate as its own root: accepted, the CN checked.
        full.verify(&own, &[], &name("db.example.com"), at(0))
            .unwrap();
        full.verify(&own, &[], &name("DB.Example.COM"), at(0))
            .unwrap();
        let e = full
            .verify(&own, &[], &name("other.example.com"), at(0))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::WrongName, "{e}");
        assert!(reason(&e).contains("CN=db.example.com"), "{}", reason(&e));
        // verify-ca: no name check; the validity period is still checked.
        let ca = verifier(p, "self.crt", NameCheck::Off);
        ca.verify(&own, &[], &name("other.example.com"), at(0))
            .unwrap();
        let e = ca
            .verify(&own, &[], &name("db.example.com"), at(400 * 86400))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::Expired, "{e}");
        assert!(reason(&e).contains("expired on"), "{}", reason(&e));
        let e = ca
            .verify(&own, &[], &name("db.example.com"), at(-86400))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::NotYetValid, "{e}");
        // Object stores check subjectAltName only: the CN-only certificate names nothing.
        let san = verifier(p, "self.crt", NameCheck::SubjectAltName);
        let e = san
            .verify(&own, &[], &name("db.example.com"), at(0))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::WrongName, "{e}");
        let own_san = cert(p, "selfsan.crt");
        let san = verifier(p, "selfsan.crt", NameCheck::SubjectAltName);
        san.verify(&own_san, &[], &name("127.0.0.1"), at(0))
            .unwrap();
        san.verify(&own_san, &[], &name("db.example.com"), at(0))
            .unwrap();
        // A subjectAltName of the host's kind turns the CN off (libpq).
        let full = verifier(p, "selfsan.crt", NameCheck::SubjectAltNameOrCommonName);
        assert!(full.verify(&own_san, &[], &name("ignored"), at(0)).is_err());
    }

    #[test]
    fn everything_else_keeps_webpkis_verdict() {
        let d = pki();
        let p = d.path();
        // A CA and the leaf it signed (CN *.example.com, no subjectAltName).
        let leaf = cert(p, "leaf.crt");
        let full = verifier(p, "root.crt", NameCheck::SubjectAltNameOrCommonName);
        full.verify(&leaf, &[], &name("db.example.com"), at(0))
            .unwrap();
        let e = full
            .verify(&leaf, &[], &name("a.b.example.com"), at(0))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::WrongName, "{e}");
        let e = full
            .verify(&leaf, &[], &name("db.example.com"), at(400 * 86400))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::Expired, "{e}");
        // Another CA: refused, naming the issuer.
        let wrong = verifier(p, "other.crt", NameCheck::Off);
        let e = wrong
            .verify(&leaf, &[], &name("db.example.com"), at(0))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::Untrusted, "{e}");
        assert!(
            reason(&e).contains("CN=root.example.com") && reason(&e).contains("other.crt"),
            "{}",
            reason(&e)
        );
        // A self-signed CA:TRUE certificate that is not in the trust file.
        let e = wrong
            .verify(&cert(p, "self.crt"), &[], &name("db.example.com"), at(0))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::Untrusted, "{e}");
        assert!(reason(&e).contains("self-signed"), "{}", reason(&e));
        // The CA's own certificate presented by a server, while only the CA is trusted: the
        // CA is in the file, so it is the pinned case and accepted (OpenSSL agrees).
        full.verify(&cert(p, "root.crt"), &[], &name("root.example.com"), at(0))
            .unwrap();
        // A version 1 leaf (openssl x509 -req without extensions, OpenSSL 3.0).
        let e = full
            .verify(&cert(p, "leafv1.crt"), &[], &name("db.example.com"), at(0))
            .unwrap_err();
        assert_eq!(TlsFailure::of(&e), TlsFailure::Unsupported, "{e}");
        assert!(reason(&e).contains("version 1"), "{}", reason(&e));
    }

    #[test]
    fn libpq_name_rules() {
        assert!(libpq_name_matches(b"db.example.com", "DB.example.com"));
        assert!(libpq_name_matches(b"*.example.com", "db.example.com"));
        assert!(!libpq_name_matches(b"*.example.com", "a.db.example.com"));
        assert!(!libpq_name_matches(b"*.example.com", "example.com"));
        assert!(!libpq_name_matches(b"db.example.com\0x", "db.example.com"));
        assert!(libpq_name_matches(b"127.0.0.1", "127.0.0.1"));
        assert!(!libpq_name_matches(b"*", "db"));
    }

    #[test]
    fn a_tls_error_is_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let outer = std::io::Error::other(io);
        assert_eq!(failure_in(&outer), Some(TlsFailure::Untrusted));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(failure_in(&plain), None);
    }

    #[test]
    fn configurations_build_for_each_trust() {
        let d = pki();
        let p = d.path();
        client_config(&ServerTrust::Any, None).unwrap();
        client_config(
            &ServerTrust::File {
                path: p.join("self.crt"),
                names: NameCheck::SubjectAltName,
            },
            Some(&ClientIdentity {
                cert: p.join("leaf.crt"),
                key: p.join("leaf.key"),
            }),
        )
        .unwrap();
        let e = client_config(
            &ServerTrust::File {
                path: p.join("v3.ext"),
                names: NameCheck::Off,
            },
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
    }
}

//! What a TLS failure was, told apart for messages and hints: the refusals of pgjet's own
//! certificate checks ([`Refusal`]) and rustls' errors, found anywhere in an error's source
//! chain. The TLS set-up itself is `crate::io::tls`; this part serves the messages and hints of
//! [`crate::error::Error`].
use rustls::pki_types::UnixTime;
use rustls::CertificateError;

/// Why a certificate was refused, where webpki's own error would not say it (carried in
/// `CertificateError::Other`, so the verdict and the TLS alert class stay webpki's).
#[derive(Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Neither the certificate's issuer nor the certificate itself is trusted.
    UnknownIssuer {
        subject: String,
        issuer: String,
        source: String,
    },
    /// A CA certificate (`CA:TRUE`) used as the server's own that is not itself trusted.
    CaNotTrusted {
        subject: String,
        self_signed: bool,
        source: String,
    },
    /// An X.509 version 1 certificate (rustls-webpki takes only version 3 end entities).
    Version1 { subject: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::UnknownIssuer {
                subject,
                issuer,
                source,
            } => write!(
                f,
                "certificate \"{subject}\" is issued by \"{issuer}\", which is not in {source}"
            ),
            Refusal::CaNotTrusted {
                subject,
                self_signed: true,
                source,
            } => write!(
                f,
                "certificate \"{subject}\" is self-signed and is not in {source}"
            ),
            Refusal::CaNotTrusted {
                subject,
                self_signed: false,
                source,
            } => write!(
                f,
                "certificate \"{subject}\" is a CA certificate (CA:TRUE) used as the server's own and is not itself in {source}"
            ),
            Refusal::Version1 { subject } => write!(
                f,
                "certificate \"{subject}\" is an X.509 version 1 certificate; only version 3 server certificates are supported"
            ),
        }
    }
}

// rustls prints `CertificateError::Other` with `{:?}`: the Debug form is the message.
impl std::fmt::Debug for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Refusal {}

/// A TLS failure, in the terms that decide what the user does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFailure {
    /// The certificate does not lead to a trusted one (unknown issuer, a CA or self-signed
    /// certificate not in the trust file, a bad signature in the chain).
    Untrusted,
    /// The certificate's validity period ended.
    Expired,
    /// The certificate's validity period has not begun.
    NotYetValid,
    /// The certificate does not name the host connected to.
    WrongName,
    /// A certificate pgjet cannot use (X.509 version 1, an unsupported algorithm).
    Unsupported,
    /// Another refusal of the certificate (purpose, critical extension, encoding).
    BadCertificate,
    /// The handshake failed otherwise (protocol versions, ciphers, an alert from the server,
    /// such as a refused client certificate).
    Handshake,
}

impl TlsFailure {
    /// The kind of `e`.
    pub fn of(e: &rustls::Error) -> TlsFailure {
        use CertificateError as C;
        let rustls::Error::InvalidCertificate(c) = e else {
            return TlsFailure::Handshake;
        };
        match c {
            C::UnknownIssuer | C::BadSignature => TlsFailure::Untrusted,
            C::Expired | C::ExpiredContext { .. } => TlsFailure::Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => TlsFailure::NotYetValid,
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsFailure::WrongName,
            C::UnsupportedSignatureAlgorithmContext { .. }
            | C::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => TlsFailure::Unsupported,
            C::Other(o) => match (&*o.0 as &(dyn std::error::Error + 'static)).downcast_ref() {
                Some(Refusal::Version1 { .. }) => TlsFailure::Unsupported,
                Some(_) => TlsFailure::Untrusted,
                None => TlsFailure::BadCertificate,
            },
            _ => TlsFailure::BadCertificate,
        }
    }
}

/// The `rustls::Error` in `e`'s source chain, also inside an `std::io::Error` (which
/// tokio-rustls returns and whose `source()` skips the error it wraps).
pub fn tls_error_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    // A chain is a few links long; the bound only guards against a cycle.
    for _ in 0..32 {
        let c = cur?;
        if let Some(t) = c.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        if let Some(inner) = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(t) = tls_error_in(inner) {
                return Some(t);
            }
        }
        cur = c.source();
    }
    None
}

/// The kind of TLS failure in `e`'s source chain, if there is one (see [`tls_error_in`]).
pub fn failure_in(e: &(dyn std::error::Error + 'static)) -> Option<TlsFailure> {
    tls_error_in(e).map(TlsFailure::of)
}

/// One sentence on what failed, for a hint: the certificate and the date, name or trust
/// that refused it.
pub fn reason(e: &rustls::Error) -> String {
    use CertificateError as C;
    let date = |t: &UnixTime| {
        i64::try_from(t.as_secs())
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .map(|d| d.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_else(|| format!("{} (UNIX time)", t.as_secs()))
    };
    match e {
        rustls::Error::InvalidCertificate(C::ExpiredContext { time, not_after }) => format!(
            "the server's certificate expired on {} (it is {} here)",
            date(not_after),
            date(time)
        ),
        rustls::Error::InvalidCertificate(C::NotValidYetContext { time, not_before }) => {
            format!(
                "the server's certificate is not valid before {} (it is {} here)",
                date(not_before),
                date(time)
            )
        }
        rustls::Error::InvalidCertificate(C::NotValidForNameContext {
            expected,
            presented,
        }) => format!(
            "the server's certificate is not valid for the host name \"{}\" (it names {})",
            expected.to_str(),
            if presented.is_empty() {
                "nothing".to_string()
            } else {
                presented.join(", ")
            }
        ),
        rustls::Error::InvalidCertificate(C::Other(o)) => {
            format!("the server's {}", o.0)
        }
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "the server's certificate is not issued by a trusted certificate".into()
        }
        other => format!("the TLS handshake failed: {other}"),
    }
}

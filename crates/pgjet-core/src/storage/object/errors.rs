//! An OpenDAL error as pgjet's [`Error::Storage`]: the fault that decides what the user does
//! next (transient, denied, not found, configuration, conflict, TLS), a short detail, the
//! client's error kept as the cause, and a hint when the answer names the fix (the region).
use crate::error::{Error, StorageFault};
use opendal::ErrorKind;

/// The store's own error inside an error of a body stream (a missing object stays not
/// found); another failure of the stream as a temporary one, which a retry may mend.
pub(super) fn from_io(e: std::io::Error) -> opendal::Error {
    let kind = e.kind();
    match e
        .into_inner()
        .map(|inner| inner.downcast::<opendal::Error>())
    {
        Some(Ok(inner)) => *inner,
        Some(Err(other)) => {
            opendal::Error::new(ErrorKind::Unexpected, "the body could not be read")
                .set_temporary()
                .set_source(std::io::Error::new(kind, other))
        }
        None => opendal::Error::new(ErrorKind::Unexpected, "the body could not be read")
            .set_temporary()
            .set_source(std::io::Error::from(kind)),
    }
}

/// The messages of `e`'s causes, outermost first, joined with ": " (OpenDAL's own message
/// stops at "error sending request"; the cause names the refused certificate or the reset).
pub(super) fn causes(e: &opendal::Error) -> String {
    let mut out = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cur {
        let m = c.to_string();
        if !out.iter().any(|o: &String| o.contains(&m)) {
            out.push(m);
        }
        cur = c.source();
    }
    out.join(": ")
}

/// Maps an OpenDAL error (after its retries) to [`Error::Storage`]: the error's kind, the
/// store's own message (an S3 error code such as `SignatureDoesNotMatch` or `NoSuchBucket`)
/// and the causes; the whole OpenDAL context (URL, headers) goes to the debug log.
pub(super) fn storage_error(op: &'static str, target: String, e: opendal::Error) -> Error {
    tracing::debug!("storage {op} {target}: {e:?}");
    let msg: String = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let tls = crate::error::tls::failure_in(&e);
    let mut fault = match e.kind() {
        ErrorKind::PermissionDenied => StorageFault::Denied,
        ErrorKind::NotFound => StorageFault::NotFound,
        ErrorKind::ConfigInvalid | ErrorKind::Unsupported => StorageFault::Config,
        ErrorKind::AlreadyExists | ErrorKind::ConditionNotMatch | ErrorKind::Conflict => {
            StorageFault::Conflict
        }
        ErrorKind::RateLimited => StorageFault::Transient,
        _ if e.is_temporary() || e.is_persistent() => StorageFault::Transient,
        _ => StorageFault::Other,
    };
    if ["NoSuchBucket", "ContainerNotFound", "bucket does not exist"]
        .iter()
        .any(|m| msg.contains(m))
    {
        fault = StorageFault::NotFound;
    }
    // SSH reports refused keys as an unexpected error; an S3 server that refuses a request's
    // signature or credentials answers 400 or 403 with one of these codes (AWS S3 API
    // reference, "Error responses"), which OpenDAL may report as unexpected.
    if msg.contains("Permission denied") || S3_REFUSALS.iter().any(|c| msg.contains(c)) {
        fault = StorageFault::Denied;
    }
    // A refused certificate; not a TLS error of a running transfer, which may be the network's.
    if let Some(t) = tls.filter(|t| *t != crate::error::tls::TlsFailure::Handshake) {
        fault = StorageFault::Tls(t);
    }
    let mut detail = format!("{}", e.kind());
    if !msg.is_empty() {
        let short: String = msg.chars().take(400).collect();
        detail.push_str(&format!(": {short}"));
    }
    let why = causes(&e);
    if !why.is_empty() {
        detail.push_str(&format!(": {why}"));
    }
    let err = Error::Storage {
        op,
        target,
        fault,
        detail,
        source: Some(Box::new(e)),
    };
    match expected_region(&msg) {
        Some(r) => err.with_hint(format!(
            "the store signs requests for region {r}: set repo1-s3-region={r} (repo-s3-region)"
        )),
        None => err,
    }
}

/// S3 error codes of a request refused for its credentials or signature.
pub(super) const S3_REFUSALS: &[&str] = &[
    "AuthorizationHeaderMalformed",
    "SignatureDoesNotMatch",
    "InvalidAccessKeyId",
    "AccessDenied",
    "InvalidToken",
    "ExpiredToken",
];

/// The region an S3 server says it expects, from its AuthorizationHeaderMalformed message
/// (AWS: `the region 'x' is wrong; expecting 'y'`; versitygw and MinIO quote it with `"`).
pub(super) fn expected_region(msg: &str) -> Option<String> {
    let rest = &msg[msg.find("expecting ")? + "expecting ".len()..];
    let rest = rest.trim_start_matches(['\\', '"', '\'']);
    let region: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    (msg.contains("region") && !region.is_empty()).then_some(region)
}

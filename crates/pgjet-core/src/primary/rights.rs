//! What the role's rights allow, per transport, as `check` reports it: a line per transport
//! ([`crate::pg::privileges::Rights`]), each missing right with the statement that grants it.
use crate::error::Error;
use crate::options::Transport;
use crate::pg::privileges::Copying;

/// A line per transport on what the role may run ([`crate::pg::privileges::Rights`]): the
/// stream (REPLICATION only), this host's files when the server runs here, the ranges; each
/// missing right with its fix, `MISSING:` for the transport asked for (for `auto`, only
/// REPLICATION, which every transport needs), `note:` for the others. Returns the lines, and
/// the failure when the transport asked for cannot run.
pub fn rights_lines(
    rights: &crate::pg::privileges::Rights,
    wanted: Transport,
    local: bool,
) -> (Vec<String>, Option<Error>) {
    let mut lines = Vec::new();
    let mut transports = vec![(Transport::Basebackup, Copying::Stream)];
    if local {
        transports.push((Transport::Local, Copying::LocalFiles));
    }
    transports.push((Transport::Libpq, Copying::Ranges));
    let all_ok = transports.iter().all(|(_, how)| rights.may(*how));
    if all_ok {
        lines.push("the role has every right pgjet needs".into());
        return (lines, None);
    }
    let mut failing = 0;
    for (t, how) in transports {
        let missing = rights.missing_for(how);
        let name = t.as_str();
        if missing.is_empty() {
            lines.push(format!("--transport {name}: the role has what it needs"));
            continue;
        }
        for m in &missing {
            let fatal = if wanted == Transport::Auto {
                m.what.starts_with("REPLICATION")
            } else {
                t == wanted
            };
            if fatal {
                failing += 1;
            }
            let tag = if fatal { "MISSING" } else { "note" };
            lines.push(format!(
                "{tag}: --transport {name}: {} -- fix: {}",
                m.what, m.fix
            ));
        }
    }
    if wanted == Transport::Auto && rights.replication {
        lines.push(
            "transport auto: the role may stream (BASE_BACKUP); it copies files only with the rights above".into(),
        );
    }
    let failure = (failing > 0).then(|| {
        Error::Config(format!(
            "the role lacks what --transport {} needs; run the statements above on the primary as a superuser",
            wanted.as_str()
        ))
    });
    (lines, failure)
}

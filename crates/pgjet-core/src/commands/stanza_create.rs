//! `stanza-create`: records the cluster's identity in the repository.
use crate::error::{Error, Result};
use crate::options::Settings;
use crate::primary::{check_pg_path, local_data_directory, primary_target};
use crate::repo::open::open_stanzas;
use crate::repo::{self, StanzaInfo, REPO_FORMAT};

/// Runs `stanza-create`. Idempotent for the same cluster; refuses a stanza that belongs to
/// another cluster (different system identifier or major version).
pub fn run(s: &Settings) -> Result<String> {
    let stanza = s.stanza()?;
    if stanza.is_empty() || stanza.contains('/') || stanza.starts_with('.') {
        return Err(Error::Config(format!(
            "stanza name '{stanza}' is not valid"
        )));
    }
    // Every repository in scope opens (credentials, bucket) before anything is written.
    let stanzas = open_stanzas(&s.repo_set)?;
    // With --source, a role pg_hba.conf lets in for replication only is asked over a
    // replication connection (remote/control.rs), which gives no catalog version: that of
    // the major's release is taken, and each backup checks it against its pg_control.
    let (ctl, mut info) = crate::remote::control::connect_control(
        &primary_target(&s.primary)?,
        s.primary.source.is_some(),
    )?;
    if info.catalog_version == 0 {
        info.catalog_version = match crate::pg::control::released_catalog_version(info.version_num)
        {
            Some(v) => v,
            None => {
                ctl.close();
                return Err(Error::Unsafe(format!(
                    "the role may connect for replication only, and the catalog version of PostgreSQL {} is not known to this pgjet: run stanza-create once with a role pg_hba.conf lets open an ordinary session",
                    info.major()
                )));
            }
        };
    }
    let local = match s.primary.transport {
        crate::options::Transport::Libpq | crate::options::Transport::Basebackup => false,
        _ => s.primary.source.is_none() || local_data_directory(&info).is_some(),
    };
    if local {
        check_pg_path(s.pg_path()?, &info)?;
    }
    ctl.close();
    let si = StanzaInfo {
        format: REPO_FORMAT,
        stanza: stanza.into(),
        system_identifier: info.system_identifier,
        pg_version: info.major(),
        pg_version_num: info.version_num,
        catalog_version: info.catalog_version,
        created: crate::repo::rfc3339(chrono::Utc::now()),
        wal_segment_size: info.wal_segment_size,
    };
    // Refuse before writing anywhere if any repository holds this stanza for another cluster.
    let mut existing = Vec::new();
    for st in &stanzas {
        if st.exists()? {
            let n = st.repo();
            repo::check_same_cluster(&st.info()?, info.system_identifier, &info.major())
                .map_err(|e| Error::Repo(format!("repo{n}")).because(e))?;
            existing.push(n);
        }
    }
    let several = stanzas.len() > 1;
    let mut lines = Vec::new();
    for st in &stanzas {
        let n = &st.repo();
        let at = if several {
            format!(" in repo{n}")
        } else {
            String::new()
        };
        if existing.contains(n) {
            lines.push(format!(
                "stanza '{stanza}' already exists for this cluster{at}"
            ));
            continue;
        }
        st.create(&si)?;
        lines.push(format!(
            "stanza '{stanza}' created{at} (system identifier {}, PostgreSQL {})",
            info.system_identifier,
            info.major()
        ));
    }
    Ok(lines.join("\n"))
}

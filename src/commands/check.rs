//! `check`: configuration, cluster and repository agree.
use super::*;
use crate::repo;
use crate::storage::Storage;

/// Runs `check`: connects, compares --pg-path with data_directory, the cluster's identity
/// with the stanza's, and writes and removes a file in the stanza to prove the repository
/// is writable. Returns a line per check.
pub fn run(s: &Settings) -> Result<Vec<String>> {
    let stanza = s.stanza()?;
    let store = open_repo(s)?;
    let sess = connect_local(s)?;
    let info = sess.server_info()?;
    let mut lines = vec![format!(
        "connected to PostgreSQL {} ({})",
        info.major(),
        sess.target()
    )];
    let pgdata = check_pg_path(s.pg_path()?, &info)?;
    lines.push(format!(
        "--pg-path {} is the data_directory",
        pgdata.display()
    ));
    let st = repo::read_stanza(&store, stanza)?;
    repo::check_same_cluster(&st, info.system_identifier, &info.major())?;
    lines.push(format!(
        "stanza '{stanza}' matches system identifier {}",
        info.system_identifier
    ));
    let probe = format!("{stanza}/check.{}", std::process::id());
    store.put_durable(&probe, b"pgjet check\n")?;
    fs::remove_file(s.repo_path()?.join(&probe)).map_err(|e| {
        Error::io(
            "remove",
            s.repo_path().unwrap_or(Path::new("")).join(&probe),
            e,
        )
    })?;
    lines.push(format!(
        "repository {} is writable",
        s.repo_path()?.display()
    ));
    if !info.data_checksums {
        lines.push("note: data checksums are off; pages cannot be validated".into());
    }
    sess.close();
    Ok(lines)
}

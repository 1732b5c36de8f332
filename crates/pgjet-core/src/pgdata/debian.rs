//! Debian's cluster layout (postgresql-common, on Debian and Ubuntu): a cluster
//! `VERSION/NAME` keeps its `postgresql.conf`, `pg_hba.conf` and `pg_ident.conf` in
//! `/etc/postgresql/VERSION/NAME`, outside its data directory (which that `postgresql.conf`
//! names in `data_directory`), and is started with `pg_ctlcluster VERSION NAME start`
//! (postgresql-common's pg_createcluster(1) and pg_ctlcluster(1)). Such a data directory, and
//! so its backup or copy, has no `postgresql.conf`: `pg_ctl -D DIR start` cannot start it.
use crate::error::{Error, Result};
use crate::pgdata::own_settings::OwnSettings;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where postgresql-common keeps its clusters' configuration.
pub const ETC: &str = "/etc/postgresql";

/// A Debian cluster: `version` ("15") and `name` ("main"), as pg_lsclusters shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebianCluster {
    pub version: String,
    pub name: String,
}

impl DebianCluster {
    /// The Debian cluster whose `postgresql.conf` in [`ETC`] names `data_dir` as its
    /// `data_directory` (compared after resolving symbolic links), if any.
    pub fn of(data_dir: &Path) -> Option<DebianCluster> {
        cluster_in(Path::new(ETC), data_dir)
    }

    /// Starts it: `pg_ctlcluster VERSION NAME start`, run as the calling user (the
    /// cluster's owner), with `-o "-p PORT"` when a port is given. Errors: pg_ctlcluster
    /// missing or failing (its log is /var/log/postgresql/postgresql-VERSION-NAME.log).
    pub fn start(&self, port: Option<u16>) -> Result<()> {
        let mut cmd = Command::new("pg_ctlcluster");
        if let Some(p) = port {
            cmd.arg("-o").arg(format!("-p {p}"));
        }
        cmd.args([&self.version, &self.name, "start"]);
        let status = cmd
            .status()
            .map_err(|e| Error::io("run pg_ctlcluster", Path::new("pg_ctlcluster"), e))?;
        if !status.success() {
            return Err(Error::Other(format!(
                "pg_ctlcluster {} {} start failed (see /var/log/postgresql/postgresql-{}-{}.log)",
                self.version, self.name, self.version, self.name
            )));
        }
        Ok(())
    }
}

fn cluster_in(etc: &Path, data_dir: &Path) -> Option<DebianCluster> {
    let want = resolved(data_dir);
    for version in subdirs(etc) {
        for cluster in subdirs(&version) {
            let Ok(text) = fs::read_to_string(cluster.join("postgresql.conf")) else {
                continue;
            };
            let Some(dir) = OwnSettings::parse(&text).get("data_directory") else {
                continue;
            };
            if resolved(Path::new(&dir)) == want {
                return Some(DebianCluster {
                    version: file_name(&version),
                    name: file_name(&cluster),
                });
            }
        }
    }
    None
}

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

fn resolved(p: &Path) -> PathBuf {
    fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The configuration files PostgreSQL reads from a data directory that `dir` lacks:
/// `postgresql.conf`, `pg_hba.conf`, `pg_ident.conf` (a copy of a cluster that keeps them
/// elsewhere, as Debian's do). Empty when all are there.
pub fn missing_config_files(dir: &Path) -> Vec<&'static str> {
    ["postgresql.conf", "pg_hba.conf", "pg_ident.conf"]
        .into_iter()
        .filter(|f| !dir.join(f).exists())
        .collect()
}

/// After a restore into `dir`: logs how to start the copy when that needs more than
/// `pg_ctl -D DIR start`. A Debian cluster's data directory: `pg_ctlcluster VERSION NAME
/// start`. A copy without its config files (its source keeps them elsewhere, so they are
/// not in the backup): a warning naming them and how to give the copy its own, as Barman
/// does for the same case.
pub fn say_how_to_start(dir: &Path) {
    if let Some(c) = DebianCluster::of(dir) {
        tracing::info!(
            "{} is the data directory of Debian's cluster {}/{}: start it with pg_ctlcluster {} {} start",
            dir.display(),
            c.version,
            c.name,
            c.version,
            c.name
        );
        return;
    }
    let missing = missing_config_files(dir);
    // A postgresql.conf may name its pg_hba.conf and pg_ident.conf elsewhere.
    if missing.contains(&"postgresql.conf") {
        tracing::warn!(
            "{} has no {}: the source cluster keeps its configuration outside its data directory (as Debian's do, in {ETC}), so the backup holds none; give the copy its own before starting it (on Debian: pg_createcluster VERSION NAME -d {} before the restore, then empty the directory; elsewhere: copy them in and set port and paths)",
            dir.display(),
            missing.join(", "),
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_is_found_by_the_cluster_config_naming_it() {
        let etc = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        let conf = etc.path().join("15/standby");
        fs::create_dir_all(&conf).unwrap();
        fs::create_dir_all(etc.path().join("15/main")).unwrap();
        fs::write(
            etc.path().join("15/main/postgresql.conf"),
            "data_directory = '/var/lib/postgresql/15/main'\n",
        )
        .unwrap();
        fs::write(
            conf.join("postgresql.conf"),
            format!(
                "# comment\ndata_directory = '{}/'\t# use data in another directory\nport = 5433\n",
                data.path().display()
            ),
        )
        .unwrap();
        assert_eq!(
            cluster_in(etc.path(), data.path()),
            Some(DebianCluster {
                version: "15".into(),
                name: "standby".into()
            })
        );
        let other = tempfile::tempdir().unwrap();
        assert_eq!(cluster_in(etc.path(), other.path()), None);
        assert_eq!(cluster_in(&etc.path().join("nothing"), data.path()), None);
    }

    #[test]
    fn a_copy_without_its_config_files_names_them() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("pg_hba.conf"), "").unwrap();
        assert_eq!(
            missing_config_files(d.path()),
            vec!["postgresql.conf", "pg_ident.conf"]
        );
    }
}

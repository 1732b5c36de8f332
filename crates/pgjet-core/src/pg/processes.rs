//! The processes of a cluster running on this host, seen through `/proc`: its postmaster
//! (the first line of `postmaster.pid`, src/backend/utils/init/miscinit.c) and the children
//! known by their process titles (set with init_ps_display / set_ps_display,
//! src/backend/utils/misc/ps_status.c, while `update_process_title` is on, the default).
use std::fs;
use std::path::Path;

/// The PID of the postmaster of `data_dir`, from the first line of its `postmaster.pid`.
/// None when there is no such file (the cluster is down) or it does not start with a PID.
pub fn postmaster_pid(data_dir: &Path) -> Option<u32> {
    let text = fs::read_to_string(data_dir.join("postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// The parent PID in the text of `/proc/<pid>/stat` (its fourth field, after the command
/// name in parentheses, which may itself hold spaces and parentheses).
fn parent_pid(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The PID of the first child of `data_dir`'s postmaster whose process title
/// (`/proc/<pid>/cmdline`, NUL bytes read as spaces) satisfies `title`. None when the
/// cluster is down, has no such child, or runs where this process cannot see it.
pub fn postmaster_child(data_dir: &Path, title: impl Fn(&str) -> bool) -> Option<u32> {
    let postmaster = postmaster_pid(data_dir)?;
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parent_pid(&stat) != Some(postmaster) {
            continue;
        }
        if fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| title(&String::from_utf8_lossy(&c).replace('\0', " ")))
        {
            return Some(pid);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_comes_after_the_command_name() {
        assert_eq!(
            parent_pid("4242 (postgres: a (b)) S 17 4242 4242 0"),
            Some(17)
        );
        assert_eq!(parent_pid("garbage"), None);
    }

    #[test]
    fn no_postmaster_pid_means_no_child() {
        let dir = std::env::temp_dir().join(format!("pgjet-processes-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(postmaster_pid(&dir), None);
        assert_eq!(postmaster_child(&dir, |_| true), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}

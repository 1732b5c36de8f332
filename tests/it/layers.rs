//! The house rule of docs/architecture.md, checked in both crates: a room imports only from
//! the floors below it, never from its own floor's other rooms or from above. Test code
//! (`#[cfg(test)]` modules and `tests.rs` files) and comments are left out. The core library
//! (crates/pgjet-core) stands below the binary (crates/pgjet) as a whole: it names no clap
//! and never ends the process.
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The core library's floors, bottom first; rooms on one floor do not import each other.
const FLOORS: &[&[&str]] = &[
    &["error"],
    &["io"],
    &["codec", "pg"],
    &["storage"],
    &["options", "transfer"],
    &["remote"],
    &["repo"],
    &["primary", "pgdata", "archive"],
    &["commands"],
];

/// The binary's floors (crates/pgjet, its modules), bottom first; `main` stands above them.
const BINARY_FLOORS: &[&[&str]] = &[&["manual", "signals", "term"], &["cli"]];

fn floor(floors: &[&[&str]], room: &str) -> Option<usize> {
    floors.iter().position(|f| f.contains(&room))
}

/// The rooms `text` (one source file) imports through `crate::<room>`, outside comments and
/// test modules.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let mut rest = t;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let room: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(room);
        }
    }
    out
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, files);
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
}

/// The imports of `dir`'s rooms that do not run down `floors`; `top` names the files that
/// stand above every room (crate roots, binaries).
fn wrong_imports(dir: &Path, floors: &[&[&str]], top: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    walk(dir, &mut files);
    let mut wrong = Vec::new();
    for f in files {
        let rel = f.strip_prefix(dir).unwrap();
        let room = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        let Some(mine) = floor(floors, &room) else {
            assert!(
                top.contains(&room.as_str()),
                "{} is in no floor of tests/it/layers.rs: add its room to FLOORS (or BINARY_FLOORS) and to docs/architecture.md",
                f.display()
            );
            continue;
        };
        let name = rel.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        for used in imports(&fs::read_to_string(&f).unwrap()) {
            if used == room {
                continue;
            }
            match floor(floors, &used) {
                Some(theirs) if theirs < mine => {}
                _ => wrong.push(format!(
                    "{} (room {room}) imports crate::{used}",
                    f.display()
                )),
            }
        }
    }
    wrong
}

#[test]
fn imports_only_run_down() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = wrong_imports(&root.join("crates/pgjet-core/src"), FLOORS, &["lib"]);
    wrong.extend(wrong_imports(
        &root.join("crates/pgjet"),
        BINARY_FLOORS,
        &["main", "cli_tests"],
    ));
    assert!(
        wrong.is_empty(),
        "imports that do not run down (see docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

/// The core library stands without the command line: no clap in its dependencies or its
/// code, no process exit, and it never names the binary's crate.
#[test]
fn core_has_no_command_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = fs::read_to_string(root.join("crates/pgjet-core/Cargo.toml")).unwrap();
    assert!(
        !manifest.lines().any(|l| l.starts_with("clap")),
        "crates/pgjet-core/Cargo.toml depends on clap"
    );
    let mut files = Vec::new();
    walk(&root.join("crates/pgjet-core/src"), &mut files);
    let mut found = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            for word in ["clap::", "process::exit", "pgjet::"] {
                if t.contains(word) {
                    found.push(format!("{}:{}: {word}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core names the command line:\n{}",
        found.join("\n")
    );
}

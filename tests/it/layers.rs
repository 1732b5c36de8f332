//! The house rule of docs/architecture.md, checked: a room of `src/` imports only from the
//! floors below it, never from its own floor's other rooms or from above. Test code
//! (`#[cfg(test)]` modules and `tests.rs` files) and comments are left out.
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The floors, bottom first; rooms on one floor do not import each other.
const FLOORS: &[&[&str]] = &[
    &["error"],
    &["io"],
    &["codec", "pg"],
    &["options"],
    &["storage", "transfer"],
    &["remote"],
    &["repo"],
    &["primary", "pgdata", "archive"],
    &["commands"],
];

fn floor(room: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&room))
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

#[test]
fn imports_only_run_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &mut files);
    let mut wrong = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let room = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        // The binaries and the crate root stand above every room.
        let Some(mine) = floor(&room) else {
            assert!(
                ["main", "lib", "term", "bin"].contains(&room.as_str()),
                "{} is in no floor of tests/it/layers.rs: add its room to FLOORS and to docs/architecture.md",
                rel.display()
            );
            continue;
        };
        if rel.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        for used in imports(&fs::read_to_string(&f).unwrap()) {
            if used == room {
                continue;
            }
            match floor(&used) {
                Some(theirs) if theirs < mine => {}
                _ => wrong.push(format!(
                    "{} (room {room}) imports crate::{used}",
                    rel.display()
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports that do not run down (see docs/architecture.md):\n{}",
        wrong.join("\n")
    );
}

//! `info --format pgbackrest` as text: pgBackRest 2.45's human report
//! (src/command/info/info.c) of the objects [`super::info_pgbackrest::collect`]
//! returns, so a DBA reads the report they know.
use super::info_pgbackrest::OTHER;
use serde_json::Value;

/// pgBackRest's text report of the same objects (`info --format pgbackrest` without
/// `--output json`): status, the archive's range and each backup's times, WAL and sizes.
pub fn render_text(stanzas: &[Value]) -> String {
    let mut t = String::new();
    let size = |v: &Value| -> String {
        let b = v.as_u64().unwrap_or(0) as f64;
        match b {
            b if b >= (1u64 << 30) as f64 => format!("{:.1}GB", b / (1u64 << 30) as f64),
            b if b >= (1u64 << 20) as f64 => format!("{:.1}MB", b / (1u64 << 20) as f64),
            b if b >= 1024.0 => format!("{:.1}KB", b / 1024.0),
            b => format!("{b}B"),
        }
    };
    let time = |v: &Value| -> String {
        chrono::DateTime::from_timestamp(v.as_i64().unwrap_or(0), 0)
            .map(|d| d.format("%Y-%m-%d %H:%M:%S+00").to_string())
            .unwrap_or_default()
    };
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    for st in stanzas {
        t.push_str(&format!("stanza: {}\n", text(&st["name"])));
        let code = st["status"]["code"].as_i64().unwrap_or(OTHER);
        let held = st["status"]["lock"]["backup"]["held"].as_bool() == Some(true);
        let status = match (code, held) {
            (0, false) => "ok".to_string(),
            (0, true) => "ok (backup/expire running)".to_string(),
            (4, _) => "mixed".to_string(),
            _ => format!("error ({})", text(&st["status"]["message"])),
        };
        t.push_str(&format!(
            "    status: {status}\n    cipher: {}\n",
            text(&st["cipher"])
        ));
        for r in st["repo"].as_array().into_iter().flatten() {
            if r["status"]["code"].as_i64() == Some(OTHER) {
                t.push_str(&format!(
                    "        repo{}: error (other)\n                {}\n",
                    r["key"],
                    text(&r["status"]["message"])
                ));
            }
        }
        if st["db"].as_array().is_none_or(|d| d.is_empty()) {
            t.push('\n');
            continue;
        }
        t.push_str("\n    db (current)\n");
        for a in st["archive"].as_array().into_iter().flatten() {
            if a["min"].is_string() {
                t.push_str(&format!(
                    "        wal archive min/max ({}): {}/{}\n",
                    text(&a["id"]).trim_end_matches("-1"),
                    text(&a["min"]),
                    text(&a["max"])
                ));
            }
        }
        for b in st["backup"].as_array().into_iter().flatten() {
            t.push_str(&format!(
                "\n        {} backup: {}\n            timestamp start/stop: {} / {}\n",
                text(&b["type"]),
                text(&b["label"]),
                time(&b["timestamp"]["start"]),
                time(&b["timestamp"]["stop"])
            ));
            if b["archive"]["start"].is_string() {
                t.push_str(&format!(
                    "            wal start/stop: {} / {}\n",
                    text(&b["archive"]["start"]),
                    text(&b["archive"]["stop"])
                ));
            }
            t.push_str(&format!(
                "            database size: {}, database backup size: {}\n            repo{}: backup set size: {}, backup size: {}\n",
                size(&b["info"]["size"]),
                size(&b["info"]["delta"]),
                b["database"]["repo-key"],
                size(&b["info"]["repository"]["size"]),
                size(&b["info"]["repository"]["delta"])
            ));
            if let Some(refs) = b["reference"].as_array() {
                let list: Vec<String> = refs.iter().map(text).collect();
                t.push_str(&format!(
                    "            backup reference list: {}\n",
                    list.join(", ")
                ));
            }
        }
    }
    t
}

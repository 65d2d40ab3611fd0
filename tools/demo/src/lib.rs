//! What both demos share: kubectl-like tables and a narrator that stamps each line with the
//! time since the start.

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Rows aligned in columns three spaces apart, as kubectl prints them; "No resources found"
/// for none.
pub fn columns(header: &[&str], rows: Vec<Vec<String>>) -> Vec<String> {
    if rows.is_empty() {
        return vec!["No resources found".to_string()];
    }
    let all: Vec<Vec<String>> = std::iter::once(header.iter().map(|h| h.to_string()).collect())
        .chain(rows)
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| all.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    all.iter()
        .map(|r| {
            r.iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect::<Vec<_>>()
                .join("   ")
                .trim_end()
                .to_string()
        })
        .collect()
}

/// An age as kubectl prints it: `42s`, `3m12s`, `2h5m`.
pub fn age(created: Option<&Time>, now: Timestamp) -> String {
    let Some(created) = created else {
        return "<unknown>".into();
    };
    let secs = now.as_second().saturating_sub(created.0.as_second()).max(0);
    match secs {
        0..120 => format!("{secs}s"),
        120..600 => format!("{}m{}s", secs / 60, secs % 60),
        600..7200 => format!("{}m", secs / 60),
        _ => format!("{}h{}m", secs / 3600, (secs % 3600) / 60),
    }
}

/// Prints lines stamped with the time since the demo started, and remembers what it last said
/// about each object so that it speaks only of changes.
#[derive(Debug)]
pub struct Narrator {
    started: Instant,
    said: BTreeMap<String, String>,
}

impl Narrator {
    /// A narrator whose clock starts now.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            said: BTreeMap::new(),
        }
    }

    /// Says `msg` now.
    pub fn say(&self, msg: &str) {
        println!("[{:>5.1}s] {msg}", self.started.elapsed().as_secs_f32());
    }

    /// Says `msg` unless `line` is what was last said about `key`.
    pub fn say_if_changed(&mut self, key: String, line: &str, msg: &str) {
        if self.said.insert(key, line.to_string()).as_deref() != Some(line) {
            self.say(msg);
        }
    }
}

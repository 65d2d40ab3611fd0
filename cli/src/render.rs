//! The report as text for a terminal.

use std::fmt::Write;

use crate::report::{Phase, Report, format_time};

/// The report as lines of text, advice last.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    let owner = r
        .owner
        .as_deref()
        .map(|o| format!(" ({o})"))
        .unwrap_or_default();
    let _ = writeln!(out, "Workload {}/{}{owner}", r.namespace, r.workload);
    let phase = match r.phase {
        Phase::Finished => "finished",
        Phase::Deactivated => "deactivated",
        Phase::Admitted => "admitted",
        Phase::WaitingForChecks => "holding quota, waiting for admission checks",
        Phase::Requeued => "evicted or requeued, waiting to be considered again",
        Phase::WaitingForQuota => "waiting for quota",
    };
    let _ = writeln!(out, "  Status:  {phase}");
    let _ = writeln!(
        out,
        "  Queue:   {} -> ClusterQueue {}",
        r.local_queue.as_deref().unwrap_or("(none)"),
        r.cluster_queue.as_deref().unwrap_or("(unknown)")
    );
    if r.quota.reserved {
        let flavors: Vec<String> = r
            .quota
            .flavors
            .iter()
            .map(|(pod_set, by_resource)| {
                let each: Vec<String> = by_resource
                    .iter()
                    .map(|(res, flavor)| format!("{res}={flavor}"))
                    .collect();
                format!("{pod_set}: {}", each.join(","))
            })
            .collect();
        let _ = writeln!(out, "  Quota:   reserved ({})", flavors.join("; "));
    } else {
        let why = r
            .quota
            .waiting_reason
            .as_deref()
            .unwrap_or("no reason given yet");
        let _ = writeln!(out, "  Quota:   not reserved: {why}");
    }
    let evicted: i32 = r
        .evictions
        .iter()
        .fold(0, |sum, e| sum.saturating_add(e.count));
    if evicted > 0 {
        let by: Vec<String> = r
            .evictions
            .iter()
            .map(|e| {
                let why = if e.underlying_cause.is_empty() {
                    e.reason.clone()
                } else {
                    format!("{} ({})", e.reason, e.underlying_cause)
                };
                format!("{why} {}", e.count)
            })
            .collect();
        let _ = writeln!(out, "  Evicted: {evicted} time(s): {}", by.join(", "));
    }
    if let Some(at) = r.requeue.as_ref().and_then(|q| q.at) {
        let _ = writeln!(out, "  Requeue: at {}", format_time(at));
    }
    checks(&mut out, r);
    rest(&mut out, r);
    let _ = writeln!(out, "Advice: {}", r.advice);
    out
}

/// The admission checks, one paragraph each.
fn checks(out: &mut String, r: &Report) {
    if !r.checks.is_empty() {
        let _ = writeln!(out, "Admission checks:");
    }
    for c in &r.checks {
        let active = match c.active {
            Some(true) => "Active".to_string(),
            Some(false) => format!(
                "inactive: {}",
                c.active_message.as_deref().unwrap_or("no reason given")
            ),
            None if c.controller.is_some() => "no Active condition".into(),
            None => "AdmissionCheck not found".into(),
        };
        let controller = c.controller.as_deref().unwrap_or("?");
        let _ = writeln!(out, "  {} ({controller}; {active})", c.name);
        let since = c
            .since
            .map(|t| format!(" since {}", format_time(t)))
            .unwrap_or_default();
        let message = if c.message.is_empty() {
            "(no message)"
        } else {
            &c.message
        };
        let _ = writeln!(out, "    {}{since}: {message}", c.state);
        let limit = c
            .retry_limit
            .map(|l| format!(" of {}", l.saturating_add(1)))
            .unwrap_or_default();
        let mut line = format!("    attempt {}{limit}", c.attempt);
        if let Some(n) = c.retry_count {
            let _ = write!(line, " (Kueue's retryCount {n})");
        }
        if let Some(at) = c.next_attempt_at {
            let own = match c.delay_ends_at {
                Some(own) if own != at => {
                    format!(" (its own delay ends at {})", format_time(own))
                }
                _ => String::new(),
            };
            let held = if c.quota_held_until_retry {
                "; quota held until then"
            } else {
                ""
            };
            let _ = write!(line, "; next attempt at {}{own}{held}", format_time(at));
        }
        let _ = writeln!(out, "{line}");
    }
}

/// Requests, templates and events.
fn rest(out: &mut String, r: &Report) {
    if !r.provisioning_requests.is_empty() {
        let _ = writeln!(out, "ProvisioningRequests:");
    }
    for p in &r.provisioning_requests {
        let conditions = if p.conditions.is_empty() {
            "no conditions yet".to_string()
        } else {
            p.conditions.join(", ")
        };
        let _ = writeln!(out, "  {}: {conditions}", p.name);
    }
    if !r.pod_templates.is_empty() {
        let _ = writeln!(out, "PodTemplates: {}", r.pod_templates.join(", "));
    }
    if !r.events.is_empty() {
        let _ = writeln!(out, "Recent events:");
    }
    for e in &r.events {
        let at = e.time.map(format_time).unwrap_or_else(|| "-".into());
        let times = if e.count > 1 {
            format!(" (x{})", e.count)
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {at} {} {}{times}: {}", e.type_, e.reason, e.note);
    }
}

//! Names of the ProvisioningRequests and PodTemplates this controller creates.
//!
//! Kueue's convention is kept while it fits: a request is `<workload>-<check>-<attempt>` and its
//! PodTemplates are `ppt-<request>-<podset>`. Kubernetes object names are DNS subdomains of at
//! most [`MAX_NAME_LEN`] characters, so a name that would be longer is shortened: its beginning
//! is kept, cut back to a letter or digit, and a hash of the whole unshortened part is appended.
//! Unlike Kueue's built-in controller, a request name always keeps its `-<attempt>` suffix, so
//! [`attempt_of`] reads the attempt back from any name, long or short.
//!
//! Every function here assumes its inputs are valid DNS subdomains (the names of Workloads,
//! AdmissionChecks and podsets are); the results then are too.

use sha2::{Digest, Sha256};

/// Longest name of a Kubernetes object (a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// First part of the name of every PodTemplate, as in Kueue.
pub const POD_TEMPLATE_PREFIX: &str = "ppt";

/// Hex characters of the hash that makes a shortened name unique.
const HASH_LEN: usize = 10;

/// The name of attempt `attempt` of the ProvisioningRequest of `check` for `workload`.
///
/// `<workload>-<check>-<attempt>` when that fits in [`MAX_NAME_LEN`] characters; otherwise the
/// `<workload>-<check>` part is shortened and followed by a hash of it, and the name still ends
/// with `-<attempt>`.
pub fn request_name(workload: &str, check: &str, attempt: u32) -> String {
    with_attempt(format!("{workload}-{check}"), attempt)
}

/// The names a request of `check` for the Workload `workload` (uid `workload_uid`) may take on
/// attempt `attempt`, in order of preference: [`request_name`], then [`alternative_request_name`].
/// The controller uses the first that no foreign object holds, and looks for its own request
/// under both, so the choice survives restarts.
pub fn request_names(workload: &str, workload_uid: &str, check: &str, attempt: u32) -> [String; 2] {
    [
        request_name(workload, check, attempt),
        alternative_request_name(workload, workload_uid, check, attempt),
    ]
}

/// The name used when [`request_name`] is held by an object that is not ours (Kueue's built-in
/// check, another controller, a user, or another Workload whose name and check concatenate to
/// the same string): `<workload>-<check>-<hash>-<attempt>`, the hash of the Workload's uid and
/// the check. Shortened like [`request_name`], always ending with `-<attempt>` (so [`attempt_of`]
/// reads it). Deterministic: a restarted controller computes the same name.
pub fn alternative_request_name(
    workload: &str,
    workload_uid: &str,
    check: &str,
    attempt: u32,
) -> String {
    let base = format!(
        "{workload}-{check}-{}",
        short_hash(&format!("{workload_uid}/{check}"))
    );
    with_attempt(base, attempt)
}

/// `<base>-<attempt>`, with `base` shortened when the whole would exceed [`MAX_NAME_LEN`]: the
/// attempt suffix is always kept whole, so [`attempt_of`] reads it back.
fn with_attempt(base: String, attempt: u32) -> String {
    let suffix = format!("-{attempt}");
    if base.len() + suffix.len() <= MAX_NAME_LEN {
        return base + &suffix;
    }
    let mut name = shorten(&base, MAX_NAME_LEN - suffix.len());
    name.push_str(&suffix);
    name
}

/// Whether two checks can give two Workloads the same request name: `<w1>-<a>-<n>` equals
/// `<w2>-<b>-<n>` for some Workload names exactly when the checks differ and one name ends with
/// `-` and the other (`a` with Workload `x-b`, `b-a` with Workload `x`).
pub fn checks_may_share_names(a: &str, b: &str) -> bool {
    a != b && (a.ends_with(&format!("-{b}")) || b.ends_with(&format!("-{a}")))
}

/// The attempt number a request name ends with (`-<attempt>`), for names made by
/// [`request_name`], shortened or not. `None` when the name does not end that way.
pub fn attempt_of(request_name: &str) -> Option<u32> {
    let (_, digits) = request_name.rsplit_once('-')?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if canonical { digits.parse().ok() } else { None }
}

/// The attempt of `request_name` when it is one of the names [`request_name`] gives `workload`
/// and `check`, `None` otherwise (another Workload's or check's request, or a foreign name).
///
/// Exact even when names are shortened, since it recomputes the name.
pub fn request_attempt(request_name: &str, workload: &str, check: &str) -> Option<u32> {
    attempt_of(request_name)
        .filter(|&attempt| self::request_name(workload, check, attempt) == request_name)
}

/// The name of the PodTemplate of podset `pod_set` in the request named `request`:
/// `ppt-<request>-<podset>`, shortened with a hash when longer than [`MAX_NAME_LEN`].
pub fn pod_template_name(request: &str, pod_set: &str) -> String {
    let full = format!("{POD_TEMPLATE_PREFIX}-{request}-{pod_set}");
    if full.len() <= MAX_NAME_LEN {
        full
    } else {
        shorten(&full, MAX_NAME_LEN)
    }
}

/// `full` (longer than `max`) cut to at most `max` characters: its beginning, ending with a
/// letter or digit, then `-` and a hash of all of `full`.
fn shorten(full: &str, max: usize) -> String {
    let hash = short_hash(full);
    let mut keep = max.saturating_sub(HASH_LEN + 1).min(full.len());
    while !full.is_char_boundary(keep) {
        keep -= 1;
    }
    // A cut may end on '-' or '.', which must not end a name nor precede the '-' added here.
    let prefix = full[..keep].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// The first [`HASH_LEN`] lowercase hex characters of the SHA-256 of `s`.
fn short_hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    let mut hex = String::with_capacity(HASH_LEN + 1);
    for byte in digest.iter() {
        if hex.len() >= HASH_LEN {
            break;
        }
        hex.push_str(&format!("{byte:02x}"));
    }
    hex.truncate(HASH_LEN);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_follow_kueue() {
        assert_eq!(request_name("job-a-1b2c3", "prov", 1), "job-a-1b2c3-prov-1");
        assert_eq!(
            request_name("wl", "check.example.com", 12),
            "wl-check.example.com-12"
        );
        assert_eq!(pod_template_name("wl-prov-1", "main"), "ppt-wl-prov-1-main");
    }

    #[test]
    fn exactly_max_length_is_not_shortened() {
        let workload = "w".repeat(MAX_NAME_LEN - "-c-1".len());
        let name = request_name(&workload, "c", 1);
        assert_eq!(name.len(), MAX_NAME_LEN);
        assert_eq!(name, format!("{workload}-c-1"));
        // One digit more and it no longer fits.
        let name = request_name(&workload, "c", 10);
        assert!(name.len() <= MAX_NAME_LEN);
        assert!(name.ends_with("-10"));
        assert_ne!(name, format!("{workload}-c-10"));
    }

    #[test]
    fn long_names_keep_their_attempt() {
        let workload = "a".repeat(253);
        let check = "b".repeat(253);
        for attempt in [1, 9, 10, 12345, u32::MAX] {
            let name = request_name(&workload, &check, attempt);
            assert!(name.len() <= MAX_NAME_LEN, "{name}");
            assert_eq!(attempt_of(&name), Some(attempt));
            assert_eq!(request_attempt(&name, &workload, &check), Some(attempt));
            assert!(name.starts_with("aaaa"));
        }
    }

    #[test]
    fn cut_never_leaves_a_dash_or_dot_before_the_hash() {
        // Put a '.' exactly where the cut falls: keep = 253 - len("-1") - 11 = 240.
        let mut workload = "a".repeat(239);
        workload.push('.');
        workload.push_str(&"b".repeat(100));
        let name = request_name(&workload, "c", 1);
        assert!(!name.contains(".-") && !name.contains("-."), "{name}");
        assert!(name.starts_with(&"a".repeat(239)));
        assert_eq!(name.as_bytes()[239], b'-');
    }

    #[test]
    fn hash_distinguishes_long_names_with_a_common_beginning() {
        let workload = "x".repeat(300);
        let one = request_name(&workload, "check-one", 1);
        let two = request_name(&workload, "check-two", 1);
        assert_ne!(one, two);
        assert_eq!(one.len(), two.len());
    }

    #[test]
    fn attempt_parsing() {
        assert_eq!(attempt_of("wl-check-3"), Some(3));
        assert_eq!(attempt_of("wl-check-0"), Some(0));
        assert_eq!(attempt_of("wl-check-4294967295"), Some(u32::MAX));
        assert_eq!(attempt_of("wl-check-4294967296"), None);
        assert_eq!(attempt_of("wl-check-03"), None);
        assert_eq!(attempt_of("wl-check-"), None);
        assert_eq!(attempt_of("wl-check-x1"), None);
        assert_eq!(attempt_of("wl-check-+1"), None);
        assert_eq!(attempt_of("12"), None);
    }

    #[test]
    fn request_attempt_recognises_only_its_own_names() {
        assert_eq!(request_attempt("wl-prov-2", "wl", "prov"), Some(2));
        assert_eq!(request_attempt("wl-prov-2", "wl", "other"), None);
        assert_eq!(request_attempt("wl2-prov-2", "wl", "prov"), None);
        assert_eq!(request_attempt("wl-prov", "wl", "prov"), None);
    }

    #[test]
    fn long_pod_template_names() {
        let request = request_name(&"r".repeat(250), "check", 3);
        let name = pod_template_name(&request, "workers");
        assert!(name.len() <= MAX_NAME_LEN);
        assert!(name.starts_with("ppt-rrr"));
        assert_ne!(name, pod_template_name(&request, "driver"));
        let other_attempt = request_name(&"r".repeat(250), "check", 4);
        assert_ne!(name, pod_template_name(&other_attempt, "workers"));
    }

    #[test]
    fn alternative_names_differ_per_workload_uid_and_keep_their_attempt() {
        // `a` + `b-c` and `a-b` + `c` share the first choice, never the alternative.
        assert_eq!(request_name("a", "b-c", 1), request_name("a-b", "c", 1));
        let one = alternative_request_name("a", "uid-1", "b-c", 1);
        let two = alternative_request_name("a-b", "uid-2", "c", 1);
        assert_ne!(one, two);
        assert!(one.starts_with("a-b-c-") && one.ends_with("-1"), "{one}");
        assert_eq!(one, alternative_request_name("a", "uid-1", "b-c", 1));
        // Another uid under the same names (a re-created Workload) gets another one.
        assert_ne!(one, alternative_request_name("a", "uid-3", "b-c", 1));
        assert_eq!(attempt_of(&one), Some(1));
        assert_ne!(one, request_name("a", "b-c", 1));
        let [first, second] = request_names("a", "uid-1", "b-c", 7);
        assert_eq!(first, "a-b-c-7");
        assert_eq!(second, alternative_request_name("a", "uid-1", "b-c", 7));
        // Long names stay within the limit and still end with the attempt.
        let long = alternative_request_name(&"w".repeat(253), "uid", &"c".repeat(253), 12);
        assert!(long.len() <= MAX_NAME_LEN, "{long}");
        assert_eq!(attempt_of(&long), Some(12));
        assert_ne!(long, request_name(&"w".repeat(253), &"c".repeat(253), 12));
    }

    #[test]
    fn checks_share_names_only_when_one_ends_with_the_other() {
        assert!(checks_may_share_names("c", "b-c"));
        assert!(checks_may_share_names("b-c", "c"));
        assert_eq!(request_name("a-b", "c", 1), request_name("a", "b-c", 1));
        assert!(!checks_may_share_names("c", "c"));
        assert!(!checks_may_share_names("c", "bc"));
        assert!(!checks_may_share_names("c", "c-b"));
        assert!(!checks_may_share_names("prov", "kueue-prov2"));
    }

    #[test]
    fn short_hash_is_lowercase_hex() {
        let hash = short_hash("anything");
        assert_eq!(hash.len(), HASH_LEN);
        assert!(
            hash.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_eq!(hash, short_hash("anything"));
    }
}

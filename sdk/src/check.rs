//! What a check author writes: an [`AdmissionCheckController`] that turns a Workload holding
//! quota into a [`Decision`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;

use crate::api::{AdmissionCheckState, CheckState, PodSetUpdate, Workload};
use crate::extensions::Extensions;
pub use crate::release::{ReleaseContext, ReleaseReason};
use crate::retry::RetryPolicy;

/// An admission check, as its author sees it. The runtime does the rest: it watches
/// AdmissionChecks and Workloads, calls [`decide`](Self::decide) only when a Workload holds
/// quota with this check's entry `Pending`, writes the answer safely, and keeps the retry
/// bookkeeping.
///
/// `decide` may be called more than once for the same Workload and attempt (after a conflict,
/// a restart, or a parameters change), so it must be idempotent: a check that takes something
/// (a license, budget) must recognise a Workload it already holds something for.
pub trait AdmissionCheckController: Send + Sync + 'static {
    /// The typed object `AdmissionCheck.spec.parameters` points at, or [`NoParameters`].
    type Parameters: CheckParameters;
    /// What `decide` and `release` fail with. Errors are retried with backoff and surfaced in
    /// events, logs and metrics; they are never written into the Workload as a state.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The `spec.controllerName` of the AdmissionChecks this controller answers.
    fn controller_name(&self) -> &str;

    /// How `Retry` decisions without an explicit delay are spaced, and when they turn into
    /// `Rejected`. Kueue's defaults unless overridden; may depend on the parameters.
    fn retry_policy(&self, _parameters: &Self::Parameters) -> RetryPolicy {
        RetryPolicy::default()
    }

    /// When a `Ready` answer is asked about again; [`Revalidate::Never`] by default.
    fn revalidate(&self) -> Revalidate {
        Revalidate::Never
    }

    /// Which Workloads in the runtime's cache keep their podsets: by default only those holding
    /// quota, which are the only ones [`decide`](Self::decide) is asked about. Say
    /// [`CachedPodSets::Always`] when [`release`](Self::release) or work beside the runtime
    /// reads the podsets of Workloads without quota.
    fn cached_pod_sets(&self) -> CachedPodSets {
        CachedPodSets::default()
    }

    /// Work this check runs beside the runtime while its replica leads (watching the objects
    /// `decide` creates, sweeping what nobody released): see [`Extensions`]. Called once, when
    /// the runtime starts; nothing by default.
    fn while_leading(&self) -> Extensions {
        Extensions::new()
    }

    /// Whether an error of [`decide`](Self::decide) can get better by trying again. The
    /// default looks for an API server refusal in the error's source chain
    /// ([`ErrorClass::of`]): a request the server found invalid (400, 422 and the like) is
    /// permanent, everything else transient. Override it to say more: a permanent failure's
    /// message is written on the Workload's entry for the user, so name what was refused and
    /// how to fix it.
    ///
    /// A transient error is retried with backoff (1 s doubling to 5 min) and never written on the
    /// Workload. A permanent one is written on the entry at once (`Pending`, with the message);
    /// the Workload keeps its quota for
    /// [`RuntimeConfig::permanent_failure_hold`](crate::RuntimeConfig::permanent_failure_hold)
    /// while the user may fix it (any change of the Workload asks the check again), then the
    /// runtime answers `Retry` (quota given back; the next attempt asks again), and past the
    /// retry limit `Rejected`. One the API server refused for want of a permission
    /// ([`ErrorClass::NotPermitted`], RBAC's 403) is shown on the entry the same way and asked
    /// again every [`NOT_PERMITTED_RECHECK`] meanwhile, but ends in `Retry` only, never
    /// `Rejected`: the operator fixes it, not the user.
    fn classify_error(&self, error: &Self::Error) -> ErrorClass {
        ErrorClass::of(error)
    }

    /// The APIs, besides Kueue's and its parameters' kind, that this check needs the cluster
    /// to serve: the kinds of the objects it creates or reads (e.g. a CRD of another project).
    /// While one is not served at its version, every AdmissionCheck of this controller is
    /// `Active=False` with reason `ApiNotServed`, naming it and the versions the cluster serves
    /// instead (so ClusterQueues wait instead of admitting through a check that cannot work);
    /// the runtime looks again with backoff (1 s doubling to 1 min) and turns the check active
    /// once the API appears. Read from the discovery endpoints, which every client may read.
    fn required_apis(&self) -> Vec<ApiKind> {
        Vec::new()
    }

    /// Why this check must not run in shadow mode ([`RuntimeConfig::shadow`](crate::RuntimeConfig::shadow)),
    /// if it must not: a check whose `decide` acts on the cluster (creates objects that cost
    /// money or capacity) would do so for Workloads that were admitted anyway. `None` (the
    /// default) allows it; the runtime refuses to start in shadow mode with this reason.
    fn shadow_mode_refusal(&self) -> Option<String> {
        None
    }

    /// Registers the check's own metrics beside the runtime's, on the same `/metrics`
    /// endpoint. Use a prefix of the check's own.
    fn register_metrics(&self, _registry: &mut prometheus_client::registry::Registry) {}

    /// Decides for one Workload that holds quota and waits for this check.
    fn decide(
        &self,
        ctx: &CheckContext<'_, Self::Parameters>,
    ) -> impl Future<Output = Result<Decision, Self::Error>> + Send;

    /// Whether [`start_early`](Self::start_early) is called: `false` by default. When `true`,
    /// the runtime also watches ClusterQueues, to know which checks a Workload will get.
    fn starts_early(&self) -> bool {
        false
    }

    /// Starts the check's work for a Workload that holds quota before Kueue has added this
    /// check's entry, so that the answer may be known by the time the entry comes. Kueue
    /// reserves quota in its scheduler but adds the entries from its Workload loop, which falls
    /// behind when Kueue is busy (seconds under a burst); nothing can be written until the
    /// entry exists, but a check that waits on something slow (capacity from an autoscaler)
    /// can ask for it meanwhile.
    ///
    /// Called (when [`starts_early`](Self::starts_early) says so) once per attempt for a
    /// Workload that holds quota, is active and not evicted, has no entry for the check yet,
    /// and whose ClusterQueue lists the check in `admissionChecksStrategy` for the flavors
    /// assigned (an `onFlavors` rule that matches none of them does not count). `ctx.entry` is
    /// a stand-in: `Pending`, with no message, named after the check. Once Kueue adds the entry,
    /// [`decide`](Self::decide) is asked as always and must find what was started here (it is
    /// idempotent anyway); an answer known by then is written at once.
    ///
    /// What was started is released through [`release`](Self::release), as any decision's:
    /// when the Workload loses its quota, is evicted, deactivated, finished or deleted, when
    /// the ClusterQueue no longer lists the check, or when the entry does not come within
    /// [`RuntimeConfig::early_start_wait`](crate::RuntimeConfig::early_start_wait)
    /// ([`ReleaseReason::EntryNotAdded`]). A transient error is logged, counted and tried again
    /// with backoff; one [`classify_error`](Self::classify_error) calls permanent (or not
    /// permitted) is tried once per attempt, the wait for the entry bounding what it left. No
    /// error is written on the Workload (there is no entry yet): `decide` meets it again when
    /// the entry comes.
    fn start_early(
        &self,
        _ctx: &CheckContext<'_, Self::Parameters>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        async { Ok(()) }
    }

    /// How long what [`start_early`](Self::start_early) makes stays useful while the entry has
    /// not come, if that is bounded (capacity booked for a while, a lease that expires): the
    /// runtime waits for the entry at most this long, cutting
    /// [`RuntimeConfig::early_start_wait`](crate::RuntimeConfig::early_start_wait) to it with a
    /// warning. `None` (the default): as long as configured.
    fn early_work_lasts(&self) -> Option<std::time::Duration> {
        None
    }

    /// Called when a Workload this check decided for (or started early for) no longer needs
    /// it: quota released, evicted, deactivated, finished, deleted, the check removed from its
    /// ClusterQueue, or its entry never added. Release whatever the Workload holds. Must be
    /// idempotent.
    fn release(
        &self,
        _ctx: &ReleaseContext<'_>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        async { Ok(()) }
    }
}

/// When the runtime asks a check again about a Workload it already answered `Ready` for
/// ([`AdmissionCheckController::revalidate`]). A new answer other than `Ready` withdraws the
/// admission as Kueue allows: `Retry` evicts the Workload, `Rejected` deactivates it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Revalidate {
    /// Never: `Ready` stands until Kueue drops the entry.
    #[default]
    Never,
    /// Whenever the Workload is reconciled: on a change of it, or a wake from a task beside the
    /// runtime ([`crate::runtime::WorkloadWaker`]), without a timer. For an answer that an
    /// outside event can take back, e.g. a ProvisioningRequest whose capacity was revoked.
    OnChange,
    /// As [`Revalidate::OnChange`], and at the latest this long after the last answer: for an
    /// answer that goes stale by itself, e.g. a budget that may run out before the job starts.
    Every(Duration),
}

impl Revalidate {
    /// Whether `Ready` entries are asked about again at all.
    pub fn asks_again(self) -> bool {
        self != Self::Never
    }

    /// How long after an answer the runtime asks again without any change, if ever.
    pub fn period(self) -> Option<Duration> {
        match self {
            Self::Every(period) => Some(period),
            Self::Never | Self::OnChange => None,
        }
    }
}

/// Which Workloads in the runtime's cache keep their podsets
/// ([`AdmissionCheckController::cached_pod_sets`]). The podsets, with their pod templates, are
/// most of a Workload's size in memory, and most Workloads of a busy cluster wait for quota or
/// have finished.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CachedPodSets {
    /// Only Workloads that hold quota and have not finished, which is every Workload `decide`
    /// sees. The others are cached without `spec.podSets`.
    #[default]
    WhileQuotaReserved,
    /// Every Workload's.
    Always,
}

/// The typed parameters of a check: the object an AdmissionCheck's `spec.parameters` names.
pub trait CheckParameters: DeserializeOwned + Clone + Debug + Send + Sync + 'static {
    /// The kind `spec.parameters` must name, or `None` for a check that takes no parameters.
    fn reference() -> Option<ParametersKind>;

    /// Checks the contents. An error makes the AdmissionCheck `Active=False` with this message,
    /// so write it for the person who will read it there.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Group, version, kind and resource (plural) of an API kind: the one a check's parameters are
/// read as, or one it needs the cluster to serve ([`AdmissionCheckController::required_apis`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiKind {
    /// API group, e.g. `kueue.x-k8s.io`; empty for the core group.
    pub group: &'static str,
    /// API version to read it at, e.g. `v1beta2`.
    pub version: &'static str,
    /// Kind, e.g. `ProvisioningRequestConfig`.
    pub kind: &'static str,
    /// Resource name (plural), e.g. `provisioningrequestconfigs`.
    pub plural: &'static str,
}

impl ApiKind {
    /// `plural.group/version` (`plural/version` for the core group), as people search for it.
    pub fn resource_path(&self) -> String {
        if self.group.is_empty() {
            format!("{}/{}", self.plural, self.version)
        } else {
            format!("{}.{}/{}", self.plural, self.group, self.version)
        }
    }

    /// The discovery path of its group and version: `/apis/group/version` (`/api/v1`).
    pub(crate) fn group_version_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// The kind a check's parameters are read as: a cluster-scoped [`ApiKind`].
pub type ParametersKind = ApiKind;

/// For checks configured by flags alone: `spec.parameters` must be absent.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct NoParameters;

impl CheckParameters for NoParameters {
    fn reference() -> Option<ParametersKind> {
        None
    }
}

/// Everything a check gets to decide for one Workload.
pub struct CheckContext<'a, P> {
    /// The Workload, as last read from the API server.
    pub workload: &'a Workload,
    /// This check's entry in `status.admissionChecks`.
    pub entry: &'a AdmissionCheckState,
    /// The AdmissionCheck's resolved, validated parameters.
    pub parameters: &'a P,
    /// A client for anything else the check needs to read or write.
    pub client: &'a kube::Client,
    /// The time of this decision; use it instead of the system clock so tests can set it.
    pub now: Timestamp,
    /// The runtime runs in shadow mode, in this scope: nothing the check answers is written.
    /// A check that reconciles what it holds judges its holdings with
    /// [`crate::holding::stale_reason`] and this.
    pub shadow: Option<&'a crate::shadow::ShadowScope>,
}

impl<P: Debug> Debug for CheckContext<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckContext")
            .field("workload", &self.workload.metadata.name)
            .field("entry", &self.entry)
            .field("parameters", &self.parameters)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl Debug for ReleaseContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseContext")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("check_name", &self.check_name)
            .field("reason", &self.reason)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

impl<P> CheckContext<'_, P> {
    /// Name of the AdmissionCheck being decided.
    pub fn check_name(&self) -> &str {
        &self.entry.name
    }

    /// The attempt being decided: 1 for the first, then one more after each `Retry` of this
    /// check. Counted by the check itself on the Workload (see [`crate::attempts`]), so it
    /// never goes back, whatever other checks' evictions do to Kueue's `retryCount`.
    pub fn attempt(&self) -> u32 {
        crate::attempts::attempt(self.workload, &self.entry.name)
    }

    /// The ResourceFlavor assigned to each resource of each podset: podset → resource → flavor.
    pub fn assigned_flavors(&self) -> BTreeMap<&str, &BTreeMap<String, String>> {
        let admission = self
            .workload
            .status
            .as_ref()
            .and_then(|s| s.admission.as_ref());
        admission
            .map(|a| {
                a.pod_set_assignments
                    .iter()
                    .map(|p| (p.name.as_str(), &p.flavors))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How a failure is handled: tried again, or shown to the user. See
/// [`AdmissionCheckController::classify_error`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// May succeed if tried again (an outage, a conflict, a timeout, a rate limit).
    Transient,
    /// Will not get better by retrying; `message` tells the user what was refused and the fix.
    Permanent {
        /// Written on the Workload's entry and in an Event: no secrets, plain words.
        message: String,
    },
    /// The API server refuses this controller something it needs (RBAC's 403): the operator
    /// must grant it, the Workload did nothing wrong. Shown on the entry (`Pending`) while the
    /// Workload keeps its quota for the permanent-failure hold, asked again meanwhile, then
    /// `Retry` without delay, never `Rejected`: as for a check that cannot answer.
    NotPermitted {
        /// Written on the Workload's entry and in an Event.
        message: String,
    },
}

/// How often a decision refused for want of a permission ([`ErrorClass::NotPermitted`]) is
/// tried again while its Workload keeps its quota: a grant is noticed within this long.
pub const NOT_PERMITTED_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

impl ErrorClass {
    /// A permanent failure with this message.
    pub fn permanent(message: impl Into<String>) -> Self {
        ErrorClass::Permanent {
            message: message.into(),
        }
    }

    /// Classifies an error by the first Kubernetes API answer in its source chain: the API
    /// server refusing a request as malformed or invalid (400, 405, 413, 415, 422) is permanent,
    /// with the server's message; everything else (and an error without an API answer) is
    /// transient. Forbidden (403) by RBAC is [`ErrorClass::NotPermitted`] (shown, never
    /// rejected); by an admission webhook or policy, permanent.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Self {
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(e) = next {
            if let Some(kube::Error::Api(status)) = e.downcast_ref::<kube::Error>() {
                return Self::of_status(status.code, &status.reason, &status.message);
            }
            next = e.source();
        }
        ErrorClass::Transient
    }

    /// Classifies an API server answer by its HTTP code; see [`ErrorClass::of`]. The server's
    /// message goes into a permanent failure with quoted values replaced by their length.
    ///
    /// A 403 is the operator's RBAC ([`ErrorClass::NotPermitted`]: fixed by a grant, not by the
    /// user; the message is kept whole, it names the ServiceAccount, verb and resource) unless
    /// the message says an admission webhook or a ValidatingAdmissionPolicy denied the request
    /// ([`admission_denial`]): a policy refusing what was sent, which no retry changes.
    pub fn of_status(code: u16, reason: &str, message: &str) -> Self {
        match code {
            400 | 405 | 413 | 415 | 422 => ErrorClass::permanent(format!(
                "the API server refused a request as {} ({code}): {}",
                if reason.is_empty() { "invalid" } else { reason },
                redact_quoted(message, &[])
            )),
            403 => match admission_denial(message) {
                Some(by) => ErrorClass::permanent(format!(
                    "{by} refused a request (403): {}",
                    redact_quoted(message, &[])
                )),
                None => ErrorClass::NotPermitted {
                    message: format!(
                        "the API server refuses this controller a request it needs (403): {}; \
                         grant it to the controller's ServiceAccount",
                        truncate_chars(message.trim_end_matches('.'), 400)
                    ),
                },
            },
            _ => ErrorClass::Transient,
        }
    }
}

/// Who denied a request, if the API server's `message` says an admission webhook
/// (`admission webhook "<name>" denied the request: ...`) or a ValidatingAdmissionPolicy
/// (`... is forbidden: ValidatingAdmissionPolicy '<name>' with binding '<binding>' denied
/// request: ...`) did, rather than RBAC (`... is forbidden: User "..." cannot patch resource
/// ...`). The webhook's name is kept (it is a configuration name, not a value); a policy's is
/// not repeated (it is single-quoted among values).
pub fn admission_denial(message: &str) -> Option<String> {
    const WEBHOOK: &str = "admission webhook \"";
    if let Some(at) = message.find(WEBHOOK) {
        let rest = &message[at + WEBHOOK.len()..];
        if let Some((name, after)) = rest.split_once('"')
            && after.trim_start().starts_with("denied the request")
        {
            return Some(format!("admission webhook {name}"));
        }
    }
    (message.contains("ValidatingAdmissionPolicy") && message.contains("denied request"))
        .then(|| "a ValidatingAdmissionPolicy".to_string())
}

/// `text` cut to at most `max` characters (on a character boundary), the cut marked with `…`:
/// for messages shown on a Workload or in an Event, which have limits. With `max` 0 there is no
/// room even for the mark, so the result is empty.
pub fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    if max == 0 {
        return String::new();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `text` with every quoted string replaced by its length, except those in `keep` (names a
/// check chose): an API server message may quote the value it refused, which can be a secret,
/// and must not be repeated on a Workload or in an Event. Double quotes always quote (an
/// unbalanced one hides the rest); a single quote quotes when it opens at the start or after a
/// character that is not a letter or digit and closes before one (`'value'`, `('a', 'b')`), so
/// an apostrophe (`doesn't`) is left as it is.
pub fn redact_quoted(text: &str, keep: &[&str]) -> String {
    let mut out = String::with_capacity(text.len().min(1024));
    let mut rest = text;
    while let Some(open) = next_quote(rest, out.chars().last()) {
        out.push_str(&rest[..open]);
        if rest[open..].starts_with('\'') {
            let after = &rest[open + 1..];
            let Some(close) = single_quote_end(after) else {
                // Not a quotation after all: an apostrophe.
                out.push('\'');
                rest = after;
                continue;
            };
            let quoted = &after[..close];
            push_redacted(&mut out, quoted, '\'', keep);
            rest = &after[close + 1..];
            continue;
        }
        let after = &rest[open + 1..];
        // The closing quote: the first one not escaped by a backslash.
        let mut close = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    close = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(close) = close else {
            // An unbalanced quote: everything after it might be the value.
            out.push_str(&characters(after.chars().count()));
            return out;
        };
        let quoted = &after[..close];
        push_redacted(&mut out, quoted, '"', keep);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The byte offset of the next quote in `rest` that opens a quotation: any `"`, or a `'` at the
/// start or after a character that is not a letter or digit (`before` is the character just
/// before `rest`).
fn next_quote(rest: &str, before: Option<char>) -> Option<usize> {
    let mut previous = before;
    for (i, c) in rest.char_indices() {
        match c {
            '"' => return Some(i),
            '\'' if !previous.is_some_and(char::is_alphanumeric) => return Some(i),
            _ => {}
        }
        previous = Some(c);
    }
    None
}

/// Where a single-quoted string that starts at `after` ends: the first `'` followed by the end
/// or by a character that is not a letter or digit.
fn single_quote_end(after: &str) -> Option<usize> {
    let mut chars = after.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\'' && !chars.peek().is_some_and(|(_, n)| n.is_alphanumeric()) {
            return Some(i);
        }
    }
    None
}

/// `quoted` as it goes into a message: kept in its quotes if the check chose it, else its
/// length.
fn push_redacted(out: &mut String, quoted: &str, quote: char, keep: &[&str]) {
    if keep.contains(&quoted) {
        out.push(quote);
        out.push_str(quoted);
        out.push(quote);
    } else {
        out.push_str(&characters(quoted.chars().count()));
    }
}

fn characters(n: usize) -> String {
    if n == 1 {
        "<1 character>".to_string()
    } else {
        format!("<{n} characters>")
    }
}

/// A check's answer for one Workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The check passes; the pods get these additive updates when the job starts.
    Ready {
        /// Shown in the Workload's status.
        message: String,
        /// Labels, annotations, node selectors and tolerations to add, per podset.
        pod_set_updates: Vec<PodSetUpdate>,
    },
    /// Not decided yet. The Workload keeps its quota while it waits.
    Pending {
        /// Tells the user what the check waits for.
        message: String,
        /// Ask the check again after this long, even if nothing changes.
        recheck_after: Option<Duration>,
    },
    /// Try again later. Kueue evicts the Workload, counts the retry in `retryCount` and requeues
    /// it once the delay has passed.
    ///
    /// Observed with Kueue v0.15 to v0.19 (see `docs/kueue-behaviour.md`): while the delay runs,
    /// the Workload **keeps its quota**; Kueue evicts it only when the delay ends, and requeues it
    /// at once. A long delay therefore holds quota that other Workloads could use. Without a delay
    /// ([`crate::retry::Backoff::Immediate`]) the quota is released at once, and the check is
    /// asked again as soon as quota is reserved again.
    Retry {
        /// Tells the user why.
        message: String,
        /// How long to wait.
        delay: RetryDelay,
    },
    /// The Workload can never pass: Kueue deactivates it.
    Rejected {
        /// Tells the user why.
        message: String,
    },
}

/// The delay of a [`Decision::Retry`].
#[derive(Clone, Debug, PartialEq)]
pub enum RetryDelay {
    /// From the check's [`RetryPolicy`] and the attempt number.
    Policy,
    /// Exactly this long (e.g. until a budget window resets); still counts against the limit.
    After(Duration),
}

impl Decision {
    /// `Ready` without pod updates.
    pub fn ready(message: impl Into<String>) -> Self {
        Decision::Ready {
            message: message.into(),
            pod_set_updates: Vec::new(),
        }
    }

    /// `Ready` with additive pod updates per podset.
    pub fn ready_with_updates(
        message: impl Into<String>,
        pod_set_updates: Vec<PodSetUpdate>,
    ) -> Self {
        Decision::Ready {
            message: message.into(),
            pod_set_updates,
        }
    }

    /// `Pending`, asked again only when the Workload or the check changes.
    pub fn pending(message: impl Into<String>) -> Self {
        Decision::Pending {
            message: message.into(),
            recheck_after: None,
        }
    }

    /// `Pending`, asked again after `after` at the latest.
    pub fn pending_recheck_after(message: impl Into<String>, after: Duration) -> Self {
        Decision::Pending {
            message: message.into(),
            recheck_after: Some(after),
        }
    }

    /// `Retry` with the delay of the check's retry policy.
    pub fn retry(message: impl Into<String>) -> Self {
        Decision::Retry {
            message: message.into(),
            delay: RetryDelay::Policy,
        }
    }

    /// `Retry` after exactly `delay`.
    pub fn retry_after(message: impl Into<String>, delay: Duration) -> Self {
        Decision::Retry {
            message: message.into(),
            delay: RetryDelay::After(delay),
        }
    }

    /// `Rejected`.
    pub fn rejected(message: impl Into<String>) -> Self {
        Decision::Rejected {
            message: message.into(),
        }
    }

    /// The state this decision asks for (before the retry limit is applied).
    pub fn state(&self) -> CheckState {
        match self {
            Decision::Ready { .. } => CheckState::Ready,
            Decision::Pending { .. } => CheckState::Pending,
            Decision::Retry { .. } => CheckState::Retry,
            Decision::Rejected { .. } => CheckState::Rejected,
        }
    }

    /// The message the check gave.
    pub fn message(&self) -> &str {
        match self {
            Decision::Ready { message, .. }
            | Decision::Pending { message, .. }
            | Decision::Retry { message, .. }
            | Decision::Rejected { message } => message,
        }
    }

    /// The message, to change (e.g. add a note) without rebuilding the decision.
    pub fn message_mut(&mut self) -> &mut String {
        match self {
            Decision::Ready { message, .. }
            | Decision::Pending { message, .. }
            | Decision::Retry { message, .. }
            | Decision::Rejected { message } => message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_replaced_by_their_length() {
        assert_eq!(
            redact_quoted(r#"PodTemplate "ppt-x" has "a\"b" and "c""#, &["ppt-x"]),
            r#"PodTemplate "ppt-x" has <4 characters> and <1 character>"#
        );
        assert_eq!(redact_quoted(r#"open "secret"#, &[]), "open <6 characters>");
        assert_eq!(redact_quoted("nothing quoted", &[]), "nothing quoted");
    }

    #[test]
    fn single_quoted_values_are_redacted_and_apostrophes_kept() {
        assert_eq!(
            redact_quoted("token 'hunter2' refused; it doesn't fit", &[]),
            "token <7 characters> refused; it doesn't fit"
        );
        assert_eq!(
            redact_quoted("values ('a b', 'c') and 'ppt-x'", &["ppt-x"]),
            "values (<3 characters>, <1 character>) and 'ppt-x'"
        );
        // A value with an apostrophe inside is one value.
        assert_eq!(
            redact_quoted("got 'it's here'.", &[]),
            "got <9 characters>."
        );
        // An opening quote that never closes is an apostrophe: nothing to hide.
        assert_eq!(redact_quoted("the workers' pods", &[]), "the workers' pods");
        assert_eq!(
            redact_quoted(r#"both "x" and 'yy'"#, &[]),
            "both <1 character> and <2 characters>"
        );
    }

    #[test]
    fn a_webhook_or_policy_denial_is_permanent_and_rbac_is_not_permitted() {
        // As the API server words Kueue's webhook refusing a podSetUpdate (seen on v0.19.2).
        let webhook = r#"admission webhook "vworkload.kb.io" denied the request: status.admissionChecks[0].podSetUpdates[0].nodeSelector: Invalid value: "example.com/zzzz": name part must be no more than 63 bytes"#;
        let ErrorClass::Permanent { message } = ErrorClass::of_status(403, "Forbidden", webhook)
        else {
            panic!("a webhook's denial is permanent");
        };
        assert!(
            message.starts_with("admission webhook vworkload.kb.io refused a request (403)"),
            "{message}"
        );
        assert!(!message.contains("example.com/zzzz"), "{message}");
        let policy = "workloads.kueue.x-k8s.io \"w\" is forbidden: ValidatingAdmissionPolicy \
                      'no-secret' with binding 'b' denied request: failed expression";
        let ErrorClass::Permanent { message } = ErrorClass::of_status(403, "Forbidden", policy)
        else {
            panic!("a policy's denial is permanent");
        };
        assert!(
            message.starts_with("a ValidatingAdmissionPolicy refused"),
            "{message}"
        );
        assert!(!message.contains("no-secret"), "{message}");
        let rbac = r#"workloads.kueue.x-k8s.io "w" is forbidden: User "system:serviceaccount:a:b" cannot patch resource "workloads" in API group "kueue.x-k8s.io" in the namespace "ns""#;
        let ErrorClass::NotPermitted { message } = ErrorClass::of_status(403, "Forbidden", rbac)
        else {
            panic!("RBAC's refusal is the operator's to fix");
        };
        assert!(
            message.contains(r#"cannot patch resource "workloads" in API group "kueue.x-k8s.io""#)
                && message.ends_with("grant it to the controller's ServiceAccount"),
            "{message}"
        );
        assert_eq!(admission_denial(rbac), None);
        // The words alone, without a webhook's name before them, are not a denial.
        assert_eq!(admission_denial("the request was denied the request"), None);
    }

    #[test]
    fn invalid_requests_are_permanent_without_the_refused_value() {
        let class = ErrorClass::of_status(
            422,
            "Invalid",
            r#"spec.parameters.token: Invalid value: "hunter2": too long"#,
        );
        let ErrorClass::Permanent { message } = class else {
            panic!("422 must be permanent");
        };
        assert!(!message.contains("hunter2"), "{message}");
        assert!(message.contains("<7 characters>"), "{message}");
        for code in [404, 409, 429, 500, 503] {
            assert_eq!(
                ErrorClass::of_status(code, "", ""),
                ErrorClass::Transient,
                "{code}"
            );
        }
    }
}

#[cfg(test)]
mod truncate_properties {
    use super::truncate_chars;

    #[test]
    fn no_room_means_empty() {
        // Found by property testing: with max 0 the mark alone exceeded the limit.
        assert_eq!(truncate_chars("abc", 0), "");
        assert_eq!(truncate_chars("", 0), "");
    }

    proptest::proptest! {
        #[test]
        fn within_limit_and_a_prefix(text in "\\PC{0,80}", max in 0usize..100) {
            let cut = truncate_chars(&text, max);
            proptest::prop_assert!(cut.chars().count() <= max);
            if text.chars().count() <= max {
                proptest::prop_assert_eq!(&cut, &text);
            } else if max > 0 {
                let kept = cut.strip_suffix('…').expect("a cut is marked");
                proptest::prop_assert!(text.starts_with(kept));
            }
        }
    }
}

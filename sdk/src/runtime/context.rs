//! What every reconcile shares: the client, the check, the registry of our checks, what is
//! kept between reconciles, and the Events it publishes on Workloads.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector;
use kube::{Client, Resource, ResourceExt};
use sha2::Digest;
use tracing::{info, warn};

use super::check_registry::Registry;
use super::line::Line;
use super::memory::Memory;
use super::own_writes::OwnWrites;
use crate::api::Workload;
use crate::check::AdmissionCheckController;
use crate::error::Error;
use crate::release::{ReleaseContext, ReleaseReason};

pub(crate) struct Context<C: AdmissionCheckController> {
    pub client: Client,
    pub controller: Arc<C>,
    pub registry: Registry<C::Parameters>,
    pub field_manager: String,
    pub recorder: Recorder,
    /// What this process keeps about each Workload and (Workload, check) pair.
    pub(super) memory: Memory,
    /// Status writes the Workload cache does not show yet.
    pub own_writes: Arc<OwnWrites>,
    pub metrics: Arc<super::metrics::Metrics>,
    pub(super) max_retry_delay: Duration,
    pub(super) permanent_failure_hold: Duration,
    /// [`super::config::RuntimeConfig::early_start_wait`].
    pub(super) early_start_wait: Duration,
    /// The ClusterQueues (watched only when the check starts early): which checks a Workload
    /// will get.
    pub(super) cluster_queues: crate::ClusterQueues,
    /// The Workloads waiting to be reconciled: their changes, and the turns to reconcile
    /// ([`super::config::RuntimeConfig::concurrency`] at once), first come, first served, answers first.
    pub(super) line: Line,
    /// The Workload cache: a reconcile that waited for its turn decides on the newest version.
    pub(super) cache: Option<reflector::Store<Workload>>,
    /// Every check this process has found in the registry: a check that left it (deleted,
    /// renamed, another controllerName, claimed by another deployment) may still have `asked`
    /// pairs, released once their Workloads no longer need them. A handful of names.
    pub(super) known_checks: Mutex<std::collections::BTreeSet<String>>,
    /// [`super::config::RuntimeConfig::shadow`]: decide and publish, write nothing on Workloads.
    pub(super) shadow: Option<crate::shadow::ShadowScope>,
    /// [`super::config::RuntimeConfig::normal_events`].
    pub(super) normal_events: bool,
    /// Where Events go once decided ([`Self::with_events_in_background`]); published in the
    /// reconcile itself without.
    event_lanes: Option<EventLanes>,
}

impl<C: AdmissionCheckController> Context<C> {
    /// Events are reported as the field manager of `config`.
    pub fn new(
        client: Client,
        controller: Arc<C>,
        registry: Registry<C::Parameters>,
        config: &super::config::RuntimeConfig,
        metrics: Arc<super::metrics::Metrics>,
        own_writes: Arc<OwnWrites>,
    ) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter::from(config.field_manager.clone()),
        );
        let start_concurrency = match controller.starts_early() {
            true => usize::from(config.early_start_concurrency),
            false => 0,
        };
        Self {
            client,
            controller,
            registry,
            field_manager: config.field_manager.clone(),
            recorder,
            memory: Default::default(),
            own_writes,
            metrics,
            max_retry_delay: config.max_retry_delay,
            permanent_failure_hold: config.permanent_failure_hold,
            early_start_wait: config.early_start_wait,
            cluster_queues: Default::default(),
            line: Line::new(usize::from(config.concurrency), start_concurrency),
            cache: None,
            known_checks: Default::default(),
            shadow: config.shadow.clone(),
            normal_events: config.normal_events,
            event_lanes: None,
        }
    }

    /// Events are published beside the reconciles instead of inside them: a reconcile hands its
    /// Event over and gives its turn to the next Workload without waiting for one more API call
    /// (at a burst, the `Ready` write and its Event were half of the turns' time). Each
    /// Workload's Events keep their order.
    pub fn with_events_in_background(mut self) -> Self {
        self.event_lanes = Some(EventLanes::start(
            self.recorder.clone(),
            self.client.clone(),
            self.field_manager.clone(),
        ));
        self
    }

    /// Waits until the Events handed over so far are published, for at most `timeout`; Events
    /// after this are published in the reconcile. For a stop.
    pub(super) async fn flush_events(&self, timeout: Duration) {
        if let Some(lanes) = &self.event_lanes {
            lanes.flush(timeout).await;
        }
    }

    /// Reconciles read the newest version of their Workload from `cache` once it is their turn.
    pub fn with_cache(mut self, cache: reflector::Store<Workload>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Early starts read which checks a Workload will get from `queues`.
    pub fn with_cluster_queues(mut self, queues: crate::ClusterQueues) -> Self {
        self.cluster_queues = queues;
        self
    }

    /// Which line `wl` waits in for a turn: answers, if an entry of one of our checks waits for
    /// its answer ([`crate::lifecycle::awaits_answer`]); else early starts, if one of our active
    /// checks (only those are started early) has not started for the Workload's attempt
    /// ([`crate::lifecycle::early_start_due`]).
    pub(super) fn line_class(&self, wl: &Workload) -> super::line::Class {
        use super::line::Class;
        let Some(status) = wl.status.as_ref() else {
            return Class::Other;
        };
        let registry = self.registry.read().unwrap_or_else(|p| p.into_inner());
        let answer_due = status.admission_checks.iter().any(|entry| {
            registry.contains_key(&entry.name) && crate::lifecycle::awaits_answer(wl, &entry.name)
        });
        if answer_due {
            return Class::Answer;
        }
        if !self.controller.starts_early() {
            return Class::Other;
        }
        let uid = wl.uid().unwrap_or_default();
        let active = registry.iter().filter(|(_, c)| c.is_ok());
        let start_due = active.map(|(check, _)| check).any(|check| {
            let expected = crate::lifecycle::AskedAt::expected(wl, check);
            let started = self.memory.pair(&(uid.clone(), check.clone()), |p| {
                p.early.is_some_and(|e| e.at == expected)
            });
            let rule = self.cluster_queues.rule_for(wl, check);
            crate::lifecycle::early_start_due(wl, check, rule, started)
        });
        match start_due {
            true => Class::Start,
            false => Class::Other,
        }
    }

    /// Whether `Ready` entries are asked about again (on a timer, on every change, or both).
    pub(super) fn revalidates(&self) -> bool {
        self.controller.revalidate().asks_again()
    }

    /// A failure of the check's `decide` that is tried again with backoff: said in a
    /// `CheckFailed` Event on the Workload, and returned as the reconcile's error. Quoted
    /// values in the note are redacted as a permanent failure's are (an API error may quote
    /// what it refused, a secret among them), except the Workload's name and namespace.
    pub(super) async fn check_failed(&self, wl: &Workload, note: String, error: C::Error) -> Error {
        let note = redact_workload_note(wl, &note);
        self.event(wl, EventType::Warning, "CheckFailed", note)
            .await;
        Error::Check(Box::new(error))
    }

    /// Publishes an event on the Workload; a failure to publish is logged, never fatal.
    pub(super) async fn event(&self, wl: &Workload, type_: EventType, reason: &str, note: String) {
        let note = truncate_note(note);
        let event = Event {
            type_,
            reason: reason.into(),
            action: event_action(&note),
            note: Some(note),
            secondary: None,
        };
        let publication = Publication {
            event,
            reference: wl.object_ref(&()),
        };
        let publication = match &self.event_lanes {
            Some(lanes) => match lanes.hand_over(publication).await {
                None => return,
                Some(flushed) => flushed,
            },
            None => publication,
        };
        publication
            .publish(&self.recorder, &self.client, &self.field_manager)
            .await;
    }
}

/// An Event about a Workload, to publish.
struct Publication {
    event: Event,
    reference: k8s_openapi::api::core::v1::ObjectReference,
}

impl Publication {
    /// Publishes; a failure is logged, never fatal.
    async fn publish(self, recorder: &Recorder, client: &Client, field_manager: &str) {
        let name = self.reference.name.clone().unwrap_or_default();
        let published = if fits_recorder_event_name(&name) {
            recorder.publish(&self.event, &self.reference).await
        } else {
            publish_long_named(client, field_manager, &self.event, self.reference).await
        };
        if let Err(e) = published {
            warn!(workload = %name, error = %e, "publishing an event");
        }
    }
}

/// How many Events are published at once in the background.
const EVENT_LANES: usize = 4;
/// Events handed over and not yet published, per lane, before a reconcile waits to hand over.
const EVENT_LANE_DEPTH: usize = 256;

/// Publishes Events beside the reconciles: a few lanes, each publishing in order; a Workload's
/// Events always take the same lane, so they keep their order.
struct EventLanes {
    /// `None` once flushed.
    senders: Mutex<Option<Vec<tokio::sync::mpsc::Sender<Publication>>>>,
    publishers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl EventLanes {
    fn start(recorder: Recorder, client: Client, field_manager: String) -> Self {
        let (mut senders, mut publishers) = (Vec::new(), Vec::new());
        for _ in 0..EVENT_LANES {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Publication>(EVENT_LANE_DEPTH);
            let (recorder, client, field_manager) =
                (recorder.clone(), client.clone(), field_manager.clone());
            publishers.push(tokio::spawn(async move {
                while let Some(publication) = rx.recv().await {
                    publication
                        .publish(&recorder, &client, &field_manager)
                        .await;
                }
            }));
            senders.push(tx);
        }
        Self {
            senders: Mutex::new(Some(senders)),
            publishers: Mutex::new(publishers),
        }
    }

    /// Hands `publication` to its lane (waiting while the lane is full); gives it back once
    /// the lanes are flushed.
    async fn hand_over(&self, publication: Publication) -> Option<Publication> {
        let lane = {
            let senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
            let Some(senders) = senders.as_ref() else {
                return Some(publication);
            };
            let key = (
                &publication.reference.namespace,
                &publication.reference.name,
            );
            let mut hasher = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(&key, &mut hasher);
            let i = std::hash::Hasher::finish(&hasher) as usize % senders.len();
            senders[i].clone()
        };
        lane.send(publication).await.err().map(|e| e.0)
    }

    async fn flush(&self, timeout: Duration) {
        drop(
            self.senders
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        let publishers =
            std::mem::take(&mut *self.publishers.lock().unwrap_or_else(|p| p.into_inner()));
        let drained = futures::future::join_all(publishers);
        if tokio::time::timeout(timeout, drained).await.is_err() {
            warn!(?timeout, "stopping before every Event was published");
        }
    }
}

/// `note` with quoted values (double or single quotes) replaced by their length, except the
/// Workload's own name and namespace: for Events that carry an error's words.
pub(super) fn redact_workload_note(wl: &Workload, note: &str) -> String {
    let (name, namespace) = (wl.name_any(), wl.namespace().unwrap_or_default());
    crate::check::redact_quoted(note, &[name.as_str(), namespace.as_str()])
}

/// kube-runtime's `Recorder` merges events by type, action and reason (not by note): a second
/// `CheckRetry` with a new attempt and time would only raise the first one's count, and its
/// message would be lost. A short digest of the note in the action keeps distinct messages
/// apart, while repeats of the same message still merge.
fn event_action(note: &str) -> String {
    let digest = sha2::Sha256::digest(note.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("Decide-{hex}")
}

/// Event names are at most 253 characters. kube-runtime's `Recorder` names an event
/// `<object>.<nanoseconds in hex>` (up to 16 digits), which does not fit for Workloads with
/// names near the limit.
fn fits_recorder_event_name(object: &str) -> bool {
    object.len() + 1 + 16 <= 253
}

/// The name of an event about an object whose own name is too long for the `Recorder`'s
/// scheme: its start (cut to end in a letter or digit), a dot and the time in hex.
fn long_event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{:x}", nanos.max(0));
    let mut keep = 253 - suffix.len();
    while !object.is_char_boundary(keep.min(object.len())) {
        keep -= 1;
    }
    let start =
        object[..keep.min(object.len())].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{start}{suffix}")
}

/// Publishes an event about an object with a long name as the `Recorder` would (same fields),
/// under a name that fits; repeats are not merged into a series.
async fn publish_long_named(
    client: &Client,
    reporter: &str,
    event: &Event,
    reference: k8s_openapi::api::core::v1::ObjectReference,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let now = Timestamp::now();
    let object = reference.name.clone().unwrap_or_default();
    let namespace = reference
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let body = K8sEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        event_time: Some(MicroTime(now)),
        regarding: Some(reference),
        metadata: ObjectMeta {
            name: Some(long_event_name(&object, now.as_nanosecond())),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        reporting_controller: Some(reporter.to_string()),
        reporting_instance: Some(reporter.to_string()),
        type_: Some(match event.type_ {
            EventType::Normal => "Normal".into(),
            EventType::Warning => "Warning".into(),
        }),
        ..Default::default()
    };
    Api::<K8sEvent>::namespaced(client.clone(), &namespace)
        .create(&Default::default(), &body)
        .await
        .map(|_| ())
}

/// Event notes are limited to 1 KiB by the API server.
fn truncate_note(mut note: String) -> String {
    const MAX: usize = 1024;
    if note.len() > MAX {
        let mut cut = MAX - '…'.len_utf8();
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push('…');
    }
    note
}

/// Calls the check's `release` for `check` on `wl`; a failure is an Event
/// `CheckReleaseFailed` on the Workload and an error (the reconcile is retried with backoff).
pub(super) async fn release<C: AdmissionCheckController>(
    ctx: &Context<C>,
    wl: &Workload,
    check: &str,
    reason: ReleaseReason,
) -> Result<(), Error> {
    let namespace = wl.namespace().unwrap_or_default();
    let name = wl.name_any();
    let release = ReleaseContext {
        namespace: &namespace,
        name: &name,
        workload: Some(wl),
        check_name: check,
        reason,
        client: &ctx.client,
        now: Timestamp::now(),
    };
    let mode = if ctx.shadow.is_some() {
        " (shadow mode)"
    } else {
        ""
    };
    if let Err(e) = ctx.controller.release(&release).await {
        let note = format!(
            "check {check}{mode}: releasing after {}: {e}",
            reason.as_str()
        );
        let note = redact_workload_note(wl, &note);
        ctx.event(wl, EventType::Warning, "CheckReleaseFailed", note)
            .await;
        return Err(Error::Check(Box::new(e)));
    }
    info!(workload = %name, namespace, check, reason = reason.as_str(), shadow = ctx.shadow.is_some(), "released");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_about_long_named_workloads_get_names_that_fit() {
        assert!(fits_recorder_event_name(&"a".repeat(236)));
        assert!(!fits_recorder_event_name(&"a".repeat(237)));
        let object = format!("{}-x", "a".repeat(250));
        let name = long_event_name(&object, i128::from(i64::MAX));
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.starts_with("aaaa"));
        assert!(name.ends_with(".7fffffffffffffff"));
        let before_dot = name.rsplit_once('.').map(|(a, _)| a).unwrap_or_default();
        assert!(
            before_dot.ends_with('a'),
            "ends in a letter or digit: {name}"
        );
    }
}

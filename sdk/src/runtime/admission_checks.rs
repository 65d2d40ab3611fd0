//! The AdmissionCheck loop: keeps the registry of our checks and their `Active` conditions
//! in line with the cluster, and stands down for checks another deployment claims.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use super::{check_registry, claim, metrics, relist};
use crate::api::AdmissionCheck;
use crate::check::{AdmissionCheckController, CheckParameters};
use crate::error::Error;

/// The AdmissionCheck loop: keeps the registry of our checks and their `Active` conditions in
/// line with the cluster. It reacts to AdmissionChecks, to the parameters objects they name,
/// and to taking the lead (only the leader writes conditions, so a new leader writes them all
/// once). A check whose parameters could not be read, or whose condition could not be written,
/// is tried again with backoff: nothing else would bring it back (an RBAC fix, say, changes no
/// watched object).
pub(super) struct CheckSync<C: AdmissionCheckController> {
    pub(super) client: Client,
    pub(super) controller: Arc<C>,
    pub(super) registry: check_registry::Registry<C::Parameters>,
    /// Asks for every Workload to be reconciled (a check appeared, changed or went away).
    pub(super) reconcile_all: mpsc::Sender<()>,
    pub(super) metrics: Arc<metrics::Metrics>,
    /// This deployment's claim on the checks it answers (`None` without leader election).
    pub(super) claim: Option<String>,
    pub(super) settings: CheckSettings,
}

/// What syncing a check needs of the runtime's configuration.
pub(super) struct CheckSettings {
    field_manager: String,
    /// [`super::config::RuntimeConfig::max_retry_delay`].
    max_retry_delay: Duration,
    /// [`super::config::RuntimeConfig::shadow`].
    shadow: Option<crate::shadow::ShadowScope>,
}

impl From<&super::config::RuntimeConfig> for CheckSettings {
    fn from(config: &super::config::RuntimeConfig) -> Self {
        Self {
            field_manager: config.field_manager.clone(),
            max_retry_delay: config.max_retry_delay,
            shadow: config.shadow.clone(),
        }
    }
}

/// What the loop knows of the checks between two events.
#[derive(Default)]
struct Known {
    /// Ours, by name, as last seen.
    ours: BTreeMap<String, AdmissionCheck>,
    names: relist::NameTracker,
    /// Checks to sync again after a failure: when, after how many failures in a row, and
    /// whether a change of the check or its parameters is still to be taken in.
    retries: BTreeMap<String, Retry>,
    /// Checks another deployment claims, with the claim and what to tell the operator: this
    /// one stands down for them.
    claimed_elsewhere: BTreeMap<String, (String, ClaimedElsewhere)>,
}

impl Known {
    /// The checks whose retry is due: each is synced, then forgotten or rescheduled (keeping
    /// its count of failures, so the backoff grows).
    fn due_retries(&mut self) -> Work {
        let now = tokio::time::Instant::now();
        let ours = &self.ours;
        self.retries.retain(|name, _| ours.contains_key(name));
        let due = self
            .retries
            .iter()
            .filter(|(_, r)| r.at <= now)
            .filter_map(|(name, _)| ours.get(name).cloned())
            .collect();
        Work::sync(due, SyncCause::Rewrite)
    }
}

/// Which checks to resolve again, why, and which went away.
struct Work {
    sync: Vec<AdmissionCheck>,
    why: SyncCause,
    gone: Vec<String>,
}

impl Work {
    fn nothing() -> Self {
        Self::sync(Vec::new(), SyncCause::Rewrite)
    }

    fn sync(sync: Vec<AdmissionCheck>, why: SyncCause) -> Self {
        Self {
            sync,
            why,
            gone: Vec::new(),
        }
    }

    fn gone(gone: Vec<String>) -> Self {
        Self {
            sync: Vec::new(),
            why: SyncCause::Changed,
            gone,
        }
    }
}

impl<C: AdmissionCheckController> CheckSync<C> {
    /// Runs until the watch ends (never, in practice: the runtime drops it). `synced` is told
    /// when the first list is complete.
    pub(super) async fn run(
        self,
        synced: Arc<tokio::sync::Notify>,
        mut leading: watch::Receiver<bool>,
    ) {
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter::from(self.settings.field_manager.clone()),
        );
        let api = Api::<AdmissionCheck>::all(self.client.clone());
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        let mut parameters = std::pin::pin!(watch_parameters::<C::Parameters>(self.client.clone()));
        let mut known = Known::default();
        let mut election_over = false;
        loop {
            let next_retry = known.retries.values().map(|r| r.at).min();
            let work = tokio::select! {
                event = events.next() => match event {
                    None => return,
                    Some(Err(e)) => {
                        warn!(error = %e, "watching AdmissionChecks");
                        continue;
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        synced.notify_one();
                        // Those a re-list no longer has were deleted while the watch was down.
                        Work::gone(known.names.observe(&watcher::Event::<AdmissionCheck>::InitDone))
                    }
                    Some(Ok(event)) => {
                        let lead = *leading.borrow();
                        self.on_event(&mut known, event, lead.then_some(&recorder)).await
                    }
                },
                changed = leading.changed(), if !election_over => {
                    if changed.is_err() {
                        election_over = true;
                        continue;
                    }
                    if !*leading.borrow_and_update() {
                        continue;
                    }
                    self.took_the_lead(&known, &recorder).await
                },
                Some(name) = parameters.next() => Work::sync(
                    known
                        .ours
                        .values()
                        .filter(|ac| ac.spec.parameters.as_ref().is_some_and(|r| r.name == name))
                        .cloned()
                        .collect(),
                    SyncCause::Changed,
                ),
                () = sleep_until_or_never(next_retry) => known.due_retries(),
            };
            let write = *leading.borrow();
            self.apply(&mut known, work, write).await;
        }
    }

    /// What an AdmissionCheck event asks for. `recorder` is there while this replica leads.
    async fn on_event(
        &self,
        known: &mut Known,
        event: watcher::Event<AdmissionCheck>,
        recorder: Option<&Recorder>,
    ) -> Work {
        let touched = known.names.observe(&event);
        match event {
            watcher::Event::Apply(ac) | watcher::Event::InitApply(ac)
                if ac.spec.controller_name == self.controller.controller_name() =>
            {
                match claimed_by_another(self.claim.as_deref(), &ac) {
                    Some(other) => self.stand_down(known, &ac, other, recorder).await,
                    None => self.on_ours(known, ac, touched.is_empty()),
                }
            }
            // Deleted, not (or no longer) ours, or a list beginning.
            _ => {
                for name in &touched {
                    if known.claimed_elsewhere.remove(name).is_some() {
                        self.metrics.check_claimed_elsewhere(name, false);
                    }
                }
                Work::gone(touched)
            }
        }
    }

    /// Another deployment claims `ac`: forgets it like a check that went away (nothing is
    /// answered or released here), and tells the operator once per claim.
    async fn stand_down(
        &self,
        known: &mut Known,
        ac: &AdmissionCheck,
        other: String,
        recorder: Option<&Recorder>,
    ) -> Work {
        let name = ac.name_any();
        if known
            .claimed_elsewhere
            .get(&name)
            .is_none_or(|(seen, _)| *seen != other)
        {
            let found = ClaimedElsewhere::new(ac, self.controller.controller_name(), &other);
            error!(check = %name, "{}", found.message);
            self.metrics.check_claimed_elsewhere(&name, true);
            if let Some(recorder) = recorder {
                found.publish(recorder).await;
            }
            known.claimed_elsewhere.insert(name.clone(), (other, found));
        }
        Work::gone(vec![name])
    }

    /// One of ours was applied: resolved again if its spec changed (or it is new); its
    /// condition written again if only its status changed and the condition is not what it
    /// should be (our own condition coming back, Kueue's finalizer); nothing for a re-list
    /// showing it unchanged (`unchanged_relist`).
    fn on_ours(&self, known: &mut Known, ac: AdmissionCheck, unchanged_relist: bool) -> Work {
        let name = ac.name_any();
        if known.claimed_elsewhere.remove(&name).is_some() {
            info!(check = %name, "no other deployment claims the admission check any more: answering it");
            self.metrics.check_claimed_elsewhere(&name, false);
        }
        let before = known.ours.insert(name.clone(), ac.clone());
        if unchanged_relist {
            return Work::nothing();
        }
        let spec_changed = before
            .is_none_or(|b| b.metadata.generation != ac.metadata.generation || b.spec != ac.spec);
        if spec_changed {
            return Work::sync(vec![ac], SyncCause::Changed);
        }
        let unclaimed = self
            .claim
            .as_deref()
            .is_some_and(|ours| claim::judge(&ac, ours) != claim::Claim::Ours);
        let condition_off = unclaimed
            || check_registry::summary(&self.registry, &name).is_none_or(|state| {
                check_registry::desired_active_condition(
                    &ac,
                    &state,
                    k8s_openapi::jiff::Timestamp::now(),
                )
                .is_some()
            });
        if condition_off {
            Work::sync(vec![ac], SyncCause::Rewrite)
        } else {
            Work::nothing()
        }
    }

    /// This replica took the lead: the Events a standby held back are the leader's to write,
    /// and every condition is written (taking the lead reconciles every Workload anyway).
    async fn took_the_lead(&self, known: &Known, recorder: &Recorder) -> Work {
        for (_, found) in known.claimed_elsewhere.values() {
            found.publish(recorder).await;
        }
        Work::sync(known.ours.values().cloned().collect(), SyncCause::Rewrite)
    }

    /// Forgets what went away, syncs what is to sync (writing conditions if this replica
    /// leads, `write`), keeps the failures for another try, and asks for every Workload to be
    /// reconciled if anything changed.
    async fn apply(&self, known: &mut Known, work: Work, write: bool) {
        let mut changed = false;
        for name in work.gone {
            // A check of ours that went away: every Workload may now be decided differently.
            if known.ours.remove(&name).is_some() {
                write_registry(&self.registry).remove(&name);
                self.metrics.forget_check(&name);
                known.retries.remove(&name);
                changed = true;
            }
        }
        for ac in &work.sync {
            changed |= self.sync_and_record(known, ac, work.why, write).await;
        }
        if changed {
            let _ = self.reconcile_all.try_send(());
        }
    }

    /// Syncs one check and keeps (or forgets) its retry; whether Workloads may now be decided
    /// differently.
    async fn sync_and_record(
        &self,
        known: &mut Known,
        ac: &AdmissionCheck,
        why: SyncCause,
        write: bool,
    ) -> bool {
        let name = ac.name_any();
        let before = check_registry::summary(&self.registry, &name);
        let Synced { recorded, result } = self.sync_check(ac, write).await;
        let after = check_registry::summary(&self.registry, &name);
        let earlier = known.retries.get(&name).copied();
        // A change of the check or its parameters not taken in yet (this one, or one whose
        // sync failed before it was recorded).
        let pending_change = why == SyncCause::Changed || earlier.is_some_and(|r| r.pending_change);
        // New parameters leave an active check active: only a change that was seen can have
        // brought them.
        let changed =
            before != after || (recorded && pending_change && matches!(after, Some(Ok(_))));
        match result {
            Ok(()) => {
                known.retries.remove(&name);
            }
            Err(e) => {
                self.metrics.check_sync_error(&name);
                let failures = earlier.map_or(0, |r| r.failures).saturating_add(1);
                let delay = check_retry_backoff().delay(failures, rand::random::<f64>());
                warn!(check = %name, error = %e, failures, retry_in = ?delay, "syncing the admission check");
                let retry = Retry {
                    at: tokio::time::Instant::now() + delay,
                    failures,
                    pending_change: pending_change && !recorded,
                };
                known.retries.insert(name, retry);
            }
        }
        changed
    }
    /// Resolves a check's parameters, records the result, and (on the leader, `write`) writes
    /// its `Active` condition.
    async fn sync_check(&self, ac: &AdmissionCheck, write: bool) -> Synced {
        let name = ac.name_any();
        let resolved = check_registry::resolve(
            &self.client,
            self.controller.as_ref(),
            ac,
            self.settings.max_retry_delay,
        )
        .await;
        let (state, failure) = match resolved {
            Ok(check_registry::Resolved::Active(active)) => (Ok(Arc::new(active)), None),
            Ok(check_registry::Resolved::Inactive(inactive)) => (Err(inactive), None),
            // Shown on the check, and tried again until fixed: an API the check needs that is
            // not served, or our own RBAC (see `check_registry::inactive_for`).
            Err(e) => match check_registry::inactive_for::<C::Parameters>(ac, &e) {
                Some(inactive) => (Err(inactive), Some(e)),
                None => {
                    if check_registry::summary(&self.registry, &name).is_none() {
                        // Never resolved here: not served, whatever the condition says.
                        self.metrics.check_active(&name, false);
                    }
                    return Synced {
                        recorded: false,
                        result: Err(e),
                    };
                }
            },
        };
        if let Err(inactive) = &state {
            warn!(check = %name, reason = %inactive.reason, message = %inactive.message, "admission check inactive");
        }
        let summary = state
            .as_ref()
            .map(|a| a.message.clone())
            .map_err(Clone::clone);
        self.metrics.check_active(&name, summary.is_ok());
        write_registry(&self.registry).insert(name.clone(), state);
        // In shadow mode a check that could answer is shown inactive: no ClusterQueue may wait
        // on answers that are never written.
        let shown = match (summary, &self.settings.shadow) {
            (Ok(message), Some(scope)) => Err(check_registry::shadow_mode(scope, &message)),
            (summary, _) => summary,
        };
        let written = if write {
            write_active_condition(
                &self.client,
                &self.settings.field_manager,
                ac,
                &shown,
                self.claim.as_deref(),
            )
            .await
        } else {
            Ok(())
        };
        Synced {
            recorded: true,
            result: written.and(failure.map_or(Ok(()), Err)),
        }
    }
}

/// The claim of another deployment on `ac`, if this one claims checks (leader election) and
/// another one's claim is on it.
fn claimed_by_another(ours: Option<&str>, ac: &AdmissionCheck) -> Option<String> {
    match claim::judge(ac, ours?) {
        claim::Claim::Elsewhere(other) => Some(other),
        claim::Claim::Ours | claim::Claim::Unclaimed => None,
    }
}

/// Another deployment's claim found on one of our checks: what the log, and the leader's
/// Warning Event on the check, tell the operator.
struct ClaimedElsewhere {
    reference: k8s_openapi::api::core::v1::ObjectReference,
    message: String,
}

impl ClaimedElsewhere {
    fn new(ac: &AdmissionCheck, controller_name: &str, other: &str) -> Self {
        Self {
            reference: ac.object_ref(&()),
            message: claim::conflict_message(&ac.name_any(), controller_name, other),
        }
    }

    async fn publish(&self, recorder: &Recorder) {
        let event = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: "ClaimedElsewhere".into(),
            note: Some(self.message.clone()),
            action: "StandDown".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &self.reference).await {
            warn!(check = ?self.reference.name, error = %e, "publishing an event");
        }
    }
}

/// What made the AdmissionCheck loop sync checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SyncCause {
    /// The check's spec or its parameters object changed (or appeared): Workloads may now be
    /// decided differently.
    Changed,
    /// To write the condition again or try again: this replica took the lead, the condition
    /// is not what it should be, an earlier sync failed.
    Rewrite,
}

/// A check whose sync failed, to try again.
#[derive(Clone, Copy, Debug)]
struct Retry {
    at: tokio::time::Instant,
    failures: u32,
    /// A change of the check or its parameters is among what failed.
    pending_change: bool,
}

/// Backoff for syncing one AdmissionCheck again after a failure: 1 s, 2 s, 4 s ... (each up to
/// 20 % longer) and never over 1 min.
fn check_retry_backoff() -> crate::retry::RetryPolicy {
    crate::retry::RetryPolicy::runtime_backoff(Duration::from_secs(60))
}

async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Names of the parameters objects of kind `P` as they change or go away, re-lists included
/// (none if `P` takes none).
fn watch_parameters<P: CheckParameters>(
    client: Client,
) -> futures::stream::BoxStream<'static, String> {
    let Some(kind) = P::reference() else {
        return futures::stream::pending().boxed();
    };
    let gvk = GroupVersionKind::gvk(kind.group, kind.version, kind.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, kind.plural);
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let mut names = relist::NameTracker::default();
    watcher(api, watcher::Config::default())
        .default_backoff()
        .flat_map(move |event| {
            let touched = match event {
                Ok(event) => names.observe(&event),
                Err(e) => {
                    warn!(error = %e, "watching the checks' parameters");
                    Vec::new()
                }
            };
            futures::stream::iter(touched)
        })
        .boxed()
}

/// What one sync of a check did.
struct Synced {
    /// Its state (active with new parameters, or inactive) was recorded in the registry.
    recorded: bool,
    /// Ok, or what is worth trying again: an API error reading the parameters (what was known
    /// before stays), or writing the condition.
    result: Result<(), Error>,
}

/// Writes the `Active` condition for `state`, resolved from `ac`, unless it is already there.
async fn write_active_condition(
    client: &Client,
    field_manager: &str,
    ac: &AdmissionCheck,
    state: &Result<String, check_registry::Inactive>,
    claim: Option<&str>,
) -> Result<(), Error> {
    // Compared with the check as it is now, not as cached: the watch may not have brought back
    // a condition written a moment ago, and writing it again would move its lastTransitionTime.
    let Some(current) = Api::<AdmissionCheck>::all(client.clone())
        .get_opt(&ac.name_any())
        .await?
    else {
        return Ok(());
    };
    // Changed since it was resolved (re-created, a new spec, another controllerName): the
    // watch event for that change syncs it again.
    if current.uid() != ac.uid()
        || current.metadata.generation != ac.metadata.generation
        || current.spec.controller_name != ac.spec.controller_name
    {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    // Another deployment's claim is never overwritten: its watch event makes this one stand
    // down. Ours (or none) is written with the Active condition, in the same apply, since an
    // apply that left it out would remove it.
    let claim_missing = match claim.map(|ours| claim::judge(&current, ours)) {
        Some(claim::Claim::Elsewhere(_)) => return Ok(()),
        Some(claim::Claim::Unclaimed) => true,
        Some(claim::Claim::Ours) | None => false,
    };
    let active = match check_registry::desired_active_condition(&current, state, now) {
        Some(condition) => condition,
        None if claim_missing => match current.active_condition() {
            Some(condition) => condition.clone(),
            None => return Ok(()),
        },
        None => return Ok(()),
    };
    let mut conditions = vec![active];
    conditions.extend(claim.map(|ours| claim::claim_condition(&current, ours, now)));
    check_registry::apply_active_condition(client, field_manager, &current, conditions).await
}

/// Withdraws this deployment's claim from every check that carries it, keeping the `Active`
/// condition as it is: on a clean stop of the leader, so that another deployment (the same
/// controller moved to another namespace or Lease) takes the checks over. Best effort: a
/// check left claimed is taken back by this deployment's next leader.
pub(super) async fn withdraw_claims(
    client: &Client,
    field_manager: &str,
    ours: &str,
    checks: &[String],
) {
    let api = Api::<AdmissionCheck>::all(client.clone());
    for name in checks {
        let withdrawn = async {
            let Some(current) = api.get_opt(name).await? else {
                return Ok(());
            };
            if claim::judge(&current, ours) != claim::Claim::Ours {
                return Ok(());
            }
            let active: Vec<_> = current.active_condition().cloned().into_iter().collect();
            check_registry::apply_active_condition(client, field_manager, &current, active).await
        };
        match withdrawn.await {
            Ok(()) => {
                info!(check = %name, "withdrew this deployment's claim on the admission check")
            }
            Err(e) => {
                warn!(check = %name, error = %e, "withdrawing the claim on the admission check")
            }
        }
    }
}

fn write_registry<P>(
    registry: &check_registry::Registry<P>,
) -> std::sync::RwLockWriteGuard<'_, check_registry::CheckMap<P>> {
    // A panic while holding the lock cannot leave the map half-updated: every write is one insert
    // or remove. So a poisoned lock is still safe to use.
    registry.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod scripted_api {
    //! The `Active` condition write against a scripted API server: what it reads first, and
    //! when it writes nothing.
    use super::*;
    use crate::testing::ScriptedApi;
    use serde_json::json;

    fn check(uid: &str, generation: i64, controller: &str) -> AdmissionCheck {
        serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": "probe", "uid": uid, "generation": generation,
                         "resourceVersion": "7"},
            "spec": {"controllerName": controller},
        }))
        .expect("an AdmissionCheck")
    }

    async fn write(api: &ScriptedApi, resolved: &AdmissionCheck) -> Result<(), Error> {
        let active = Ok("The admission check is active".to_string());
        write_active_condition(&api.client(), "sdk", resolved, &active, None).await
    }

    #[tokio::test]
    async fn a_condition_resolved_from_an_older_spec_is_not_written() {
        let resolved = check("u1", 1, "example.com/probe");
        for (why, now) in [
            ("a new generation", check("u1", 2, "example.com/probe")),
            (
                "re-created under its name",
                check("u2", 1, "example.com/probe"),
            ),
            (
                "another controllerName",
                check("u1", 1, "example.com/other"),
            ),
        ] {
            let api = ScriptedApi::new();
            api.answer(200, &now);
            write(&api, &resolved).await.expect(why);
            let seen: Vec<String> = api.requests().iter().map(|r| r.method.clone()).collect();
            assert_eq!(seen, ["GET"], "{why}: only the read, no write");
        }
    }

    #[tokio::test]
    async fn a_deleted_check_is_not_written_and_the_current_one_is_applied() {
        let resolved = check("u1", 1, "example.com/probe");
        let api = ScriptedApi::new();
        api.fail(
            404,
            "NotFound",
            "admissionchecks.kueue.x-k8s.io \"probe\" not found",
        );
        write(&api, &resolved).await.expect("gone is not an error");
        assert_eq!(api.requests().len(), 1);

        let api = ScriptedApi::new();
        api.answer(200, &resolved);
        api.answer(200, &resolved);
        write(&api, &resolved).await.expect("written");
        let seen = api.requests();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[1].method, "PATCH");
        assert!(
            seen[1].path.ends_with("/admissionchecks/probe/status"),
            "{}",
            seen[1].path
        );
        let condition = &seen[1].body["status"]["conditions"][0];
        assert_eq!(condition["type"], "Active");
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["observedGeneration"], 1);
    }

    #[tokio::test]
    async fn a_failed_write_is_an_error_to_retry() {
        let resolved = check("u1", 1, "example.com/probe");
        let api = ScriptedApi::new();
        api.answer(200, &resolved);
        api.fail(403, "Forbidden", "cannot patch admissionchecks/status");
        let err = write(&api, &resolved).await.expect_err("refused");
        assert_eq!(err.label(), "api");
    }
}

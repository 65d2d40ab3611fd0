//! The SDK trait implementation: reads the Workload and its config, creates the attempt's
//! PodTemplates and ProvisioningRequest, and answers from the request's conditions.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodTemplate};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{
    CheckState, ProvisioningRequest, ResourceFlavorSpec, Workload, workload_condition as cond,
};
use kueue_admission_sdk::prometheus_client::registry::Registry;
use kueue_admission_sdk::{
    AdmissionCheckController, ApiKind, CheckContext, Decision, ErrorClass, Extensions,
    ReleaseContext, RetryPolicy, Revalidate,
};
use tracing::{debug, info, warn};

use crate::config::ProvisioningParameters;
use crate::error::{ApiCall, Error};
use crate::identity::{self, Identity, Ownership, ownership};
use crate::metrics::Metrics;
use crate::names;
use crate::outcome::{self, Outcome};
use crate::plan::{self, Plan, PlanInput, RequestPlan};
use crate::refusal::{self, Subject};
use crate::requests::{self, RequestCache};
use crate::topology::{self, CheckView, QueueView};
use kueue_admission_sdk::flavors::FlavorCache;
use kueue_admission_sdk::watched_cache::{Unavailable, WatchedCache};

/// How often a Workload whose request names are all held by foreign objects looks again.
const BLOCKED_RECHECK: Duration = Duration::from_secs(30);

/// How long cluster-autoscaler keeps a provisioned request's capacity booked (10 minutes, not
/// configurable in 1.36; see `BookingExpired`).
pub const CAPACITY_BOOKING: Duration = Duration::from_secs(600);

/// Settings that are not in Kueue's `ProvisioningRequestConfig`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `spec.controllerName` this controller answers.
    pub controller_name: String,
    /// Timeout for configs without the timeout annotation; `None` waits forever (as Kueue).
    pub default_timeout: Option<Duration>,
    /// Make the request when the Workload gets quota, before Kueue adds the check's entry
    /// (see [`kueue_admission_sdk::AdmissionCheckController::start_early`]); `false` waits for
    /// the entry, as Kueue's built-in check does.
    pub start_early: bool,
}

/// The ProvisioningRequest admission check.
#[derive(Clone, Debug)]
pub struct ProvisioningCheck {
    settings: Settings,
    /// Value of the label that ties requests and templates to this controller instance.
    instance: String,
    metrics: Arc<Metrics>,
    /// `(what, request uid)` of what was already counted of a request (a timeout, pods left
    /// unplaced): a decision may be computed twice.
    counted: Arc<Mutex<HashSet<(&'static str, String)>>>,
    /// The ResourceFlavors, kept by a watch while this replica leads.
    flavors: FlavorCache,
    /// This instance's requests, kept by the leader's watch of them.
    requests: Arc<RequestCache>,
    /// Every AdmissionCheck's name → its controllerName (and our topology warning on it).
    admission_checks: Arc<WatchedCache<CheckView>>,
    /// Every ClusterQueue's flavors and checks (for the topology warning).
    cluster_queues: Arc<WatchedCache<QueueView>>,
}

impl ProvisioningCheck {
    /// A check answering `settings.controller_name`.
    pub fn new(settings: Settings) -> Self {
        let instance = identity::instance_label(&settings.controller_name);
        Self {
            settings,
            instance,
            metrics: Arc::new(Metrics::new()),
            counted: Default::default(),
            flavors: FlavorCache::default(),
            requests: requests::request_cache(),
            admission_checks: Arc::new(WatchedCache::new("admissionchecks.kueue.x-k8s.io")),
            cluster_queues: Arc::new(WatchedCache::new("clusterqueues.kueue.x-k8s.io")),
        }
    }

    /// The metrics, shared with the task that watches requests.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The label value that marks this instance's requests and templates.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Creates the attempt's PodTemplates (owned by the Workload), then its request. Templates
    /// first: a request created before them would be seen by the autoscaler without its
    /// templates (cluster-autoscaler may fail it: an attempt lost), and a crash between the two
    /// leaves only templates, which the sweep deletes. Objects of ours under the same names (a
    /// restart between two steps) are kept; a name taken by anything else is
    /// [`Error::NameTaken`] (the templates made for it deleted), and the caller tries the next.
    async fn create(
        &self,
        client: &Client,
        wl: &Workload,
        me: &Identity<'_>,
        attempt: u32,
        plan: &RequestPlan,
        config: &str,
    ) -> Result<ProvisioningRequest, Error> {
        let creation = &Creation {
            wl,
            me,
            attempt,
            plan,
            config,
        };
        let namespace = wl.namespace().unwrap_or_default();
        let templates: Api<PodTemplate> = Api::namespaced(client.clone(), &namespace);
        let requests: Api<ProvisioningRequest> = Api::namespaced(client.clone(), &namespace);
        let made = self.create_templates(&templates, creation).await?;
        let mut request =
            plan::request_object(plan, wl, me.check, attempt, identity::MANAGED_BY, &made);
        request
            .labels_mut()
            .insert(identity::INSTANCE_LABEL.into(), self.instance.clone());
        let created = match requests.create(&PostParams::default(), &request).await {
            Ok(r) => {
                let since_reserved = seconds_since_reserved(wl, &r);
                self.metrics.created(me.check, attempt, since_reserved);
                info!(request = %plan.name, attempt, "created ProvisioningRequest");
                r
            }
            Err(e) if is_already_exists(&e) => {
                // Not in the cache: foreign, or ours not delivered yet (a lost response).
                let existing = requests.get(&plan.name).await.map_err(Error::api::<
                    ProvisioningRequest,
                >(
                    "get", &namespace, &plan.name,
                ))?;
                let taken = ours_or_taken(existing, me, "ProvisioningRequest", &namespace);
                if taken.is_err() {
                    discard(&templates, &made).await;
                }
                taken?
            }
            Err(e) => {
                return Err(refused(
                    e,
                    refusal::Kind::ProvisioningRequest,
                    &plan.name,
                    creation,
                ));
            }
        };
        let key = (namespace.clone(), created.name_any());
        let uid = created.uid().unwrap_or_default();
        self.requests.created(key, uid, requests::kept(&created));
        Ok(created)
    }

    /// Creates the request's PodTemplates, all at once (a Workload of three podsets waits for
    /// one round trip, not three), taking ours that exist already (a pass interrupted after
    /// making them). A name held by anything else is [`Error::NameTaken`], and the templates
    /// made are deleted again. No name is read before: a create that finds it taken is the only
    /// read.
    async fn create_templates(
        &self,
        templates: &Api<PodTemplate>,
        creation: &Creation<'_>,
    ) -> Result<Vec<PodTemplate>, Error> {
        let Creation {
            wl,
            me,
            attempt,
            plan,
            ..
        } = *creation;
        let mut objects =
            plan::pod_template_objects(plan, wl, me.check, attempt, identity::MANAGED_BY);
        for t in &mut objects {
            t.labels_mut()
                .insert(identity::INSTANCE_LABEL.into(), self.instance.clone());
        }
        let created = futures::future::join_all(
            objects
                .iter()
                .map(|t| self.create_template(templates, creation, t)),
        )
        .await;
        let (mut made, mut failed) = (Vec::with_capacity(objects.len()), None);
        for result in created {
            match result {
                Ok(t) => made.push(t),
                // A taken name is for good: it is the error to tell, whatever else failed.
                Err(e) if matches!(e, Error::NameTaken(_)) => failed = Some(e),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            None => Ok(made),
            Some(e) => {
                // Deleted only when a name is taken for good; after a failure that may pass,
                // the next pass takes them as they are.
                if matches!(e, Error::NameTaken(_)) {
                    discard(templates, &made).await;
                }
                Err(e)
            }
        }
    }

    /// Creates `template`. A template of ours under its name is taken if our live request of
    /// the plan's name owns it (a pass interrupted after making both); otherwise it is stale (a
    /// pass interrupted before the request, or the template of an earlier request of the same
    /// name, whose deletion may still be on its way to the request watch, which deletes that
    /// request's templates by uid), so it is deleted and the create tried again: a new request
    /// never shares a template with another. A predecessor's (left by a deleted Workload of the
    /// same name) is deleted once the Workload is confirmed current; anything else is
    /// [`Error::NameTaken`].
    async fn create_template(
        &self,
        templates: &Api<PodTemplate>,
        creation: &Creation<'_>,
        template: &PodTemplate,
    ) -> Result<PodTemplate, Error> {
        let me = creation.me;
        let namespace = creation.wl.namespace().unwrap_or_default();
        let name = template.name_any();
        let mut replaced = false;
        loop {
            match templates.create(&PostParams::default(), template).await {
                Ok(t) => return Ok(t),
                Err(e) if is_already_exists(&e) => {}
                Err(e) => return Err(refused(e, refusal::Kind::PodTemplate, &name, creation)),
            }
            let existing = templates.get(&name).await;
            let existing = existing.map_err(Error::api::<PodTemplate>("get", &namespace, &name))?;
            let client = templates.clone().into_client();
            let stale = match ownership(&existing.metadata, me) {
                Ownership::Ours => {
                    if owned_by_live_request(&client, creation, &existing).await? {
                        return Ok(existing);
                    }
                    true
                }
                Ownership::Predecessor => self.workload_is_current(&client, &namespace, me).await?,
                Ownership::Foreign => false,
            };
            if !stale || replaced {
                return Err(Error::NameTaken(format!(
                    "PodTemplate {namespace}/{name} exists, {}",
                    identity::describe_owner(&existing.metadata, me)
                )));
            }
            requests::delete_exactly(templates, &existing).await?;
            replaced = true;
        }
    }

    /// Our request for this attempt, under whichever of its names it has, or what of this
    /// instance's holds each name (`None`: free, or held by a foreign object, which only a
    /// create finds). Both names are looked at, so a restart finds the request again even when
    /// the first name was freed after it was made under the second. Read from the cache only.
    async fn locate(
        &self,
        namespace: &str,
        me: &Identity<'_>,
        attempt: u32,
    ) -> Result<Located, Unavailable> {
        let requests = &self.requests;
        requests.listed().await?;
        let mut holders = Vec::new();
        for name in names::request_names(me.workload, me.workload_uid, me.check, attempt) {
            let holder = requests.get(&(namespace.to_string(), name.clone()))?;
            let holder = holder.map(|r| ProvisioningRequest::clone(&r));
            if let Some(r) = holder.as_ref()
                && ownership(&r.metadata, me) == Ownership::Ours
            {
                return Ok(Located::Ours(Box::new(r.clone())));
            }
            holders.push((name, holder));
        }
        Ok(Located::Absent(holders))
    }

    /// Whether the Workload named `me.workload` still has uid `me.workload_uid`, read fresh:
    /// the Workload being decided may come from a cache that has not seen a re-creation.
    async fn workload_is_current(
        &self,
        client: &Client,
        namespace: &str,
        me: &Identity<'_>,
    ) -> Result<bool, Error> {
        let api: Api<Workload> = Api::namespaced(client.clone(), namespace);
        let current = api.get_opt(me.workload).await;
        let current = current.map_err(Error::api::<Workload>("get", namespace, me.workload))?;
        Ok(current.is_some_and(|w| w.uid().as_deref() == Some(me.workload_uid)))
    }

    /// No request of ours exists for this attempt: clear what earlier attempts left, then create
    /// the request under the first name whose request and templates are free (or ours). Names
    /// held by anything else are skipped, never deleted; when all are held, the answer is
    /// `Pending` with a message naming what holds them.
    async fn start_attempt(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        me: &Identity<'_>,
        attempt: u32,
        plan: &RequestPlan,
        holders: &[(String, Option<ProvisioningRequest>)],
    ) -> Result<Decision, Error> {
        let (client, wl) = (ctx.client, ctx.workload);
        let namespace = wl.namespace().unwrap_or_default();
        // Left by a deleted Workload of the same name: never adopt its capacity, and free the
        // name for this one (as before names could collide).
        if let Some((name, Some(old))) = holders.iter().find(|(_, h)| {
            h.as_ref()
                .is_some_and(|r| ownership(&r.metadata, me) == Ownership::Predecessor)
        }) && self.workload_is_current(client, &namespace, me).await?
        {
            requests::delete_request(client, &self.instance, &self.requests, old).await?;
            return Ok(Decision::pending(format!(
                "replacing ProvisioningRequest {namespace}/{name}, left by an earlier Workload of \
                 the same name"
            )));
        }
        self.delete_earlier_attempts(ctx, me, attempt).await?;
        let mut taken: Vec<String> = Vec::new();
        // Kueue's built-in check never steps aside: a name it may want for one of its own
        // Workloads is left to it, whoever comes first.
        let kueue_checks = match self.kueue_checks_sharing_names(me.check).await {
            Ok(checks) => checks,
            Err(why) => return unavailable(why),
        };
        for (i, (name, holder)) in holders.iter().enumerate() {
            if i == 0 && !kueue_checks.is_empty() {
                taken.push(wanted_by_kueue(
                    &format!("{namespace}/{name}"),
                    &kueue_checks,
                ));
                continue;
            }
            let plan = plan.renamed(name);
            if let Err(why) = self.create_under(ctx, me, &plan, holder).await? {
                taken.push(why);
                continue;
            }
            let qualified = format!("{namespace}/{name}");
            if taken.is_empty()
                && let Some(quiet) = outcome::quiet(
                    &Outcome::Unseen {
                        grace_left: outcome::UNSEEN_GRACE,
                    },
                    &ctx.entry.message,
                    &qualified,
                )
            {
                return Ok(quiet);
            }
            let mut message = format!(
                "created ProvisioningRequest {qualified} (attempt {attempt}); waiting for it to \
                 be provisioned"
            );
            if !taken.is_empty() {
                warn!(request = %name, taken = ?taken, "the first choice of name is taken; using another");
                message.push_str(&format!(" ({})", not_the_usual_name(&taken.join("; "))));
            }
            return Ok(Decision::pending(message));
        }
        // Nothing of ours changes when the holder goes away, so no watch wakes the Workload.
        Ok(Decision::pending_recheck_after(
            format!(
                "cannot create a ProvisioningRequest for attempt {attempt}: every name this check \
             may use is taken: {}. This check never deletes or adopts objects it did not make: \
             delete them if they are stale, or give the Workload or the AdmissionCheck another \
             name",
                taken.join("; ")
            ),
            BLOCKED_RECHECK,
        ))
    }

    /// Deletes this Workload's requests for `check` of attempts before `attempt`, with their
    /// templates.
    async fn delete_earlier_attempts(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        me: &Identity<'_>,
        attempt: u32,
    ) -> Result<usize, Error> {
        let earlier =
            |r: &ProvisioningRequest| names::attempt_of(&r.name_any()).is_some_and(|a| a < attempt);
        let (client, wl, instance) = (ctx.client, ctx.workload, &self.instance);
        requests::delete_requests_of(client, instance, wl, me.check, &self.requests, earlier).await
    }

    /// Creates the request `plan` names (and its templates) unless what holds the name (`holder`,
    /// of this instance's, else found by the create) or a template's name is not ours:
    /// `Ok(Err(why))` then says what holds it.
    async fn create_under(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        me: &Identity<'_>,
        plan: &RequestPlan,
        holder: &Option<ProvisioningRequest>,
    ) -> Result<Result<(), String>, Error> {
        let (client, wl) = (ctx.client, ctx.workload);
        let namespace = wl.namespace().unwrap_or_default();
        if let Some(r) = holder {
            return Ok(Err(format!(
                "ProvisioningRequest {namespace}/{} exists, {}",
                plan.name,
                identity::describe_owner(&r.metadata, me)
            )));
        }
        let config = ctx.parameters.metadata.name.as_str();
        match self
            .create(client, wl, me, ctx.attempt(), plan, config)
            .await
        {
            Ok(_) => Ok(Ok(())),
            Err(Error::NameTaken(why)) => Ok(Err(why)),
            Err(e) => Err(e),
        }
    }

    /// Why a request of ours has its other name: what holds (or may want) the usual one.
    async fn why_not_usual(&self, namespace: &str, usual: &str, check: &str) -> String {
        let kueue_checks = self
            .kueue_checks_sharing_names(check)
            .await
            .unwrap_or_default();
        let qualified = format!("{namespace}/{usual}");
        let why = if kueue_checks.is_empty() {
            format!("ProvisioningRequest {qualified} is held by an object this check did not make")
        } else {
            wanted_by_kueue(&qualified, &kueue_checks)
        };
        not_the_usual_name(&why)
    }

    /// The AdmissionChecks of Kueue's built-in provisioning check whose requests can take the
    /// names of `check`'s ([`names::checks_may_share_names`]), from the cache.
    async fn kueue_checks_sharing_names(&self, check: &str) -> Result<Vec<String>, Unavailable> {
        self.admission_checks.listed().await?;
        let mut found: Vec<String> = self
            .admission_checks
            .select(|(_, name), c| {
                c.controller_name == identity::KUEUE_CONTROLLER_NAME
                    && names::checks_may_share_names(check, name)
            })?
            .into_iter()
            .map(|((_, name), _)| name)
            .collect();
        found.sort();
        Ok(found)
    }

    /// For a `Ready` entry: withdraw it only as [`outcome::revalidation`] says (the capacity
    /// revoked; before admission, the booking expired or the request failed), or, once the
    /// booking of an admitted Workload's request ran out, as [`outcome::stranded`] says of its
    /// pods. Anything else keeps the answer exactly as written (no write).
    async fn revalidate(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        namespace: &str,
    ) -> Result<Decision, Error> {
        let keep = Decision::Ready {
            message: ctx.entry.message.clone(),
            pod_set_updates: ctx.entry.pod_set_updates.clone(),
        };
        let (workload, uid) = (
            ctx.workload.name_any(),
            ctx.workload.uid().unwrap_or_default(),
        );
        let me = Identity {
            instance: &self.instance,
            workload: &workload,
            workload_uid: &uid,
            check: &ctx.entry.name,
        };
        // Unreadable: the answer stands until the cache can say otherwise.
        let located = self.locate(namespace, &me, ctx.attempt()).await;
        let Ok(Located::Ours(request)) = located else {
            return Ok(keep);
        };
        let name = request.name_any();
        let admitted = ctx.workload.condition_is_true(cond::ADMITTED);
        let o = outcome::outcome(&request, admitted, None, ctx.now);
        let qualified = format!("{namespace}/{name}");
        if let Some(withdrawn) = outcome::revalidation(&o, admitted, &qualified, ctx.attempt()) {
            return Ok(withdrawn);
        }
        let booking_over = request
            .status
            .as_ref()
            .is_some_and(|s| outcome::booking_ran_out(&s.conditions).is_some());
        if admitted && o == Outcome::Provisioned && booking_over {
            let unplaced = self.unplaced_consumers(ctx.client, namespace, &name).await;
            if let Some(retry) = outcome::stranded(&qualified, &unplaced) {
                if self.first_time("stranded", &request) {
                    self.metrics.stranded(&ctx.entry.name);
                }
                info!(request = %qualified, pods = unplaced.len(), "pods that consume the request were not scheduled when its booking ran out: retrying");
                return Ok(retry);
            }
        }
        Ok(keep)
    }

    /// The pods of `namespace` that consume `request` and that the scheduler found no room for
    /// (one list of the namespace's unbound `Pending` pods, served from the API server's
    /// cache). A refused or failed list finds none: the `Ready` answer stands, with a warning.
    async fn unplaced_consumers(
        &self,
        client: &Client,
        namespace: &str,
        request: &str,
    ) -> Vec<outcome::Unplaced> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let unbound = ListParams::default()
            .fields("status.phase=Pending,spec.nodeName=")
            .match_any();
        match pods.list(&unbound).await {
            Ok(list) => outcome::unplaced_consumers(&list.items, request),
            Err(e) => {
                warn!(
                    namespace,
                    request,
                    error = %e,
                    "cannot list pods (needs list on pods): pods of an admitted workload left \
                     without room when the booking ran out are not detected"
                );
                Vec::new()
            }
        }
    }

    /// Whether `what` is counted for `request` for the first time.
    fn first_time(&self, what: &'static str, request: &ProvisioningRequest) -> bool {
        self.counted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((what, request.uid().unwrap_or_default()))
    }
}

/// Whether our request of the plan's name, read fresh, owns `template` (or predates templates
/// owning requests and so names its templates only by name).
async fn owned_by_live_request(
    client: &Client,
    creation: &Creation<'_>,
    template: &PodTemplate,
) -> Result<bool, Error> {
    let namespace = creation.wl.namespace().unwrap_or_default();
    let name = &creation.plan.name;
    let requests: Api<ProvisioningRequest> = Api::namespaced(client.clone(), &namespace);
    let request = requests.get_opt(name).await;
    let request = request.map_err(Error::api::<ProvisioningRequest>("get", &namespace, name))?;
    Ok(request.is_some_and(|r| {
        let owners = plan::owner_template_uids(&r);
        ownership(&r.metadata, creation.me) == Ownership::Ours
            && (owners.is_empty() || template.uid().is_some_and(|u| owners.contains(&u.as_str())))
    }))
}

/// Why a request's usual name (`namespace/name`) is left alone: Kueue's built-in check
/// `kueue_checks` may want it.
fn wanted_by_kueue(qualified: &str, kueue_checks: &[String]) -> String {
    format!(
        "ProvisioningRequest {qualified} may be wanted by Kueue's built-in check {} \
         (AdmissionCheck {}), which names its requests the same way",
        identity::KUEUE_CONTROLLER_NAME,
        kueue_checks.join(", ")
    )
}

/// The note on a request under its other name, `why` saying what holds the usual one.
fn not_the_usual_name(why: &str) -> String {
    format!("not the usual name: {why}; this check never touches objects it did not make")
}

/// The answer while a cache a decision reads cannot be read: `Pending` while its first list is
/// not done yet (asked again shortly); a refused permission is an error the SDK shows on the
/// entry and bounds (the quota is given back after the hold: the operator must grant it).
fn unavailable(why: Unavailable) -> Result<Decision, Error> {
    warn!(%why, "a decision waits for a cache");
    match why {
        Unavailable::NotListed { .. } => Ok(Decision::pending_recheck_after(
            why.to_string(),
            Duration::from_secs(5),
        )),
        Unavailable::Refused { .. } => Err(Error::NotPermitted(why.to_string())),
    }
}

/// Seconds from the Workload's quota reservation to the request's creation, both as the control
/// plane stamped them (whole seconds), so no clock of ours enters.
fn seconds_since_reserved(wl: &Workload, request: &ProvisioningRequest) -> Option<f64> {
    let reserved = wl
        .condition(cond::QUOTA_RESERVED)
        .filter(|c| c.status == "True")?
        .last_transition_time
        .0;
    let created = request.metadata.creation_timestamp.as_ref()?.0;
    Some(created.duration_since(reserved).as_secs_f64().max(0.0))
}

/// Whether an existing request is the one `plan` describes (class, parameters, podsets).
fn matches_plan(plan: &RequestPlan, request: &ProvisioningRequest) -> bool {
    let spec = &request.spec;
    spec.provisioning_class_name == plan.provisioning_class_name
        && spec.parameters == plan.parameters
        && spec.pod_sets.len() == plan.pod_sets.len()
        && spec
            .pod_sets
            .iter()
            .zip(&plan.pod_sets)
            .all(|(have, want)| {
                have.pod_template_ref.name == want.template_name && have.count == want.count
            })
}

pub(crate) fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}

/// The objects one create makes: for attempt `attempt` of the Workload `wl`, answered by the
/// check `me`, as `plan` names them, under the ProvisioningRequestConfig `config`.
struct Creation<'a> {
    wl: &'a Workload,
    me: &'a Identity<'a>,
    attempt: u32,
    plan: &'a RequestPlan,
    config: &'a str,
}

/// Deletes templates made for a name that turned out taken: the next name gets its own. Best
/// effort: the template sweep deletes what is left.
async fn discard(templates: &Api<PodTemplate>, made: &[PodTemplate]) {
    for t in made {
        if let Err(e) = requests::delete_exactly(templates, t).await {
            warn!(template = %t.name_any(), error = %e, "deleting a template of a taken name");
        }
    }
}

/// The error for a failed create of `object`: [`Error::Refused`] when the API server refused it
/// for good (malformed or invalid), with a message for the user; the API error otherwise.
fn refused(e: kube::Error, kind: refusal::Kind, object: &str, creation: &Creation<'_>) -> Error {
    let Creation { wl, config, .. } = *creation;
    let (namespace, workload) = (wl.namespace().unwrap_or_default(), wl.name_any());
    let failed_create = |source| Error::Api {
        call: Box::new(ApiCall {
            verb: "create",
            kind: kind.as_str().into(),
            object: format!("{namespace}/{object}"),
        }),
        source,
    };
    let kube::Error::Api(status) = &e else {
        return failed_create(e);
    };
    let subject = Subject {
        namespace: &namespace,
        workload: &workload,
        config,
    };
    let keys: Vec<String> = plan::annotation_parameters(wl).into_keys().collect();
    match refusal::for_api(kind, object, status, &keys, &subject) {
        Some(message) => {
            warn!(%object, error = %e, "the API server refused an object of this check for good");
            Error::Refused {
                message,
                api: Some(e),
            }
        }
        None => failed_create(e),
    }
}

/// `object` when it is ours, else the error saying who holds the name.
fn ours_or_taken<K: ResourceExt>(
    object: K,
    me: &Identity<'_>,
    kind: &str,
    namespace: &str,
) -> Result<K, Error> {
    if ownership(object.meta(), me) == Ownership::Ours {
        return Ok(object);
    }
    Err(Error::NameTaken(format!(
        "{kind} {namespace}/{} exists, {}",
        object.name_any(),
        identity::describe_owner(object.meta(), me)
    )))
}

/// What the names an attempt's request may take hold.
enum Located {
    /// Our request, under one of them.
    Ours(Box<ProvisioningRequest>),
    /// None of ours: each name with what of this instance's holds it (`None`: free, or held by
    /// a foreign object), in order of preference.
    Absent(Vec<(String, Option<ProvisioningRequest>)>),
}

/// The answer for a Workload admitted before this check applied to it.
pub const ADMITTED_BEFORE_THE_CHECK: &str = "the Workload was admitted before this check applied \
     to it (its pods are placed): no capacity is provisioned for it";

/// The ProvisioningRequest API this check creates objects of.
const PROVISIONING_REQUEST_API: ApiKind = ApiKind {
    group: "autoscaling.x-k8s.io",
    version: "v1",
    kind: "ProvisioningRequest",
    plural: "provisioningrequests",
};

impl AdmissionCheckController for ProvisioningCheck {
    type Parameters = ProvisioningParameters;
    type Error = Error;

    fn controller_name(&self) -> &str {
        &self.settings.controller_name
    }

    fn retry_policy(&self, parameters: &ProvisioningParameters) -> RetryPolicy {
        parameters.retry_policy()
    }

    // A request or template the API server refuses as invalid (or the parameter check before
    // creating one) is the user's to fix: shown on the entry, quota held for a while only.
    fn classify_error(&self, error: &Error) -> ErrorClass {
        error.class()
    }

    // Capacity can be revoked after admission: a change of the request wakes the Workload and
    // its Ready answer is read again.
    fn revalidate(&self) -> Revalidate {
        Revalidate::OnChange
    }

    // On the leader: watch this instance's requests, wake their Workloads, count their
    // transitions and remove orphans; keep the caches of flavors, AdmissionChecks and
    // ClusterQueues; warn on our checks that a ClusterQueue applies to a topology-aware flavor.
    fn while_leading(&self) -> Extensions {
        let (instance, metrics) = (self.instance().to_string(), self.metrics());
        let (flavors, requests) = (self.flavors.shared(), self.requests.clone());
        let (admission_checks, cluster_queues) =
            (self.admission_checks.clone(), self.cluster_queues.clone());
        let sources = topology::Sources {
            checks: admission_checks.clone(),
            queues: cluster_queues.clone(),
            flavors: flavors.clone(),
        };
        let controller_name = self.settings.controller_name.clone();
        Extensions::new()
            .while_leading("provisioning-requests", move |ctx| {
                crate::request_watch::watch_requests(ctx, instance, metrics, requests)
            })
            .while_leading("resource-flavors", move |ctx| {
                FlavorCache::watch(flavors, ctx)
            })
            .while_leading("admission-checks", move |ctx| {
                admission_checks.fill(Api::all(ctx.client), topology::kept_check)
            })
            .while_leading("cluster-queues", move |ctx| {
                cluster_queues.fill(Api::all(ctx.client), topology::kept_queue)
            })
            .while_leading("topology-warning", move |ctx| {
                topology::warn_while_leading(ctx, controller_name, sources)
            })
    }

    // Without cluster-autoscaler's ProvisioningRequest CRD at v1 nothing can be provisioned:
    // the check says so on its Active condition instead of failing every Workload's decision.
    fn required_apis(&self) -> Vec<ApiKind> {
        vec![PROVISIONING_REQUEST_API]
    }

    // Its decisions act: a shadow run would have the autoscaler add nodes for Workloads that
    // were admitted without them.
    fn shadow_mode_refusal(&self) -> Option<String> {
        Some(
            "its decisions create ProvisioningRequests, on which cluster-autoscaler adds nodes; \
             in shadow mode it would do so for Workloads admitted without waiting for them"
                .into(),
        )
    }

    fn register_metrics(&self, registry: &mut Registry) {
        self.metrics.register(registry);
    }

    async fn decide(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
    ) -> Result<Decision, Error> {
        let wl = ctx.workload;
        let namespace = wl
            .namespace()
            .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "namespace"))?;
        if ctx.entry.state == CheckState::Ready {
            return self.revalidate(ctx, &namespace).await;
        }
        if wl.condition_is_true(cond::ADMITTED) {
            // Kueue admits only once every entry is Ready, and an eviction clears Admitted: an
            // admitted Workload with our entry Pending got this check after its admission (the
            // ClusterQueue's checks changed, e.g. a check renamed). Its pods are placed already;
            // capacity provisioned now would go unused.
            return Ok(Decision::ready(ADMITTED_BEFORE_THE_CHECK));
        }
        let check = ctx.entry.name.as_str();
        let attempt = ctx.attempt();
        let flavors = match self.flavors.assigned(wl).await {
            Ok(flavors) => flavors,
            Err(why) => return unavailable(why),
        };
        let Some(plan) = self.plan_for(ctx, &namespace, &flavors).await? else {
            return Ok(Decision::ready(
                "no podset needs capacity: the provisioning request is not needed",
            ));
        };
        let (workload, uid) = (
            wl.name_any(),
            wl.uid()
                .ok_or_else(|| Error::MalformedWorkload(wl.name_any(), "uid"))?,
        );
        let me = Identity {
            instance: &self.instance,
            workload: &workload,
            workload_uid: &uid,
            check,
        };
        let located = match self.locate(&namespace, &me, attempt).await {
            Ok(located) => located,
            Err(why) => return unavailable(why),
        };
        let request = match located {
            Located::Ours(r) if r.metadata.deletion_timestamp.is_some() => {
                return Ok(Decision::pending(format!(
                    "waiting for the old ProvisioningRequest {namespace}/{} to be deleted",
                    r.name_any()
                )));
            }
            Located::Ours(r) => *r,
            Located::Absent(holders) => {
                return self.start_attempt(ctx, &me, attempt, &plan, &holders).await;
            }
        };
        // The request is ours (the rule in `locate`): only now may its name reach podSetUpdates.
        let plan = plan.renamed(&request.name_any());
        let answer = self.answer_from(ctx, &namespace, &request, &plan).await?;
        let usual = names::request_name(&workload, check, attempt);
        if request.name_any() == usual {
            return Ok(answer);
        }
        // Made under its other name, maybe before the entry existed (an early start, whose
        // message nobody saw): every answer says why, as the one that made it did.
        let why = self.why_not_usual(&namespace, &usual, check).await;
        let mut answer = answer;
        answer.message_mut().push_str(&format!(" ({why})"));
        Ok(answer)
    }

    // Kueue adds the entry from a loop that falls seconds behind its scheduler under load:
    // the request is made as soon as the quota is reserved, so the autoscaler starts sooner.
    fn starts_early(&self) -> bool {
        self.settings.start_early
    }

    // cluster-autoscaler books a request's capacity for 10 minutes after Provisioned
    // (hard-coded in 1.36), then marks it BookingExpired. A request made at the reservation is
    // Provisioned at or after it, so a wait of at most this long releases an early request
    // before its booking can expire under a Workload still waiting for its entry.
    fn early_work_lasts(&self) -> Option<Duration> {
        Some(CAPACITY_BOOKING)
    }

    // The same path as a decision for the attempt the entry will have: the templates and the
    // request are made (or found); the answer waits for the entry, whose decision finds them.
    async fn start_early(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
    ) -> Result<(), Error> {
        let decision = self.decide(ctx).await?;
        debug!(
            workload = %ctx.workload.name_any(),
            check = %ctx.entry.name,
            state = %decision.state(),
            message = decision.message(),
            "started before Kueue added the entry"
        );
        Ok(())
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), Error> {
        let Some(wl) = ctx.workload else {
            return Ok(());
        };
        let (client, check) = (ctx.client, ctx.check_name);
        let deleted =
            requests::delete_requests_of(client, &self.instance, wl, check, &self.requests, |_| {
                true
            })
            .await?;
        if deleted > 0 {
            info!(
                workload = %ctx.name,
                namespace = %ctx.namespace,
                check = %ctx.check_name,
                reason = ctx.reason.as_str(),
                deleted,
                "deleted ProvisioningRequests"
            );
        }
        Ok(())
    }
}

impl ProvisioningCheck {
    /// The request this Workload needs (`None`: no podset needs capacity). Parameters no
    /// ProvisioningRequest accepts (a too long annotation) are found here, before anything is
    /// created, and reported as the user's to fix.
    async fn plan_for(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        namespace: &str,
        flavors: &BTreeMap<String, ResourceFlavorSpec>,
    ) -> Result<Option<RequestPlan>, Error> {
        let wl = ctx.workload;
        let plan = plan::plan(&PlanInput {
            workload: wl,
            check: &ctx.entry.name,
            attempt: ctx.attempt(),
            config: &ctx.parameters.spec,
            flavors,
        })
        .map_err(|e| {
            let subject = Subject {
                namespace,
                workload: &wl.name_any(),
                config: &ctx.parameters.metadata.name,
            };
            match refusal::for_plan(&e, &subject) {
                Some(message) => Error::Refused { message, api: None },
                None => Error::Plan(e),
            }
        })?;
        Ok(match plan {
            Plan::NotNeeded => None,
            Plan::Request(p) => Some(p),
        })
    }

    /// The answer given by our current `request` (made from `plan`): recreated if the config
    /// changed since, else what its conditions say.
    async fn answer_from(
        &self,
        ctx: &CheckContext<'_, ProvisioningParameters>,
        namespace: &str,
        request: &ProvisioningRequest,
        plan: &RequestPlan,
    ) -> Result<Decision, Error> {
        let (wl, check, attempt) = (ctx.workload, ctx.entry.name.as_str(), ctx.attempt());
        let qualified = format!("{namespace}/{}", plan.name);
        if !matches_plan(plan, request) {
            // The config changed since the request was made (the request spec is immutable).
            // The desired request already includes the Workload's annotation overrides, so a
            // request made from them is never judged out of date: no recreate loop.
            requests::delete_request(ctx.client, &self.instance, &self.requests, request).await?;
            return Ok(Decision::pending(format!(
                "ProvisioningRequest {qualified} no longer matches ProvisioningRequestConfig {}; \
                 recreating it",
                ctx.parameters.metadata.name
            )));
        }
        let timeout = ctx.parameters.timeout(self.settings.default_timeout);
        let admitted = wl.condition_is_true(cond::ADMITTED);
        let o = outcome::outcome(request, admitted, timeout, ctx.now);
        if matches!(o, Outcome::TimedOut(_)) && self.first_time("timed out", request) {
            self.metrics.timed_out(check);
        }
        let members: Vec<String> = plan
            .pod_sets
            .iter()
            .flat_map(|p| p.members.iter().cloned())
            .collect();
        if let Some(quiet) = outcome::quiet(&o, &ctx.entry.message, &qualified) {
            return Ok(quiet);
        }
        let node_selector = ctx.parameters.node_selector_updates();
        Ok(outcome::decision(&o, &qualified, attempt, || {
            outcome::pod_set_updates(request, &members, node_selector)
        }))
    }
}

#[cfg(test)]
#[path = "check_scripted_api.rs"]
mod scripted_api;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kueue_admission_sdk::testing::WorkloadBuilder;

    #[test]
    fn time_to_request_counts_from_the_reservation_on_the_control_plane_stamps() {
        let at = |s: &str| Time(s.parse().expect("timestamp"));
        let reserved = WorkloadBuilder::new("ns", "wl")
            .at(at("2026-11-26T10:00:00Z").0)
            .quota_reserved("cq", "default")
            .build();
        let mut request = ProvisioningRequest::new("wl-1", Default::default());
        request.metadata.creation_timestamp = Some(at("2026-11-26T10:00:03Z"));
        assert_eq!(seconds_since_reserved(&reserved, &request), Some(3.0));
        // Two clocks a second apart never make it negative.
        request.metadata.creation_timestamp = Some(at("2026-11-26T09:59:59Z"));
        assert_eq!(seconds_since_reserved(&reserved, &request), Some(0.0));
        let waiting = WorkloadBuilder::new("ns", "wl").build();
        assert_eq!(seconds_since_reserved(&waiting, &request), None);
        request.metadata.creation_timestamp = None;
        assert_eq!(seconds_since_reserved(&reserved, &request), None);
    }

    #[test]
    fn the_instance_label_differs_per_controller_name() {
        let a = ProvisioningCheck::new(Settings {
            controller_name: "a.example.com/provisioning".into(),
            default_timeout: None,
            start_early: true,
        });
        let b = ProvisioningCheck::new(Settings {
            controller_name: "b.example.com/provisioning".into(),
            default_timeout: None,
            start_early: true,
        });
        assert_ne!(a.instance(), b.instance());
        assert!(a.instance().len() <= 63);
    }

    #[test]
    fn the_required_api_is_the_one_requests_are_created_at() {
        use kube::Resource;
        let api = PROVISIONING_REQUEST_API;
        assert_eq!(api.group, ProvisioningRequest::group(&()));
        assert_eq!(api.version, ProvisioningRequest::version(&()));
        assert_eq!(api.kind, ProvisioningRequest::kind(&()));
        assert_eq!(api.plural, ProvisioningRequest::plural(&()));
    }

    #[test]
    fn api_error_kinds() {
        let status = |code, reason: &str| {
            kube::Error::Api(
                kube::core::Status::failure("x", reason)
                    .with_code(code)
                    .boxed(),
            )
        };
        assert!(is_already_exists(&status(409, "AlreadyExists")));
        assert!(!is_already_exists(&status(409, "Conflict")));
        assert!(crate::requests::is_not_found(&status(404, "NotFound")));
    }
}

//! The provisioning chart's RBAC under the API server's real RBAC: sufficient (the controller,
//! run as the chart's ServiceAccount, provisions, retries, cleans up and reports without one
//! failed reconcile) and minimal (without any single verb the chart grants, a step of the same
//! scenario fails).
//!
//! Every run is a release of charts/kueue-provisioning-controller of its own: its namespace
//! (the release namespace), controllerName, Lease, ClusterRole and provisioning class, so runs go
//! on at the same time without seeing each other. A run renders the chart with helm, applies the
//! ServiceAccount, ClusterRole, Role and their bindings (a variant with one verb taken out of
//! one rule), waits until the authorizer grants exactly that, then runs the controller
//! in-process as the Deployment runs it (the container's arguments, so leader election on the
//! Lease the Role names in the release namespace; a TokenRequest token of the ServiceAccount)
//! beside the autoscaler simulator (admin), and drives the [`Step`]s in order, each waited for
//! [`STEP_TIMEOUT`] ([`LEADING_TIMEOUT`] for the start), and [`UNREFUSED_GRACE`] longer while
//! the verb taken away has not been refused (a slow machine is no evidence). The last step needs
//! a restart after 60 s, so the whole test takes about 90 s.
//!
//! Each run also submits a Job when its controller starts, to a queue of its own guarded by a
//! check that exists from the start: [`EXPECTED`] says, for every verb, which step fails first
//! and what becomes of that Job (admitted; told why on its entry, with its quota bounded;
//! queued without quota; or, only where the controller can neither see nor write Workloads,
//! silent).
//!
//! The base run must pass every step without one request refused; each variant must fail one,
//! and the API server's audit log must show a 403 for the verb taken away (a step that only
//! timed out proves nothing), or be listed in [`JUSTIFIED`] with the reason no scenario can see
//! it. The variants come from the rendered roles, so a verb
//! added to the chart is tried without a change here (and fails this test until a step needs
//! it or it is justified).

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::Running;
use e2e::chart::{self, Grant, PROVISIONING_CHART};
use e2e::{Forbidden, TestEnv};
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{
    ADMISSION_CHECK_ACTIVE, AdmissionCheck, AdmissionCheckParametersReference, AdmissionCheckSpec,
    ProvisioningRequest, Workload, find_condition, workload_condition as cond,
};
use kueue_admission_sdk::attempts;
use kueue_admission_sdk::runtime::lease_name_for;
use kueue_provisioning_controller::identity::{
    CHECK_ANNOTATION, MANAGED_BY_LABEL, REQUEST_ANNOTATION, WORKLOAD_ANNOTATION, WORKLOAD_UID_LABEL,
};
use kueue_provisioning_controller::plan::PARAMETER_ANNOTATION_PREFIX;
use kueue_provisioning_controller::{identity, names};
use serde_json::{Value, json};
use tokio::time::Instant;

/// How long a step is waited for once the verb taken away has been refused. Each takes 0.1 to
/// 6 s on an idle machine, up to 9 s seen with other end-to-end tests running beside, over 20 s
/// on a loaded 2-core CI machine; a variant whose verb was refused waits this long before it
/// counts as failed.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// The bound of [`Step::Leading`]: every run's controller starts at about the same time, and
/// each lists every Workload and AdmissionCheck of the shared cluster before it is ready, which
/// took up to 20 s on 2 cores with 400 Workloads left by earlier runs (0.5 to 5 s on a fresh
/// control plane).
const LEADING_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a step looks again.
const POLL: Duration = Duration::from_millis(500);

/// How much longer a step is waited for past its bound while the API server has not refused
/// the verb taken away: a timeout without that 403 proves nothing about the verb, and with the
/// 29 runs' controllers on a 2-core CI machine a step that passes took over 20 s. A run whose
/// verb was refused fails at the bound; the base run has this much more to pass.
const UNREFUSED_GRACE: Duration = Duration::from_secs(120);

/// How often, past a step's bound, the audit log is read for the 403.
const REFUSAL_CHECK: Duration = Duration::from_secs(5);

/// Verbs of the chart whose removal no scenario can observe, each with the reason:
/// (role kind, API group, resource, verb, why). A verb listed here whose removal does fail a
/// step fails the test too, so that the list stays true.
const JUSTIFIED: &[(&str, &str, &str, &str, &str)] = &[
    (
        "ClusterRole",
        "autoscaling.x-k8s.io",
        "provisioningrequests",
        "get",
        "requests are read from the leader's watch; get is only for a create that finds the name \
     taken by a request the watch does not hold (another controller's, such as Kueue's own \
     check): no scenario here runs a second controller, provisioning_collisions covers it",
    ),
    (
        "ClusterRole",
        "",
        "pods",
        "list",
        "read only when an admitted Workload's request's booking runs out (10 minutes after \
         Provisioned), to find its pods left without room; without it the answer stands: no \
         scenario here waits out a booking, provisioning_shared_capacity covers it",
    ),
];

/// The finalizer Kueue adds to AdmissionChecks.
const KUEUE_FINALIZER: &str = "kueue.x-k8s.io/resource-in-use";

/// Field manager of what the test applies.
const FIELD_MANAGER: &str = "e2e-chart-rbac";

/// What a run waits for, in order: behaviours of the controller. Each names the verbs whose
/// removal makes it the first step to fail (a verb may be needed by later steps too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Leases create, get, patch (the election); admissionchecks and workloads list (readiness);
    /// tokenreviews and subjectaccessreviews create (`kueue_ac_leader` is read from the
    /// authenticated /metrics).
    Leading,
    /// admissionchecks watch (the check is created after the start) and get (read afresh
    /// before its condition is written), admissionchecks/status patch,
    /// provisioningrequestconfigs get.
    CheckInactive,
    /// provisioningrequestconfigs list and watch (the config is created after the check).
    CheckActive,
    /// clusterqueues list and watch (the ClusterQueue is created after the start; the
    /// warning is judged from the leader's cache of them only), and resourceflavors list and
    /// watch (the flavors' topologyName comes from the flavor cache, so without them this is
    /// the first step to fail).
    TopologyWarned,
    /// workloads get (the sweep reads the Workload afresh), provisioningrequests list (the
    /// leader's watch of its requests lists first) and delete.
    OrphanRequestRemoved,
    /// workloads watch, workloads/status patch, resourceflavors list and watch (a decision
    /// waits for the flavor cache and says which verb is refused; TopologyWarned fails first
    /// without them), provisioningrequests create,
    /// podtemplates create; workloads patch (the attempt annotation, applied before the Retry:
    /// without it no Retry is written and the Job is never retried).
    Admitted,
    /// provisioningrequests watch (transitions are counted from the watch).
    TransitionsCounted,
    /// No verb of its own: the ownerReference is in the templates' create.
    TemplatesOwned,
    /// events create.
    EventsPublished,
    /// podtemplates get and delete.
    JobCleanedUp,
    /// Any forbidden call in a reconcile.
    NoReconcileErrors,
    /// events patch (a repeat is counted into the first event's series).
    RepeatedEventCounted,
    /// podtemplates list (the sweep of templates whose request is gone).
    OrphanTemplateSwept,
}

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Leading => "the controller is ready and holds the Lease",
            Step::CheckInactive => {
                "an AdmissionCheck created after the start, naming a config that does not exist \
                 yet, gets Active=False, and the controller handles all its events"
            }
            Step::CheckActive => "creating the config makes the check Active=True",
            Step::TopologyWarned => {
                "a ClusterQueue created after the start that applies the check to a \
                 topology-aware flavor puts TopologyAssignedBeforeProvisioning=True on the check"
            }
            Step::OrphanRequestRemoved => {
                "a request left by a Workload deleted while no controller ran is deleted"
            }
            Step::Admitted => {
                "a \"fail,provision\" Job is retried once (its attempt counted on the Workload), \
                 then admitted"
            }
            Step::TransitionsCounted => "the requests' Failed and Provisioned are counted",
            Step::TemplatesOwned => "the Workload owns its PodTemplates (garbage collection)",
            Step::EventsPublished => "CheckRetry and CheckReady events are on the Workload",
            Step::JobCleanedUp => "the Job completing deletes its request and PodTemplates",
            Step::NoReconcileErrors => "kueue_ac_reconcile_errors_total is 0 for every kind",
            Step::RepeatedEventCounted => {
                "a repeated CheckFailedPermanently event is counted in its series"
            }
            Step::OrphanTemplateSwept => {
                "after a restart, a PodTemplate orphaned over 60 s ago is deleted"
            }
        }
    }
}

/// One verb taken out of one rule of the rendered ClusterRole or Role.
#[derive(Clone, Debug)]
struct Removal {
    role_kind: &'static str,
    rule: usize,
    verb: String,
}

/// A step that did not happen.
#[derive(Debug)]
struct Failure {
    step: Step,
    why: String,
    after: Duration,
}

/// What one run saw.
#[derive(Debug)]
struct Report {
    /// The verb taken away (`None`: the base run), as the authorizer was asked about it.
    removed: Option<Vec<Grant>>,
    removal: Option<Removal>,
    namespace: String,
    passed: Vec<(Step, Duration)>,
    failure: Option<Failure>,
    /// Every 403 the API server answered the run's ServiceAccount (its audit log).
    forbidden: Vec<Forbidden>,
    /// What became of the Job submitted when the controller started.
    meanwhile: Option<Fate>,
    total: Duration,
}

/// What became of a Workload submitted when the controller started, in a queue of its own
/// guarded by a check of its own: what an operator's users see while the verb is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fate {
    /// Admitted through the check.
    Admitted,
    /// Holding quota (or given it back), the check's entry telling why: this message.
    Told(String),
    /// Never given quota: Kueue keeps it in its queue (the check is not active), holding
    /// nothing.
    Queued,
    /// Holding quota with an entry that says nothing: stranded.
    Silent,
}

impl Fate {
    /// The Workload as read now.
    fn of(wl: &Workload, check: &str) -> Self {
        let entry = wl.admission_check(check);
        if wl.condition_is_true(cond::ADMITTED) {
            return Fate::Admitted;
        }
        match entry {
            Some(e) if !e.message.is_empty() => Fate::Told(e.message.clone()),
            _ if wl.condition_is_true(cond::QUOTA_RESERVED) => Fate::Silent,
            _ => Fate::Queued,
        }
    }

    /// The kind, as [`EXPECTED`] names it.
    fn kind(&self) -> &'static str {
        match self {
            Fate::Admitted => "admitted",
            Fate::Told(_) => "told",
            Fate::Queued => "queued",
            Fate::Silent => "silent",
        }
    }
}

/// For each verb taken away: the first step that fails, and what becomes of a Workload
/// submitted meanwhile (`admitted`; `told`: its entry says why, the quota bounded; `queued`:
/// never given quota, since the check is not active; `silent`: quota held, nothing said),
/// as (API group, resource, verb, step, fate). `silent` only where the controller can neither
/// see Workloads nor write on them: its readiness, its log and its reconcile errors say so.
/// `told|admitted` where only a cache's watch is refused: its list works, and a decision made
/// from the first list in the moment before the watch's refusal arrives reads a list just made
/// and admits; one made after it is told (the Job is submitted as the controller starts).
#[rustfmt::skip]
const EXPECTED: &[(&str, &str, &str, Step, &str)] = &[
    ("kueue.x-k8s.io", "admissionchecks", "get", Step::CheckInactive, "queued"),
    ("kueue.x-k8s.io", "admissionchecks", "list", Step::Leading, "queued"),
    ("kueue.x-k8s.io", "admissionchecks", "watch", Step::CheckInactive, "told|admitted"),
    ("kueue.x-k8s.io", "admissionchecks/status", "patch", Step::CheckInactive, "queued"),
    ("kueue.x-k8s.io", "clusterqueues", "list", Step::TopologyWarned, "admitted"),
    ("kueue.x-k8s.io", "clusterqueues", "watch", Step::TopologyWarned, "admitted"),
    ("kueue.x-k8s.io", "provisioningrequestconfigs", "get", Step::CheckInactive, "queued"),
    ("kueue.x-k8s.io", "provisioningrequestconfigs", "list", Step::CheckActive, "admitted"),
    ("kueue.x-k8s.io", "provisioningrequestconfigs", "watch", Step::CheckActive, "admitted"),
    ("kueue.x-k8s.io", "resourceflavors", "list", Step::TopologyWarned, "told"),
    ("kueue.x-k8s.io", "resourceflavors", "watch", Step::TopologyWarned, "told|admitted"),
    ("kueue.x-k8s.io", "workloads", "get", Step::OrphanRequestRemoved, "admitted"),
    ("kueue.x-k8s.io", "workloads", "list", Step::Leading, "silent"),
    ("kueue.x-k8s.io", "workloads", "watch", Step::Admitted, "silent"),
    ("kueue.x-k8s.io", "workloads", "patch", Step::Admitted, "admitted"),
    ("kueue.x-k8s.io", "workloads/status", "patch", Step::Admitted, "silent"),
    ("autoscaling.x-k8s.io", "provisioningrequests", "list", Step::OrphanRequestRemoved, "told"),
    ("autoscaling.x-k8s.io", "provisioningrequests", "watch", Step::Admitted, "told|admitted"),
    ("autoscaling.x-k8s.io", "provisioningrequests", "create", Step::Admitted, "told"),
    ("autoscaling.x-k8s.io", "provisioningrequests", "delete", Step::OrphanRequestRemoved, "admitted"),
    ("", "podtemplates", "get", Step::OrphanRequestRemoved, "admitted"),
    ("", "podtemplates", "list", Step::OrphanTemplateSwept, "admitted"),
    ("", "podtemplates", "create", Step::Admitted, "told"),
    ("", "podtemplates", "delete", Step::Admitted, "admitted"),
    ("events.k8s.io", "events", "create", Step::EventsPublished, "admitted"),
    ("events.k8s.io", "events", "patch", Step::RepeatedEventCounted, "admitted"),
    ("coordination.k8s.io", "leases", "create", Step::Leading, "queued"),
    ("coordination.k8s.io", "leases", "get", Step::Leading, "queued"),
    ("coordination.k8s.io", "leases", "patch", Step::Leading, "queued"),
    ("authentication.k8s.io", "tokenreviews", "create", Step::Leading, "admitted"),
    ("authorization.k8s.io", "subjectaccessreviews", "create", Step::Leading, "admitted"),
];

/// What [`EXPECTED`] says of the verb `grants` take away.
fn expected(grants: &[Grant]) -> Option<(Step, &'static str)> {
    let g = grants.first()?;
    EXPECTED
        .iter()
        .find(|(group, resource, verb, ..)| {
            *group == g.group && *resource == g.resource && *verb == g.verb
        })
        .map(|(.., step, fate)| (*step, *fate))
}

/// The outcome of a step: `Ok(Err(why))` when it did not happen, `Err` when the test itself
/// could not go on (then the whole test fails: that is no evidence about a verb).
type Waited<T> = Result<std::result::Result<T, String>>;

/// What a step waits with: the run's controller, and whether the API server has refused the
/// verb taken away yet.
struct Waiter<'a> {
    controller: &'a Running,
    run: &'a Run,
}

impl Waiter<'_> {
    /// Whether the audit log shows a 403 for a verb this run's roles lack.
    async fn refused(&self) -> Result<bool> {
        if self.run.denied.is_empty() {
            return Ok(false);
        }
        let (mark, user) = (self.run.audit_mark.clone(), self.run.user.clone());
        let forbidden =
            tokio::task::spawn_blocking(move || e2e::forbidden_since(&mark, &user)).await??;
        Ok(refuses_any(&forbidden, &self.run.denied))
    }
}

/// Whether one of the `forbidden` requests was for one of the `grants`.
fn refuses_any(forbidden: &[Forbidden], grants: &[Grant]) -> bool {
    forbidden.iter().any(|x| {
        grants
            .iter()
            .any(|g| g.verb == x.verb && g.group == x.group && g.resource == x.resource)
    })
}

/// Probes until `probe` answers `Ok(Ok(..))`, the controller stops, or `bound` passes and the
/// verb taken away has been refused (else [`UNREFUSED_GRACE`] more). A probe answers
/// `Ok(Err(state))` to go on waiting; the last state explains a timeout.
async fn poll<T, F, Fut>(w: &Waiter<'_>, bound: Duration, mut probe: F) -> Waited<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Waited<T>>,
{
    let deadline = Instant::now() + bound;
    let mut next_refusal_check = deadline;
    let mut last = "never probed".to_string();
    loop {
        if let Some(exit) = w.controller.exited() {
            return Ok(Err(format!("the controller {exit} (last seen: {last})")));
        }
        match probe().await? {
            Ok(v) => return Ok(Ok(v)),
            Err(state) => last = state,
        }
        let now = Instant::now();
        if now >= deadline + UNREFUSED_GRACE {
            return Ok(Err(format!(
                "not within {:?}, and nothing taken away was refused meanwhile; last seen: {last}",
                bound + UNREFUSED_GRACE
            )));
        }
        if now >= next_refusal_check {
            if w.refused().await? {
                return Ok(Err(format!(
                    "not within {bound:?}, the verb taken away refused; last seen: {last}"
                )));
            }
            next_refusal_check = now + REFUSAL_CHECK;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A run's cluster objects and processes.
struct Run {
    env: TestEnv,
    started: Instant,
    /// When the orphaned PodTemplate was created.
    template_created: Instant,
    objects: Vec<Value>,
    client: Client,
    instance: String,
    check: String,
    orphan_template: String,
    orphan_request: String,
    /// The ServiceAccount's user name, as the audit log records it.
    user: String,
    /// What the variant takes away (nothing for the base run).
    denied: Vec<Grant>,
    /// The audit log before the run: its 403s are read from here.
    audit_mark: e2e::AuditMark,
    /// The base run also admits a plain "provision" Job.
    base: bool,
    /// The check of the queue the Job submitted meanwhile goes to (its config exists).
    meanwhile_check: String,
}

impl Run {
    /// Everything before the controller starts. Errors here are the test's, not a verb's.
    async fn setup(label: &str, removal: Option<&Removal>) -> Result<(Self, Option<Vec<Grant>>)> {
        let env = TestEnv::new(&format!("chart-rbac-{label}")).await?;
        let started = Instant::now();
        let audit_mark = e2e::audit_log_mark()?;
        let controller_name = env.provisioning_controller_name();
        let instance = identity::instance_label(&controller_name);
        let check = env.cluster_name("prov");
        // First, since the sweep spares PodTemplates younger than 60 s: one of this controller
        // instance's, left by a request that no longer exists. It records the Workload and check
        // it was made for, as the controller's own do: the sweep deletes nothing without them.
        let orphan_template = "ppt-leftover-main".to_string();
        let template: PodTemplate = serde_json::from_value(json!({
            "metadata": {
                "name": orphan_template,
                "labels": {
                    identity::INSTANCE_LABEL: instance,
                    MANAGED_BY_LABEL: identity::MANAGED_BY,
                    WORKLOAD_UID_LABEL: "00000000-0000-0000-0000-000000000001",
                },
                "annotations": {
                    REQUEST_ANNOTATION: "leftover",
                    WORKLOAD_ANNOTATION: "left",
                    CHECK_ANNOTATION: check,
                },
            },
            "template": {"spec": {"containers": [{"name": "main", "image": "registry.invalid/x:1"}]}},
        }))?;
        Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns)
            .create(&PostParams::default(), &template)
            .await
            .context("creating the orphaned PodTemplate")?;
        let template_created = Instant::now();

        let set = format!("controllerName={controller_name}");
        let mut objects = chart::render(
            PROVISIONING_CHART,
            &env.ns,
            &env.ns,
            &["--set-string", &set],
        )?;
        // The Role names the Lease the binary derives from the controller name.
        let role = chart::the(&objects, "Role")?;
        let lease = lease_name_for(&controller_name);
        ensure!(
            chart::grants(role)
                .iter()
                .any(|g| g.name.as_deref() == Some(lease.as_str())),
            "the Role does not name the Lease {lease}: {role:#}"
        );
        let removed = match removal {
            None => None,
            Some(r) => Some(remove(&mut objects, r)?),
        };
        let (service_account, _) = chart::apply_rbac(
            &env.client,
            &env.ns,
            &objects,
            FIELD_MANAGER,
            removed.as_deref().unwrap_or_default(),
        )
        .await?;

        let (flavor, _) = env.pool_queues("4", &[&check]).await?;
        let meanwhile_check = meanwhile_queue(&env, &controller_name, &flavor).await?;
        // A request of this instance whose Workload is gone, as one deleted while no replica ran
        // leaves it; its class is one no simulator serves.
        let orphan_request = "gone-prov-1".to_string();
        let request: ProvisioningRequest = serde_json::from_value(json!({
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "metadata": {
                "name": orphan_request,
                "labels": {
                    identity::INSTANCE_LABEL: instance,
                    MANAGED_BY_LABEL: identity::MANAGED_BY,
                    WORKLOAD_UID_LABEL: "00000000-0000-0000-0000-000000000000",
                },
                "annotations": {WORKLOAD_ANNOTATION: "gone", CHECK_ANNOTATION: check},
            },
            "spec": {
                "provisioningClassName": format!("{}.orphan", env.ns),
                "podSets": [{"podTemplateRef": {"name": "ppt-gone-prov-1-main"}, "count": 1}],
            },
        }))?;
        env.provisioning_requests()
            .create(&PostParams::default(), &request)
            .await
            .context("creating the orphaned ProvisioningRequest")?;

        let client = e2e::service_account_client(&env.ns, &service_account).await?;
        let run_ns = env.ns.clone();
        let run = Self {
            env,
            started,
            template_created,
            objects,
            client,
            instance,
            check,
            orphan_template,
            orphan_request,
            user: format!("system:serviceaccount:{}:{service_account}", run_ns),
            denied: removed.clone().unwrap_or_default(),
            audit_mark,
            base: removal.is_none(),
            meanwhile_check,
        };
        Ok((run, removed))
    }

    /// The controller as the rendered Deployment runs it, authenticated as the ServiceAccount.
    fn start_controller(&self) -> Result<Running> {
        let (settings, runtime) = self.deployment_config()?;
        let lease = runtime
            .leader_election
            .as_ref()
            .map(|e| e.lease_name.clone());
        ensure!(
            lease == Some(lease_name_for(&settings.controller_name)),
            "the Deployment elects on {lease:?}, not the Lease the Role grants"
        );
        chart::start_controller(self.client.clone(), settings, runtime)
    }

    /// The steps, in order; `Ok(Some(..))` at the first that does not happen.
    async fn scenario(
        &self,
        passed: &mut Vec<(Step, Duration)>,
        meanwhile: &mut Option<Fate>,
    ) -> Result<Option<Failure>> {
        let simulator = self.env.start_simulator()?;
        let outcome = self.both_controllers(passed, meanwhile).await;
        simulator.stop().await?;
        outcome
    }

    /// The first controller's steps, then, once the orphaned PodTemplate is over 60 s old, a
    /// second controller's (a restart: the template sweep runs when a replica takes the lead).
    async fn both_controllers(
        &self,
        passed: &mut Vec<(Step, Duration)>,
        meanwhile: &mut Option<Fate>,
    ) -> Result<Option<Failure>> {
        let controller = self.start_controller()?;
        let submitted = self.submit_meanwhile().await?;
        let outcome = self.steps(&controller, passed).await;
        *meanwhile = Some(self.fate(&submitted).await?);
        if outcome.as_ref().map_or(true, Option::is_some) {
            controller.kill().await;
            return outcome;
        }
        // Stopped cleanly, it releases the Lease: the next one leads at once.
        controller.stop().await?;
        // The template sweep runs when a replica takes the lead, on templates over 60 s old.
        let age = self.template_created.elapsed();
        if age < Duration::from_secs(61) {
            tokio::time::sleep(Duration::from_secs(61) - age).await;
        }
        let at = Instant::now();
        let controller = self.start_controller()?;
        let outcome = self.swept(&controller).await;
        match outcome {
            Ok(Ok(())) => {
                controller.stop().await?;
                passed.push((Step::OrphanTemplateSwept, at.elapsed()));
                Ok(None)
            }
            Ok(Err(why)) => {
                controller.kill().await;
                Ok(Some(Failure {
                    step: Step::OrphanTemplateSwept,
                    why,
                    after: at.elapsed(),
                }))
            }
            Err(e) => {
                controller.kill().await;
                Err(e)
            }
        }
    }

    /// Submits a Job to the queue of the check that exists from the start; returns its
    /// Workload.
    async fn submit_meanwhile(&self) -> Result<String> {
        let script = [(autoscaler_simulator::SCRIPT_ANNOTATION, "provision")];
        let job = self
            .env
            .job_with_pod_annotations("meanwhile", "lq-meanwhile", "1", 1, &script)
            .await?;
        Ok(self.env.workload_for_job(&job).await?.name_any())
    }

    /// What became of the Job submitted meanwhile, once the first controller's steps are over:
    /// admitted, or its entry telling why, within [`STEP_TIMEOUT`]; else as it stands then.
    async fn fate(&self, workload: &str) -> Result<Fate> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        loop {
            let wl = self.env.workloads().get(workload).await?;
            let fate = Fate::of(&wl, &self.meanwhile_check);
            if matches!(fate, Fate::Admitted | Fate::Told(_)) || Instant::now() >= deadline {
                return Ok(fate);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// After a restart: the orphaned PodTemplate, now over 60 s old, is deleted.
    async fn swept(&self, controller: &Running) -> Waited<()> {
        let w = &Waiter {
            controller,
            run: self,
        };
        if let Err(why) = leading(w).await? {
            return Ok(Err(format!("after the restart: {why}")));
        }
        let templates = Api::<PodTemplate>::namespaced(self.env.client.clone(), &self.env.ns);
        let (templates, name) = (&templates, self.orphan_template.as_str());
        poll(w, STEP_TIMEOUT, || async move {
            Ok(match templates.get_opt(name).await? {
                None => Ok(()),
                Some(_) => Err(format!("{name} still exists")),
            })
        })
        .await
    }

    /// The steps with the first controller, up to the restart.
    async fn steps(
        &self,
        controller: &Running,
        passed: &mut Vec<(Step, Duration)>,
    ) -> Result<Option<Failure>> {
        let env = &self.env;
        let check = self.check.as_str();
        let field_manager = self.field_manager()?;
        let w = &Waiter {
            controller,
            run: self,
        };
        macro_rules! step {
            ($step:expr, $wait:expr) => {{
                let at = Instant::now();
                match $wait.await? {
                    Ok(v) => {
                        passed.push(($step, at.elapsed()));
                        v
                    }
                    Err(why) => {
                        return Ok(Some(Failure {
                            step: $step,
                            why,
                            after: at.elapsed(),
                        }));
                    }
                }
            }};
        }

        step!(Step::Leading, leading(w));

        let controller_name = &env.provisioning_controller_name();
        let config = env.cluster_name("prc");
        env.provisioning_check("prov", controller_name, &config)
            .await?;
        step!(Step::CheckInactive, async {
            let inactive = "BadParametersRef";
            if let Err(why) = check_active(env, w, check, &field_manager, "False", inactive).await?
            {
                return Ok(Err(why));
            }
            settled(env, w, controller_name, check, &field_manager).await
        });
        env.provisioning_config(
            "prc",
            json!({"retryStrategy": {"backoffLimitCount": 1, "backoffBaseSeconds": 1, "backoffMaxSeconds": 10}}),
        )
        .await?;
        step!(
            Step::CheckActive,
            check_active(env, w, check, &field_manager, "True", "Active")
        );

        topology_aware_queue(env, check).await?;
        step!(Step::TopologyWarned, topology_warned(env, w, check));

        step!(
            Step::OrphanRequestRemoved,
            poll(w, STEP_TIMEOUT, || async {
                Ok(
                    match env
                        .provisioning_requests()
                        .get_opt(&self.orphan_request)
                        .await?
                    {
                        None => Ok(()),
                        Some(_) => Err(format!("{} still exists", self.orphan_request)),
                    },
                )
            })
        );

        let wl = env.job_with_script("job", "fail,provision").await?;
        let plain = match self.base {
            true => Some(env.job_with_script("plain", "provision").await?),
            false => None,
        };
        let admitted = step!(
            Step::Admitted,
            poll(w, STEP_TIMEOUT, || async {
                if let Some(plain) = &plain {
                    let p = env.workloads().get(plain).await?;
                    if !p.condition_is_true(cond::ADMITTED) {
                        return Ok(Err(format!(
                            "the \"provision\" Job's {plain} is not admitted: {:?}",
                            p.admission_check(check)
                        )));
                    }
                }
                let w = env.workloads().get(&wl).await?;
                let entry = w.admission_check(check).cloned();
                let retried = entry.as_ref().and_then(|e| e.retry_count) == Some(1);
                // The Retry was counted by the check itself: what `patch` on workloads is for.
                let counted = attempts::record(&w, check).map(|r| r.retries);
                Ok(
                    if w.condition_is_true(cond::ADMITTED) && retried && counted == Some(1) {
                        Ok(w)
                    } else {
                        Err(format!("{wl}: {entry:?}, retries counted: {counted:?}"))
                    },
                )
            })
        );
        let uid = admitted.uid().unwrap_or_default();

        step!(
            Step::TransitionsCounted,
            poll(w, STEP_TIMEOUT, || async {
                let text = match controller.metrics().await {
                    Ok(text) => text,
                    Err(e) => return Ok(Err(format!("no metrics: {e}"))),
                };
                let counted = |what: &str| {
                    e2e::metric_sample(
                        &text,
                        &format!("kueue_provisioning_requests_{what}_total{{check=\"{check}\"}}"),
                    )
                    .unwrap_or_default()
                };
                let (failed, provisioned) = (counted("failed"), counted("provisioned"));
                Ok(if failed >= 1.0 && provisioned >= 1.0 {
                    Ok(())
                } else {
                    Err(format!("failed {failed}, provisioned {provisioned}"))
                })
            })
        );

        let request = names::request_name(&wl, check, 2);
        step!(
            Step::TemplatesOwned,
            poll(w, STEP_TIMEOUT, || async {
                let Some(r) = env.provisioning_requests().get_opt(&request).await? else {
                    return Ok(Err(format!("no request {request}")));
                };
                let templates = Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns);
                let mut unowned = Vec::new();
                for p in &r.spec.pod_sets {
                    let name = &p.pod_template_ref.name;
                    let workload_uid = r.labels().get(WORKLOAD_UID_LABEL);
                    let owned = templates.get_opt(name).await?.is_some_and(|t| {
                        t.owner_references()
                            .iter()
                            .any(|o| o.kind == "Workload" && Some(&o.uid) == workload_uid)
                    });
                    if !owned {
                        unowned.push(name.clone());
                    }
                }
                Ok(if unowned.is_empty() && !r.spec.pod_sets.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "not owned by the Workload of {request}: {unowned:?}"
                    ))
                })
            })
        );

        step!(
            Step::EventsPublished,
            poll(w, STEP_TIMEOUT, || async {
                let reasons = event_reasons(env, &wl, &field_manager).await?;
                let missing: Vec<&str> = ["CheckRetry", "CheckReady"]
                    .into_iter()
                    .filter(|r| !reasons.iter().any(|(have, _)| have == r))
                    .collect();
                Ok(if missing.is_empty() {
                    Ok(())
                } else {
                    Err(format!("missing {missing:?}; published: {reasons:?}"))
                })
            })
        );

        env.complete_job("job", &wl).await?;
        let selector = format!(
            "{}={},{WORKLOAD_UID_LABEL}={uid}",
            identity::INSTANCE_LABEL,
            self.instance
        );
        step!(
            Step::JobCleanedUp,
            poll(w, STEP_TIMEOUT, || async {
                let lp = ListParams::default().labels(&selector);
                let requests = listed_names(env.provisioning_requests(), &lp).await?;
                let templates = listed_names(
                    Api::<PodTemplate>::namespaced(env.client.clone(), &env.ns),
                    &lp,
                )
                .await?;
                Ok(if requests.is_empty() && templates.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "left: requests {requests:?}, templates {templates:?}"
                    ))
                })
            })
        );

        step!(Step::NoReconcileErrors, async {
            let text = match controller.metrics().await {
                Ok(text) => text,
                Err(e) => return Ok(Err(format!("no metrics: {e}"))),
            };
            let errors: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("kueue_ac_reconcile_errors_total"))
                // The series exist from the start, at 0.
                .filter(|l| !l.ends_with(" 0"))
                .collect();
            Ok::<_, anyhow::Error>(if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join(", "))
            })
        });

        // A Workload whose request cannot be planned (a parameter over 255 characters): a
        // permanent failure, shown on the entry; the check is asked again when the runtime's own
        // Pending write comes back, fails the same way, and the event recorder counts the same
        // CheckFailedPermanently into the first event's series with a patch.
        let failing = "toolong";
        env.workloads()
            .create(
                &PostParams::default(),
                &too_long_workload(&env.ns, failing)?,
            )
            .await
            .context("creating the Workload that cannot be planned")?;
        step!(
            Step::RepeatedEventCounted,
            poll(w, STEP_TIMEOUT, || async {
                let counts: Vec<i32> = Api::<Event>::namespaced(env.client.clone(), &env.ns)
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|e| {
                        e.reason.as_deref() == Some("CheckFailedPermanently")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(failing)
                    })
                    .map(|e| e.series.as_ref().map_or(1, |s| s.count))
                    .collect();
                Ok(if counts.iter().any(|c| *c >= 2) {
                    Ok(())
                } else {
                    Err(format!(
                        "CheckFailed events on {failing}, by count: {counts:?}"
                    ))
                })
            })
        );
        env.workloads()
            .delete(failing, &DeleteParams::background())
            .await?;

        Ok(None)
    }

    /// The events' reporting controller: the field manager the Deployment's args give.
    fn field_manager(&self) -> Result<String> {
        Ok(self.deployment_config()?.1.field_manager)
    }

    /// The controller's settings as the rendered Deployment's args give them, serving metrics
    /// on a free local port.
    fn deployment_config(
        &self,
    ) -> Result<(
        kueue_provisioning_controller::Settings,
        kueue_admission_sdk::RuntimeConfig,
    )> {
        chart::provisioning_config_from_deployment(
            &self.objects,
            &self.env.ns,
            e2e::free_local_address()?,
        )
    }
}

/// A config and an AdmissionCheck of the controller that exist before it starts, and
/// ClusterQueue `cq-meanwhile` (2 cpu of `flavor`) guarded by that check with LocalQueue
/// `lq-meanwhile`; returns the check's name.
async fn meanwhile_queue(env: &TestEnv, controller_name: &str, flavor: &str) -> Result<String> {
    let config = env.provisioning_config("prc-meanwhile", json!({})).await?;
    let check = env
        .provisioning_check("meanwhile", controller_name, &config)
        .await?;
    let cq = env
        .cluster_queue("cq-meanwhile", flavor, "2", &[&check])
        .await?
        .name_any();
    env.local_queue("lq-meanwhile", &cq).await?;
    Ok(check)
}

/// Names of the objects `api` lists with `lp`.
async fn listed_names<K>(api: Api<K>, lp: &ListParams) -> kube::Result<Vec<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(lp)
        .await?
        .items
        .iter()
        .map(|k| k.name_any())
        .collect())
}

/// Ready (caches synced) and leading (holds the Lease).
async fn leading(w: &Waiter<'_>) -> Waited<()> {
    let controller = w.controller;
    poll(w, LEADING_TIMEOUT, || async {
        let ready = controller.readyz().await;
        // Nothing answers before the server is up, nor after the controller stopped. The
        // metrics (an HTTPS request, its token reviewed) only once ready: 33 runs poll at once.
        let leader = match ready {
            Some(200) => match controller.metrics().await {
                Ok(text) => e2e::metric_sample(&text, "kueue_ac_leader"),
                Err(_) => None,
            },
            _ => None,
        };
        Ok(if ready == Some(200) && leader == Some(1.0) {
            Ok(())
        } else {
            Err(format!("/readyz {ready:?}, kueue_ac_leader {leader:?}"))
        })
    })
    .await
}

/// Waits until the controller has handled every event of AdmissionCheck `check` so far.
///
/// Each event of a check of ours (Kueue adding its finalizer, the controller's own status
/// writes) makes the controller resolve the check's config again: were the config created before
/// such an event is handled, it would be found without the config watch, and the variants
/// without `list` or `watch` on configs would pass (seen under load). The controller handles the
/// events of all AdmissionChecks one at a time, in the order of one watch, so once a check of
/// ours created after the last change of `check` has its condition, every event of `check` has
/// been handled. Which change came first is told by resourceVersion: etcd revisions on this
/// apiserver (the API does not promise that they compare; a test of a known apiserver may).
async fn settled(
    env: &TestEnv,
    w: &Waiter<'_>,
    controller_name: &str,
    check: &str,
    field_manager: &str,
) -> Waited<()> {
    let checks = Api::<AdmissionCheck>::all(env.client.clone());
    let revision = |ac: &AdmissionCheck| -> Result<u64> {
        let rv = ac.resource_version().unwrap_or_default();
        rv.parse()
            .with_context(|| format!("resourceVersion {rv:?} is not an etcd revision"))
    };
    let mut last = String::new();
    for attempt in 1..=5 {
        let spec = AdmissionCheckSpec {
            controller_name: controller_name.into(),
            parameters: Some(AdmissionCheckParametersReference {
                api_group: "kueue.x-k8s.io".into(),
                kind: "ProvisioningRequestConfig".into(),
                name: env.cluster_name("missing"),
            }),
        };
        let name = env.cluster_name(&format!("barrier-{attempt}"));
        let barrier = checks
            .create(&PostParams::default(), &AdmissionCheck::new(&name, spec))
            .await
            .context("creating a barrier AdmissionCheck")?;
        let wait = check_active(env, w, &name, field_manager, "False", "BadParametersRef");
        if let Err(why) = wait.await? {
            return Ok(Err(format!("{name}, created after {check}: {why}")));
        }
        let current = checks.get(check).await?;
        if revision(&current)? < revision(&barrier)? {
            return Ok(Ok(()));
        }
        last = format!(
            "{check} changed at {} after {name} at {}",
            current.resource_version().unwrap_or_default(),
            barrier.resource_version().unwrap_or_default()
        );
    }
    Ok(Err(format!("{check} kept changing: {last}")))
}

/// The check's Active condition has this status and reason, applied by the controller (its
/// field manager owns status fields), and Kueue has added its finalizer (both writes are done).
async fn check_active(
    env: &TestEnv,
    w: &Waiter<'_>,
    check: &str,
    field_manager: &str,
    status: &str,
    reason: &str,
) -> Waited<()> {
    poll(w, STEP_TIMEOUT, || async {
        let ac = Api::<AdmissionCheck>::all(env.client.clone())
            .get(check)
            .await?;
        let finalized = ac.finalizers().iter().any(|f| f == KUEUE_FINALIZER);
        let by_us = ac.managed_fields().iter().any(|m| {
            m.manager.as_deref() == Some(field_manager)
                && m.subresource.as_deref() == Some("status")
        });
        let conditions = ac.status.map(|s| s.conditions).unwrap_or_default();
        let c = find_condition(&conditions, ADMISSION_CHECK_ACTIVE);
        Ok(
            if by_us && finalized && c.is_some_and(|c| c.status == status && c.reason == reason) {
                Ok(())
            } else {
                Err(format!(
                    "Active: {c:?}, status applied by {field_manager}: {by_us}, Kueue's finalizer: {finalized}"
                ))
            },
        )
    })
    .await
}

/// A ResourceFlavor with a Topology (none needs to exist: the warning reads the flavor's
/// `topologyName`) and ClusterQueue `cq-tas` applying `check` to it.
async fn topology_aware_queue(env: &TestEnv, check: &str) -> Result<()> {
    let flavor: kueue_admission_sdk::api::ResourceFlavor = serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": env.cluster_name("tas")},
        "spec": {"nodeLabels": {"pool": env.ns}, "topologyName": env.cluster_name("topology")},
    }))?;
    Api::<kueue_admission_sdk::api::ResourceFlavor>::all(env.client.clone())
        .create(&PostParams::default(), &flavor)
        .await
        .context("creating the topology-aware flavor")?;
    env.cluster_queue("cq-tas", &env.cluster_name("tas"), "1", &[check])
        .await?;
    Ok(())
}

/// The check carries `TopologyAssignedBeforeProvisioning=True`, applied by the controller's
/// topology warning.
async fn topology_warned(env: &TestEnv, w: &Waiter<'_>, check: &str) -> Waited<()> {
    use kueue_provisioning_controller::topology;
    poll(w, STEP_TIMEOUT, || async {
        let ac = Api::<AdmissionCheck>::all(env.client.clone())
            .get(check)
            .await?;
        let conditions = ac.status.map(|s| s.conditions).unwrap_or_default();
        let c = find_condition(&conditions, topology::CONDITION);
        let cq = env.cluster_name("cq-tas");
        Ok(match c {
            Some(c) if c.status == "True" && c.message.contains(&cq) => Ok(()),
            other => Err(format!("{}: {other:?}", topology::CONDITION)),
        })
    })
    .await
}

/// (reason, note) of the events our controller published on the Workload.
async fn event_reasons(
    env: &TestEnv,
    workload: &str,
    reporter: &str,
) -> Result<Vec<(String, String)>> {
    Ok(Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(workload)
                && e.reporting_controller.as_deref() == Some(reporter)
        })
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect())
}

/// A standalone Workload in LocalQueue `lq` whose request cannot be planned: a provisioning
/// parameter longer than a ProvisioningRequest accepts.
fn too_long_workload(namespace: &str, name: &str) -> Result<Workload> {
    let parameter = format!("{PARAMETER_ANNOTATION_PREFIX}too-long");
    e2e::standalone_workload(
        namespace,
        name,
        json!({parameter: "x".repeat(300)}),
        e2e::pod_template(json!({}), "1"),
    )
}

/// Takes `removal`'s verb out of its rule (the rule goes when no verb is left); returns what
/// the ServiceAccount must no longer be allowed.
fn remove(objects: &mut [Value], removal: &Removal) -> Result<Vec<Grant>> {
    let index = chart::controller_role_index(objects, removal.role_kind)?;
    let role = &mut objects[index];
    let denied = chart::rule_grants(
        role,
        removal.rule,
        Some(std::slice::from_ref(&removal.verb)),
    );
    ensure!(!denied.is_empty(), "nothing to remove for {removal:?}");
    let rules = role["rules"]
        .as_array_mut()
        .context("a role without rules")?;
    let verbs = rules[removal.rule]["verbs"]
        .as_array_mut()
        .context("a rule without verbs")?;
    verbs.retain(|v| v.as_str() != Some(removal.verb.as_str()));
    if verbs.is_empty() {
        rules.remove(removal.rule);
    }
    Ok(denied)
}

/// One run from setup to teardown.
async fn run(label: String, removal: Option<Removal>) -> Result<Report> {
    let (r, removed) = Run::setup(&label, removal.as_ref())
        .await
        .with_context(|| format!("setting up run {label}"))?;
    let mut passed = Vec::new();
    let mut meanwhile = None;
    let failure = r
        .scenario(&mut passed, &mut meanwhile)
        .await
        .with_context(|| format!("run {label} ({})", r.env.ns))?;
    // Read once the controllers have stopped, so the run's last requests are in the log.
    let forbidden = e2e::forbidden_since(&r.audit_mark, &r.user)?;
    Ok(Report {
        removed,
        removal,
        namespace: r.env.ns.clone(),
        passed,
        failure,
        forbidden,
        meanwhile,
        total: r.started.elapsed(),
    })
}

fn justified(g: &Grant) -> Option<&'static str> {
    JUSTIFIED
        .iter()
        .find(|(kind, group, resource, verb, _)| {
            *kind == g.role_kind && *group == g.group && *resource == g.resource && *verb == g.verb
        })
        .map(|(.., why)| *why)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_grants_what_the_controller_needs_and_nothing_more() -> Result<()> {
    let started = Instant::now();
    // The variants: every verb of every rule of a rendering with default values.
    let (removals, sample_grants) = every_verb_of_the_chart()?;
    tables_name_only_what_the_chart_grants(&sample_grants)?;
    // The token every run scrapes the authenticated /metrics with, made before any run starts
    // so that no run's first step waits for its binding to reach the authorizer.
    e2e::scraper_token().await?;

    let runs = std::iter::once(run("base".into(), None)).chain(
        removals
            .iter()
            .enumerate()
            .map(|(i, r)| run(format!("v{i:02}"), Some(r.clone()))),
    );
    let reports: Vec<Report> = futures::future::join_all(runs)
        .await
        .into_iter()
        .collect::<Result<_>>()?;

    let mut table = String::new();
    let mut problems = Vec::new();
    for report in &reports {
        let verdict = report.verdict(&mut problems);
        let _ = writeln!(table, "{}", report.row(&verdict));
    }
    let took = started.elapsed().as_secs_f64();
    let _ = writeln!(table, "{} runs in {took:.0}s", reports.len());
    println!("{table}");
    if !problems.is_empty() {
        bail!("{}\n\nall runs:\n{table}", problems.join("\n"));
    }
    Ok(())
}

/// One removal per verb of every rule of the chart's ClusterRole and Role (rendered with
/// default values), and every grant of that rendering.
fn every_verb_of_the_chart() -> Result<(Vec<Removal>, Vec<Grant>)> {
    let sample = chart::render(PROVISIONING_CHART, "sample", "sample", &[])?;
    let mut removals = Vec::new();
    let mut sample_grants = Vec::new();
    for role_kind in ["ClusterRole", "Role"] {
        let role = chart::controller_role(&sample, role_kind)?;
        sample_grants.extend(chart::grants(role));
        let rules = role["rules"].as_array().context("rules")?;
        for (rule, r) in rules.iter().enumerate() {
            for verb in r["verbs"].as_array().context("verbs")? {
                removals.push(Removal {
                    role_kind,
                    rule,
                    verb: verb.as_str().context("a verb")?.to_string(),
                });
            }
        }
    }
    Ok((removals, sample_grants))
}

/// [`EXPECTED`] and [`JUSTIFIED`] name only verbs the chart grants, so that they stay true.
fn tables_name_only_what_the_chart_grants(sample_grants: &[Grant]) -> Result<()> {
    for (group, resource, verb, ..) in EXPECTED {
        ensure!(
            sample_grants
                .iter()
                .any(|g| g.group == *group && g.resource == *resource && g.verb == *verb),
            "EXPECTED lists {resource} ({group}): {verb}, which the chart no longer grants"
        );
    }
    for (kind, group, resource, verb, _) in JUSTIFIED {
        ensure!(
            sample_grants.iter().any(|g| g.role_kind == *kind
                && g.group == *group
                && g.resource == *resource
                && g.verb == *verb),
            "JUSTIFIED lists {kind} {resource} ({group}): {verb}, which the chart no longer grants"
        );
    }
    Ok(())
}

impl Report {
    /// What the run removed, as people read it.
    fn name(&self) -> String {
        match &self.removed {
            None => "base (the chart's rules)".to_string(),
            Some(grants) => grants
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The 403s the API server answered the run, as people read them.
    fn refused(&self) -> Vec<String> {
        self.forbidden.iter().map(ToString::to_string).collect()
    }

    /// What the run shows, for the table; what is wrong with it goes into `problems`.
    fn verdict(&self, problems: &mut Vec<String>) -> String {
        let refused = self.refused();
        match (&self.removed, &self.failure) {
            (None, None) if !refused.is_empty() => {
                problems.push(format!(
                    "the base run passed, but the API server refused it: {}",
                    refused.join("; ")
                ));
                format!("REFUSED {}", refused.join("; "))
            }
            (None, None) if self.meanwhile != Some(Fate::Admitted) => {
                problems.push(format!(
                    "the base run passed, but the Job submitted meanwhile was not admitted: {:?}",
                    self.meanwhile
                ));
                format!("MEANWHILE {:?}", self.meanwhile)
            }
            (None, None) => "sufficient: every step passed, no request refused".to_string(),
            (None, Some(f)) => {
                problems.push(format!(
                    "the base run failed step {:?} ({}) after {:.1?}: {}",
                    f.step,
                    f.step.what(),
                    f.after,
                    f.why
                ));
                format!("FAILED {:?}: {}", f.step, f.why)
            }
            (Some(grants), None) => self.passed_without(grants, problems),
            (Some(grants), Some(f)) => self.failed_without(grants, f, problems),
        }
    }

    /// A variant whose every step passed: only a justified verb may.
    fn passed_without(&self, grants: &[Grant], problems: &mut Vec<String>) -> String {
        match grants.iter().find_map(justified) {
            Some(why) => format!("not observable, justified: {why}"),
            None => {
                problems.push(format!(
                    "without {} every step still passed: the chart grants more than the \
                     controller needs, or no step covers the code that uses it (add one, or \
                     justify it in JUSTIFIED)",
                    self.name()
                ));
                "NOT NEEDED by any step".to_string()
            }
        }
    }

    /// A variant that failed step `f`: the 403 for its verb must be seen, and the step and
    /// the fate of the Job submitted meanwhile must be [`EXPECTED`]'s.
    fn failed_without(&self, grants: &[Grant], f: &Failure, problems: &mut Vec<String>) -> String {
        let name = self.name();
        if grants.iter().any(|g| justified(g).is_some()) {
            problems.push(format!(
                "{name} is in JUSTIFIED, but without it step {:?} fails: {}",
                f.step, f.why
            ));
        }
        // Only a 403 for the very verb shows it is needed: a step that timed out for another
        // reason (a loaded machine) proves nothing.
        if !refuses_any(&self.forbidden, grants) {
            let refused = self.refused();
            problems.push(format!(
                "without {name} step {:?} failed ({}), but the API server never answered 403 \
                 for that verb (it refused: {}): the failure has another cause and does not \
                 show the verb is needed",
                f.step,
                f.why,
                if refused.is_empty() {
                    "nothing".to_string()
                } else {
                    refused.join("; ")
                }
            ));
        }
        let fate = self.meanwhile.as_ref().map_or("none", Fate::kind);
        match expected(grants) {
            None => problems.push(format!(
                "without {name} step {:?} fails and the Job submitted meanwhile is {fate}: add \
                 the verb to EXPECTED",
                f.step
            )),
            Some((step, want)) if step != f.step || !want.split('|').any(|w| w == fate) => {
                problems.push(format!(
                "without {name} the first step to fail should be {step:?} and the Job submitted \
                 meanwhile {want}; it was {:?} ({}) and {fate}: {:?}",
                f.step, f.why, self.meanwhile
                ))
            }
            Some(_) => {}
        }
        format!(
            "needed: 403 for it seen; {:?} ({}) failed after {:.1?}: {}",
            f.step,
            f.step.what(),
            f.after,
            truncate(&f.why, 300)
        )
    }

    /// The run's lines in the table.
    fn row(&self, verdict: &str) -> String {
        let steps: Vec<String> = self
            .passed
            .iter()
            .map(|(s, d)| format!("{s:?} {:.1}s", d.as_secs_f64()))
            .collect();
        let meanwhile = match &self.meanwhile {
            Some(Fate::Told(message)) => format!("told: {}", truncate(message, 200)),
            Some(fate) => fate.kind().to_string(),
            None => "not submitted".to_string(),
        };
        let rule = self
            .removal
            .as_ref()
            .map(|r| format!(" (rule {} of the {})", r.rule, r.role_kind))
            .unwrap_or_default();
        format!(
            "- {}{rule} [{}, {:.0}s]\n    {verdict}\n    meanwhile: {meanwhile}\n    passed: {}",
            self.name(),
            self.namespace,
            self.total.as_secs_f64(),
            steps.join(", ")
        )
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &s[..cut])
}

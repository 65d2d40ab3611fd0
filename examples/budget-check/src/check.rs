//! The check itself: the thin layer between the SDK runtime, the cost and ledger arithmetic and
//! the [`ConfigMapBackend`].
//!
//! Why a namespace is never charged twice or beyond its budget: every charge is a
//! read-modify-write of the namespace's ledger that carries the `resourceVersion` it was read at,
//! so of two writers that read the same ledger only one lands; the other gets 409, reads again
//! and decides again (the SDK's [`Updater`] runs that loop, and makes the runtime's concurrent
//! reconciles in one process take turns). Charges are keyed by Workload uid, so asking again
//! (after a conflict or a restart) finds the charge instead of making another.
//!
//! Why nothing is lost: the runtime calls [`release`](AdmissionCheckController::release) when a
//! Workload it asked about finishes or is evicted, and the charge is settled (what was not used
//! is given back). The runtime forgets what it asked on restart, and a Workload can end while no
//! controller runs, so open charges are also checked against the Workloads themselves
//! ([`BudgetCheck::sweep`] at start and periodically, and before a Workload is told to wait for
//! the next window): a charge whose Workload is gone, finished, evicted since, deactivated or no
//! longer holds quota with this check `Pending` or `Ready` is settled as of when it ended.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::{Workload, workload_condition as cond};
use kueue_admission_sdk::configmap_store::{Attempt, Updater};
use kueue_admission_sdk::holding::{self, Holding, Lasts};
use kueue_admission_sdk::shadow::ShadowScope;
use kueue_admission_sdk::{
    AdmissionCheckController, CheckContext, Decision, Extensions, NoParameters, ReleaseContext,
    RetryPolicy,
};
use ledger_common::{Sweep, read_workload, sweep_while_leading};
use tracing::info;

use crate::Error;
use crate::backend::{ConfigMapBackend, Saved};
use crate::cost::{Estimate, Prices, estimate};
use crate::ledger::{BudgetLedger, Charge, Fit, Settlement};
use crate::money::Credits;
use crate::window::{Budget, Window, format_time};

/// How the check behaves, beyond where its state lives.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `spec.controllerName` of the AdmissionChecks this controller answers.
    pub controller_name: String,
    /// Credits per unit of each resource per hour.
    pub prices: Prices,
    /// Run time assumed for Workloads without `maximumExecutionTimeSeconds`.
    pub default_runtime: Duration,
    /// How soon to look again at a Workload left `Pending` because its budget is missing or bad.
    pub budget_recheck: Duration,
    /// Longest `Retry` delay; `None` waits until the window resets. Kueue keeps a Workload's
    /// quota reserved while its retry delay runs, so a shorter wait frees the queue sooner (the
    /// Workload is then asked again, and waits again if the budget is still spent).
    pub max_wait: Option<Duration>,
    /// How often the leader sweeps the ledgers (and once when it takes the lead), settling
    /// charges of Workloads that ended unnoticed, e.g. while no controller ran.
    pub sweep_interval: Duration,
}

/// The budget check. Cheap to clone: clones share the ledgers' updater, so the sweep and the
/// runtime's reconciles take turns.
#[derive(Clone, Debug)]
pub struct BudgetCheck {
    settings: Arc<Settings>,
    backend: Arc<ConfigMapBackend>,
    ledgers: Updater,
}

/// What a Workload asks to be charged, and the budget it is judged against.
struct Asking<'a> {
    ctx: &'a CheckContext<'a, NoParameters>,
    uid: String,
    namespace: String,
    estimate: Estimate,
    budget: Budget,
    window: Window,
    evictions: i32,
}

/// A charge settled because its Workload ended unnoticed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swept {
    /// Namespace of the Workload.
    pub namespace: String,
    /// What was settled.
    pub settlement: Settlement,
    /// Why: what became of the Workload.
    pub reason: String,
}

impl AdmissionCheckController for BudgetCheck {
    type Parameters = NoParameters;
    type Error = Error;

    fn controller_name(&self) -> &str {
        &self.settings.controller_name
    }

    /// The delay of every `Retry` is explicit (until the window resets), and waiting for money
    /// is not a failure: no attempt limit.
    fn retry_policy(&self, _: &NoParameters) -> RetryPolicy {
        RetryPolicy::immediate()
    }

    async fn decide(&self, ctx: &CheckContext<'_, NoParameters>) -> Result<Decision, Error> {
        let wl = ctx.workload;
        let (Some(uid), Some(ns)) = (wl.uid(), wl.namespace()) else {
            return Err(Error::NotFromTheApiServer(wl.name_any()));
        };
        let s = &self.settings;
        let estimate = match estimate(wl, &s.prices, s.default_runtime) {
            Ok(e) => e,
            Err(e) => return Ok(Decision::rejected(format!("cannot estimate the cost: {e}"))),
        };
        if estimate.cost.is_zero() {
            return Ok(Decision::ready(format!(
                "costs nothing: requests none of the priced resources ({})",
                s.prices
            )));
        }
        let budget = match self.backend.budget(ctx.client, &ns).await? {
            Ok(b) => b,
            Err(message) => return Ok(Decision::pending_recheck_after(message, s.budget_recheck)),
        };
        if estimate.cost > budget.limit {
            return Ok(Decision::rejected(format!(
                "the estimated cost of {} credits ({}) is more than the whole budget of namespace {ns}: {} credits per {}",
                estimate.cost,
                estimate.describe(),
                budget.limit,
                budget.period
            )));
        }
        let asking = Asking {
            ctx,
            window: Window::containing(budget.period, ctx.now),
            evictions: wl.total_evictions(),
            uid,
            namespace: ns,
            estimate,
            budget,
        };
        let ledger_name = self.backend.ledger_name(&asking.namespace);
        self.ledgers
            .update(&ledger_name, || self.try_charge(&asking))
            .await
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), Error> {
        let uid = ctx.workload.and_then(|wl| wl.uid());
        let settlements = self
            .ledgers
            .update(&self.backend.ledger_name(ctx.namespace), || async {
                let loaded = self.backend.load(ctx.client, ctx.namespace).await?;
                let mut ledger = loaded.value;
                // Without the Workload (and so its uid), every charge of that name is settled.
                let uids: Vec<String> = ledger
                    .open_charges()
                    .iter()
                    .filter(|(u, c)| uid.as_ref().map_or(c.name == ctx.name, |uid| *u == uid))
                    .map(|(u, _)| u.clone())
                    .collect();
                if uids.is_empty() {
                    return Ok(Attempt::Done(Vec::new()));
                }
                let settlements: Vec<Settlement> = uids
                    .iter()
                    .filter_map(|u| {
                        let end = ledger
                            .open_charge(u)
                            .map(|c| end_of_use(ctx.workload, c, ctx.now))?;
                        ledger.settle(u, end)
                    })
                    .collect();
                let saved = self
                    .backend
                    .save(
                        ctx.client,
                        ctx.namespace,
                        &ledger,
                        loaded.version.as_deref(),
                    )
                    .await?;
                Ok::<_, Error>(Attempt::saved(saved, settlements))
            })
            .await?;
        for s in settlements {
            info!(workload = %ctx.name, namespace = ctx.namespace, reason = ctx.reason.as_str(),
                  used = %s.used, refund = %s.refund, "charge settled");
        }
        Ok(())
    }

    /// The sweep: once when this replica takes the lead, then every
    /// [`Settings::sweep_interval`].
    fn while_leading(&self) -> Extensions {
        sweep_while_leading("budget-ledger-sweep", self.settings.sweep_interval, self)
    }
}

impl BudgetCheck {
    /// A check with these settings, keeping its state in `backend`.
    pub fn new(settings: Settings, backend: ConfigMapBackend) -> Self {
        Self {
            settings: Arc::new(settings),
            backend: Arc::new(backend),
            ledgers: Updater::default(),
        }
    }

    /// One read-decide-write of the Workload's charge, on the ledger as read now.
    async fn try_charge(&self, asking: &Asking<'_>) -> Result<Attempt<Decision>, Error> {
        let Asking {
            ctx,
            uid,
            namespace: ns,
            estimate,
            budget,
            window,
            evictions,
        } = asking;
        let now = ctx.now;
        let loaded = self.backend.load(ctx.client, ns).await?;
        let mut ledger = loaded.value;
        ledger.prune(now);
        let mut changed = false;
        let mut swept = Vec::new();
        if let Some(charge) = ledger.open_charge(uid) {
            if charge.evictions == *evictions {
                // Asked again for the admission already charged.
                let message = charged(ns, estimate, &ledger, budget, window);
                return Ok(Attempt::Done(Decision::ready(message)));
            }
            // Charged for an admission that ended (evicted) without a release reaching us.
            let end = end_of_use(Some(ctx.workload), charge, now);
            if let Some(settlement) = ledger.settle(uid, end) {
                swept.push(Swept {
                    namespace: ns.clone(),
                    settlement,
                    reason: "evicted since it was charged".into(),
                });
            }
            changed = true;
        }
        let mut fit = ledger.check_fit(estimate.cost, budget, window);
        if matches!(fit, Fit::Exceeds { .. }) {
            // Make it wait only for money really spent: settle what ended unnoticed first.
            let stale = self
                .settle_stale(ctx.client, ns, &mut ledger, now, ctx.shadow)
                .await?;
            if !stale.is_empty() {
                changed = true;
                swept.extend(stale);
                fit = ledger.check_fit(estimate.cost, budget, window);
            }
        }
        let decision = match fit {
            Fit::Fits { .. } => {
                ledger.charge(
                    uid,
                    Charge {
                        name: ctx.workload.name_any(),
                        check: ctx.check_name().to_string(),
                        cost: estimate.cost,
                        runtime_seconds: estimate.runtime.as_secs(),
                        charged_at: Time(now),
                        evictions: *evictions,
                    },
                );
                changed = true;
                Decision::ready(charged(ns, estimate, &ledger, budget, window))
            }
            Fit::Exceeds { spent } => self.over_budget(asking, spent),
            Fit::Never => Decision::rejected("the estimated cost is more than the whole budget"),
        };
        if changed
            && self
                .backend
                .save(ctx.client, ns, &ledger, loaded.version.as_deref())
                .await?
                == Saved::Conflict
        {
            return Ok(Attempt::Conflict);
        }
        log_swept(&swept);
        if let Decision::Ready { .. } = decision {
            info!(workload = %ctx.workload.name_any(), namespace = %ns, cost = %estimate.cost, "charged");
        }
        Ok(Attempt::Done(decision))
    }

    /// The `Retry` of a Workload that would take its namespace over budget: until the window
    /// resets, or at most the configured wait.
    fn over_budget(&self, asking: &Asking<'_>, spent: Credits) -> Decision {
        let Asking {
            ctx,
            namespace: ns,
            estimate,
            budget,
            window,
            ..
        } = asking;
        let wait = window.remaining(ctx.now);
        let wait = self.settings.max_wait.map_or(wait, |max| wait.min(max));
        Decision::retry_after(
            format!(
                "the estimated cost of {} credits ({}) would take namespace {ns} over its budget: {spent} of {} credits spent this {}; the budget starts again at {}",
                estimate.cost,
                estimate.describe(),
                budget.limit,
                budget.period,
                format_time(window.end())
            ),
            wait,
        )
    }

    /// Settles, in `ledger`, every open charge whose Workload no longer needs it, judged on
    /// Workloads read after the ledger.
    async fn settle_stale(
        &self,
        client: &Client,
        namespace: &str,
        ledger: &mut BudgetLedger,
        now: Timestamp,
        shadow: Option<&ShadowScope>,
    ) -> Result<Vec<Swept>, Error> {
        let mut swept = Vec::new();
        for (uid, charge) in ledger.open_charges().clone() {
            // Read fresh, after the ledger: a charge is never judged by an older Workload.
            let wl = read_workload(client, namespace, &charge.name).await?;
            let Some(reason) = stale_reason(&uid, &charge, wl.as_ref(), shadow) else {
                continue;
            };
            let end = end_of_use(wl.as_ref(), &charge, now);
            if let Some(settlement) = ledger.settle(&uid, end) {
                swept.push(Swept {
                    namespace: namespace.to_string(),
                    settlement,
                    reason,
                });
            }
        }
        Ok(swept)
    }

    async fn sweep_namespace(
        &self,
        client: &Client,
        ns: &str,
        shadow: Option<&ShadowScope>,
    ) -> Result<Vec<Swept>, Error> {
        let swept = self
            .ledgers
            .update(&self.backend.ledger_name(ns), || async {
                let loaded = self.backend.load(client, ns).await?;
                let mut ledger = loaded.value;
                let before = ledger.clone();
                let now = Timestamp::now();
                ledger.prune(now);
                let swept = self
                    .settle_stale(client, ns, &mut ledger, now, shadow)
                    .await?;
                if ledger == before {
                    return Ok(Attempt::Done(swept));
                }
                let saved = self
                    .backend
                    .save(client, ns, &ledger, loaded.version.as_deref())
                    .await?;
                Ok::<_, Error>(Attempt::saved(saved, swept))
            })
            .await?;
        log_swept(&swept);
        Ok(swept)
    }
}

impl Sweep for BudgetCheck {
    type Swept = Swept;

    /// Settles every open charge, in every ledger, whose Workload no longer needs it, and drops
    /// settled days no window reaches any more. Returns what it settled.
    async fn sweep(
        &self,
        client: &Client,
        shadow: Option<&ShadowScope>,
    ) -> Result<Vec<Swept>, Error> {
        let mut all = Vec::new();
        for ns in self.backend.ledgers(client).await? {
            all.extend(self.sweep_namespace(client, &ns, shadow).await?);
        }
        Ok(all)
    }
}

/// The `Ready` message: what was charged and where the namespace stands.
fn charged(
    ns: &str,
    estimate: &Estimate,
    ledger: &BudgetLedger,
    budget: &Budget,
    window: &Window,
) -> String {
    format!(
        "charged {} credits ({}); namespace {ns} has spent {} of {} credits this {}, until {}",
        estimate.cost,
        estimate.describe(),
        ledger.spent(window),
        budget.limit,
        budget.period,
        format_time(window.end())
    )
}

fn log_swept(swept: &[Swept]) {
    for s in swept {
        info!(workload = %s.settlement.charge.name, namespace = %s.namespace, reason = %s.reason,
              used = %s.settlement.used, refund = %s.settlement.refund,
              "charge settled for a workload that ended unnoticed");
    }
}

/// Why an open charge is stale, judged on its Workload as read now (`None`: it no longer
/// exists), or `None` if the Workload still runs on it: same uid, same admission (no eviction
/// since), holding quota with this check `Pending` or `Ready` (the SDK's rule, see
/// [`kueue_admission_sdk::holding`]).
pub fn stale_reason(
    uid: &str,
    charge: &Charge,
    wl: Option<&Workload>,
    shadow: Option<&ShadowScope>,
) -> Option<String> {
    let held = Holding {
        uid,
        check: &charge.check,
        lasts: Lasts::ForTheAdmission {
            evictions: charge.evictions,
        },
    };
    holding::stale_reason(&held, wl, shadow)
}

/// When the Workload stopped using what it was charged for: when it finished, else when it was
/// evicted after the charge, else `now` (e.g. it is gone: the latest it can have ended).
pub fn end_of_use(wl: Option<&Workload>, charge: &Charge, now: Timestamp) -> Timestamp {
    let when = |type_: &str, must_be_true: bool| {
        let c = wl?.condition(type_)?;
        (!must_be_true || c.status == "True").then_some(c.last_transition_time.0)
    };
    let end = when(cond::FINISHED, true)
        .or_else(|| when(cond::EVICTED, false).filter(|t| *t > charge.charged_at.0))
        .unwrap_or(now);
    end.min(now)
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;

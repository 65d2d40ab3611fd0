//! The check itself: the thin layer between the SDK runtime, the ledger arithmetic and the
//! [`ConfigMapBackend`].
//!
//! Why licenses are never handed out twice: every grant is a read-modify-write of the one ledger
//! object that carries the `resourceVersion` it was read at, so of two writers that read the
//! same ledger only one lands; the other gets 409, reads again and decides again (the SDK's
//! [`Updater`] runs that loop). The updater also makes the runtime's concurrent reconciles in
//! one process take turns, so 409s come only from other processes (e.g. two replicas during a
//! leader hand-over).
//!
//! Why none leak: the runtime calls [`release`](AdmissionCheckController::release) when a
//! Workload it asked about goes idle, but forgets what it asked on restart, and a Workload can be
//! deleted while no controller runs. So holdings are also checked against the Workloads
//! themselves ([`LicenseCheck::sweep`] at start and periodically, and before any request is
//! refused for lack of licenses): a holding whose Workload is gone, replaced, finished, evicted,
//! deactivated or no longer holds quota with this check `Pending` or `Ready` is dropped.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Client, ResourceExt};
use kueue_admission_sdk::api::Workload;
use kueue_admission_sdk::configmap_store::{Attempt, Updater};
use kueue_admission_sdk::holding as sdk_holding;
use kueue_admission_sdk::shadow::ShadowScope;
use kueue_admission_sdk::{
    AdmissionCheckController, CheckContext, Decision, Extensions, NoParameters, ReleaseContext,
    RetryPolicy,
};
use ledger_common::{Sweep, read_workload, sweep_while_leading};
use tracing::info;

use crate::Error;
use crate::backend::{ConfigMapBackend, Saved};
use crate::ledger::{Acquired, Holding, Ledger, describe_holding};
use crate::pool::Pool;
use crate::request::{format_licenses, requested_licenses};

/// How the check behaves, beyond where its state lives.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The `spec.controllerName` of the AdmissionChecks this controller answers.
    pub controller_name: String,
    /// Delays between attempts while licenses are short (`Retry`), and the attempt limit.
    pub retry_policy: RetryPolicy,
    /// How soon to look again at a Workload left `Pending` because the pool is missing or bad.
    pub pool_recheck: Duration,
    /// How often the leader sweeps the ledger (and once when it takes the lead), reclaiming
    /// licenses of Workloads that went away unnoticed, e.g. while no controller ran.
    pub sweep_interval: Duration,
}

/// The binary's retry policy: delays doubling from `base` up to `max` (never below `base`), each
/// up to 10 % longer so that Workloads refused together do not come back in step.
pub fn backoff(base: Duration, max: Duration) -> RetryPolicy {
    RetryPolicy::exponential(base, 2.0, max.max(base), 0.1)
}

/// The license check. Cheap to clone: clones share the ledger's updater, so a sweeper task and
/// the runtime take turns.
#[derive(Clone, Debug)]
pub struct LicenseCheck {
    settings: Arc<Settings>,
    backend: Arc<ConfigMapBackend>,
    ledger: Updater,
}

/// A holding dropped because its Workload no longer needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swept {
    /// The Workload's uid.
    pub uid: String,
    /// What it held.
    pub holding: Holding,
    /// Why it no longer needs it.
    pub reason: String,
}

impl AdmissionCheckController for LicenseCheck {
    type Parameters = NoParameters;
    type Error = Error;

    fn controller_name(&self) -> &str {
        &self.settings.controller_name
    }

    fn retry_policy(&self, _: &NoParameters) -> RetryPolicy {
        self.settings.retry_policy.clone()
    }

    async fn decide(&self, ctx: &CheckContext<'_, NoParameters>) -> Result<Decision, Error> {
        let wl = ctx.workload;
        let request = match requested_licenses(wl) {
            Ok(r) => r,
            Err(e) => return Ok(Decision::rejected(e)),
        };
        if request.is_empty() {
            return Ok(Decision::ready("no licenses requested"));
        }
        let pool = match self.backend.pool(ctx.client).await? {
            Ok(pool) => pool,
            Err(message) => {
                return Ok(Decision::pending_recheck_after(
                    message,
                    self.settings.pool_recheck,
                ));
            }
        };
        if let Some(why) = pool.never_fits(&request) {
            return Ok(Decision::rejected(why));
        }
        let uid = wl
            .uid()
            .ok_or_else(|| Error::NotFromTheApiServer(wl.name_any()))?;
        let wanted = Holding {
            namespace: wl.namespace().unwrap_or_default(),
            name: wl.name_any(),
            check: ctx.check_name().to_string(),
            licenses: request,
            since: Time(ctx.now),
        };

        self.ledger
            .update(&self.backend.ledger_name(), || {
                self.try_grant(ctx, &uid, &wanted, &pool)
            })
            .await
    }

    async fn release(&self, ctx: &ReleaseContext<'_>) -> Result<(), Error> {
        let uid = ctx.workload.and_then(|wl| wl.uid());
        let released = self
            .ledger
            .update(&self.backend.ledger_name(), || async {
                let loaded = self.backend.load(ctx.client).await?;
                let mut ledger = loaded.value;
                let released: Vec<Holding> = match &uid {
                    Some(uid) => ledger.release(uid).into_iter().collect(),
                    None => {
                        let before = ledger.clone();
                        ledger
                            .release_by_name(ctx.namespace, ctx.name)
                            .iter()
                            .filter_map(|uid| before.holding(uid).cloned())
                            .collect()
                    }
                };
                if released.is_empty() {
                    return Ok(Attempt::Done(released));
                }
                let saved = self
                    .backend
                    .save(ctx.client, &ledger, loaded.version.as_deref())
                    .await?;
                Ok::<_, Error>(Attempt::saved(saved, released))
            })
            .await?;
        for h in &released {
            info!(holding = %describe_holding(h), reason = ctx.reason.as_str(), "licenses released");
        }
        Ok(())
    }

    /// The sweep: once when this replica takes the lead, then every
    /// [`Settings::sweep_interval`].
    fn while_leading(&self) -> Extensions {
        sweep_while_leading("license-ledger-sweep", self.settings.sweep_interval, self)
    }
}

impl LicenseCheck {
    /// A check with these settings, keeping its state in `backend`.
    pub fn new(settings: Settings, backend: ConfigMapBackend) -> Self {
        Self {
            settings: Arc::new(settings),
            backend: Arc::new(backend),
            ledger: Updater::default(),
        }
    }

    /// Where the pool and the ledger live.
    pub fn backend(&self) -> &ConfigMapBackend {
        &self.backend
    }

    /// One read-decide-write of the Workload's licenses, on the ledger as read now.
    async fn try_grant(
        &self,
        ctx: &CheckContext<'_, NoParameters>,
        uid: &str,
        wanted: &Holding,
        pool: &Pool,
    ) -> Result<Attempt<Decision>, Error> {
        let loaded = self.backend.load(ctx.client).await?;
        let mut ledger = loaded.value;
        let mut result = ledger.acquire(uid, wanted.clone(), pool);
        let mut swept = Vec::new();
        if result.is_err() {
            // Refuse only for licenses really in use: drop what finished or vanished first.
            swept = self.stale_holdings(ctx.client, &ledger, ctx.shadow).await?;
            if !swept.is_empty() {
                for s in &swept {
                    ledger.release(&s.uid);
                }
                result = ledger.acquire(uid, wanted.clone(), pool);
            }
        }
        let changed = matches!(result, Ok(Acquired::Granted)) || !swept.is_empty();
        if changed
            && self
                .backend
                .save(ctx.client, &ledger, loaded.version.as_deref())
                .await?
                == Saved::Conflict
        {
            return Ok(Attempt::Conflict);
        }
        log_swept(&swept);
        Ok(Attempt::Done(match result {
            Ok(acquired) => {
                let held = ledger.holding(uid).unwrap_or(wanted);
                if acquired == Acquired::Granted {
                    info!(workload = %held.workload(), licenses = %format_licenses(&held.licenses), "licenses granted");
                }
                Decision::ready(format!(
                    "holds {} until the workload finishes or is evicted",
                    format_licenses(&held.licenses)
                ))
            }
            Err(shortage) => Decision::retry(ledger.describe_shortage(&shortage, pool)),
        }))
    }

    /// Holdings whose Workload no longer needs them, judged on Workloads read after the ledger:
    /// a holding present in that ledger was granted while its Workload held quota, so a later
    /// read that shows otherwise means the Workload really moved on.
    async fn stale_holdings(
        &self,
        client: &Client,
        ledger: &Ledger,
        shadow: Option<&ShadowScope>,
    ) -> Result<Vec<Swept>, Error> {
        let mut stale = Vec::new();
        for (uid, holding) in ledger.holdings() {
            // Read fresh, after the ledger: a holding is never judged by an older Workload.
            let wl = read_workload(client, &holding.namespace, &holding.name).await?;
            if let Some(reason) = stale_reason(uid, holding, wl.as_ref(), shadow) {
                stale.push(Swept {
                    uid: uid.clone(),
                    holding: holding.clone(),
                    reason,
                });
            }
        }
        Ok(stale)
    }
}

impl Sweep for LicenseCheck {
    type Swept = Swept;

    /// Drops every holding whose Workload no longer needs it and returns them.
    async fn sweep(
        &self,
        client: &Client,
        shadow: Option<&ShadowScope>,
    ) -> Result<Vec<Swept>, Error> {
        let swept = self
            .ledger
            .update(&self.backend.ledger_name(), || async {
                let loaded = self.backend.load(client).await?;
                let mut ledger = loaded.value;
                let swept = self.stale_holdings(client, &ledger, shadow).await?;
                if swept.is_empty() {
                    return Ok(Attempt::Done(swept));
                }
                for s in &swept {
                    ledger.release(&s.uid);
                }
                let saved = self
                    .backend
                    .save(client, &ledger, loaded.version.as_deref())
                    .await?;
                Ok::<_, Error>(Attempt::saved(saved, swept))
            })
            .await?;
        log_swept(&swept);
        Ok(swept)
    }
}

fn log_swept(swept: &[Swept]) {
    for s in swept {
        info!(holding = %describe_holding(&s.holding), reason = %s.reason, "licenses reclaimed from a workload that no longer needs them");
    }
}

/// Why a holding is stale, judged on its Workload as read now (`None`: it no longer exists),
/// or `None` if the Workload still needs it: same uid, holding quota with this check's entry
/// `Pending` or `Ready` (the SDK's rule, see [`kueue_admission_sdk::holding`]).
pub fn stale_reason(
    uid: &str,
    holding: &Holding,
    wl: Option<&Workload>,
    shadow: Option<&ShadowScope>,
) -> Option<String> {
    let held = sdk_holding::Holding {
        uid,
        check: &holding.check,
        lasts: sdk_holding::Lasts::WhileAnswered,
    };
    sdk_holding::stale_reason(&held, wl, shadow)
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;

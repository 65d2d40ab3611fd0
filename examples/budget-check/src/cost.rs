//! What a Workload will cost: its resource requests, times its pods, times how long it may run,
//! times the price of each resource per hour.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use kueue_admission_sdk::api::Workload;

use crate::money::Credits;
use crate::quantity::parse_quantity;

/// Resources measured in GiB for pricing; every other resource is priced per unit (a core of
/// `cpu`, one `nvidia.com/gpu`, ...).
fn is_bytes(resource: &str) -> bool {
    matches!(resource, "memory" | "ephemeral-storage") || resource.starts_with("hugepages-")
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Credits per unit of each resource per hour. Resources without a price cost nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prices(pub BTreeMap<String, Credits>);

impl FromStr for Prices {
    type Err = String;

    /// `cpu=1,memory=0.25,nvidia.com/gpu=20`: per core, per GiB, per device, each per hour.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut prices = BTreeMap::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (resource, price) = item
                .split_once('=')
                .ok_or_else(|| format!("price {item:?} is not resource=credits"))?;
            let resource = resource.trim();
            // A resource name, as Kubernetes spells them (`cpu`, `nvidia.com/gpu`): `=2.5`
            // would price a resource no Workload can ask for, and the typo would go unseen.
            if resource.is_empty()
                || !resource
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
            {
                return Err(format!(
                    "price {item:?} does not name a resource (like cpu or nvidia.com/gpu)"
                ));
            }
            let price: Credits = price
                .trim()
                .parse()
                .map_err(|e| format!("price of {resource}: {e}"))?;
            if prices.insert(resource.to_string(), price).is_some() {
                return Err(format!("resource {resource:?} is priced twice"));
            }
        }
        Ok(Prices(prices))
    }
}

impl fmt::Display for Prices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let items: Vec<String> = self.0.iter().map(|(r, p)| format!("{r}={p}")).collect();
        f.write_str(&items.join(","))
    }
}

/// A Workload's estimated cost, and what it is made of.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Credits for the whole run.
    pub cost: Credits,
    /// How long the run is assumed to take.
    pub runtime: Duration,
    /// Total priced resources over all pods (cores, GiB, devices).
    pub resources: BTreeMap<String, f64>,
}

impl Estimate {
    /// `2 cpu, 4 GiB memory for 1h`, for messages.
    pub fn describe(&self) -> String {
        let resources: Vec<String> = self
            .resources
            .iter()
            .map(|(r, v)| {
                let v = (v * 1000.0).round() / 1000.0;
                if is_bytes(r) {
                    format!("{v} GiB {r}")
                } else {
                    format!("{v} {r}")
                }
            })
            .collect();
        format!(
            "{} for {}",
            resources.join(", "),
            human_duration(self.runtime)
        )
    }
}

/// `1h`, `90m`, `45s`.
pub fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// Estimates what `wl` costs: every podset's per-pod requests (as Kueue counts them: the
/// containers' sum or the largest init container, whichever is more, plus pod overhead; a
/// limit stands in for a missing request) times its pods (the admitted count under partial
/// admission), priced per hour, over `spec.maximumExecutionTimeSeconds` or else
/// `default_runtime`. Rounded up to a thousandth of a credit.
pub fn estimate(
    wl: &Workload,
    prices: &Prices,
    default_runtime: Duration,
) -> Result<Estimate, String> {
    let runtime = wl
        .spec
        .maximum_execution_time_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_runtime, Duration::from_secs);
    let mut resources: BTreeMap<String, f64> = BTreeMap::new();
    for pod_set in &wl.spec.pod_sets {
        let pods = f64::from(wl.pod_count(&pod_set.name));
        let Some(spec) = pod_set.template.spec.as_ref() else {
            continue;
        };
        let per_pod = pod_requests(spec).map_err(|e| format!("podset {:?}: {e}", pod_set.name))?;
        for (resource, amount) in per_pod {
            if !prices.0.contains_key(&resource) {
                continue;
            }
            let units = if is_bytes(&resource) {
                amount / GIB
            } else {
                amount
            };
            *resources.entry(resource).or_default() += units * pods;
        }
    }
    let hours = runtime.as_secs_f64() / 3600.0;
    let milli: f64 = resources
        .iter()
        .map(|(r, units)| units * prices.0.get(r).map_or(0.0, |p| p.milli() as f64) * hours)
        .sum();
    // Beyond 2^53 thousandths f64 loses whole units; no real budget is that large.
    if !milli.is_finite() || milli > 9.0e15 {
        return Err(format!(
            "the estimated cost is too large to count ({milli} thousandths of a credit)"
        ));
    }
    Ok(Estimate {
        cost: Credits::from_milli(milli.ceil() as u64),
        runtime,
        resources,
    })
}

/// What one pod of this spec requests, per resource.
fn pod_requests(spec: &PodSpec) -> Result<BTreeMap<String, f64>, String> {
    let mut running: BTreeMap<String, f64> = BTreeMap::new();
    let mut init_peak: BTreeMap<String, f64> = BTreeMap::new();
    for c in &spec.containers {
        add(&mut running, &container_requests(c)?);
    }
    for c in spec.init_containers.iter().flatten() {
        let requests = container_requests(c)?;
        // A sidecar (init container that keeps running) adds to the pod for its whole life.
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut running, &requests);
        } else {
            for (r, v) in requests {
                let peak = init_peak.entry(r).or_default();
                *peak = peak.max(v);
            }
        }
    }
    for (r, v) in init_peak {
        let total = running.entry(r).or_default();
        *total = total.max(v);
    }
    if let Some(overhead) = &spec.overhead {
        for (r, q) in overhead {
            *running.entry(r.clone()).or_default() += parse_quantity(&q.0)?;
        }
    }
    Ok(running)
}

fn container_requests(c: &Container) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    let Some(resources) = &c.resources else {
        return Ok(out);
    };
    for (r, q) in resources.limits.iter().flatten() {
        out.insert(
            r.clone(),
            parse_quantity(&q.0).map_err(|e| format!("container {:?} limit {r}: {e}", c.name))?,
        );
    }
    for (r, q) in resources.requests.iter().flatten() {
        out.insert(
            r.clone(),
            parse_quantity(&q.0).map_err(|e| format!("container {:?} request {r}: {e}", c.name))?,
        );
    }
    Ok(out)
}

fn add(total: &mut BTreeMap<String, f64>, more: &BTreeMap<String, f64>) {
    for (r, v) in more {
        *total.entry(r.clone()).or_default() += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kueue_admission_sdk::testing::WorkloadBuilder;

    const HOUR: Duration = Duration::from_secs(3600);

    fn prices(s: &str) -> Prices {
        s.parse().expect("prices")
    }

    #[test]
    fn prices_parse_and_refuse_with_the_resource_named() {
        let p = prices("cpu=1, memory=0.25,nvidia.com/gpu=20");
        assert_eq!(p.0.get("memory"), Some(&Credits::from_milli(250)));
        assert_eq!(p.to_string(), "cpu=1,memory=0.25,nvidia.com/gpu=20");
        assert!("cpu".parse::<Prices>().is_err());
        assert_eq!(
            "cpu=-1".parse::<Prices>(),
            Err("price of cpu: \"-1\" is not an amount of credits (e.g. 500 or 12.5, at most 3 decimals)".into())
        );
        assert!("cpu=1,cpu=2".parse::<Prices>().is_err());
        // Found by fuzzing the flag: an empty or odd resource name was priced silently.
        for bad in ["=2.5", " =1", "cpu=1,=2", "c pu=1", "cpu,=1"] {
            let err = bad.parse::<Prices>().expect_err(bad);
            assert!(err.contains("resource"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn cost_is_requests_times_pods_times_hours_times_price() {
        let wl = WorkloadBuilder::new("ns", "wl")
            .pod_set("driver", 1, "500m")
            .pod_set("workers", 4, "2")
            .build();
        let e = estimate(&wl, &prices("cpu=1.5"), HOUR).expect("estimate");
        assert_eq!(e.cost, "12.75".parse().expect("credits")); // 8.5 cores × 1.5
        assert_eq!(e.describe(), "8.5 cpu for 1h");

        let mut short = wl.clone();
        short.spec.maximum_execution_time_seconds = Some(1800);
        assert_eq!(
            estimate(&short, &prices("cpu=1.5"), HOUR)
                .expect("estimate")
                .cost,
            "6.375".parse().expect("credits")
        );
        assert_eq!(
            estimate(&wl, &prices("memory=1"), HOUR)
                .expect("estimate")
                .cost,
            Credits::ZERO,
            "unpriced: free"
        );
    }

    #[test]
    fn kueue_rules_for_pod_requests_apply() {
        let mut wl = WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 2, "1")
            .build();
        let spec = wl.spec.pod_sets[0].template.spec.as_mut().expect("spec");
        let q = |s: &str| Quantity(s.into());
        // A limit stands in for a missing request; memory is priced per GiB.
        spec.containers[0]
            .resources
            .as_mut()
            .expect("resources")
            .limits = Some(BTreeMap::from([("memory".to_string(), q("2Gi"))]));
        // The largest init container wins when it needs more than the containers together.
        let mut init = spec.containers[0].clone();
        init.name = "init".into();
        init.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), q("3"))])),
            ..Default::default()
        });
        spec.init_containers = Some(vec![init]);
        spec.overhead = Some(BTreeMap::from([("cpu".to_string(), q("250m"))]));
        let e = estimate(&wl, &prices("cpu=1,memory=0.5"), HOUR).expect("estimate");
        // cpu: max(1, 3) + 0.25 = 3.25 per pod; memory 2 GiB per pod; 2 pods.
        assert_eq!(
            e.resources,
            BTreeMap::from([("cpu".to_string(), 6.5), ("memory".to_string(), 4.0)])
        );
        assert_eq!(e.cost, Credits::from_milli(8500));
        assert_eq!(e.describe(), "6.5 cpu, 4 GiB memory for 1h");
    }

    #[test]
    fn partial_admission_counts_the_assigned_pods_and_costs_round_up() {
        let mut wl = WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 4, "1")
            .quota_reserved("cq", "f")
            .build();
        wl.status
            .as_mut()
            .and_then(|s| s.admission.as_mut())
            .expect("admission")
            .pod_set_assignments[0]
            .count = Some(1);
        wl.spec.maximum_execution_time_seconds = Some(1);
        // 1 core for 1 s at 1 credit/hour: 0.000277… credits, charged as 0.001.
        assert_eq!(
            estimate(&wl, &prices("cpu=1"), HOUR)
                .expect("estimate")
                .cost,
            Credits::from_milli(1)
        );
    }

    #[test]
    fn unreadable_quantities_name_the_container() {
        let mut wl = WorkloadBuilder::new("ns", "wl")
            .pod_set("main", 1, "lots")
            .build();
        wl.spec.pod_sets[0].name = "workers".into();
        let err = estimate(&wl, &prices("cpu=1"), HOUR).expect_err("bad quantity");
        assert!(
            err.starts_with("podset \"workers\": container \"main\" request cpu: \"lots\""),
            "{err}"
        );
    }
}

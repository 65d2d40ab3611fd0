//! Charts as they deploy: render a chart with `helm template`, apply what it renders, ask the API
//! server's authorizer what its roles grant, and run the provisioning controller in-process the
//! way the chart's Deployment runs it: with the container's arguments and a token of the chart's
//! ServiceAccount.
//!
//! helm is `$E2E_HELM` when set, else the binary `tests/helm/install-helm.sh` builds once per
//! machine and caches (it prints the path). Rendered YAML is turned into JSON by `python3` with
//! PyYAML, which the chart checks in tests/helm already need.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use clap::Parser;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{self, Scope};
use kueue_admission_sdk::{Options, RuntimeConfig};
use kueue_provisioning_controller::{ProvisioningCheck, Settings};
use serde_json::{Value, json};

use crate::{Audited, Running, TestEnv};

/// The provisioning controller's chart, relative to the repository root.
pub const PROVISIONING_CHART: &str = "charts/kueue-provisioning-controller";

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The helm binary: `$E2E_HELM`, else the one `tests/helm/install-helm.sh` ensures (built from
/// the Go module proxy on a machine's first run, then cached).
pub fn helm() -> Result<PathBuf> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| find_helm().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!("no helm to render the charts with: {e}"))
}

fn find_helm() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("E2E_HELM") {
        return Ok(PathBuf::from(path));
    }
    let script = repo_root().join("tests/helm/install-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} failed ({}):\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("install-helm.sh printed no path")?;
    Ok(PathBuf::from(path.trim()))
}

/// `helm template <release> <chart> --namespace <namespace> <args...>`, as JSON objects (empty
/// documents left out). `chart` is relative to the repository root.
pub fn render(chart: &str, release: &str, namespace: &str, args: &[&str]) -> Result<Vec<Value>> {
    let out = Command::new(helm()?)
        .arg("template")
        .arg(release)
        .arg(repo_root().join(chart))
        .args(["--namespace", namespace])
        .args(args)
        .output()
        .context("running helm template")?;
    ensure!(
        out.status.success(),
        "helm template {chart} {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_to_json(out.stdout)
}

/// Every document of a YAML stream as JSON, through python3 and PyYAML (this crate has no YAML
/// parser; the chart checks already need PyYAML).
fn yaml_to_json(yaml: Vec<u8>) -> Result<Vec<Value>> {
    const SCRIPT: &str = "import json, sys, yaml\n\
                          json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)";
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running python3 to read helm's YAML")?;
    let mut stdin = child.stdin.take().context("python3's stdin")?;
    // Written from another thread: python may fill its stdout pipe before reading all of stdin.
    let writer = std::thread::spawn(move || stdin.write_all(&yaml));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow!("the thread writing to python3 panicked"))??;
    ensure!(
        out.status.success(),
        "python3 could not read helm's YAML ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The rendered objects of this kind.
pub fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// The one rendered object of this kind.
pub fn the<'a>(objects: &'a [Value], kind: &str) -> Result<&'a Value> {
    match of_kind(objects, kind).as_slice() {
        [one] => Ok(one),
        many => bail!("the chart rendered {} objects of kind {kind}", many.len()),
    }
}

/// Where the one role of this kind (`ClusterRole` or `Role`) that the chart binds to its own
/// ServiceAccount is among the rendered objects: not the metrics reader ClusterRole the chart
/// renders for scrapers, which only an operator binds.
pub fn controller_role_index(objects: &[Value], kind: &str) -> Result<usize> {
    let binding = format!("{kind}Binding");
    let bound: Vec<&str> = of_kind(objects, &binding)
        .into_iter()
        .filter_map(|b| b["roleRef"]["name"].as_str())
        .collect();
    let found: Vec<usize> = objects
        .iter()
        .enumerate()
        .filter(|(_, o)| o["kind"] == kind)
        .filter(|(_, o)| {
            o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| bound.contains(&n))
        })
        .map(|(i, _)| i)
        .collect();
    match found.as_slice() {
        [one] => Ok(*one),
        many => bail!("the chart binds {} objects of kind {kind}", many.len()),
    }
}

/// The one role of this kind the chart binds to its ServiceAccount ([`controller_role_index`]).
pub fn controller_role<'a>(objects: &'a [Value], kind: &str) -> Result<&'a Value> {
    Ok(&objects[controller_role_index(objects, kind)?])
}

/// `metadata.name` of a rendered object.
pub fn name_of(object: &Value) -> Result<&str> {
    object["metadata"]["name"]
        .as_str()
        .with_context(|| format!("an object without a name: {object}"))
}

/// Server-side applies one rendered object (its kind found by discovery) as `field_manager`.
pub async fn apply(client: &Client, object: &Value, field_manager: &str) -> Result<()> {
    let api_version = object["apiVersion"].as_str().context("no apiVersion")?;
    let kind = object["kind"].as_str().context("no kind")?;
    let name = name_of(object)?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {api_version} {kind}"))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .with_context(|| format!("{kind} {name} is rendered without a namespace"))?;
            Api::namespaced_with(client.clone(), ns, &resource)
        }
    };
    api.patch(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

/// One verb a Role or ClusterRole grants on one resource (and one name, for rules with
/// `resourceNames`): what a SubjectAccessReview asks about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// `Role` (namespaced) or `ClusterRole` (bound cluster-wide).
    pub role_kind: String,
    /// The Role's namespace; `None` for a ClusterRole.
    pub namespace: Option<String>,
    /// API group (`""` for the core group).
    pub group: String,
    /// Resource, with `/subresource` if any.
    pub resource: String,
    /// The one object name a `resourceNames` rule limits it to.
    pub name: Option<String>,
    /// The verb.
    pub verb: String,
}

impl Grant {
    /// `verb` on `resource` of API group `group`, granted cluster-wide by a ClusterRole.
    pub fn cluster(group: &str, resource: &str, verb: &str) -> Self {
        Self {
            role_kind: "ClusterRole".into(),
            namespace: None,
            group: group.into(),
            resource: resource.into(),
            name: None,
            verb: verb.into(),
        }
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = crate::group_name(&self.group);
        write!(f, "{} {} ({group})", self.role_kind, self.resource)?;
        if let Some(name) = &self.name {
            write!(f, " [{name}]")?;
        }
        write!(f, ": {}", self.verb)
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Every grant of one rule of a rendered Role or ClusterRole, restricted to `verbs` (all of the
/// rule's verbs when `None`).
pub fn rule_grants(role: &Value, rule: usize, verbs: Option<&[String]>) -> Vec<Grant> {
    let role_kind = role["kind"].as_str().unwrap_or_default().to_string();
    let namespace = (role_kind == "Role")
        .then(|| role["metadata"]["namespace"].as_str().map(String::from))
        .flatten();
    let r = &role["rules"][rule];
    let names = strings(&r["resourceNames"]);
    let names: Vec<Option<String>> = if names.is_empty() {
        vec![None]
    } else {
        names.into_iter().map(Some).collect()
    };
    let mut out = Vec::new();
    for group in strings(&r["apiGroups"]) {
        for resource in strings(&r["resources"]) {
            for name in &names {
                for verb in strings(&r["verbs"]) {
                    if verbs.is_some_and(|only| !only.contains(&verb)) {
                        continue;
                    }
                    out.push(Grant {
                        role_kind: role_kind.clone(),
                        namespace: namespace.clone(),
                        group: group.clone(),
                        resource: resource.clone(),
                        name: name.clone(),
                        verb,
                    });
                }
            }
        }
    }
    out
}

/// Every grant of a rendered Role or ClusterRole.
pub fn grants(role: &Value) -> Vec<Grant> {
    let rules = role["rules"].as_array().map_or(0, Vec::len);
    (0..rules)
        .flat_map(|i| rule_grants(role, i, None))
        .collect()
}

/// Whether the API server's authorizer lets ServiceAccount `namespace/service_account` do what
/// `grant` names (asked with a SubjectAccessReview, as the admin).
pub async fn is_allowed(
    admin: &Client,
    namespace: &str,
    service_account: &str,
    grant: &Grant,
) -> Result<bool> {
    let (resource, subresource) = grant
        .resource
        .split_once('/')
        .unwrap_or((&grant.resource, ""));
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{namespace}:{service_account}"),
            "groups": [
                "system:serviceaccounts",
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated",
            ],
            "resourceAttributes": {
                "group": grant.group,
                "resource": resource,
                "subresource": subresource,
                "verb": grant.verb,
                "namespace": grant.namespace.clone().unwrap_or_default(),
                "name": grant.name.clone().unwrap_or_default(),
            },
        },
    }))?;
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("SubjectAccessReview of {grant}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Waits (at most 30 s: the authorizer learns of new roles and bindings through its informers)
/// until the ServiceAccount is allowed everything in `allowed` and nothing in `denied`.
pub async fn wait_for_authorizer(
    admin: &Client,
    namespace: &str,
    service_account: &str,
    allowed: &[Grant],
    denied: &[Grant],
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut wrong = Vec::new();
        for g in allowed {
            if !is_allowed(admin, namespace, service_account, g).await? {
                wrong.push(format!("not allowed: {g}"));
            }
        }
        for g in denied {
            if is_allowed(admin, namespace, service_account, g).await? {
                wrong.push(format!("still allowed: {g}"));
            }
        }
        if wrong.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "ServiceAccount {namespace}/{service_account}, 30 s after its roles were applied:\n  {}",
                wrong.join("\n  ")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Applies the chart's ServiceAccount and RBAC objects (ServiceAccount, ClusterRoles and Role
/// with their bindings) and waits until the authorizer allows the ServiceAccount everything
/// its roles grant and nothing in `denied`; returns the ServiceAccount's name and what its
/// roles grant.
pub async fn apply_rbac(
    admin: &Client,
    namespace: &str,
    objects: &[Value],
    field_manager: &str,
    denied: &[Grant],
) -> Result<(String, Vec<Grant>)> {
    for kind in [
        "ServiceAccount",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ] {
        apply(admin, the(objects, kind)?, field_manager).await?;
    }
    // The controller's, and the metrics reader role for scrapers (bound by no one here).
    for role in of_kind(objects, "ClusterRole") {
        apply(admin, role, field_manager).await?;
    }
    let service_account = name_of(the(objects, "ServiceAccount")?)?.to_string();
    let mut allowed = grants(controller_role(objects, "ClusterRole")?);
    allowed.extend(grants(controller_role(objects, "Role")?));
    wait_for_authorizer(admin, namespace, &service_account, &allowed, denied).await?;
    Ok((service_account, allowed))
}

/// The provisioning chart's ServiceAccount and RBAC for `controller_name`, rendered as a release
/// in `namespace` and applied there ([`apply_rbac`]); returns the ServiceAccount's name, for
/// running the controller with exactly the chart's rights.
pub async fn provisioning_service_account(
    admin: &Client,
    namespace: &str,
    controller_name: &str,
    field_manager: &str,
) -> Result<String> {
    let set = format!("controllerName={controller_name}");
    let objects = render(
        PROVISIONING_CHART,
        namespace,
        namespace,
        &["--set-string", &set],
    )?;
    let (service_account, _) = apply_rbac(admin, namespace, &objects, field_manager, &[]).await?;
    Ok(service_account)
}

/// The provisioning controller's command line, parsed as the binary parses it.
#[derive(Debug, Parser)]
struct ProvisioningArgs {
    #[arg(long)]
    controller_name: String,
    #[arg(long)]
    provisioning_timeout_seconds: Option<u64>,
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    start_early: bool,
    #[command(flatten)]
    runtime: Options,
}

/// The provisioning controller's settings and runtime configuration, from the arguments of the
/// rendered Deployment's container, as the binary would derive them in a pod of
/// `release_namespace` (`$POD_NAMESPACE`, where the Lease goes). Metrics are served on
/// `metrics_address` instead of the container's port, as the args say (HTTPS with authentication
/// by default: [`Running::metrics`] reads them with a token), the probes on a free local port.
pub fn provisioning_config_from_deployment(
    objects: &[Value],
    release_namespace: &str,
    metrics_address: SocketAddr,
) -> Result<(Settings, RuntimeConfig)> {
    let deployment = the(objects, "Deployment")?;
    let args = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    ensure!(!args.is_empty(), "the Deployment's container has no args");
    let parsed = ProvisioningArgs::try_parse_from(
        std::iter::once("kueue-provisioning-controller".to_string()).chain(args.iter().cloned()),
    )
    .map_err(|e| anyhow!("the Deployment's args {args:?} do not parse: {e}"))?;
    let mut runtime = parsed
        .runtime
        .runtime_config(&parsed.controller_name, release_namespace);
    if let Some(election) = &mut runtime.leader_election {
        election.namespace = release_namespace.to_string();
    }
    runtime.metrics_address = Some(metrics_address);
    runtime.health_address = Some(crate::free_local_address_besides(metrics_address)?);
    let settings = Settings {
        controller_name: parsed.controller_name,
        default_timeout: parsed.provisioning_timeout_seconds.map(Duration::from_secs),
        start_early: parsed.start_early,
    };
    Ok((settings, runtime))
}

/// Starts the provisioning check in this process (the SDK's `run_until`) with `client` (e.g. a
/// ServiceAccount's); `runtime` must serve metrics and probes.
pub fn start_controller(
    client: Client,
    settings: Settings,
    runtime: RuntimeConfig,
) -> Result<Running> {
    runtime
        .metrics_address
        .context("the runtime config serves no metrics")?;
    runtime
        .health_address
        .context("the runtime config serves no probes")?;
    Ok(Running::check(
        client,
        ProvisioningCheck::new(settings),
        runtime,
    ))
}

/// The ServiceAccount's user name and its requests as the audit log recorded them; fails if
/// there are none.
pub fn requests_of(env: &TestEnv, service_account: &str) -> Result<(String, Vec<Audited>)> {
    let user = format!("system:serviceaccount:{}:{service_account}", env.ns);
    let requests = crate::audited_requests(&user)?;
    ensure!(
        !requests.is_empty(),
        "the audit log has no request of {user}"
    );
    Ok((user, requests))
}

/// The requests the API server refused (403), described.
pub fn refused(requests: &[Audited]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.code == 403)
        .map(ToString::to_string)
        .collect()
}

/// How many successful requests used each grant, and what is wrong about the grants: one never
/// used and not excused in `unused_here` (group, resource, verb, why), or one excused there but
/// used.
pub fn uses_per_grant(
    granted: &[Grant],
    requests: &[Audited],
    unused_here: &[(&str, &str, &str, &str)],
) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut unused = Vec::new();
    let mut used_by_grant = BTreeMap::new();
    for g in granted {
        let uses = requests
            .iter()
            .filter(|r| {
                r.code < 400 && r.verb == g.verb && r.group == g.group && r.resource == g.resource
            })
            .count();
        used_by_grant.insert(g.to_string(), uses);
        let excused = unused_here.iter().any(|(group, resource, verb, _)| {
            *group == g.group && *resource == g.resource && *verb == g.verb
        });
        match (uses, excused) {
            (0, false) => unused.push(format!("{g}: granted, never used")),
            (n, true) if n > 0 => unused.push(format!(
                "{g}: excused as unused but used {n} times; take it off the list"
            )),
            _ => {}
        }
    }
    (used_by_grant, unused)
}

/// The rendered Deployment's container arguments, with `$(POD_NAMESPACE)` expanded to
/// `namespace` as Kubernetes expands it in the pod.
pub fn container_args(objects: &[Value], namespace: &str) -> Result<Vec<String>> {
    let deployment = the(objects, "Deployment")?;
    let args = strings(&deployment["spec"]["template"]["spec"]["containers"][0]["args"]);
    ensure!(!args.is_empty(), "the Deployment's container has no args");
    Ok(args
        .iter()
        .map(|a| a.replace("$(POD_NAMESPACE)", namespace))
        .collect())
}

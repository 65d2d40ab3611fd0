use super::*;

const TEMPLATES: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: small
  labels:
    kwok-nodegroup: small
    pool: a
  annotations:
    cluster-autoscaler.kwok.nodegroup/min-count: "1"
    cluster-autoscaler.kwok.nodegroup/max-count: "3"
status:
  allocatable:
    cpu: "4"
    memory: 16Gi
    pods: "110"
---
apiVersion: v1
kind: Node
metadata:
  name: no-group
  labels:
    pool: b
---
apiVersion: v1
kind: Node
metadata:
  name: big
  labels:
    kwok-nodegroup: big
status:
  capacity:
    cpu: "32"
    pods: "110"
"#;

fn load(text: &str) -> LoadedGroups {
    parse_node_groups(text, DEFAULT_GROUP_LABEL, false).expect("valid")
}

/// Rule 18: groups come from templates grouped by label, with the kwok provider's bounds and
/// defaults; templates without the label are skipped with a warning.
#[test]
fn rule_18_templates_make_groups_with_kwok_defaults() {
    let loaded = load(TEMPLATES);
    let groups: Vec<_> = loaded
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.min_count, g.max_count))
        .collect();
    assert_eq!(groups, [("small", 1, 3), ("big", 0, DEFAULT_MAX_COUNT)]);
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(loaded.warnings[0].contains("no-group"));
    // Allocatable defaults to capacity.
    let big = &loaded.groups[1];
    assert_eq!(allocatable_of(&big.template)["cpu"], 32_000);
}

/// Rule 18: a created Node is the template's, named `<group>-<suffix>`, kwok-managed, tainted
/// unless skipTaint, with the template's capacity and allocatable.
#[test]
fn rule_18_created_nodes_follow_the_kwok_provider() {
    let group = &load(TEMPLATES).groups[0];
    let node = new_node(group, "small-b4x7k");
    assert_eq!(node.metadata.name.as_deref(), Some("small-b4x7k"));
    let labels = node.metadata.labels.as_ref().expect("labels");
    assert_eq!(labels["kubernetes.io/hostname"], "small-b4x7k");
    assert_eq!(labels["pool"], "a");
    let annotations = node.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(annotations[KWOK_NODE_ANNOTATION], "fake");
    let spec = node.spec.as_ref().expect("spec");
    assert_eq!(spec.provider_id.as_deref(), Some("kwok:small-b4x7k"));
    let taints = spec.taints.as_ref().expect("taints");
    assert_eq!(
        taints
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
            .collect::<Vec<_>>(),
        [(PROVIDER_TAINT_KEY, Some("true"), "NoSchedule")]
    );
    assert_eq!(allocatable_of(&node)["memory"], 16 * (1i128 << 30) * 1000);
    assert!(is_kwok_managed(&node));
    assert_eq!(
        group_of(&node, DEFAULT_GROUP_LABEL).as_deref(),
        Some("small")
    );

    let untainted = parse_node_groups(TEMPLATES, DEFAULT_GROUP_LABEL, true).expect("valid");
    let node = new_node(&untainted.groups[0], "small-aaaaa");
    assert!(
        node.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .is_empty()
    );
}

#[test]
fn lists_sequences_and_other_labels_load() {
    let list = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: t1, labels: {pool: p1}}
- apiVersion: v1
  kind: Node
  metadata: {name: t2, labels: {pool: p1}}
"#;
    let loaded = parse_node_groups(list, "pool", false).expect("valid");
    assert_eq!(
        loaded.groups.len(),
        1,
        "the second template of p1 is ignored"
    );
    assert_eq!(loaded.warnings.len(), 2, "{:?}", loaded.warnings);
    let sequence = "- {kind: Node, metadata: {name: t, labels: {kwok-nodegroup: g}}, status: {allocatable: {pods: '5'}}}";
    let loaded = load(sequence);
    assert_eq!(loaded.groups[0].name, "g");
    assert!(loaded.warnings.is_empty());
}

#[test]
fn bad_files_are_refused_with_a_reason() {
    for (text, expected) in [
        (
            "kind: Node\nmetadata: {labels: {kwok-nodegroup: g}}",
            "no metadata.name",
        ),
        ("kind: Pod\nmetadata: {name: p}", "kind \"Pod\""),
        (": : :\n  - [", "not valid YAML"),
        ("", "no node template"),
        (
            "kind: Node\nmetadata: {name: t, labels: {kwok-nodegroup: g}, annotations: {cluster-autoscaler.kwok.nodegroup/max-count: '0'}}",
            "max count is 0",
        ),
        (
            "kind: Node\nmetadata: {name: t, labels: {kwok-nodegroup: g}, annotations: {cluster-autoscaler.kwok.nodegroup/max-count: 'ten'}}",
            "not a whole number",
        ),
        (
            "kind: Node\nmetadata: {name: t, labels: {kwok-nodegroup: g}, annotations: {cluster-autoscaler.kwok.nodegroup/min-count: '5', cluster-autoscaler.kwok.nodegroup/max-count: '2'}}",
            "above the max",
        ),
        (
            "kind: Node\nmetadata: {name: t, labels: {kwok-nodegroup: g}}\nstatus: {allocatable: {cpu: lots}}",
            "not a resource quantity",
        ),
        (
            "kind: Node\nmetadata: {name: 3}\nspec: {taints: 5}",
            "not a valid Node",
        ),
    ] {
        let error = parse_node_groups(text, DEFAULT_GROUP_LABEL, false)
            .expect_err(text)
            .to_string();
        assert!(error.contains(expected), "{text}: {error}");
    }
}

#[test]
fn fresh_nodes_carry_kube_proxy_only_without_a_live_node_to_copy() {
    let group = &load(TEMPLATES).groups[0];
    assert_eq!(fresh_room(group, false).used["cpu"], KUBE_PROXY_CPU_MILLIS);
    assert!(fresh_room(group, true).used.is_empty());
    assert_eq!(fresh_room(group, true).taints.len(), 1);
}

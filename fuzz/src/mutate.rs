//! What an input becomes: a JSON case is mutated as a tree (so most mutants still parse and
//! reach deep code), anything else as bytes.

use serde_json::Value;

use crate::rng::Rng;

/// Strings that have broken, or could break, code fed by cluster data: limits (253, 255, 63
/// characters), multi-byte characters, DNS edge cases, odd quantities and dates, the names of
/// the conditions and states the code matches on.
pub const TRICKY_STRINGS: &[&str] = &[
    "",
    "-",
    ".",
    "a.-b",
    "-a-",
    "A_B",
    "é",
    "名前",
    "\u{0}",
    "\"quoted\"",
    "x=1,y",
    "=2.5",
    "+-1",
    "1e999",
    "-1",
    "0",
    "1Gi",
    "500m",
    "1e3",
    "9223372036854775807",
    "True",
    "False",
    "Unknown",
    "Pending",
    "Ready",
    "Retry",
    "Rejected",
    "QuotaReserved",
    "Admitted",
    "Evicted",
    "Finished",
    "Provisioned",
    "Failed",
    "BookingExpired",
    "CapacityRevoked",
    "Accepted",
    "IdenticalPodTemplates",
    "IdenticalWorkloadSchedulingRequirements",
    "provreq.kueue.x-k8s.io/ValidUntilSeconds",
    "provreq.kueue.x-k8s.io/",
    "retries=2,evictions=1",
    "retries=-1",
    "2026-11-24",
    "20261124",
    "+002026-11-24",
    "1970-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "2026-11-24T03:04:05Z",
];

/// Numbers at the edges of the types the code converts to.
pub const EDGE_NUMBERS: &[f64] = &[
    0.0,
    1.0,
    -1.0,
    2.0,
    0.5,
    63.0,
    253.0,
    255.0,
    256.0,
    2_147_483_647.0,
    -2_147_483_648.0,
    4_294_967_295.0,
    4_294_967_296.0,
    9_007_199_254_740_992.0,
    1e300,
];

/// A mutant of `input`: a JSON mutation when `input` is JSON, else a byte mutation.
pub fn mutant(input: &[u8], rng: &mut Rng) -> Vec<u8> {
    if let Ok(mut value) = serde_json::from_slice::<Value>(input)
        && !rng.one_in(8)
    {
        for _ in 0..1 + rng.below(4) {
            mutate_json(&mut value, rng);
        }
        return serde_json::to_vec(&value).expect("a JSON value serializes");
    }
    let mut bytes = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        mutate_bytes(&mut bytes, rng);
    }
    bytes
}

/// One change somewhere in the tree. Mostly of the same type (a string stays a string), so the
/// case still deserializes and the change reaches the code under test; now and then a null or
/// a subtree copied from elsewhere, for the parsers.
pub fn mutate_json(root: &mut Value, rng: &mut Rng) {
    // A donor subtree taken before the walk, so a mutation can copy one part of the case into
    // another (a podset into another podset, a condition into another request).
    let donor = random_node(root, rng).clone();
    let node = random_node_mut(root, rng);
    if rng.one_in(20) {
        *node = if rng.one_in(2) { Value::Null } else { donor };
        return;
    }
    match node {
        Value::String(s) => {
            if rng.one_in(2) {
                *s = (*rng.pick(TRICKY_STRINGS)).to_string();
            } else {
                grow_string(s, rng);
            }
        }
        Value::Number(n) => {
            let v = n.as_f64().unwrap_or(0.0);
            *node = number(match rng.below(6) {
                0 => v + 1.0,
                1 => v - 1.0,
                2 => -v,
                3 => v * 2.0,
                _ => *rng.pick(EDGE_NUMBERS),
            });
        }
        Value::Bool(b) => *b = !*b,
        Value::Array(items) => {
            if !items.is_empty() && rng.one_in(2) {
                items.remove(rng.below(items.len()));
            } else if !items.is_empty() {
                let copy = items[rng.below(items.len())].clone();
                for _ in 0..1 + rng.below(8) {
                    items.push(copy.clone());
                }
            }
        }
        Value::Object(map) => {
            let key = (!map.is_empty())
                .then(|| map.keys().nth(rng.below(map.len())).cloned())
                .flatten();
            match (key, rng.below(3)) {
                (Some(key), 0) => {
                    map.remove(&key);
                }
                // Renamed, so that maps (labels, annotations, parameters) get odd keys.
                (Some(key), 1) => {
                    if let Some(v) = map.remove(&key) {
                        let mut renamed = key;
                        grow_string(&mut renamed, rng);
                        map.insert(renamed, v);
                    }
                }
                (Some(key), _) => {
                    let copy = map[&key].clone();
                    map.insert((*rng.pick(TRICKY_STRINGS)).to_string(), copy);
                }
                (None, _) => {
                    map.insert((*rng.pick(TRICKY_STRINGS)).to_string(), donor);
                }
            }
        }
        Value::Null => *node = donor,
    }
}

fn number(v: f64) -> Value {
    if v.fract() == 0.0 && v.abs() < 9.3e18 {
        Value::from(v as i64)
    } else {
        serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
    }
}

/// Appends, repeats or cuts: the length limits are where names and messages break.
fn grow_string(s: &mut String, rng: &mut Rng) {
    match rng.below(4) {
        0 => {
            let token: &&str = rng.pick(TRICKY_STRINGS);
            s.push_str(token);
        }
        1 => {
            let unit = if s.is_empty() {
                "x".to_string()
            } else {
                s.clone()
            };
            let target = *rng.pick(&[62usize, 63, 64, 252, 253, 254, 255, 256, 300]);
            while s.chars().count() < target {
                s.push_str(&unit);
            }
            *s = s.chars().take(target).collect();
        }
        2 => {
            let keep = rng.below(s.chars().count() + 1);
            *s = s.chars().take(keep).collect();
        }
        _ => s.push(*rng.pick(&['-', '.', '/', 'é', 'Z', '0', ' ', '"', '\u{0}'])),
    }
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

fn random_node<'a>(root: &'a Value, rng: &mut Rng) -> &'a Value {
    let mut n = rng.below(count_nodes(root));
    fn walk<'a>(v: &'a Value, n: &mut usize) -> Option<&'a Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => return None,
        };
        for child in children {
            if let Some(found) = walk(child, n) {
                return Some(found);
            }
        }
        None
    }
    walk(root, &mut n).unwrap_or(root)
}

fn random_node_mut<'a>(root: &'a mut Value, rng: &mut Rng) -> &'a mut Value {
    let target = rng.below(count_nodes(root));
    // Find the path first, then follow it mutably: simpler than a mutable walk.
    fn path_to(v: &Value, n: &mut usize, path: &mut Vec<usize>) -> bool {
        if *n == 0 {
            return true;
        }
        *n -= 1;
        let children: Vec<&Value> = match v {
            Value::Array(items) => items.iter().collect(),
            Value::Object(map) => map.values().collect(),
            _ => return false,
        };
        for (i, child) in children.into_iter().enumerate() {
            path.push(i);
            if path_to(child, n, path) {
                return true;
            }
            path.pop();
        }
        false
    }
    let mut path = Vec::new();
    let mut n = target;
    path_to(root, &mut n, &mut path);
    let mut node = root;
    for i in path {
        node = match node {
            Value::Array(items) => &mut items[i],
            Value::Object(map) => map
                .values_mut()
                .nth(i)
                .expect("the path was read from this tree"),
            _ => unreachable!("a path only goes through arrays and objects"),
        };
    }
    node
}

/// One byte-level change: for targets that read text, and for JSON that stops being JSON.
pub fn mutate_bytes(bytes: &mut Vec<u8>, rng: &mut Rng) {
    let len = bytes.len();
    match rng.below(6) {
        0 if len > 0 => {
            let i = rng.below(len);
            bytes[i] ^= 1 << rng.below(8);
        }
        1 => {
            let i = rng.below(len + 1);
            bytes.insert(i, rng.next_u64() as u8);
        }
        2 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(8)).min(len);
            bytes.drain(start..end);
        }
        3 => {
            let i = rng.below(len + 1);
            let token = rng.pick(TRICKY_STRINGS).as_bytes().to_vec();
            bytes.splice(i..i, token);
        }
        4 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(16)).min(len);
            let copy = bytes[start..end].to_vec();
            let at = rng.below(len + 1);
            bytes.splice(at..at, copy);
        }
        _ => {
            let i = rng.below(len + 1);
            bytes.insert(i, *rng.pick(b",=.-+/ \"\\0123456789eE"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_mutants_mostly_stay_json_and_differ() {
        let input = br#"{"a":[1,{"b":"x"}],"c":true}"#;
        let mut rng = Rng::new(1);
        let (mut json, mut changed) = (0, 0);
        for _ in 0..1000 {
            let m = mutant(input, &mut rng);
            json += usize::from(serde_json::from_slice::<Value>(&m).is_ok());
            changed += usize::from(m != input);
        }
        assert!(json > 700, "{json} of 1000 mutants were JSON");
        assert!(changed > 800, "{changed} of 1000 mutants changed");
    }

    #[test]
    fn byte_mutants_of_empty_input_do_not_panic() {
        let mut rng = Rng::new(2);
        for _ in 0..1000 {
            let _ = mutant(b"", &mut rng);
        }
    }
}

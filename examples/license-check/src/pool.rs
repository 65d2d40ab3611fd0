//! The pool of floating licenses: a ConfigMap whose keys are features and values counts.

use std::collections::BTreeMap;

use crate::request::{Licenses, check_feature_name, parse_count};

/// How many licenses of each feature exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// Total licenses per feature.
    pub total: Licenses,
}

impl Pool {
    /// Reads the `data` of the pool ConfigMap. Every bad entry is reported, one per line, so a
    /// person fixing the ConfigMap sees them all at once.
    pub fn from_config_map_data(data: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut total = Licenses::new();
        let mut errors = Vec::new();
        for (feature, value) in data {
            if let Err(e) = check_feature_name(feature) {
                errors.push(e);
                continue;
            }
            match parse_count(value.trim()) {
                Some(n) => {
                    total.insert(feature.clone(), n);
                }
                None => errors.push(format!(
                    "{feature}: {value:?} is not a number of licenses (a whole number from 0)"
                )),
            }
        }
        if errors.is_empty() {
            Ok(Self { total })
        } else {
            Err(errors.join("; "))
        }
    }

    /// Licenses of `feature` in the pool; 0 for a feature it does not have.
    pub fn total_of(&self, feature: &str) -> u32 {
        self.total.get(feature).copied().unwrap_or(0)
    }

    /// Why a request can never be granted by this pool, whatever is released: a feature the
    /// pool does not have, or more licenses than exist. `None` if it may fit some day.
    pub fn never_fits(&self, request: &Licenses) -> Option<String> {
        let unknown: Vec<&str> = request
            .keys()
            .filter(|f| !self.total.contains_key(*f))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            let known: Vec<&str> = self.total.keys().map(String::as_str).collect();
            return Some(format!(
                "unknown license feature{} {}; the pool has: {}",
                if unknown.len() > 1 { "s" } else { "" },
                unknown.join(", "),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ));
        }
        let too_many: Vec<String> = request
            .iter()
            .filter(|(f, n)| **n > self.total_of(f))
            .map(|(f, n)| format!("{n} {f} (the pool has {})", self.total_of(f)))
            .collect();
        if too_many.is_empty() {
            None
        } else {
            Some(format!(
                "asks for more licenses than exist: {}",
                too_many.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(items: &[(&str, &str)]) -> BTreeMap<String, String> {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn request(items: &[(&str, u32)]) -> Licenses {
        items.iter().map(|(f, n)| (f.to_string(), *n)).collect()
    }

    #[test]
    fn reads_counts_and_reports_every_bad_entry() {
        let pool = Pool::from_config_map_data(&data(&[("matlab", "4"), ("ansys", " 0 ")]));
        assert_eq!(
            pool.map(|p| p.total),
            Ok(request(&[("ansys", 0), ("matlab", 4)]))
        );
        let err = Pool::from_config_map_data(&data(&[("a", "-1"), ("b", "x"), ("c", "2")]))
            .expect_err("bad");
        assert_eq!(
            err,
            "a: \"-1\" is not a number of licenses (a whole number from 0); \
             b: \"x\" is not a number of licenses (a whole number from 0)"
        );
    }

    #[test]
    fn unknown_features_and_impossible_counts_never_fit() {
        let pool = Pool::from_config_map_data(&data(&[("matlab", "4")])).expect("pool");
        assert_eq!(pool.never_fits(&request(&[("matlab", 4)])), None);
        assert_eq!(
            pool.never_fits(&request(&[("matlab", 1), ("ansys", 1), ("abaqus", 1)])),
            Some("unknown license features abaqus, ansys; the pool has: matlab".into())
        );
        assert_eq!(
            pool.never_fits(&request(&[("matlab", 5)])),
            Some("asks for more licenses than exist: 5 matlab (the pool has 4)".into())
        );
        assert_eq!(
            Pool::default().never_fits(&request(&[("x", 1)])),
            Some("unknown license feature x; the pool has: none".into())
        );
    }
}

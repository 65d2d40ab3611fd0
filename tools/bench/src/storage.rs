//! What etcd holds, as the API server reports it: the size of its database, read before each
//! run beside the objects the API counts. A set of runs slows down as it goes on although every
//! run starts with the same objects; this says whether what grows is etcd's history (its
//! database keeps every revision until a compaction and its space until a defragmentation).

/// The size in bytes of etcd's database from the API server's metrics text: the sum of
/// `apiserver_storage_size_bytes` over its storage clusters (one here). `None` when the metric
/// is absent (a version that does not export it, or metrics refused).
pub fn storage_size_bytes(metrics: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            let bare = name.split('{').next()?;
            (bare == "apiserver_storage_size_bytes")
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_storage_clusters_and_ignores_everything_else() {
        let text = "\
# HELP apiserver_storage_size_bytes [STABLE] Size of the storage database file physically allocated in bytes.
# TYPE apiserver_storage_size_bytes gauge
apiserver_storage_size_bytes{storage_cluster_id=\"etcd-0\"} 1.2582912e+07
apiserver_storage_size_bytes{storage_cluster_id=\"etcd-1\"} 1048576
apiserver_storage_size_bytes_total 99
apiserver_storage_objects{resource=\"pods\"} 10
";
        assert_eq!(storage_size_bytes(text), Some(12_582_912.0 + 1_048_576.0));
        assert_eq!(storage_size_bytes("apiserver_storage_objects 3\n"), None);
        assert_eq!(storage_size_bytes(""), None);
    }
}

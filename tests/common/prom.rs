//! Reading a Prometheus text scrape, shared by tests/hostile.rs and
//! examples/hostile_bench.rs (which includes this file by path).

/// Sum of every sample of metric `name` (any labels) whose line contains `filter`; `None`
/// when the scrape has no such sample (a renamed metric, a label set the daemon does not
/// export, a truncated scrape), which a caller must not read as 0.
pub fn metric(text: &str, name: &str, filter: &str) -> Option<f64> {
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// [`metric`], which must be in the scrape: panics naming the series, with the scrape.
pub fn required(text: &str, name: &str, filter: &str) -> f64 {
    metric(text, name, filter)
        .unwrap_or_else(|| panic!("no sample of {name} matching {filter:?} in the scrape:\n{text}"))
}

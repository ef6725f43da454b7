//! Reading a Prometheus text scrape, shared by tests/hostile.rs and
//! examples/hostile_bench.rs (which includes this file by path).

/// Sum of every sample of metric `name` (any labels) whose line contains `filter`.
pub fn metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

//! The series as values: what the journal and the console read of the registry, the same data
//! `/metrics` shows.

use super::Metrics;

impl Metrics {
    /// The samples of the counter and gauge families named in `names` (without the `rebound_`
    /// prefix), as `/metrics` shows them: what the console and the journal read.
    pub(crate) fn samples(&self, names: &[&str]) -> Vec<Sample> {
        let mut out = Vec::new();
        for family in self.registry.gather() {
            let Some(name) = family.name().strip_prefix("rebound_") else {
                continue;
            };
            if !names.contains(&name) {
                continue;
            }
            let kind = family.get_field_type();
            for m in family.get_metric() {
                let value = match kind {
                    prometheus::proto::MetricType::COUNTER => m.get_counter().get_value(),
                    prometheus::proto::MetricType::GAUGE => m.get_gauge().get_value(),
                    _ => continue,
                };
                out.push(Sample {
                    name: name.to_string(),
                    labels: m
                        .get_label()
                        .iter()
                        .map(|l| (l.name().to_string(), l.value().to_string()))
                        .collect(),
                    value,
                });
            }
        }
        out
    }
}

/// One sample of a family (its name without the `rebound_` prefix).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: Vec<(String, String)>,
    pub(crate) value: f64,
}

impl Sample {
    /// The value of label `name` ("" when it has none).
    pub(crate) fn label(&self, name: &str) -> &str {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

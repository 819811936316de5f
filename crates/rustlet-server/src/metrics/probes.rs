//! `/metrics/probes` (upstream: `pkg/kubelet/prober/prober_manager.go`'s `ProberResults`):
//! `prober_probe_total`, the probes run per container and result.

use super::{Desc, Kind, Sample, Stability, encode};

const PROBE_TOTAL: Desc = Desc {
    name: "prober_probe_total",
    help: "Cumulative number of a liveness, readiness or startup probe for a container by result.",
    stability: Stability::Beta,
    kind: Kind::Counter,
};

/// One series of `prober_probe_total`: a container's probe of one type, by result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeCount {
    /// `Liveness`, `Readiness` or `Startup`.
    pub probe_type: String,
    /// `successful`, `failed` or `unknown`.
    pub result: String,
    /// The container's name.
    pub container: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The probes run.
    pub count: u64,
}

/// The page of `counts`.
pub fn probe_metrics(counts: &[ProbeCount]) -> String {
    let samples = counts
        .iter()
        .map(|c| Sample {
            labels: vec![
                ("probe_type", c.probe_type.clone()),
                ("result", c.result.clone()),
                ("container", c.container.clone()),
                ("pod", c.pod.clone()),
                ("namespace", c.namespace.clone()),
                ("pod_uid", c.pod_uid.clone()),
            ],
            value: c.count as f64,
            timestamp_ms: None,
        })
        .collect();
    encode(vec![(PROBE_TOTAL, samples)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter with upstream's labels, sorted by name as client_golang writes them.
    #[test]
    fn prober_probe_total_has_upstreams_labels() {
        let count = ProbeCount {
            probe_type: "Liveness".into(),
            result: "successful".into(),
            container: "c".into(),
            pod: "p".into(),
            namespace: "ns".into(),
            pod_uid: "u".into(),
            count: 3,
        };
        assert_eq!(
            probe_metrics(&[count]),
            "# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n\
             # TYPE prober_probe_total counter\n\
             prober_probe_total{container=\"c\",namespace=\"ns\",pod=\"p\",pod_uid=\"u\",probe_type=\"Liveness\",result=\"successful\"} 3\n"
        );
        assert_eq!(probe_metrics(&[]), "");
    }
}

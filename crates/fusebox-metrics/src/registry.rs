//! Builds the Prometheus registry from the catalogue and renders the text exposition.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::catalogue::{self as cat, MetricDef};
use crate::error::MetricsError;
use crate::labels::{self, Bounded};

/// Gate latency targets 50 µs–50 ms; the two wider buckets show how bad a bad tail is.
const GATE_LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/// A group commit is an fsync: sub-millisecond on good disks, up to a second on bad ones.
const LOG_COMMIT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// Tenants kept as distinct label values by default when the tenant label is on.
pub const DEFAULT_MAX_TENANTS: usize = 100;

/// How the registry is built.
#[derive(Debug, Clone)]
pub struct MetricsOptions {
    /// Add a `tenant` label to the events, decisions and stops counters. Off by default:
    /// every tenant multiplies those series.
    pub tenant_label: bool,
    /// Distinct tenants kept when `tenant_label` is on; later ones are counted as `other`.
    pub max_tenants: usize,
}

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            tenant_label: false,
            max_tenants: DEFAULT_MAX_TENANTS,
        }
    }
}

/// The fusebox metrics. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    pub(crate) registry: Registry,
    /// `Some` when the tenant label is on.
    pub(crate) tenants: Option<Bounded>,
    pub(crate) event_types: Bounded,
    pub(crate) actions: Bounded,
    pub(crate) reasons: Bounded,
    pub(crate) terminal_states: Bounded,
    pub(crate) termination_reasons: Bounded,
    pub(crate) rejection_reasons: Bounded,
    pub(crate) detectors: Bounded,
    pub(crate) api_ops: Bounded,
    pub(crate) regions: Bounded,

    pub(crate) events: IntCounterVec,
    pub(crate) events_rejected: IntCounterVec,
    pub(crate) decisions: IntCounterVec,
    pub(crate) gate_latency: Histogram,
    pub(crate) log_commit: Histogram,
    pub(crate) runs_active: IntGauge,
    pub(crate) subagents_active: IntGaugeVec,
    pub(crate) runs_stopped: IntCounterVec,
    pub(crate) replay: Gauge,
    pub(crate) nats_connected: IntGauge,
    pub(crate) watchdog_instances: IntGaugeVec,
    pub(crate) watchdog_terminations: IntCounterVec,
    pub(crate) watchdog_oldest_age: Gauge,
    pub(crate) watchdog_api_errors: IntCounterVec,
    pub(crate) detector_fires: IntCounterVec,
    pub(crate) ledger_hits: IntCounter,
    pub(crate) snapshot_age: Gauge,
    pub(crate) log_size: IntGauge,
    pub(crate) consumer_lag: IntGauge,
    pub(crate) dlq: IntCounter,
    pub(crate) watchdog_next_deadline: Gauge,
    pub(crate) watchdog_blast_radius: IntCounter,
    pub(crate) watchdog_held: IntGauge,
    pub(crate) watchdog_held_total: IntCounterVec,
    pub(crate) watchdog_protected: IntGauge,
    pub(crate) watchdog_halted: IntGauge,
    pub(crate) cluster_partitions: IntGauge,
    pub(crate) cluster_partitions_owned: IntGauge,
    pub(crate) cluster_changes: IntCounterVec,
    pub(crate) otlp_outcomes: Bounded,
    pub(crate) otlp_spans: IntCounterVec,
    pub(crate) otlp_log_records: IntCounterVec,
}

impl Metrics {
    /// A fresh registry with every metric registered and `fusebox_build_info{version}` set.
    pub fn new(version: &str, options: MetricsOptions) -> Result<Self, MetricsError> {
        let b = Builder {
            registry: Registry::new(),
            tenant_label: options.tenant_label,
        };
        let metrics = Metrics {
            tenants: options
                .tenant_label
                .then(|| Bounded::open(options.max_tenants)),
            event_types: Bounded::Fixed(labels::EVENT_TYPES),
            actions: Bounded::Fixed(labels::ACTIONS),
            reasons: Bounded::Fixed(labels::REASONS),
            terminal_states: Bounded::Fixed(labels::TERMINAL_STATES),
            termination_reasons: Bounded::Fixed(labels::TERMINATION_REASONS),
            rejection_reasons: Bounded::open(labels::OPEN_LABEL_CAP),
            detectors: Bounded::open(labels::OPEN_LABEL_CAP),
            api_ops: Bounded::open(labels::OPEN_LABEL_CAP),
            regions: Bounded::open(labels::OPEN_LABEL_CAP),

            events: b.counter_vec(&cat::EVENTS)?,
            events_rejected: b.counter_vec(&cat::EVENTS_REJECTED)?,
            decisions: b.counter_vec(&cat::DECISIONS)?,
            gate_latency: b.histogram(&cat::GATE_LATENCY, GATE_LATENCY_BUCKETS)?,
            log_commit: b.histogram(&cat::LOG_COMMIT, LOG_COMMIT_BUCKETS)?,
            runs_active: b.int_gauge(&cat::RUNS_ACTIVE)?,
            subagents_active: b.gauge_vec(&cat::SUBAGENTS_ACTIVE)?,
            runs_stopped: b.counter_vec(&cat::RUNS_STOPPED)?,
            replay: b.gauge(&cat::REPLAY)?,
            nats_connected: b.int_gauge(&cat::NATS_CONNECTED)?,
            watchdog_instances: b.gauge_vec(&cat::WATCHDOG_INSTANCES)?,
            watchdog_terminations: b.counter_vec(&cat::WATCHDOG_TERMINATIONS)?,
            watchdog_oldest_age: b.gauge(&cat::WATCHDOG_OLDEST_AGE)?,
            watchdog_api_errors: b.counter_vec(&cat::WATCHDOG_API_ERRORS)?,
            detector_fires: b.counter_vec(&cat::DETECTOR_FIRES)?,
            ledger_hits: b.counter(&cat::LEDGER_HITS)?,
            snapshot_age: b.gauge(&cat::SNAPSHOT_AGE)?,
            log_size: b.int_gauge(&cat::LOG_SIZE)?,
            consumer_lag: b.int_gauge(&cat::CONSUMER_LAG)?,
            dlq: b.counter(&cat::DLQ)?,
            watchdog_next_deadline: b.gauge(&cat::WATCHDOG_NEXT_DEADLINE)?,
            watchdog_blast_radius: b.counter(&cat::WATCHDOG_BLAST_RADIUS)?,
            watchdog_held: b.int_gauge(&cat::WATCHDOG_HELD)?,
            watchdog_held_total: b.counter_vec(&cat::WATCHDOG_HELD_TOTAL)?,
            watchdog_protected: b.int_gauge(&cat::WATCHDOG_PROTECTED)?,
            watchdog_halted: b.int_gauge(&cat::WATCHDOG_HALTED)?,
            cluster_partitions: b.int_gauge(&cat::CLUSTER_PARTITIONS)?,
            cluster_partitions_owned: b.int_gauge(&cat::CLUSTER_PARTITIONS_OWNED)?,
            cluster_changes: b.counter_vec(&cat::CLUSTER_HANDOVERS)?,
            otlp_outcomes: Bounded::open(labels::OPEN_LABEL_CAP),
            otlp_spans: b.counter_vec(&cat::OTLP_SPANS)?,
            otlp_log_records: b.counter_vec(&cat::OTLP_LOG_RECORDS)?,
            registry: b.registry,
        };
        metrics.init_series(version)?;
        Ok(metrics)
    }

    /// Series that must exist before anything happens, so that dashboards and alerts
    /// see a 0 (not "no data") and `rate()` has a starting point.
    fn init_series(&self, version: &str) -> Result<(), MetricsError> {
        let build_info = IntGaugeVec::new(opts(&cat::BUILD_INFO), cat::BUILD_INFO.labels)?;
        build_info.with_label_values(&[version]).set(1);
        self.registry.register(Box::new(build_info))?;
        // Present from the start, so a rate over the OTLP receiver's spans is 0, not absent.
        for outcome in ["mapped", "skipped"] {
            self.otlp_spans.with_label_values(&[outcome]).inc_by(0);
            self.otlp_log_records
                .with_label_values(&[outcome])
                .inc_by(0);
        }
        for change in labels::PARTITION_CHANGES {
            self.cluster_changes.with_label_values(&[*change]).inc_by(0);
        }
        for state in labels::INSTANCE_STATES {
            self.watchdog_instances.with_label_values(&[*state]).set(0);
        }
        for depth in labels::DEPTHS {
            self.subagents_active.with_label_values(&[*depth]).set(0);
        }
        for reason in labels::TERMINATION_REASONS {
            self.watchdog_held_total
                .with_label_values(&[*reason])
                .inc_by(0);
        }
        // No deadline known yet: NaN keeps "< 0" alerts quiet and graphs gapped.
        self.watchdog_next_deadline.set(f64::NAN);
        Ok(())
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> Result<String, MetricsError> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|_| MetricsError::NotUtf8)
    }

    /// Appends `tenant` to `values` when the tenant label is on.
    pub(crate) fn with_tenant<'a>(&self, values: &[&'a str], tenant: &'a str) -> Vec<&'a str> {
        let mut all = values.to_vec();
        if let Some(tenants) = &self.tenants {
            all.push(tenants.bound(tenant));
        }
        all
    }
}

/// The Content-Type of [`Metrics::encode`]'s output.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

fn opts(def: &MetricDef) -> Opts {
    Opts::new(def.name, def.help)
}

struct Builder {
    registry: Registry,
    tenant_label: bool,
}

impl Builder {
    fn labels(&self, def: &MetricDef) -> Vec<&'static str> {
        let mut labels = def.labels.to_vec();
        if def.tenant_opt_in && self.tenant_label {
            labels.push("tenant");
        }
        labels
    }

    fn register<M: prometheus::core::Collector + Clone + 'static>(
        &self,
        metric: M,
    ) -> Result<M, MetricsError> {
        self.registry.register(Box::new(metric.clone()))?;
        Ok(metric)
    }

    fn counter_vec(&self, def: &MetricDef) -> Result<IntCounterVec, MetricsError> {
        self.register(IntCounterVec::new(opts(def), &self.labels(def))?)
    }

    fn gauge_vec(&self, def: &MetricDef) -> Result<IntGaugeVec, MetricsError> {
        self.register(IntGaugeVec::new(opts(def), &self.labels(def))?)
    }

    fn counter(&self, def: &MetricDef) -> Result<IntCounter, MetricsError> {
        self.register(IntCounter::with_opts(opts(def))?)
    }

    fn int_gauge(&self, def: &MetricDef) -> Result<IntGauge, MetricsError> {
        self.register(IntGauge::with_opts(opts(def))?)
    }

    fn gauge(&self, def: &MetricDef) -> Result<Gauge, MetricsError> {
        self.register(Gauge::with_opts(opts(def))?)
    }

    fn histogram(&self, def: &MetricDef, buckets: &[f64]) -> Result<Histogram, MetricsError> {
        let opts = HistogramOpts::new(def.name, def.help).buckets(buckets.to_vec());
        self.register(Histogram::with_opts(opts)?)
    }
}

//! A latency histogram that every request observes without a lock.
//!
//! prometheus-client's `Histogram` keeps its buckets behind one mutex shared by every
//! session; two of them were observed per request (processing time, upstream round trip),
//! so every request took that mutex twice, contended across the runtime's worker threads.
//! Here each bucket, the count and the sum are atomics: an observation is a bucket search
//! over [`BUCKETS`] bounds and three relaxed adds. A scrape reads them without stopping
//! writers, so it may see a count one ahead of the buckets' sum; Prometheus tolerates such
//! skew between scrapes of a histogram (it is the same with any lock-free client).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, TypedMetric},
};

/// Number of finite buckets: upper bounds 50 µs × 2^i, i = 0..22 (50 µs to ~105 s), then +Inf.
pub const BUCKETS: usize = 22;
/// The first upper bound, in nanoseconds.
const FIRST_BOUND_NS: u64 = 50_000;

/// A lock-free latency histogram (clones share it).
#[derive(Clone, Default, Debug)]
pub struct LatencyHistogram(Arc<Inner>);

#[derive(Default, Debug)]
struct Inner {
    /// Observations per bucket (not cumulative); the last is +Inf.
    buckets: [AtomicU64; BUCKETS + 1],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// The bucket of `ns`: the first whose upper bound (`FIRST_BOUND_NS << i`) is at least `ns`.
fn bucket_of(ns: u64) -> usize {
    if ns <= FIRST_BOUND_NS {
        return 0;
    }
    // Smallest i with FIRST_BOUND_NS << i >= ns, i.e. ceil(log2(ns / FIRST_BOUND_NS)).
    let ratio = ns.div_ceil(FIRST_BOUND_NS);
    let i = (u64::BITS - (ratio - 1).leading_zeros()) as usize;
    i.min(BUCKETS)
}

fn bound_secs(i: usize) -> f64 {
    (FIRST_BOUND_NS << i) as f64 / 1e9
}

impl LatencyHistogram {
    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.0;
        if let Some(b) = inner.buckets.get(bucket_of(ns)) {
            b.fetch_add(1, Relaxed);
        }
        inner.count.fetch_add(1, Relaxed);
        inner.sum_ns.fetch_add(ns, Relaxed);
    }

    /// (sum in seconds, count, per-bucket (upper bound, count) with +Inf last).
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.0;
        let buckets: Vec<(f64, u64)> = inner
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bound = if i < BUCKETS {
                    bound_secs(i)
                } else {
                    f64::INFINITY
                };
                (bound, b.load(Relaxed))
            })
            .collect();
        let count = inner.count.load(Relaxed);
        (inner.sum_ns.load(Relaxed) as f64 / 1e9, count, buckets)
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::{
        encoding::text::encode, metrics::histogram::Histogram, registry::Registry,
    };

    #[test]
    fn buckets_match_the_upper_bounds() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(50_000), 0);
        assert_eq!(bucket_of(50_001), 1);
        assert_eq!(bucket_of(100_000), 1);
        assert_eq!(bucket_of(100_001), 2);
        assert_eq!(bucket_of(FIRST_BOUND_NS << 21), 21);
        assert_eq!(bucket_of((FIRST_BOUND_NS << 21) + 1), BUCKETS);
        assert_eq!(bucket_of(u64::MAX), BUCKETS);
    }

    /// The exposition is the same as prometheus-client's own histogram with the same
    /// buckets and observations (the format scrapers and dashboards already read).
    #[test]
    fn encodes_like_the_library_histogram() {
        let ours = LatencyHistogram::default();
        let theirs = Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
            0.000_05, 2.0, 22,
        ));
        for us in [
            1u64,
            50,
            51,
            99,
            700,
            3_000,
            250_000,
            90_000_000,
            400_000_000,
        ] {
            ours.observe(Duration::from_micros(us));
            theirs.observe(Duration::from_micros(us).as_secs_f64());
        }
        let text = |h: &dyn Fn(&mut Registry)| {
            let mut r = Registry::default();
            h(&mut r);
            let mut s = String::new();
            encode(&mut s, &r).unwrap();
            s
        };
        let a = text(&|r| r.register("lat_seconds", "h", ours.clone()));
        let b = text(&|r| r.register("lat_seconds", "h", theirs.clone()));
        // Sums differ in the last float digits (integer nanoseconds vs f64 seconds).
        let strip = |s: &str| {
            s.lines()
                .filter(|l| !l.starts_with("lat_seconds_sum"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&a), strip(&b));
        assert!(a.contains("lat_seconds_count 9"), "{a}");
        assert!(a.contains("lat_seconds_bucket{le=\"0.00005\"} 2"), "{a}");
        assert!(a.contains("lat_seconds_bucket{le=\"+Inf\"} 9"), "{a}");
    }
}

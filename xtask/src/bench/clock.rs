//! Clocks for a shared machine: the process's on-CPU time (`clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`, in
//! nanoseconds) beside wall time, and per-pass times taken from the pipeline's own `tracing` spans
//! (DESIGN.md section 5: compile time is reported per pass through those spans).
//!
//! On a machine where other jobs compete for the cores, wall time includes the time the compiler waited to
//! run; on-CPU time does not, and equals wall time on an idle machine as long as the compile runs on one
//! thread (today every pass does; a parallel pass would make CPU time exceed wall time, which the report
//! would show as a CPU / wall ratio above 1).
//! (The kernel's `/proc/thread-self/schedstat` is no substitute: it is updated only at scheduler ticks, 4 ms
//! here, for the thread that reads it.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// On-CPU nanoseconds of this process; `None` where the clock is unavailable.
pub fn cpu_ns() -> Option<u64> {
    cpu_time::ProcessTime::try_now().ok().map(|t| u64::try_from(t.as_duration().as_nanos()).unwrap_or(u64::MAX))
}

/// Wall and on-CPU time of one run, milliseconds (CPU is `None` without scheduler statistics).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Elapsed {
    /// Wall time.
    pub wall_ms: f64,
    /// On-CPU time.
    pub cpu_ms: Option<f64>,
}

impl Elapsed {
    /// The time the report uses: on-CPU where known, else wall.
    pub fn ms(&self) -> f64 {
        self.cpu_ms.unwrap_or(self.wall_ms)
    }
}

/// A started stopwatch over both clocks.
pub struct Stopwatch {
    wall: Instant,
    cpu: Option<u64>,
}

impl Stopwatch {
    /// Start now.
    pub fn start() -> Stopwatch {
        let cpu = cpu_ns();
        Stopwatch { wall: Instant::now(), cpu }
    }

    /// Time since the start.
    pub fn elapsed(&self) -> Elapsed {
        let wall_ms = self.wall.elapsed().as_secs_f64() * 1e3;
        let cpu_ms = match (self.cpu, cpu_ns()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 / 1e6),
            _ => None,
        };
        Elapsed { wall_ms, cpu_ms }
    }
}

/// Per-pass times collected from the pipeline's `pass` spans, in the order the passes finished.
#[derive(Clone, Default)]
pub struct PassTimes(Arc<Mutex<Vec<(String, Elapsed)>>>);

impl PassTimes {
    /// Take what was collected since the last call.
    pub fn take(&self) -> Vec<(String, Elapsed)> {
        self.0.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default()
    }
}

struct PassName(String);

struct NameVisitor(Option<String>);

impl Visit for NameVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.0 = Some(value.to_string());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "name" && self.0.is_none() {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_string());
        }
    }
}

/// A `tracing` layer timing every span named `pass` (field `name`: the pass) on both clocks.
pub struct PassClock {
    times: PassTimes,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for PassClock {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "pass" {
            return;
        }
        let mut v = NameVisitor(None);
        attrs.record(&mut v);
        if let (Some(name), Some(span)) = (v.0, ctx.span(id)) {
            span.extensions_mut().replace(PassName(name));
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if span.extensions().get::<PassName>().is_some() {
                span.extensions_mut().replace(Stopwatch::start());
            }
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(watch) = span.extensions_mut().remove::<Stopwatch>() else { return };
        let elapsed = watch.elapsed();
        let ext = span.extensions();
        if let (Some(PassName(name)), Ok(mut v)) = (ext.get::<PassName>(), self.times.0.lock()) {
            v.push((name.clone(), elapsed));
        }
    }
}

/// Install the pass clock as the global `tracing` subscriber; `None` when one is already installed.
pub fn install() -> Option<PassTimes> {
    use tracing_subscriber::layer::SubscriberExt;
    let times = PassTimes::default();
    let subscriber = tracing_subscriber::registry().with(PassClock { times: times.clone() });
    tracing::subscriber::set_global_default(subscriber).ok()?;
    Some(times)
}

/// Sum repeated entries of the same pass (a pass spans once per build; sum to be safe).
pub fn by_pass(times: &[(String, Elapsed)]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (n, e) in times {
        *out.entry(n.clone()).or_insert(0.0) += e.ms();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_clock_moves_with_work_where_available() {
        let Some(a) = cpu_ns() else { return };
        let mut x = 0u64;
        for i in 0..200_000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
        let b = cpu_ns().unwrap();
        assert!(b > a, "the clock resolves well under a scheduler tick");
    }

    #[test]
    fn pass_spans_are_timed_by_name() {
        use tracing_subscriber::layer::SubscriberExt;
        let times = PassTimes::default();
        let subscriber = tracing_subscriber::registry().with(PassClock { times: times.clone() });
        tracing::subscriber::with_default(subscriber, || {
            let _outer = tracing::info_span!("build").entered();
            for name in ["topo", "memory"] {
                let _s = tracing::info_span!("pass", name = name).entered();
            }
            let _other = tracing::info_span!("not_a_pass", name = "x").entered();
        });
        let got: Vec<String> = times.take().into_iter().map(|(n, _)| n).collect();
        assert_eq!(got, vec!["topo", "memory"]);
        assert!(times.take().is_empty());
    }
}

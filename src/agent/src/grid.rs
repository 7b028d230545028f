//! One grid of instants for the whole agent, for the timers that may fire a little late: the
//! hosted connections' HTTP/2 pings and the periodic probes. Rounded up to a point of the grid,
//! the deadlines of thousands of hosted clusters fall on a few points, and one wake-up of the
//! runtime serves each point's timers together.
//!
//! Each timer on its own instant woke the agent for it alone: at 3,000 hosted clusters about
//! 1,400 context switches a second at rest, and the kernel's switch-in path led the idle
//! profile (`cargo bench --bench scale`, perf; docs/architecture.md, "One agent, a thousand
//! HCPs"). A timer's work is the same either way; what the grid saves is the wake-ups.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How far the hosted connections' timers move: a ping goes at most this much later, and a
/// hung hosted server is seen at most twice this later (its ping and its ping's timeout).
pub(crate) const CONNECTION_GRAIN: Duration = Duration::from_millis(500);

/// The grid's origin, one for the process, so that every timer shares the same points.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// The first point of the grid of `grain` at or after `at` (`at` itself before the grid's
/// origin, or with a zero grain).
pub(crate) fn on_grid(at: Instant, grain: Duration) -> Instant {
    let origin = origin();
    let grain_nanos = grain.as_nanos();
    let Some(since) = at.checked_duration_since(origin) else {
        return at;
    };
    if grain_nanos == 0 {
        return at;
    }
    let points = since.as_nanos().div_ceil(grain_nanos);
    let Ok(nanos) = u64::try_from(points.saturating_mul(grain_nanos)) else {
        return at;
    };
    origin + Duration::from_nanos(nanos)
}

/// hyper's timer for the hosted connections, every deadline rounded up to the grid of
/// `CONNECTION_GRAIN`. The sleeps are tokio's, so hyper's in-place `reset` still applies.
#[derive(Clone, Debug)]
pub(crate) struct GridTimer {
    inner: hyper_util::rt::TokioTimer,
    grain: Duration,
}

impl GridTimer {
    pub(crate) fn new(grain: Duration) -> Self {
        Self {
            inner: hyper_util::rt::TokioTimer::new(),
            grain,
        }
    }
}

impl hyper::rt::Timer for GridTimer {
    fn sleep(&self, duration: Duration) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        self.inner.sleep_until(on_grid(deadline, self.grain))
    }

    fn reset(&self, sleep: &mut std::pin::Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: Instant) {
        self.inner.reset(sleep, on_grid(new_deadline, self.grain));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline moves up to the next point, never earlier and less than a grain later;
    /// deadlines within one grain share a point; a point stays where it is.
    #[test]
    fn deadlines_move_up_to_the_next_point_and_no_further() {
        let grain = Duration::from_millis(500);
        let base = origin() + Duration::from_secs(100);
        for offset_ms in [1_u64, 137, 250, 499, 500, 501, 999] {
            let at = base + Duration::from_millis(offset_ms);
            let p = on_grid(at, grain);
            assert!(p >= at, "{offset_ms} ms: earlier");
            assert!(p - at < grain, "{offset_ms} ms: a grain or more later");
            assert_eq!(
                (p - origin()).as_nanos() % grain.as_nanos(),
                0,
                "{offset_ms} ms: not on the grid"
            );
            assert_eq!(on_grid(p, grain), p, "{offset_ms} ms: a point moved");
        }
        let a = on_grid(base + Duration::from_millis(10), grain);
        let b = on_grid(base + Duration::from_millis(490), grain);
        assert_eq!(a, b, "one grain, one point");
        assert_eq!(on_grid(base, Duration::ZERO), base, "no grain, no move");
    }
}

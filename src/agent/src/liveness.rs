//! Whether the agent's controller is alive, for `/healthz` and for the process itself. A
//! controller that panicked or hung must not keep the Lease (and `hcp_fleet_leader 1`): the
//! kubelet restarts a replica whose `/healthz` fails, and a process whose controller ended
//! gives the Lease back and exits non-zero, so a standby leads.

use std::sync::atomic::{AtomicI64, Ordering};

/// How often the controller says it is alive.
pub(crate) const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(5);

/// How old the last heartbeat of a running controller may be before `/healthz` fails: six
/// missed beats, well past any pause of a busy runtime, well within a kubelet's patience.
pub(crate) const STALE_AFTER_SECONDS: i64 = 30;

pub struct Liveness {
    /// Unix seconds of the running controller's last heartbeat; 0 while none runs.
    beat: AtomicI64,
    ended: tokio::sync::watch::Sender<Option<String>>,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            beat: AtomicI64::new(0),
            ended: tokio::sync::watch::channel(None).0,
        }
    }
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl Liveness {
    /// A running controller's heartbeat.
    pub fn beat(&self) {
        self.beat.store(now(), Ordering::Relaxed);
    }

    /// No controller runs here (a standby, or one stopped on purpose): nothing to be stale.
    pub fn idle(&self) {
        self.beat.store(0, Ordering::Relaxed);
    }

    /// The controller ended on its own (panicked, or its stream ended): `why`.
    pub fn end(&self, why: String) {
        self.beat.store(0, Ordering::Relaxed);
        self.ended.send_replace(Some(why));
    }

    /// Resolves with why, once the controller has ended on its own.
    pub async fn ended(&self) -> String {
        let mut rx = self.ended.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The sender lives as long as `self`: unreachable while `self` is borrowed.
            Err(_) => std::future::pending().await,
        }
    }

    /// `/healthz`'s answer: fine, or why not.
    pub fn check(&self) -> Result<(), Unhealthy> {
        judge(
            self.ended.borrow().as_deref(),
            self.beat.load(Ordering::Relaxed),
            now(),
        )
    }
}

/// Why `/healthz` fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    #[error("the controller has ended: {0}")]
    Ended(String),
    #[error("the controller's last heartbeat is {age}s old (more than {STALE_AFTER_SECONDS}s)")]
    Stale { age: i64 },
}

/// The pure part of `check`.
pub(crate) fn judge(ended: Option<&str>, beat: i64, now: i64) -> Result<(), Unhealthy> {
    if let Some(why) = ended {
        return Err(Unhealthy::Ended(why.to_string()));
    }
    if beat > 0 && now - beat > STALE_AFTER_SECONDS {
        return Err(Unhealthy::Stale { age: now - beat });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_fails_for_an_ended_or_silent_controller_only() {
        assert_eq!(
            judge(None, 0, 1000),
            Ok(()),
            "no controller here: a standby"
        );
        assert_eq!(judge(None, 990, 1000), Ok(()));
        assert_eq!(judge(None, 970, 1000), Ok(()));
        assert_eq!(judge(None, 969, 1000), Err(Unhealthy::Stale { age: 31 }));
        assert!(judge(None, 969, 1000).is_err_and(|e| e.to_string().contains("31s old")));
        assert!(
            judge(Some("it panicked"), 1000, 1000)
                .is_err_and(|e| e.to_string().contains("it panicked"))
        );
    }

    #[tokio::test]
    async fn an_ended_controller_is_announced_once_and_stays_ended() {
        let l = Liveness::default();
        l.beat();
        assert_eq!(l.check(), Ok(()));
        let waiting = l.ended();
        l.end("the controller panicked".into());
        assert_eq!(waiting.await, "the controller panicked");
        assert_eq!(l.ended().await, "the controller panicked");
        assert!(l.check().is_err());
    }
}

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
pub fn judge(ended: Option<&str>, beat: i64, now: i64) -> Result<(), Unhealthy> {
    if let Some(why) = ended {
        return Err(Unhealthy::Ended(why.to_string()));
    }
    if beat > 0 && now - beat > STALE_AFTER_SECONDS {
        return Err(Unhealthy::Stale { age: now - beat });
    }
    Ok(())
}

/// `hcp-fleet-agent ready`: asks an agent's health port whether it is ready (the chart's
/// `helm test`), exiting 0 on `200`, 1 otherwise with the reason.
#[derive(Debug, clap::Args)]
pub struct ReadyArgs {
    /// The agent's health port, `host:port` (the chart's Service names it).
    #[arg(long)]
    pub addr: String,
    /// `/readyz`, or `/healthz` for liveness.
    #[arg(long, default_value = "/readyz")]
    pub path: String,
    #[arg(long, default_value_t = 10)]
    pub timeout_seconds: u64,
}

pub async fn ready(args: ReadyArgs) -> std::process::ExitCode {
    let wait = std::time::Duration::from_secs(args.timeout_seconds);
    match tokio::time::timeout(wait, get(&args.addr, &args.path)).await {
        Ok(Ok((200, _))) => {
            println!("{}{}: ready", args.addr, args.path);
            std::process::ExitCode::SUCCESS
        }
        Ok(Ok((code, body))) => {
            eprintln!(
                "{}{}: {code}: {}",
                args.addr,
                args.path,
                crate::reporting::untrusted(body.trim(), 512)
            );
            std::process::ExitCode::FAILURE
        }
        Ok(Err(e)) => {
            eprintln!("{}{}: {e}", args.addr, args.path);
            std::process::ExitCode::FAILURE
        }
        Err(_) => {
            eprintln!("{}{}: no answer within {wait:?}", args.addr, args.path);
            std::process::ExitCode::FAILURE
        }
    }
}

/// Why `ready` got no HTTP answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AskError {
    #[error("connecting: {0}")]
    Connect(#[source] std::io::Error),
    #[error("sending: {0}")]
    Send(#[source] std::io::Error),
    #[error("reading: {0}")]
    Read(#[source] std::io::Error),
    #[error("not an HTTP answer")]
    NotHttp,
}

/// One plain HTTP/1.0 GET: (status code, body), the body cut at 64 KiB.
async fn get(addr: &str, path: &str) -> Result<(u16, String), AskError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(AskError::Connect)?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .map_err(AskError::Send)?;
    let mut buf = Vec::new();
    s.take(64 * 1024)
        .read_to_end(&mut buf)
        .await
        .map_err(AskError::Read)?;
    let text = String::from_utf8_lossy(&buf);
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(AskError::NotHttp)?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok((code, body.to_string()))
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

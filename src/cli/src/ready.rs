//! `ready`: the chart's `helm test` asks an agent's health port whether it is ready.

/// `hcp-fleet-agent ready`: asks an agent's health port whether it is ready (the chart's
/// `helm test`), exiting 0 on `200`, 1 otherwise with the reason.
#[derive(Debug, clap::Args)]
pub struct ReadyArgs {
    /// The agent's health port, `host:port` (the chart's Service names it).
    #[arg(long)]
    pub(crate) addr: String,
    /// `/readyz`, or `/healthz` for liveness.
    #[arg(long, default_value = "/readyz")]
    pub(crate) path: String,
    #[arg(long, default_value_t = 10)]
    pub(crate) timeout_seconds: u64,
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
                hcp_fleet_render::reporting::untrusted(body.trim(), 512)
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

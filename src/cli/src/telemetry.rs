//! Logging: human-readable by default, JSON with `--log-format json` (what the agent's
//! Deployment uses). Level from RUST_LOG, defaulting to info.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// kube's client logs every failed request at error level, including the expected refusals
/// while a server boots; our own errors carry the same cause with the HCP in context.
const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // Colours only for a person at a terminal: a log file or a pod's log would carry the
    // escape codes as text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // A second init (tests) is harmless: the first subscriber stays.
    let _ = match format {
        LogFormat::Text => builder.fmt_fields(one_line_fields()).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Field values on one line: a value may carry what a hosted cluster's admins wrote (an API
/// server's error text, a webhook's denial), and a line break in it would start a forged log
/// line. Line breaks and other control characters are written escaped (`\n`); JSON logs
/// escape them already.
fn one_line_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    use tracing_subscriber::field::MakeExt;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = escape_controls(&format!("{value:?}"));
        if field.name() == "message" {
            write!(w, "{text}")
        } else {
            write!(w, "{}={text}", field.name())
        }
    })
    .delimited(" ")
}

/// `text` with control characters written as escapes.
pub(crate) fn escape_controls(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's text cannot start a log line of its own, whatever it holds.
    #[test]
    fn a_field_value_stays_on_one_line() {
        use std::sync::{Arc, Mutex};
        let buf = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(sink.clone()))
            .fmt_fields(one_line_fields())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let denial = "denied\n2026-11-25T00:00:00Z  INFO forged: all Compliant\r\u{1b}[2J";
            tracing::warn!(error = %denial, "probe failed: {denial}");
        });
        let out = String::from_utf8(buf.lock().map(|b| b.clone()).unwrap_or_default())
            .unwrap_or_default();
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(out.contains("probe failed: denied\\n2026"), "{out}");
        assert!(out.contains("error=denied\\n2026"), "{out}");
        assert!(!out.contains('\u{1b}'), "{out}");
    }

    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(b);
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}

//! A child process of the local control plane that can never outlive us.
//!
//! Three layers keep it so: `Drop` kills and reaps it; each child asks the kernel to kill it
//! when its parent thread dies (PR_SET_PDEATHSIG), which covers a SIGKILL of this process; and
//! each child gets its own process group, so a Ctrl-C reaches only us and we stop the children
//! in order (API servers before etcd) instead of all at once.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::LocalCpError;

/// The Go runtime's settings for the test bed's servers (etcd, the API servers, the controller
/// managers), each unless the environment sets it itself. They live for one test, spend their
/// start building large documents once, and a fleet runs a dozen of them on two cores.
/// - `GOGC=400`: collecting at every doubling of the heap (Go's default, 100) was a tenth of
///   their CPU. A fleet's start (`testbed::management_and_two_hosted_clusters_serve_crds_and_fixtures`,
///   three runs each) took 7.4 CPU-s instead of 8.3, its largest server 370-465 MB instead of
///   260-310; 200 and 800 saved less, and no collection at all (`GOGC=off` under a 1 GiB
///   `GOMEMLIMIT`) cost more.
/// - `GOMAXPROCS=1`: with two processors each, a dozen runtimes on two cores spin looking for
///   work each other's threads could do. The same start, seven runs each: 6.0 CPU-s instead of
///   6.5, and no slower (4.6 s instead of 5.0 of wall time).
const GO_RUNTIME: [(&str, &str); 2] = [("GOGC", "400"), ("GOMAXPROCS", "1")];

pub(crate) struct ManagedProcess {
    component: String,
    child: Option<Child>,
    log_path: PathBuf,
}

/// `cmd`'s process is killed when the thread that starts it exits (PR_SET_PDEATHSIG), even by
/// a signal no destructor sees.
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
    // which is async-signal-safe; it touches no memory shared with the parent.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl ManagedProcess {
    /// Starts `program` with stdout and stderr appended to `log_path`.
    ///
    /// Call from a long-lived thread (a runtime worker or the test's own thread, never a
    /// `spawn_blocking` thread): PDEATHSIG fires when the *thread* that forked exits.
    pub(crate) fn spawn(
        component: &str,
        program: &Path,
        args: &[String],
        log_path: &Path,
    ) -> Result<Self, LocalCpError> {
        Self::spawn_with_env(component, program, args, &[], log_path)
    }

    /// `spawn`, with extra environment variables.
    pub(crate) fn spawn_with_env(
        component: &str,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log_path: &Path,
    ) -> Result<Self, LocalCpError> {
        let io_err = |source| LocalCpError::Io {
            context: format!("opening log {} for {component}", log_path.display()),
            source,
        };
        let log = File::options()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(io_err)?;
        let log2 = log.try_clone().map_err(io_err)?;
        let mut cmd = Command::new(program);
        for (name, value) in GO_RUNTIME {
            if std::env::var_os(name).is_none() && !env.iter().any(|(k, _)| k == name) {
                cmd.env(name, value);
            }
        }
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|source| LocalCpError::Spawn {
            component: component.to_string(),
            program: program.to_path_buf(),
            source,
        })?;
        Ok(Self {
            component: component.to_string(),
            child: Some(child),
            log_path: log_path.to_path_buf(),
        })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(description)` once the process has exited.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            None => Some("stopped".to_string()),
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Ok(None)) => None,
            Some(Err(e)) => Some(format!("unknown ({e})")),
        }
    }

    /// The last `lines` lines of the process's log.
    pub(crate) fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    pub(crate) fn component(&self) -> &str {
        &self.component
    }

    /// Kills and reaps the process. Idempotent.
    /// Stops the process as a kubelet stops a container: SIGTERM, then SIGKILL if it has not
    /// exited within `grace`. Returns at once; the wait happens on a thread of its own.
    pub(crate) fn terminate(mut self, grace: std::time::Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) with our own child's pid; no memory is involved.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + grace;
            while std::time::Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        });
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The test bed's servers hold nothing worth a graceful shutdown, and SIGKILL
            // cannot be ignored, so stopping never hangs.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file (at most the last 64 KiB are read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    const MAX: u64 = 64 * 1024;
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

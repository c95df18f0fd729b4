//! The child processes of one bench run (started, watched, killed by PID on drop) and the
//! signals that stop a run cleanly.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver as ChannelRx, RecvTimeoutError, Sender as ChannelTx};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::ProgressBar;
use serde_json::Value;

use crate::processes::TAG;

// Signals.

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub(super) fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub(super) fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; stopped every process and removed the namespaces");
    }
    Ok(())
}

// The processes.

pub(super) enum Msg {
    Event {
        role: String,
        kind: String,
        body: Value,
    },
    Log {
        role: String,
        line: String,
    },
}

pub(super) struct Proc {
    pub(super) role: String,
    child: Child,
    /// Held open: the child exits when it closes. The leader reads its commands from it.
    stdin: Option<ChildStdin>,
    pub(super) status: Option<ExitStatus>,
}

/// The children of one run; dropping it kills and reaps every child still running.
pub(super) struct Fleet {
    pub(super) exe: PathBuf,
    pub(super) secret: String,
    pub(super) procs: Vec<Proc>,
    pub(super) readers: Vec<JoinHandle<()>>,
    pub(super) tx: ChannelTx<Msg>,
}

impl Fleet {
    /// Starts `deltacast ARGS`, inside `ns` when given.
    pub(super) fn spawn(&mut self, role: &str, ns: Option<&str>, args: Vec<String>) -> Result<()> {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let mut child = cmd
            .args(&args)
            .env(deltacast_net::SECRET_ENV, &self.secret)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {role}"))?;
        let stdin = child.stdin.take();
        if let Some(out) = child.stdout.take() {
            let (role, tx) = (role.to_string(), self.tx.clone());
            self.readers.push(thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    let parsed = line.strip_prefix(TAG).and_then(|rest| {
                        let (kind, body) = rest.split_once(' ')?;
                        Some((kind.to_string(), serde_json::from_str(body).ok()?))
                    });
                    let msg = match parsed {
                        Some((kind, body)) => Msg::Event {
                            role: role.clone(),
                            kind,
                            body,
                        },
                        None => Msg::Log {
                            role: role.clone(),
                            line,
                        },
                    };
                    if tx.send(msg).is_err() {
                        return;
                    }
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let (role, tx) = (role.to_string(), self.tx.clone());
            self.readers.push(thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                    if tx
                        .send(Msg::Log {
                            role: role.clone(),
                            line,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            }));
        }
        self.procs.push(Proc {
            role: role.to_string(),
            child,
            stdin,
            status: None,
        });
        Ok(())
    }

    /// Children that exited since the last call, with their status.
    pub(super) fn poll(&mut self) -> Vec<String> {
        let mut exited = Vec::new();
        for p in self.procs.iter_mut().filter(|p| p.status.is_none()) {
            if let Ok(Some(status)) = p.child.try_wait() {
                p.status = Some(status);
                exited.push(format!("{} exited with {status}", p.role));
            }
        }
        exited
    }

    pub(super) fn all_exited(&self) -> bool {
        self.procs.iter().all(|p| p.status.is_some())
    }

    /// One line to the leader's stdin.
    pub(super) fn command(&mut self, line: &str) -> Result<()> {
        let leader = self
            .procs
            .first_mut()
            .and_then(|p| p.stdin.as_mut())
            .ok_or_else(|| anyhow!("the leader is not running"))?;
        writeln!(leader, "{line}")
            .and_then(|_| leader.flush())
            .context("the leader stopped taking commands")
    }

    fn kill_remaining(&mut self) {
        for p in self.procs.iter_mut().filter(|p| p.status.is_none()) {
            let _ = p.child.kill();
            p.status = p.child.wait().ok();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.procs {
            p.stdin = None;
        }
        self.kill_remaining();
    }
}

/// Waits for the tagged event `kind` from `role`, passing logs through and failing when a
/// process exits, the run is interrupted, or `limit` passes.
pub(super) fn wait_for(
    fleet: &mut Fleet,
    rx: &ChannelRx<Msg>,
    bar: &ProgressBar,
    role: &str,
    kind: &str,
    limit: Option<Duration>,
    also: &mut Vec<(String, Value)>,
) -> Result<Value> {
    let deadline = limit.map(|l| Instant::now() + l);
    loop {
        check_interrupt()?;
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Msg::Event {
                role: r,
                kind: k,
                body,
            }) if r == role && k == kind => return Ok(body),
            Ok(Msg::Event {
                role: r,
                kind: k,
                body,
            }) => also.push((format!("{r}:{k}"), body)),
            Ok(Msg::Log { role: r, line }) => bar.suspend(|| eprintln!("[{r}] {line}")),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => bail!("every process output closed"),
        }
        let exited = fleet.poll();
        if !exited.is_empty() {
            // Let the last lines (the error) through before failing.
            let until = Instant::now() + Duration::from_millis(500);
            while let Ok(m) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                if let Msg::Log { role: r, line } = m {
                    bar.suspend(|| eprintln!("[{r}] {line}"));
                }
            }
            check_interrupt()?;
            bail!("{} (while waiting for {role} `{kind}`)", exited.join("; "));
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            bail!(
                "{role} did not report `{kind}` within {:?}",
                limit.unwrap_or_default()
            );
        }
    }
}

//! Network namespaces, veth links and tc shaping for `deltacast bench`.
//!
//! One namespace per host: `dcb-<pid>-t` holds every trainer rank (they gather over the
//! namespace's own address, as ranks of one host do over their local fabric), and
//! `dcb-<pid>-r<i>` holds receiver `i`. Each receiver host has its own veth link to the trainer
//! host (`vr<i>` in the trainer namespace, `vt` in the receiver's), `10.77.<i>.1` ↔
//! `10.77.<i>.2/24`, so every receiver gets a link of the full rate, as hosts with their own NIC
//! path do. The trainer's servers listen on 10.77.255.1, an address on the trainer namespace's
//! loopback that every receiver routes through its link. Devices are created inside the
//! namespaces (`ip -n`), so nothing ever appears in the caller's namespace; deleting the
//! namespaces removes every link and qdisc.
//!
//! Shaping, per link and on both ends (each end shapes its egress): `tbf rate R` at the root
//! with a `netem delay D` child, so a packet waits D (one way; the round trip is 2D) and leaves
//! at R. On a kernel without netem (no `sch_netem`; it cannot be loaded from here) the rate is
//! shaped alone and the delay is not emulated; the run says so and records it. The sysctls of the namespaces (not the host's) are set for bulk transfers on persistent
//! connections: no slow-start restart after idle, 64 MiB TCP buffer maxima.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Every namespace this tool creates starts with this.
pub const PREFIX: &str = "dcb-";
/// Where the trainer host's servers listen (on its loopback, routed from every receiver).
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 255, 1);

/// A shaped link: rate in bit/s and one-way delay in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkSpec {
    pub name: String,
    pub rate_bps: u64,
    pub delay_us: u64,
}

impl LinkSpec {
    pub fn describe(&self) -> String {
        format!(
            "{} ({}, {} one way)",
            self.name,
            rate_text(self.rate_bps),
            delay_text(self.delay_us)
        )
    }
}

pub fn rate_text(bps: u64) -> String {
    let b = bps as f64;
    if b >= 1e9 {
        format!("{} Gbit/s", trim(b / 1e9))
    } else if b >= 1e6 {
        format!("{} Mbit/s", trim(b / 1e6))
    } else {
        format!("{} kbit/s", trim(b / 1e3))
    }
}

pub fn delay_text(us: u64) -> String {
    if us >= 1000 {
        format!("{} ms", trim(us as f64 / 1e3))
    } else {
        format!("{us} µs")
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// `10gbit`, `2.5gbit`, `500mbit`, `10g`, `800m`, `1000000` (bit/s).
pub fn parse_rate(text: &str) -> Result<u64> {
    let t = text.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("bit/s")
        .or_else(|| t.strip_suffix("bit"))
        .unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1e3),
        Some('m') => (&t[..t.len() - 1], 1e6),
        Some('g') => (&t[..t.len() - 1], 1e9),
        Some('t') => (&t[..t.len() - 1], 1e12),
        _ => (t, 1.0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .with_context(|| format!("`{text}` is not a rate (e.g. 10gbit, 2.5gbit, 500mbit)"))?;
    let bps = (v * mult).round();
    if !(8_000.0..=1e13).contains(&bps) {
        bail!("rate `{text}` is outside 8kbit..10tbit");
    }
    Ok(bps as u64)
}

/// `10ms`, `0.5ms`, `200us`, `0`, `1s` (one way).
pub fn parse_delay(text: &str) -> Result<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e6)
    } else {
        (t.as_str(), 1e3)
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .with_context(|| format!("`{text}` is not a delay (e.g. 10ms, 500us, 0)"))?;
    let us = (v * mult).round();
    if us > 10e6 {
        bail!("delay `{text}` is above 10 s");
    }
    Ok(us as u64)
}

/// The named presets: `wan`, `10g`, `25g`.
pub fn preset_link(name: &str) -> Option<LinkSpec> {
    let (rate, delay) = match name {
        "wan" => (1_000_000_000, 10_000),
        "10g" => (10_000_000_000, 1_000),
        "25g" => (25_000_000_000, 500),
        _ => return None,
    };
    Some(LinkSpec {
        name: name.to_string(),
        rate_bps: rate,
        delay_us: delay,
    })
}

/// A preset name, or `RATE/DELAY` (e.g. `2gbit/5ms`).
pub fn parse_link(text: &str) -> Result<LinkSpec> {
    let t = text.trim();
    if let Some(l) = preset_link(&t.to_ascii_lowercase()) {
        return Ok(l);
    }
    let Some((rate, delay)) = t.split_once('/') else {
        bail!("unknown link `{t}`: use wan, 10g, 25g or RATE/DELAY such as 2gbit/5ms");
    };
    Ok(LinkSpec {
        name: t.to_string(),
        rate_bps: parse_rate(rate)?,
        delay_us: parse_delay(delay)?,
    })
}

/// Runs a command to completion; an error names the command and quotes its stderr.
fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run `{program}`"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run `{program}`"))?;
    if !out.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Why shaped runs cannot work here, if they cannot: not root, or `ip`/`tc` missing or unable
/// to make a namespace.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("shaped links need root (network namespaces, veth links, tc qdiscs)".into());
    }
    for tool in ["ip", "tc"] {
        let ok = Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            return Some(format!(
                "`{tool}` (iproute2) is not installed or does not run"
            ));
        }
    }
    if let Err(e) = output("ip", &["netns", "list"]) {
        return Some(format!("`ip netns` does not work here: {e:#}"));
    }
    None
}

/// The namespaces that exist now.
pub fn list_namespaces() -> Result<Vec<String>> {
    Ok(output("ip", &["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The pid that a `dcb-<pid>-…` name belongs to.
fn owner_pid(name: &str) -> Option<i32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

fn process_alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Deletes namespaces named `dcb-<pid>-…` whose pid no longer runs (left by a run that was
/// killed with SIGKILL), first killing any deltacast process still inside them. Returns the
/// names removed. Namespaces of runs still going are left alone.
pub fn clean_leftovers() -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        let Some(pid) = owner_pid(&ns) else { continue };
        if process_alive(pid) {
            continue;
        }
        if let Ok(pids) = output("ip", &["netns", "pids", &ns]) {
            for p in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
                if comm.trim() == "deltacast" {
                    // SAFETY: plain kill(2) on a pid read from ip netns pids.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
            }
        }
        run("ip", &["netns", "del", &ns])?;
        removed.push(ns);
    }
    Ok(removed)
}

/// The namespaces and links of one run; dropping it deletes them (children must be gone first
/// for the kernel to free them at once).
pub struct Topology {
    pub trainer_ns: String,
    pub receiver_ns: Vec<String>,
    /// Names to delete, recorded before each is created.
    created: Vec<String>,
    /// `(namespace, device)` of both ends of every link.
    ends: Vec<(String, String)>,
    /// Whether this kernel has netem (delays are emulated only then).
    pub netem: bool,
    torn_down: bool,
}

impl Topology {
    /// Creates the trainer host and `receivers` receiver hosts for this process.
    pub fn create(receivers: usize) -> Result<Self> {
        if receivers == 0 || receivers > 250 {
            bail!("--receivers must be 1..=250 with shaped links");
        }
        let pid = std::process::id();
        let mut topo = Topology {
            trainer_ns: format!("{PREFIX}{pid}-t"),
            receiver_ns: (0..receivers)
                .map(|i| format!("{PREFIX}{pid}-r{i}"))
                .collect(),
            created: Vec::new(),
            ends: Vec::new(),
            netem: false,
            torn_down: false,
        };
        topo.build()?;
        topo.netem = topo.probe_netem();
        Ok(topo)
    }

    fn add_ns(&mut self, ns: &str) -> Result<()> {
        self.created.push(ns.to_string());
        run("ip", &["netns", "add", ns])?;
        run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        // Namespaced sysctls only (they start at kernel defaults in a new namespace).
        let _ = run(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.tcp_slow_start_after_idle=0",
                "net.ipv4.tcp_rmem=4096 131072 67108864",
                "net.ipv4.tcp_wmem=4096 65536 67108864",
            ],
        );
        Ok(())
    }

    fn build(&mut self) -> Result<()> {
        let t = self.trainer_ns.clone();
        self.add_ns(&t)?;
        run(
            "ip",
            &[
                "-n",
                &t,
                "addr",
                "add",
                &format!("{SERVICE_IP}/32"),
                "dev",
                "lo",
            ],
        )?;
        for (i, r) in self.receiver_ns.clone().iter().enumerate() {
            self.add_ns(r)?;
            let dev = format!("vr{i}");
            run(
                "ip",
                &[
                    "-n", &t, "link", "add", &dev, "type", "veth", "peer", "name", "vt", "netns", r,
                ],
            )?;
            self.ends.push((t.clone(), dev.clone()));
            self.ends.push((r.clone(), "vt".into()));
            let (near, far) = (format!("10.77.{i}.1"), format!("10.77.{i}.2"));
            run(
                "ip",
                &["-n", &t, "addr", "add", &format!("{near}/24"), "dev", &dev],
            )?;
            run("ip", &["-n", &t, "link", "set", &dev, "up"])?;
            run(
                "ip",
                &["-n", r, "addr", "add", &format!("{far}/24"), "dev", "vt"],
            )?;
            run("ip", &["-n", r, "link", "set", "vt", "up"])?;
            run(
                "ip",
                &[
                    "-n",
                    r,
                    "route",
                    "add",
                    &format!("{SERVICE_IP}/32"),
                    "via",
                    &near,
                ],
            )?;
        }
        Ok(())
    }

    /// Whether a netem qdisc can be added here (some kernels are built without it).
    fn probe_netem(&self) -> bool {
        let Some((ns, dev)) = self.ends.first() else {
            return false;
        };
        let ok = run(
            "tc",
            &[
                "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
                "0us",
            ],
        )
        .is_ok();
        let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
        ok
    }

    /// Shapes every link end (both directions) as `link`; `None` removes the shaping. Without
    /// netem the rate is shaped and the delay is not emulated (the caller says so).
    pub fn shape(&self, link: Option<&LinkSpec>) -> Result<()> {
        for (ns, dev) in &self.ends {
            // Start from the default qdisc; "No such file" when nothing was there is fine.
            let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
            let Some(l) = link else { continue };
            // tbf needs a bucket of at least one timer tick of traffic and a whole GSO packet.
            let burst = (l.rate_bps / 8 / 1000).max(256 << 10);
            run(
                "tc",
                &[
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "handle",
                    "1:",
                    "tbf",
                    "rate",
                    &format!("{}bit", l.rate_bps),
                    "burst",
                    &burst.to_string(),
                    "latency",
                    "100ms",
                ],
            )?;
            if !self.netem {
                continue;
            }
            run(
                "tc",
                &[
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    "netem",
                    "delay",
                    &format!("{}us", l.delay_us),
                    "limit",
                    "1000000",
                ],
            )?;
        }
        Ok(())
    }

    /// The qdiscs on every link end, as `tc qdisc show` prints them (for the record).
    pub fn describe_qdiscs(&self) -> String {
        let mut out = String::new();
        for (ns, dev) in &self.ends {
            if let Ok(s) = output("tc", &["-n", ns, "qdisc", "show", "dev", dev]) {
                for line in s.lines() {
                    out.push_str(&format!("{ns}/{dev}: {line}\n"));
                }
            }
        }
        out
    }

    /// Deletes every namespace of the run; returns what could not be deleted.
    pub fn teardown(&mut self) -> Vec<String> {
        self.torn_down = true;
        let mut failed = Vec::new();
        for ns in self.created.drain(..).rev() {
            if let Err(e) = run("ip", &["netns", "del", &ns]) {
                // Already gone is fine; anything else is reported.
                if list_namespaces().map_or(true, |l| l.contains(&ns)) {
                    failed.push(format!("{ns}: {e:#}"));
                }
            }
        }
        failed
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if !self.torn_down {
            for f in self.teardown() {
                eprintln!("deltacast bench: could not remove namespace {f}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_delays_and_links_parse() {
        assert_eq!(parse_rate("10gbit").unwrap(), 10_000_000_000);
        assert_eq!(parse_rate("2.5gbit").unwrap(), 2_500_000_000);
        assert_eq!(parse_rate("500mbit").unwrap(), 500_000_000);
        assert_eq!(parse_rate("10g").unwrap(), 10_000_000_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0gbit").is_err());
        assert_eq!(parse_delay("10ms").unwrap(), 10_000);
        assert_eq!(parse_delay("0.5ms").unwrap(), 500);
        assert_eq!(parse_delay("200us").unwrap(), 200);
        assert_eq!(parse_delay("0").unwrap(), 0);
        assert!(parse_delay("-1ms").is_err());
        assert_eq!(parse_link("wan").unwrap().rate_bps, 1_000_000_000);
        let l = parse_link("2gbit/5ms").unwrap();
        assert_eq!((l.rate_bps, l.delay_us), (2_000_000_000, 5_000));
        assert!(parse_link("lan").is_err());
        assert_eq!(owner_pid("dcb-1234-r0"), Some(1234));
        assert_eq!(owner_pid("other-1"), None);
        assert_eq!(rate_text(25_000_000_000), "25 Gbit/s");
        assert_eq!(delay_text(500), "500 µs");
    }
}

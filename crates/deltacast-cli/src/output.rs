//! Human and JSON output helpers: every count, size, hash and error the CLI prints goes through
//! one of these, so each is spelled one way everywhere.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte count for people: 1.23 GB, 45.6 MB, 789 B (decimal units, like network rates: wire
/// bytes, file sizes, memory).
pub fn bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// `n` and the noun in agreement: "1 flush", "2 flushes", "0 chunks".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A 64-bit hash or digest (slot tables, state digests) as the CLI spells it: 16 hex digits.
pub fn hex64(h: u64) -> String {
    format!("{h:016x}")
}

/// Binary units of a [`ByteSize`], smallest first.
const BINARY_UNITS: [(&str, &str, u32); 4] = [
    ("", "B", 0),
    ("K", "KiB", 10),
    ("M", "MiB", 20),
    ("G", "GiB", 30),
];

/// A size given on the command line (`--bucket-size 512M`): its bytes, and the binary unit it
/// was written in, so that it is shown the way the user wrote it (`512 MiB`, `1536 KiB`,
/// `4096 B`) rather than as a rounded decimal figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize {
    bytes: u64,
    /// Index into [`BINARY_UNITS`].
    unit: usize,
}

impl ByteSize {
    /// A size in the largest binary unit that divides it (for built-in defaults).
    pub fn from_bytes(bytes: u64) -> Self {
        let unit = (0..BINARY_UNITS.len())
            .rev()
            .find(|&u| bytes.is_multiple_of(1 << BINARY_UNITS[u].2) && bytes > 0)
            .unwrap_or(0);
        ByteSize { bytes, unit }
    }

    /// Parses `4096`, `64K`, `512M`, `1G`, also written `64KiB`, `512MiB`, `1GiB` (binary
    /// multiples; case does not matter).
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let upper = t.to_ascii_uppercase();
        let body = upper
            .strip_suffix("IB")
            .filter(|b| b.ends_with(['K', 'M', 'G']))
            .unwrap_or(&upper);
        let unit = BINARY_UNITS
            .iter()
            .rposition(|(suffix, _, _)| !suffix.is_empty() && body.ends_with(suffix))
            .unwrap_or(0);
        let digits = body[..body.len() - BINARY_UNITS[unit].0.len()].trim();
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("`{text}` is not a size (e.g. 4096, 64K, 512M, 1G)"))?;
        let bytes = n
            .checked_mul(1 << BINARY_UNITS[unit].2)
            .ok_or_else(|| format!("`{text}` is too large"))?;
        Ok(ByteSize { bytes, unit })
    }

    pub fn bytes(self) -> u64 {
        self.bytes
    }

    /// The size as an argument that parses back to the same size and unit (`512M`).
    pub fn arg(self) -> String {
        let (suffix, _, shift) = BINARY_UNITS[self.unit];
        format!("{}{suffix}", self.bytes >> shift)
    }
}

impl std::fmt::Display for ByteSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (_, name, shift) = BINARY_UNITS[self.unit];
        write!(f, "{} {name}", self.bytes >> shift)
    }
}

/// The error and its causes, each said once: a cause whose message its wrapper already
/// repeats (as the core library's errors do, for `to_string` users) is not printed again.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// A progress bar over `total` units on stderr; hidden when stderr is not a terminal or when
/// output is JSON.
pub fn progress(total: u64, message: &str, hidden: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(total),
        if hidden {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("{msg:>18} [{bar:40}] {percent:>3}% {elapsed_precise}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(message.to_string());
    bar
}

/// A long phase people should know is under way: a bar over `total` units on a terminal;
/// elsewhere (a log, a pipe) one line on stderr saying what is happening. Nothing with JSON
/// output (stdout stays JSON only, stderr quiet).
pub fn phase(total: u64, message: &str, json: bool) -> ProgressBar {
    if !json && !std::io::stderr().is_terminal() {
        eprintln!("{message}…");
    }
    progress(total, message, json)
}

/// Prints one JSON object on its own line.
pub fn json_line(value: &serde_json::Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_show_as_written() {
        for (text, bytes, shown, arg) in [
            ("512M", 512 << 20, "512 MiB", "512M"),
            ("512MiB", 512 << 20, "512 MiB", "512M"),
            ("512mib", 512 << 20, "512 MiB", "512M"),
            ("16k", 16 << 10, "16 KiB", "16K"),
            ("1536K", 1536 << 10, "1536 KiB", "1536K"),
            ("1G", 1 << 30, "1 GiB", "1G"),
            ("4096", 4096, "4096 B", "4096"),
            (" 10 ", 10, "10 B", "10"),
        ] {
            let s = ByteSize::parse(text).unwrap();
            assert_eq!(
                (s.bytes(), s.to_string(), s.arg()),
                (bytes, shown.into(), arg.into())
            );
            assert_eq!(ByteSize::parse(&s.arg()).unwrap(), s);
        }
        for bad in ["", "M", "12X", "1.5M", "-1", "512MB", "99999999999G"] {
            assert!(ByteSize::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(ByteSize::from_bytes(512 << 20).to_string(), "512 MiB");
        assert_eq!(ByteSize::from_bytes(3 << 19).to_string(), "1536 KiB");
        assert_eq!(ByteSize::from_bytes(1000).to_string(), "1000 B");
        assert_eq!(ByteSize::from_bytes(0).to_string(), "0 B");
    }

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(count(1, "flush", "flushes"), "1 flush");
        assert_eq!(count(0, "flush", "flushes"), "0 flushes");
        assert_eq!(count(2, "chunk", "chunks"), "2 chunks");
    }

    #[derive(Debug)]
    struct Wrapper(std::io::Error);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "I/O error on x: {}", self.0)
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn every_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(Wrapper(io)).context("cannot open OLD x");
        assert_eq!(
            error_chain(&err),
            "cannot open OLD x: I/O error on x: no such file"
        );
        // Causes that a wrapper does not repeat are all said.
        let err = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(error_chain(&err), "outer: middle: inner");
    }
}

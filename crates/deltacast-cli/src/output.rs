//! Human and JSON output helpers.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte count for people: 1.23 GB, 45.6 MB, 789 B (decimal units, like network rates).
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

/// Prints one JSON object on its own line.
pub fn json_line(value: &serde_json::Value) {
    println!("{value}");
}

//! The bench's output: a markdown table like llama-bench's (with the step's work, the achieved
//! bandwidth and llama.cpp's figures beside cera's), the kernel profiles, or JSON. A CPU run's
//! table leaves out the GPU's columns (dispatches, passes and submits, host time recording
//! them, the roofline).

use std::fmt::Write;

use super::{BenchReport, BenchRow};

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn speed(s: &super::Spread) -> String {
    format!("{:.1} ({:.0}–{:.0})", s.median, s.min, s.max)
}

fn row_line(r: &BenchRow, compare: bool, gpu: bool) -> String {
    let mut line = format!("| {} | {} | {} | {} | {} | {:.3} |", r.model, r.quant, gib(r.file_bytes), r.test, speed(&r.tok_s), r.ms_per_token);
    match &r.step {
        Some(w) if !gpu => {
            let _ = write!(line, " {:.1} MB | {:.1} |", w.weight_bytes as f64 / 1e6, w.gb_s);
        }
        None if !gpu => line.push_str(" - | - |"),
        Some(w) => {
            let frac = if w.roofline_fraction > 0.0 { format!("{:.0}%", 100.0 * w.roofline_fraction) } else { "-".into() };
            let _ = write!(
                line,
                " {} / {} / {} | {:.0} | {:.1} MB | {:.1} | {frac} |",
                w.dispatches,
                w.passes,
                w.submits,
                w.host_us,
                w.weight_bytes as f64 / 1e6,
                w.gb_s
            );
        }
        None => line.push_str(" - | - | - | - | - |"),
    }
    if compare {
        match &r.llama_cpp {
            Some(l) => {
                let _ = write!(line, " {} | **{:.2}×** |", speed(l), r.tok_s.median / l.median);
            }
            None => line.push_str(" - | - |"),
        }
    }
    line
}

/// The table (and, with profiles, the top kernels per row) as markdown.
pub fn print_table(report: &BenchReport) -> String {
    let compare = report.rows.iter().any(|r| r.llama_cpp.is_some());
    let mut s = String::new();
    let _ = writeln!(s, "device: {}", report.device);
    if let Some(r) = report.roofline_gb_s {
        let _ = writeln!(s, "roofline (streaming read, this run): {r:.1} GB/s");
    }
    if let Some(d) = &report.llama_cpp_device {
        let _ = writeln!(s, "llama.cpp: {d}");
    }
    let _ = writeln!(
        s,
        "median of {} runs after a warm-up (min–max){}; pipelined decoding {}; decode GEMV activations {}",
        report.reps,
        if report.warm_ms > 0 && report.roofline_gb_s.is_some() { format!(", each after {} ms of GPU load", report.warm_ms) } else { String::new() },
        if report.pipeline { "on" } else { "off" },
        report.decode_gemv
    );
    s.push('\n');
    if report.gpu {
        s.push_str("| model | quant | size | test | tok/s | ms/tok | dispatches / passes / submits per token | host µs/tok | weights/tok | GB/s | roofline |");
    } else {
        s.push_str("| model | quant | size | test | tok/s | ms/tok | weights/tok | GB/s |");
    }
    if compare {
        s.push_str(" llama.cpp tok/s | cera / llama.cpp |");
    }
    s.push('\n');
    s.push_str(if report.gpu { "|---|---|---|---|---|---|---|---|---|---|---|" } else { "|---|---|---|---|---|---|---|---|" });
    if compare {
        s.push_str("---|---|");
    }
    s.push('\n');
    for r in &report.rows {
        s.push_str(&row_line(r, compare, report.gpu));
        s.push('\n');
    }
    for c in &report.cold {
        let writes = c.device_writes_s.map_or(String::new(), |w| format!(", {w:.2} s of it writing to the device"));
        let writes = writes + &c.host_wait_s.map_or(String::new(), |w| format!(" and {w:.2} s waiting for the host's layout"));
        let _ = write!(
            s,
            "\nload {}: {:.2} s ({:.2} GB/s; the file {:.2} s, the device {:.2} s, the weights {:.2} s{writes})",
            c.model, c.load_s, c.load_gb_s, c.file_s, c.device_s, c.weights_s
        );
        if c.prompt > 0 {
            let warm = report.rows.iter().find(|r| r.model == c.model && r.test == format!("pp{}", c.prompt)).map(|r| r.tok_s.median);
            let ratio = warm
                .filter(|&w| w > 0.0 && c.prefill_tok_s > 0.0)
                .map_or(String::new(), |w| format!("; the warm pp{} is {:.2}x that", c.prompt, w / c.prefill_tok_s));
            let _ = write!(s, "; first request ({} prompt tokens): time to first token {:.1} ms ({:.0} tok/s){ratio}", c.prompt, c.ttft_ms, c.prefill_tok_s);
        }
        s.push('\n');
    }
    for n in &report.notes {
        let _ = writeln!(s, "\nnote: {n}");
    }
    for r in report.rows.iter().filter(|r| !r.profile.is_empty()) {
        let per = if r.test.starts_with("tg") { "decode token" } else { "prompt token" };
        let total: f64 = r.profile.iter().map(|k| k.us_per_token).sum();
        let _ = writeln!(s, "\nGPU time per {per}, {} {} (top {}, {total:.2} µs listed):\n", r.model, r.test, r.profile.len());
        s.push_str("| kernel | µs/token | dispatches per step | share |\n|---|---|---|---|\n");
        for k in &r.profile {
            let _ = writeln!(s, "| {} | {:.3} | {} | {:.1}% |", k.kernel, k.us_per_token, k.dispatches, 100.0 * k.fraction);
        }
    }
    s
}

/// The report as pretty JSON.
pub fn print_json(report: &BenchReport) -> String {
    serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

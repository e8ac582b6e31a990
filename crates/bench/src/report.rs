//! Results as JSON, a Markdown report, and PNG plots (throughput against latency per system).

use crate::driver::RunStats;
use anyhow::{Context, Result};
use plotters::prelude::*;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The machine a report was measured on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
}

impl Machine {
    pub fn this() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map_or("unknown".into(), |(_, m)| m.trim().to_string()),
            memory_gib: crate::procstat::parse_vmrss(&meminfo.replace("MemTotal:", "VmRSS:"))
                .map_or(0.0, |b| b as f64 / f64::from(1u32 << 30)),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
        }
    }
}

/// A workload a system could not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Unsupported {
    pub system: String,
    pub workload: String,
    pub reason: String,
}

/// Everything one `bulwark bench compare` measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub unix_time: u64,
    pub machine: Machine,
    pub systems: Vec<String>,
    pub runs: Vec<RunStats>,
    pub unsupported: Vec<Unsupported>,
    pub notes: Vec<String>,
    /// The machine's own limits for a 1 MiB get, when measured.
    pub limits: Option<crate::limits::Limits>,
}

pub fn human_bytes(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

fn is_ycsb(run: &RunStats) -> bool {
    run.workload.starts_with("ycsb-")
}

/// The Markdown report; `plots` are the PNG file names to show.
pub fn markdown(report: &Report, plots: &[String]) -> String {
    let mut out = String::new();
    let m = &report.machine;
    let _ = writeln!(
        out,
        "# Bulwark benchmark: {}\n",
        report.systems.join(" vs ")
    );
    let _ = writeln!(out, "```sh\n{}\n```\n", report.command);
    let _ = writeln!(
        out,
        "Machine: {} CPUs ({}), {:.1} GiB, Linux {}. All systems on loopback on this machine, \
         interleaved run by run. Latencies in ms; CPU is server processes' user + system time \
         per operation (client: this process); bytes are what the client sent per operation.\n",
        m.cpus, m.cpu_model, m.memory_gib, m.kernel
    );
    if let Some(rate) = report.runs.iter().find_map(|r| r.target_rate) {
        let _ = writeln!(
            out,
            "YCSB runs aimed at {rate:.0} operations per second in total; their latencies are \
             corrected for coordinated omission (HDR `record_correct`).\n"
        );
    }
    // Under --links, what crossed the client's link, each way: the bytes that bound the run.
    let links = report.runs.iter().any(|r| r.link_bytes_per_op.is_some());
    let link_header = if links {
        (" client link in/op | client link out/op |", "---|---|")
    } else {
        ("", "")
    };
    let ycsb: Vec<&RunStats> = report.runs.iter().filter(|r| is_ycsb(r)).collect();
    if !ycsb.is_empty() {
        let _ = writeln!(out, "## YCSB CoreWorkload\n");
        let _ = writeln!(
            out,
            "| workload | system | clients | ops/s | p50 | p90 | p99 | p99.9 | max | server CPU µs/op | client CPU µs/op | sent/op | server RSS | failed |{}",
            link_header.0
        );
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|{}",
            link_header.1
        );
        let mut sorted = ycsb.clone();
        sorted.sort_by(|a, b| {
            (&a.workload, a.concurrency, &a.system).cmp(&(&b.workload, b.concurrency, &b.system))
        });
        for r in &sorted {
            let _ = writeln!(out, "{}", row(r, &r.workload.replace("ycsb-", ""), links));
        }
        let _ = writeln!(out);
    }
    let sizes: Vec<&RunStats> = report.runs.iter().filter(|r| !is_ycsb(r)).collect();
    if !sizes.is_empty() {
        let _ = writeln!(out, "## Object sizes\n");
        let _ = writeln!(
            out,
            "| op, size | system | clients | ops/s | p50 | p90 | p99 | p99.9 | max | server CPU µs/op | client CPU µs/op | sent/op | server RSS | failed |{}",
            link_header.0
        );
        let _ = writeln!(
            out,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|{}",
            link_header.1
        );
        let mut sorted = sizes.clone();
        sorted.sort_by(|a, b| {
            (a.object_bytes, a.workload != "put", &a.system).cmp(&(
                b.object_bytes,
                b.workload != "put",
                &b.system,
            ))
        });
        for r in &sorted {
            let label = format!(
                "{} {} ({}/s)",
                r.workload,
                human_bytes(r.object_bytes as f64),
                human_bytes(r.throughput_ops * r.object_bytes as f64)
            );
            let _ = writeln!(out, "{}", row(r, &label, links));
        }
        let _ = writeln!(out);
    }
    let ratios = ratios(report);
    if !ratios.is_empty() {
        let _ = writeln!(out, "## Throughput ratios (same run)\n");
        for line in ratios {
            let _ = writeln!(out, "- {line}");
        }
        let _ = writeln!(out);
    }
    if let Some(limits) = &report.limits {
        let _ = writeln!(out, "## What the machine allows a 1 MiB get (same run)\n");
        let _ = writeln!(
            out,
            "Reed-Solomon decode (n = 4, k = 2, one data fragment missing) {:.0} MiB/s; BLAKE3 \
             over 512 KiB fragments {:.0} MiB/s; a plain TCP copy over 127.0.0.1 {:.0} MiB/s. A \
             PoWerStore get of 1 MiB at f = 1 copies 1 MiB of fragments (f + 1 of them) and hashes \
             2 MiB (servers re-hash what they serve, the client what it receives): one core could \
             do at most \
             {:.0} such gets per second, {:.0} if each had to decode.\n",
            limits.decode_mib_s,
            limits.hash_mib_s,
            limits.loopback_mib_s,
            limits.get_1mib_ceiling_ops,
            limits.get_1mib_ceiling_decoding_ops
        );
        for r in report.runs.iter().filter(|r| {
            r.workload == "get" && r.object_bytes == 1 << 20 && r.system == "powerstore"
        }) {
            let _ = writeln!(
                out,
                "- powerstore 1 MiB get with {} clients: {:.0} ops/s, {:.2}x that one-core ceiling\n",
                r.concurrency,
                r.throughput_ops,
                r.throughput_ops / limits.get_1mib_ceiling_ops.max(1e-9)
            );
        }
    }
    if !report.unsupported.is_empty() {
        let _ = writeln!(out, "## Not run\n");
        for u in &report.unsupported {
            let _ = writeln!(
                out,
                "- {} on {}: unsupported: {}",
                u.workload, u.system, u.reason
            );
        }
        let _ = writeln!(out);
    }
    let failing: Vec<&RunStats> = report.runs.iter().filter(|r| r.failures > 0).collect();
    if !failing.is_empty() {
        let _ = writeln!(out, "## Failures\n");
        for r in failing {
            let _ = writeln!(
                out,
                "- {} {} {} x{}: {} failed: {}",
                r.system,
                r.workload,
                human_bytes(r.object_bytes as f64),
                r.concurrency,
                r.failures,
                r.errors.join("; ")
            );
        }
        let _ = writeln!(out);
    }
    for note in &report.notes {
        let _ = writeln!(out, "{note}\n");
    }
    for plot in plots {
        let _ = writeln!(out, "![{plot}]({plot})\n");
    }
    out
}

fn row(r: &RunStats, label: &str, links: bool) -> String {
    let l = &r.overall;
    let link = match (links, r.link_bytes_per_op) {
        (false, _) => String::new(),
        (true, None) => " ? | ? |".into(),
        (true, Some(bytes)) => format!(
            " {} | {} |",
            human_bytes(bytes.received),
            human_bytes(bytes.sent)
        ),
    };
    format!(
        "| {label} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {} | {} | {} |",
        r.system,
        r.concurrency,
        r.throughput_ops,
        l.p50_ms,
        l.p90_ms,
        l.p99_ms,
        l.p999_ms,
        l.max_ms,
        r.server_cpu_us_per_op,
        r.client_cpu_us_per_op,
        r.bytes_sent_per_op.map_or("?".into(), human_bytes),
        human_bytes(r.server_rss_bytes as f64),
        r.failures,
    ) + &link
}

/// For each workload and object size, the best throughput of every system over the first
/// system's, so the comparison does not depend on which client count suits whom.
pub fn ratios(report: &Report) -> Vec<String> {
    let Some(first) = report.systems.first() else {
        return Vec::new();
    };
    let mut best: BTreeMap<(String, usize), BTreeMap<String, f64>> = BTreeMap::new();
    for r in &report.runs {
        let entry = best
            .entry((r.workload.clone(), r.object_bytes))
            .or_default()
            .entry(r.system.clone())
            .or_insert(0.0);
        *entry = entry.max(r.throughput_ops);
    }
    let mut lines = Vec::new();
    for ((workload, size), systems) in best {
        let Some(&base) = systems.get(first) else {
            continue;
        };
        let others: Vec<String> = systems
            .iter()
            .filter(|(s, _)| *s != first)
            .map(|(s, &t)| {
                if t > 0.0 {
                    format!("{:.2}x {s}", base / t)
                } else {
                    format!("{s} completed none")
                }
            })
            .collect();
        if others.is_empty() {
            continue;
        }
        let what = if workload.starts_with("ycsb-") {
            workload.clone()
        } else {
            format!("{workload} {}", human_bytes(size as f64))
        };
        lines.push(format!(
            "{what}: {first} best {:.0} ops/s = {}",
            base,
            others.join(", ")
        ));
    }
    lines
}

/// Registers a system TrueType font for plot text; false when none is found.
fn load_font() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        for path in [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
        ] {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// One line per system through (throughput, p99 latency) points, one point per client count.
pub fn plot_throughput_latency(
    path: &Path,
    title: &str,
    runs: &[&RunStats],
    systems: &[String],
) -> Result<()> {
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = runs.iter().map(|r| r.throughput_ops).fold(1.0f64, f64::max) * 1.1;
    let y_max = runs.iter().map(|r| r.overall.p99_ms).fold(0.1f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("throughput (ops/s)")
        .y_desc("p99 latency (ms)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    for (i, system) in systems.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut points: Vec<(usize, f64, f64)> = runs
            .iter()
            .filter(|r| &r.system == system && r.ops > 0)
            .map(|r| (r.concurrency, r.throughput_ops, r.overall.p99_ms))
            .collect();
        if points.is_empty() {
            continue;
        }
        points.sort_by_key(|p| p.0);
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.1, p.2)),
                colour.stroke_width(2),
            ))?
            .label(system.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        chart.draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.1, p.2), 4, colour.filled())),
        )?;
        chart.draw_series(points.iter().map(|p| {
            Text::new(
                format!("x{}", p.0),
                (p.1, p.2),
                ("sans-serif", 13).into_font(),
            )
        }))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .label_font(("sans-serif", 16))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Data throughput (MiB/s) against object size, one line per system and operation.
pub fn plot_sizes(path: &Path, runs: &[&RunStats], systems: &[String]) -> Result<()> {
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mib = |r: &RunStats| r.throughput_ops * r.object_bytes as f64 / f64::from(1u32 << 20);
    // x is log2 of the size, so that ticks fall on powers of two.
    let log2 = |r: &RunStats| (r.object_bytes.max(1) as f64).log2();
    let x_min = runs.iter().map(|r| log2(r)).fold(f64::MAX, f64::min) - 0.5;
    let x_max = runs.iter().map(|r| log2(r)).fold(0.0, f64::max) + 0.5;
    let y_max = runs.iter().map(|r| mib(r)).fold(0.1, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Put and get: data throughput by object size",
            ("sans-serif", 24),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("object size")
        .y_desc("throughput (MiB/s)")
        .x_labels(8)
        .x_label_formatter(&|x| human_bytes(2f64.powf(x.round())))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 15))
        .draw()?;
    // One colour per system; gets are drawn thick, puts thin.
    for (i, system) in systems.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for op in ["put", "get"] {
            let mut points: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| &r.system == system && r.workload == op && r.ops > 0)
                .map(|r| (log2(r), mib(r)))
                .collect();
            if points.is_empty() {
                continue;
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let width = if op == "put" { 1 } else { 4 };
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(width)))?
                .label(format!("{system} {op}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(width))
                });
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .label_font(("sans-serif", 16))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes `report.json`, `report.md` and the plots into `dir`; returns the Markdown path.
pub fn write(dir: &Path, report: &Report) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(report)?)?;
    let mut plots = Vec::new();
    if load_font() {
        let workloads: BTreeSet<String> = report
            .runs
            .iter()
            .filter(|r| is_ycsb(r))
            .map(|r| r.workload.clone())
            .collect();
        for workload in workloads {
            let runs: Vec<&RunStats> = report
                .runs
                .iter()
                .filter(|r| r.workload == workload)
                .collect();
            let file = format!("{workload}.png");
            let title = format!(
                "YCSB {}: p99 latency against throughput",
                workload.trim_start_matches("ycsb-")
            );
            plot_throughput_latency(&dir.join(&file), &title, &runs, &report.systems)?;
            plots.push(file);
        }
        let sizes: Vec<&RunStats> = report.runs.iter().filter(|r| !is_ycsb(r)).collect();
        if !sizes.is_empty() {
            plot_sizes(&dir.join("sizes.png"), &sizes, &report.systems)?;
            plots.push("sizes.png".into());
        }
    }
    let mut markdown = markdown(report, &plots);
    if plots.is_empty() {
        markdown.push_str(
            "(No plots: no TrueType font found for their text; install fonts-dejavu-core.)\n",
        );
    }
    let path = dir.join("report.md");
    std::fs::write(&path, markdown)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::LatencyStats;

    fn run(system: &str, workload: &str, clients: usize, throughput: f64) -> RunStats {
        let latency = LatencyStats {
            ops: 100,
            failures: 0,
            mean_ms: 1.0,
            p50_ms: 1.0,
            p90_ms: 2.0,
            p99_ms: 3.0 + clients as f64,
            p999_ms: 4.0,
            max_ms: 5.0,
        };
        RunStats {
            system: system.into(),
            workload: workload.into(),
            object_bytes: 1000,
            concurrency: clients,
            target_rate: None,
            elapsed_s: 1.0,
            ops: 100,
            failures: 0,
            throughput_ops: throughput,
            overall: latency.clone(),
            by_op: [("read".to_string(), latency)].into_iter().collect(),
            server_cpu_us_per_op: 10.0,
            client_cpu_us_per_op: 5.0,
            bytes_sent_per_op: Some(2048.0),
            link_bytes_per_op: None,
            server_rss_bytes: 50 << 20,
            server_rss_max_bytes: 20 << 20,
            errors: Vec::new(),
        }
    }

    fn report() -> Report {
        Report {
            command: "bulwark bench compare --quick".into(),
            unix_time: 0,
            machine: Machine::this(),
            systems: vec!["powerstore".into(), "etcd".into()],
            runs: vec![
                run("powerstore", "ycsb-A", 1, 100.0),
                run("powerstore", "ycsb-A", 8, 400.0),
                run("etcd", "ycsb-A", 1, 200.0),
                run("etcd", "ycsb-A", 8, 800.0),
                RunStats {
                    object_bytes: 1 << 20,
                    ..run("powerstore", "put", 8, 100.0)
                },
                run("powerstore", "put", 8, 1000.0),
                run("etcd", "get", 8, 3000.0),
            ],
            unsupported: vec![Unsupported {
                system: "powerstore".into(),
                workload: "ycsb-E".into(),
                reason: "a register store cannot scan".into(),
            }],
            notes: vec![],
            limits: Some(crate::limits::Limits {
                decode_mib_s: 4000.0,
                hash_mib_s: 3000.0,
                loopback_mib_s: 1500.0,
                get_1mib_ceiling_ops: 500.0,
                get_1mib_ceiling_decoding_ops: 450.0,
            }),
        }
    }

    #[test]
    fn markdown_has_one_row_per_run_ratios_and_what_was_not_run() {
        let md = markdown(&report(), &["ycsb-A.png".into()]);
        assert_eq!(md.matches("| A | ").count(), 4, "{md}");
        assert!(
            md.contains(
                "one core could do at most 500 such gets per second, 450 if each had to decode"
            ),
            "{md}"
        );
        assert!(md.contains("| A | etcd | 8 | 800 | 1.00 | 2.00 | 11.00 | 4.00 | 5.00 | 10 | 5 | 2.0 KiB | 50.0 MiB | 0 |"), "{md}");
        assert!(
            md.contains("ycsb-A: powerstore best 400 ops/s = 0.50x etcd"),
            "{md}"
        );
        assert!(md.contains("ycsb-E on powerstore: unsupported: a register store cannot scan"));
        assert!(md.contains("![ycsb-A.png](ycsb-A.png)"));
        assert!(
            !md.contains("coordinated omission"),
            "no target rate, no correction"
        );
        let mut paced = report();
        paced.runs[0].target_rate = Some(500.0);
        assert!(markdown(&paced, &[]).contains("aimed at 500 operations per second"));
        assert!(
            md.contains("| put 1.0 MiB (100.0 MiB/s) | powerstore | 8 | 100 |"),
            "{md}"
        );
        assert!(
            !md.contains("put 1000 B: powerstore"),
            "no ratio where only one system ran: {md}"
        );
        let put = md.find("| put 1000 B").unwrap();
        assert!(put < md.find("| get 1000 B").unwrap(), "puts come first");
    }

    #[test]
    fn write_puts_json_markdown_and_a_png_in_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), &report()).unwrap();
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap())
                .unwrap();
        assert_eq!(json["runs"].as_array().unwrap().len(), 7);
        assert_eq!(json["runs"][0]["overall"]["p99_ms"], 4.0);
        assert!(std::fs::read_to_string(path).unwrap().contains("## YCSB"));
        if load_font() {
            for plot in ["ycsb-A.png", "sizes.png"] {
                let png = std::fs::read(dir.path().join(plot)).unwrap();
                assert_eq!(&png[1..4], b"PNG");
            }
        }
    }

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(16.0 * 1048576.0), "16.0 MiB");
    }
}

//! What a process has cost, read from `/proc`: CPU time (`stat` utime + stime) and resident
//! memory (`status` VmRSS). Linux only; a missing process reads as `None`.

/// `sysconf(_SC_CLK_TCK)`: 100 on every Linux configuration the kernel exposes to user space.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    parse_stat_cpu(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds this process has used.
pub fn own_cpu_seconds() -> Option<f64> {
    cpu_seconds(std::process::id())
}

/// utime + stime from a `/proc/<pid>/stat` line. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat_cpu(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_SECOND)
}

/// Resident memory in bytes, from `/proc/<pid>/status`.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    parse_vmrss(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

pub fn parse_vmrss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The sum over `pids` (processes that have gone count as nothing).
pub fn total_cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&p| cpu_seconds(p)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_name() {
        let line = "1234 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(parse_stat_cpu(line), Some(3.0));
        assert_eq!(parse_vmrss("Name:\tx\nVmRSS:\t   2048 kB\n"), Some(2 << 20));
        assert!(own_cpu_seconds().is_some());
        assert!(resident_bytes(std::process::id()).unwrap() > 0);
    }
}

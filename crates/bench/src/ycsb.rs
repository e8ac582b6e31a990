//! YCSB's CoreWorkload, reimplemented from its definition (`site.ycsb.workloads.CoreWorkload` and
//! the generators in `site.ycsb.generator`), with the parameters of the workload files A-F.
//!
//! Kept as YCSB defines it, including its quirks: keys are `"user"` followed by the decimal FNV-64
//! hash of the insertion number (`Math.abs` of a signed 64-bit value), the zipfian key chooser is
//! a scrambled zipfian over 10^10 items whose zeta is the precomputed constant YCSB ships, and
//! the skewed-latest generator keeps YCSB's `eta` computed from the item count it was built with.

use rand::Rng;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// YCSB's `Utils.FNV_OFFSET_BASIS_64`.
pub const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
/// YCSB's `Utils.FNV_PRIME_64`.
pub const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// FNV-1a, 64 bits, over bytes.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS_64, |hash, &octet| {
        (hash ^ u64::from(octet)).wrapping_mul(FNV_PRIME_64)
    })
}

/// YCSB's `Utils.fnvhash64(long)`: FNV-1a over the value's 8 bytes, least significant first, then
/// `Math.abs` (which leaves `Long.MIN_VALUE` negative, as here).
pub fn fnvhash64(value: i64) -> i64 {
    (fnv1a_64(&value.to_le_bytes()) as i64).wrapping_abs()
}

/// YCSB's `CoreWorkload.buildKeyName` with `insertorder=hashed` and `zeropadding=1`.
pub fn key_name(keynum: i64) -> String {
    format!("user{}", fnvhash64(keynum))
}

/// `ZipfianGenerator.ZIPFIAN_CONSTANT`.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// `ScrambledZipfianGenerator.ITEM_COUNT`.
pub const SCRAMBLED_ITEM_COUNT: i64 = 10_000_000_000;
/// `ScrambledZipfianGenerator.ZETAN`: zeta(10^10, 0.99), precomputed by YCSB.
pub const SCRAMBLED_ZETAN: f64 = 26.469_028_201_783_02;

/// `ZipfianGenerator.zetastatic(st, n, theta, initialsum)`: the sum of `1 / (i+1)^theta` for
/// `i` in `st..n`, added to `initial`.
pub fn zeta(start: i64, n: i64, theta: f64, initial: f64) -> f64 {
    (start..n).fold(initial, |sum, i| sum + 1.0 / ((i + 1) as f64).powf(theta))
}

/// YCSB's `ZipfianGenerator`: item `base + k` has probability proportional to `1 / (k+1)^theta`.
#[derive(Clone, Debug)]
pub struct Zipfian {
    base: i64,
    items: i64,
    theta: f64,
    zeta2theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    count_for_zeta: i64,
}

impl Zipfian {
    /// `new ZipfianGenerator(min, max, constant, zetan)`.
    pub fn with_zetan(min: i64, max: i64, theta: f64, zetan: f64) -> Zipfian {
        let items = max - min + 1;
        let zeta2theta = zeta(0, 2, theta, 0.0);
        Zipfian {
            base: min,
            items,
            theta,
            zeta2theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan),
            count_for_zeta: items,
        }
    }

    /// `new ZipfianGenerator(min, max)`: zeta computed over the range (O(items)).
    pub fn new(min: i64, max: i64) -> Zipfian {
        let items = max - min + 1;
        Zipfian::with_zetan(
            min,
            max,
            ZIPFIAN_CONSTANT,
            zeta(0, items, ZIPFIAN_CONSTANT, 0.0),
        )
    }

    /// `nextLong(itemcount)` for the item count the generator was built with.
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> i64 {
        self.next_with(rng, self.items)
    }

    /// `nextLong(itemcount)`; the caller has brought `zetan` up to `itemcount` (see
    /// [`Zipfian::grow`]).
    fn next_with<R: Rng + ?Sized>(&self, rng: &mut R, itemcount: i64) -> i64 {
        let u: f64 = rng.random();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }

    /// The growing branch of `nextLong(itemcount)`: zeta is extended incrementally, and `eta` is
    /// recomputed from the original item count, exactly as YCSB does.
    fn grow(&mut self, itemcount: i64) {
        if itemcount > self.count_for_zeta {
            self.zetan = zeta(self.count_for_zeta, itemcount, self.theta, self.zetan);
            self.count_for_zeta = itemcount;
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta))
                / (1.0 - self.zeta2theta / self.zetan);
        }
    }
}

/// YCSB's `ScrambledZipfianGenerator(min, max)`: a zipfian over 10^10 items, hashed with
/// `fnvhash64` into `min..=max`, so popular items are spread over the key space.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    min: i64,
    itemcount: i64,
    zipfian: Zipfian,
}

impl ScrambledZipfian {
    pub fn new(min: i64, max: i64) -> ScrambledZipfian {
        ScrambledZipfian {
            min,
            itemcount: max - min + 1,
            zipfian: Zipfian::with_zetan(
                0,
                SCRAMBLED_ITEM_COUNT,
                ZIPFIAN_CONSTANT,
                SCRAMBLED_ZETAN,
            ),
        }
    }

    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R) -> i64 {
        self.min + fnvhash64(self.zipfian.next(rng)) % self.itemcount
    }
}

/// YCSB's `AcknowledgedCounterGenerator`: hands out insertion numbers; `last` is the highest
/// number below which every insert has been acknowledged.
#[derive(Debug)]
pub struct AcknowledgedCounter {
    next: AtomicU64,
    state: Mutex<(i64, BTreeSet<i64>)>,
}

impl AcknowledgedCounter {
    pub fn new(start: i64) -> AcknowledgedCounter {
        AcknowledgedCounter {
            next: AtomicU64::new(start as u64),
            state: Mutex::new((start - 1, BTreeSet::new())),
        }
    }
    pub fn next_value(&self) -> i64 {
        self.next.fetch_add(1, Ordering::Relaxed) as i64
    }
    pub fn last(&self) -> i64 {
        self.lock().0
    }
    pub fn acknowledge(&self, value: i64) {
        let mut state = self.lock();
        state.1.insert(value);
        loop {
            let want = state.0 + 1;
            if !state.1.remove(&want) {
                break;
            }
            state.0 = want;
        }
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, (i64, BTreeSet<i64>)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// YCSB's `SkewedLatestGenerator`: zipfian over the distance from the latest acknowledged insert.
#[derive(Debug)]
pub struct SkewedLatest {
    zipfian: Mutex<Zipfian>,
}

impl SkewedLatest {
    pub fn new(basis: &AcknowledgedCounter) -> SkewedLatest {
        SkewedLatest {
            zipfian: Mutex::new(Zipfian::new(0, basis.last() - 1)),
        }
    }
    pub fn next<R: Rng + ?Sized>(&self, rng: &mut R, basis: &AcknowledgedCounter) -> i64 {
        let max = basis.last();
        let mut zipfian = self.zipfian.lock().unwrap_or_else(|e| e.into_inner());
        zipfian.grow(max);
        max - zipfian.next_with(rng, max)
    }
}

/// How a workload picks the keys of reads, updates and scans (`requestdistribution`).
#[derive(Debug)]
pub enum KeyChooser {
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
    Uniform { min: i64, max: i64 },
}

/// One of YCSB's operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl OpKind {
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Update => "update",
            OpKind::Insert => "insert",
            OpKind::Scan => "scan",
            OpKind::ReadModifyWrite => "rmw",
        }
    }
}

/// The parameters of a YCSB workload file.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct WorkloadSpec {
    pub name: char,
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
    /// `requestdistribution`: "zipfian", "latest" or "uniform".
    pub distribution: &'static str,
    pub max_scan_length: i64,
    pub field_count: usize,
    pub field_length: usize,
}

impl WorkloadSpec {
    /// Workloads A-F as YCSB's `workloads/workload[a-f]` define them.
    pub fn standard(name: char) -> Option<WorkloadSpec> {
        let base = WorkloadSpec {
            name: name.to_ascii_uppercase(),
            read: 0.0,
            update: 0.0,
            insert: 0.0,
            scan: 0.0,
            read_modify_write: 0.0,
            distribution: "zipfian",
            max_scan_length: 1000,
            field_count: 10,
            field_length: 100,
        };
        Some(match name.to_ascii_uppercase() {
            'A' => WorkloadSpec {
                read: 0.5,
                update: 0.5,
                ..base
            },
            'B' => WorkloadSpec {
                read: 0.95,
                update: 0.05,
                ..base
            },
            'C' => WorkloadSpec { read: 1.0, ..base },
            'D' => WorkloadSpec {
                read: 0.95,
                insert: 0.05,
                distribution: "latest",
                ..base
            },
            'E' => WorkloadSpec {
                scan: 0.95,
                insert: 0.05,
                max_scan_length: 100,
                ..base
            },
            'F' => WorkloadSpec {
                read: 0.5,
                read_modify_write: 0.5,
                ..base
            },
            _ => return None,
        })
    }

    pub fn needs_scan(&self) -> bool {
        self.scan > 0.0
    }

    /// Bytes of one record as the key-value targets store it: every field, one after another.
    pub fn record_bytes(&self) -> usize {
        self.field_count * self.field_length
    }
}

/// One operation a workload asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Read { key: String },
    Update { key: String },
    Insert { key: String, keynum: i64 },
    Scan { start: String, count: usize },
    ReadModifyWrite { key: String },
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Read { .. } => OpKind::Read,
            Op::Update { .. } => OpKind::Update,
            Op::Insert { .. } => OpKind::Insert,
            Op::Scan { .. } => OpKind::Scan,
            Op::ReadModifyWrite { .. } => OpKind::ReadModifyWrite,
        }
    }
}

/// A running CoreWorkload: shared by all client tasks, each with its own random generator.
#[derive(Debug)]
pub struct CoreWorkload {
    pub spec: WorkloadSpec,
    pub record_count: i64,
    chooser: KeyChooser,
    inserts: AcknowledgedCounter,
}

impl CoreWorkload {
    /// As YCSB's `CoreWorkload.init` with `recordcount` records loaded and about
    /// `operation_count` operations to come (which sizes the zipfian key space for inserts).
    pub fn new(spec: WorkloadSpec, record_count: i64, operation_count: i64) -> CoreWorkload {
        let inserts = AcknowledgedCounter::new(record_count);
        let chooser = match spec.distribution {
            "latest" => KeyChooser::Latest(SkewedLatest::new(&inserts)),
            "uniform" => KeyChooser::Uniform {
                min: 0,
                max: record_count - 1,
            },
            _ => {
                let expected_new_keys = (operation_count as f64 * spec.insert * 2.0) as i64;
                KeyChooser::Zipfian(ScrambledZipfian::new(0, record_count + expected_new_keys))
            }
        };
        CoreWorkload {
            spec,
            record_count,
            chooser,
            inserts,
        }
    }

    /// `CoreWorkload.nextKeynum`: a key that has been inserted.
    pub fn next_keynum<R: Rng + ?Sized>(&self, rng: &mut R) -> i64 {
        // Bounded: the chooser's range only exceeds the inserted keys by the expected inserts.
        for _ in 0..10_000 {
            let keynum = match &self.chooser {
                KeyChooser::Zipfian(z) => z.next(rng),
                KeyChooser::Latest(l) => l.next(rng, &self.inserts),
                KeyChooser::Uniform { min, max } => rng.random_range(*min..=*max),
            };
            if keynum <= self.inserts.last() {
                return keynum;
            }
        }
        rng.random_range(0..self.record_count)
    }

    /// The next operation (YCSB's `DiscreteGenerator` over the proportions, in YCSB's order).
    pub fn next_op<R: Rng + ?Sized>(&self, rng: &mut R) -> Op {
        let s = &self.spec;
        let total = s.read + s.update + s.insert + s.scan + s.read_modify_write;
        let mut u = rng.random::<f64>() * total;
        for (weight, kind) in [
            (s.read, OpKind::Read),
            (s.update, OpKind::Update),
            (s.insert, OpKind::Insert),
            (s.scan, OpKind::Scan),
            (s.read_modify_write, OpKind::ReadModifyWrite),
        ] {
            if weight <= 0.0 {
                continue;
            }
            if u < weight {
                return self.make(kind, rng);
            }
            u -= weight;
        }
        self.make(OpKind::Read, rng)
    }

    fn make<R: Rng + ?Sized>(&self, kind: OpKind, rng: &mut R) -> Op {
        match kind {
            OpKind::Read => Op::Read {
                key: key_name(self.next_keynum(rng)),
            },
            OpKind::Update => Op::Update {
                key: key_name(self.next_keynum(rng)),
            },
            OpKind::Insert => {
                let keynum = self.inserts.next_value();
                Op::Insert {
                    key: key_name(keynum),
                    keynum,
                }
            }
            OpKind::Scan => Op::Scan {
                start: key_name(self.next_keynum(rng)),
                count: rng.random_range(1..=self.spec.max_scan_length) as usize,
            },
            OpKind::ReadModifyWrite => Op::ReadModifyWrite {
                key: key_name(self.next_keynum(rng)),
            },
        }
    }

    /// Marks an insert done, so reads may choose it (`transactioninsertkeysequence.acknowledge`).
    pub fn acknowledge_insert(&self, keynum: i64) {
        self.inserts.acknowledge(keynum);
    }

    /// A record: `field_count` fields of `field_length` random printable bytes.
    pub fn record<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<u8> {
        (0..self.spec.record_bytes())
            .map(|_| rng.random_range(b' '..=b'~'))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use std::collections::HashMap;

    #[test]
    fn fnv1a_64_matches_the_reference_vectors() {
        // From the FNV reference test suite (Landon Curt Noll).
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn ycsb_hashes_the_little_endian_bytes_of_a_long() {
        assert_eq!(
            fnvhash64(0),
            (fnv1a_64(&[0; 8]) as i64).wrapping_abs(),
            "fnvhash64 is FNV-1a over eight bytes"
        );
        assert_eq!(
            fnvhash64(0x0102),
            (fnv1a_64(&[2, 1, 0, 0, 0, 0, 0, 0]) as i64).wrapping_abs()
        );
        for v in [0, 1, 2, 999, 1_000_000] {
            assert!(fnvhash64(v) >= 0);
        }
        // The first key YCSB's load phase inserts with insertorder=hashed.
        assert_eq!(key_name(0), "user6284781860667377211");
    }

    #[test]
    fn the_shipped_zetan_is_zeta_of_ten_billion_items() {
        // Euler-Maclaurin: sum_{i=1}^n i^-s = zeta(s) + n^(1-s)/(1-s) + n^-s/2 + O(n^-s-1), and
        // Riemann zeta(0.99) = -99.4228... (1/(s-1) + Euler's gamma + O(s-1)).
        let s = ZIPFIAN_CONSTANT;
        let n = SCRAMBLED_ITEM_COUNT as f64 + 1.0;
        let riemann = 1.0 / (s - 1.0) + 0.577_215_664_901_532_9 + 0.072_815_845 * (s - 1.0);
        let approx = riemann + n.powf(1.0 - s) / (1.0 - s) + n.powf(-s) / 2.0;
        assert!(
            (approx - SCRAMBLED_ZETAN).abs() < 1e-4,
            "{approx} vs {SCRAMBLED_ZETAN}"
        );
        // And the direct sum agrees with the closed form on a range we can afford.
        let direct = zeta(0, 100_000, s, 0.0);
        let closed = riemann + 100_000f64.powf(1.0 - s) / (1.0 - s) + 100_000f64.powf(-s) / 2.0;
        assert!((direct - closed).abs() < 1e-4, "{direct} vs {closed}");
    }

    #[test]
    fn zipfian_gives_the_most_popular_item_its_share() {
        let items = 1000;
        let zipfian = Zipfian::new(0, items - 1);
        let mut rng = StdRng::seed_from_u64(1);
        let draws = 200_000;
        let mut counts = vec![0u32; items as usize];
        for _ in 0..draws {
            let v = zipfian.next(&mut rng);
            assert!((0..items).contains(&v), "{v} out of range");
            counts[v as usize] += 1;
        }
        let zetan = zeta(0, items, ZIPFIAN_CONSTANT, 0.0);
        // Gray et al.'s method, which YCSB uses, is exact for the two most popular items and
        // approximate beyond them.
        for (rank, &count) in counts.iter().enumerate().take(2) {
            let expected = 1.0 / ((rank + 1) as f64).powf(ZIPFIAN_CONSTANT) / zetan;
            let seen = f64::from(count) / f64::from(draws);
            assert!(
                (seen - expected).abs() < 0.1 * expected,
                "item {rank}: {seen} vs {expected}"
            );
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[9] && counts[9] > counts[500]);
    }

    #[test]
    fn scrambled_zipfian_spreads_the_popular_items_over_the_key_space() {
        let chooser = ScrambledZipfian::new(0, 9_999);
        let mut rng = StdRng::seed_from_u64(7);
        let mut counts: HashMap<i64, u32> = HashMap::new();
        let draws = 100_000;
        for _ in 0..draws {
            let v = chooser.next(&mut rng);
            assert!((0..10_000).contains(&v));
            *counts.entry(v).or_default() += 1;
        }
        let mut by_count: Vec<(i64, u32)> = counts.into_iter().collect();
        by_count.sort_by_key(|b| std::cmp::Reverse(b.1));
        // The most popular item is item 0 of the 10^10-item zipfian, hashed into the range.
        assert_eq!(by_count[0].0, fnvhash64(0) % 10_000);
        let share = f64::from(by_count[0].1) / f64::from(draws);
        let expected = 1.0 / SCRAMBLED_ZETAN;
        assert!((share - expected).abs() < 0.1 * expected, "{share}");
        // Skewed (the top ten draw far more than 10/10000 of the load) but not clustered: the
        // ten most popular keys are spread over the range rather than being 0..10.
        let top: Vec<i64> = by_count.iter().take(10).map(|(k, _)| *k).collect();
        let top_share: u32 = by_count.iter().take(10).map(|(_, c)| c).sum();
        assert!(f64::from(top_share) / f64::from(draws) > 0.05);
        assert!(top.iter().filter(|k| **k >= 5_000).count() >= 2, "{top:?}");
        assert!(top.iter().filter(|k| **k < 5_000).count() >= 2, "{top:?}");
    }

    #[test]
    fn latest_prefers_the_newest_inserts() {
        let workload = CoreWorkload::new(WorkloadSpec::standard('D').unwrap(), 1000, 1000);
        let mut rng = StdRng::seed_from_u64(3);
        let mut newest = 0;
        for _ in 0..10_000 {
            let k = workload.next_keynum(&mut rng);
            assert!((0..1000).contains(&k));
            if k == 999 {
                newest += 1;
            }
        }
        assert!(newest > 1000, "the latest key drew {newest} of 10000");
        let Op::Insert { keynum, .. } = workload.make(OpKind::Insert, &mut rng) else {
            unreachable!()
        };
        assert_eq!(keynum, 1000);
        workload.acknowledge_insert(keynum);
        let mut seen_new = false;
        for _ in 0..1000 {
            seen_new |= workload.next_keynum(&mut rng) == 1000;
        }
        assert!(seen_new, "an acknowledged insert becomes the latest key");
    }

    #[test]
    fn acknowledged_counter_waits_for_gaps() {
        let c = AcknowledgedCounter::new(10);
        assert_eq!(c.last(), 9);
        let (a, b) = (c.next_value(), c.next_value());
        c.acknowledge(b);
        assert_eq!(c.last(), 9, "11 is done but 10 is not");
        c.acknowledge(a);
        assert_eq!(c.last(), 11);
    }

    #[test]
    fn workload_mixes_follow_the_workload_files() {
        let mut rng = StdRng::seed_from_u64(11);
        for (name, kind, share) in [
            ('A', OpKind::Read, 0.5),
            ('B', OpKind::Update, 0.05),
            ('C', OpKind::Read, 1.0),
            ('D', OpKind::Insert, 0.05),
            ('E', OpKind::Scan, 0.95),
            ('F', OpKind::ReadModifyWrite, 0.5),
        ] {
            let w = CoreWorkload::new(WorkloadSpec::standard(name).unwrap(), 1000, 20_000);
            let n = 20_000;
            let hits = (0..n)
                .filter(|_| w.next_op(&mut rng).kind() == kind)
                .count();
            let seen = hits as f64 / n as f64;
            assert!((seen - share).abs() < 0.02, "{name}: {seen} vs {share}");
        }
        let e = WorkloadSpec::standard('E').unwrap();
        assert_eq!(e.max_scan_length, 100);
        assert!(e.needs_scan());
        let w = CoreWorkload::new(e, 1000, 1000);
        for _ in 0..1000 {
            if let Op::Scan { count, .. } = w.next_op(&mut rng) {
                assert!((1..=100).contains(&count));
            }
        }
        assert_eq!(w.record(&mut rng).len(), 1000);
        assert!(WorkloadSpec::standard('G').is_none());
    }
}

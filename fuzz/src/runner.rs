//! A stable-toolchain driver for the harnesses: replays files, then mutates seeds for a
//! bounded time. No coverage feedback (that needs cargo-fuzz and libFuzzer); the seeds are
//! valid inputs built by each harness, so mutations start deep in the protocol.
//!
//! ```text
//! target [--secs N] [--seed S] [--save DIR] [FILE|DIR]...
//! target --write-seeds DIR
//! ```
//!
//! `--write-seeds` writes the harness's built-in seeds as files (a starting corpus for
//! `cargo fuzz run`) and exits.
//!
//! With paths and no `--secs`, only the given inputs are replayed (regression mode). With
//! no paths, `fuzz/corpus/<target>/` is replayed if present, then mutation runs for
//! `--secs` (default 10; env `FUZZ_SECS`). A panicking input is written to
//! `fuzz/artifacts/<target>/crash-<hash>` (or `--save DIR`), printed as hex, and the
//! process exits 1.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// SplitMix64: small, seedable, good enough for picking mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    31,
    32,
    63,
    64,
    72,
    127,
    128,
    255,
    256,
    1023,
    1024,
    4095,
    4096,
    8191,
    8192,
    0x7fff,
    0x8000,
    0xffef,
    0xfff0,
    0xfffe,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
];

/// Applies 1..=8 random byte-level mutations to `v`; `pool` supplies splice material.
pub fn mutate(rng: &mut Rng, v: &mut Vec<u8>, pool: &[Vec<u8>], max_len: usize) {
    for _ in 0..1 + rng.below(8) {
        let len = v.len();
        match rng.below(11) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = rng.next_u64() as u8;
            }
            2 if len > 0 => {
                // An interesting value, 1/2/4/8 bytes, little or big endian.
                let w = 1 << rng.below(4);
                let i = rng.below(len);
                let val = INTERESTING[rng.below(INTERESTING.len())];
                let b = if rng.below(2) == 0 {
                    val.to_le_bytes()
                } else {
                    val.to_be_bytes()
                };
                let b = if rng.below(2) == 0 {
                    &b[..w]
                } else {
                    &b[8 - w..]
                };
                for (k, &x) in b.iter().enumerate() {
                    if let Some(d) = v.get_mut(i + k) {
                        *d = x;
                    }
                }
            }
            3 if len > 0 => {
                // Add or subtract a small amount from one byte.
                let i = rng.below(len);
                let d = 1 + rng.below(16) as u8;
                v[i] = if rng.below(2) == 0 {
                    v[i].wrapping_add(d)
                } else {
                    v[i].wrapping_sub(d)
                };
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                v.drain(at..at + n);
            }
            5 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(64);
                let fill = rng.next_u64() as u8;
                let random = rng.below(2) == 0;
                let ins: Vec<u8> = (0..n)
                    .map(|_| if random { rng.next_u64() as u8 } else { fill })
                    .collect();
                v.splice(at..at, ins);
            }
            6 if len > 0 => {
                // Duplicate a chunk in place (repeats a PDU, a YAML line...).
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(256));
                let chunk = v[at..at + n].to_vec();
                let to = rng.below(len + 1);
                v.splice(to..to, chunk);
            }
            7 if len > 0 => v.truncate(rng.below(len)),
            8 if !pool.is_empty() => {
                // Splice: our prefix, another input's suffix.
                let o = &pool[rng.below(pool.len())];
                let cut = rng.below(len + 1);
                let ocut = rng.below(o.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&o[ocut..]);
            }
            9 if !pool.is_empty() => {
                // Overwrite with a chunk of another input at the same offset.
                let o = &pool[rng.below(pool.len())];
                if !o.is_empty() && len > 0 {
                    let at = rng.below(len.min(o.len()));
                    let n = 1 + rng.below((o.len() - at).min(len - at).min(128));
                    v[at..at + n].copy_from_slice(&o[at..at + n]);
                }
            }
            10 if len > 1 => {
                // Swap two bytes.
                let (a, b) = (rng.below(len), rng.below(len));
                v.swap(a, b);
            }
            _ => {}
        }
    }
    v.truncate(max_len);
}

struct Args {
    secs: Option<u64>,
    seed: u64,
    save: Option<PathBuf>,
    write_seeds: Option<PathBuf>,
    paths: Vec<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        secs: std::env::var("FUZZ_SECS").ok().and_then(|s| s.parse().ok()),
        seed: std::env::var("FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            }),
        save: None,
        write_seeds: None,
        paths: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--secs" => a.secs = Some(val("--secs").parse().expect("--secs N")),
            "--seed" => a.seed = val("--seed").parse().expect("--seed S"),
            "--save" => a.save = Some(PathBuf::from(val("--save"))),
            "--write-seeds" => a.write_seeds = Some(PathBuf::from(val("--write-seeds"))),
            "-h" | "--help" => {
                eprintln!(
                    "usage: [--secs N] [--seed S] [--save DIR] [--write-seeds DIR] [FILE|DIR]..."
                );
                std::process::exit(0);
            }
            // libFuzzer-style flags are accepted and ignored, so scripts can share a line.
            s if s.starts_with('-') => {}
            _ => a.paths.push(PathBuf::from(arg)),
        }
    }
    a
}

fn read_inputs(p: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    if p.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            read_inputs(&e, out);
        }
    } else if let Ok(b) = std::fs::read(p) {
        out.push((p.display().to_string(), b));
    }
}

fn hash(b: &[u8]) -> u64 {
    // FNV-1a, for artifact names.
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn report_crash(name: &str, save: &Option<PathBuf>, input: &[u8], what: &str) -> ! {
    let dir = save.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("artifacts")
            .join(name)
    });
    let file = dir.join(format!("crash-{:016x}", hash(input)));
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(&file, input);
    eprintln!(
        "{name}: FAILED on {what}: input ({} bytes) saved to {}",
        input.len(),
        file.display()
    );
    if input.len() <= 1024 {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!("{name}: hex: {hex}");
    }
    std::process::exit(1);
}

/// Runs `harness` per the command line (see the module docs). `seeds` are valid inputs
/// to mutate from; `max_len` bounds mutated inputs.
pub fn main(name: &str, harness: fn(&[u8]), seeds: Vec<Vec<u8>>, max_len: usize) {
    let args = parse_args();
    if let Some(dir) = &args.write_seeds {
        std::fs::create_dir_all(dir).expect("create the seed directory");
        for s in &seeds {
            std::fs::write(dir.join(format!("seed-{:016x}", hash(s))), s).expect("write a seed");
        }
        eprintln!("{name}: wrote {} seeds to {}", seeds.len(), dir.display());
        return;
    }
    let run = |input: &[u8]| panic::catch_unwind(AssertUnwindSafe(|| harness(input))).is_ok();

    let mut replay = Vec::new();
    if args.paths.is_empty() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(name);
        read_inputs(&corpus, &mut replay);
    }
    for p in &args.paths {
        read_inputs(p, &mut replay);
    }
    // Only the first panic message is interesting; the rest are the same input's.
    for (what, input) in &replay {
        if !run(input) {
            report_crash(name, &args.save, input, what);
        }
    }
    for (i, s) in seeds.iter().enumerate() {
        if !run(s) {
            report_crash(name, &args.save, s, &format!("built-in seed {i}"));
        }
    }
    let secs = match (args.secs, args.paths.is_empty()) {
        (Some(s), _) => s,
        (None, true) => 10,
        (None, false) => 0,
    };
    eprintln!(
        "{name}: replayed {} inputs and {} seeds; mutating for {secs} s, seed {}",
        replay.len(),
        seeds.len(),
        args.seed
    );
    let mut pool: Vec<Vec<u8>> = seeds;
    pool.extend(replay.into_iter().map(|(_, b)| b));
    if pool.is_empty() {
        pool.push(Vec::new());
    }
    let mut rng = Rng::new(args.seed);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut execs: u64 = 0;
    // Silence the default hook while mutating; a failure is re-run with it restored so
    // its message and location are printed.
    let hook = panic::take_hook();
    panic::set_hook(Box::new(|_| {}));
    while Instant::now() < deadline {
        for _ in 0..64 {
            let mut v = pool[rng.below(pool.len())].clone();
            mutate(&mut rng, &mut v, &pool, max_len);
            execs += 1;
            if !run(&v) {
                panic::set_hook(hook);
                let _ = run(&v);
                report_crash(name, &args.save, &v, "a mutated input");
            }
        }
    }
    let _ = panic::take_hook();
    panic::set_hook(hook);
    eprintln!("{name}: {execs} executions, no failure");
}

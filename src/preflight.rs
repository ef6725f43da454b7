//! `nvmf-target preflight`: what a host or BlueField lacks before the daemon can serve a
//! config. One line per check, `OK`, `FAIL` (with the fix) or `SKIP` (not needed by this
//! config, or cannot be checked without something that already failed); the exit status
//! is 1 when any check failed.
//!
//! Checks: whether each TCP listener's address is one of this host's, the DOCA library
//! and its version, DOCA's STA-capable devices (the configured STA and network devices), a
//! BlueField-3 (whose DPA STA runs on), RDMA devices and their link state, the IOMMU, the
//! VFIO binding of configured NVMe drives, whether the kernel can export a VFIO BAR as a
//! dma-buf (P2P doorbells), hugepages, the memlock limit. Which ones a config needs
//! follows from its engine, listeners and backends.
//!
//! The system is read under a root directory (`/` for real; a test tree in the tests), so
//! every check's text is tested here without the hardware.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::config::{BackendKind, Config, EngineKind, TransportKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Skip,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub outcome: Outcome,
    pub detail: String,
    /// What to do about a FAIL.
    pub fix: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.outcome {
            Outcome::Ok => "OK  ",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        };
        write!(f, "{tag} {}: {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "; fix: {fix}")?;
        }
        Ok(())
    }
}

fn ok(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        outcome: Outcome::Ok,
        detail: detail.into(),
        fix: None,
    }
}

fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        outcome: Outcome::Fail,
        detail: detail.into(),
        fix: Some(fix.into()),
    }
}

fn skip(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        outcome: Outcome::Skip,
        detail: detail.into(),
        fix: None,
    }
}

/// What the checks read: the file system under `root`, and the process's limits and
/// libraries.
pub struct System {
    pub root: PathBuf,
    /// RLIMIT_MEMLOCK soft limit in bytes (`None`: unlimited).
    pub memlock: Option<u64>,
    /// The DOCA library as this process loads it: Ok((files, version, is_double)) or the
    /// loader's error (which names where it searched).
    pub doca: Result<(Vec<PathBuf>, Option<String>, bool), String>,
    /// DOCA's devices (ibdev, STA capable), when the library loaded.
    pub doca_devices: Result<Vec<(String, bool)>, String>,
    /// rdma-core's verbs libraries, as `sta::verbs::available` reports them.
    pub verbs: Result<usize, String>,
    /// Binds a TCP socket to the address (port 0) and closes it again: whether the address
    /// is one of this host's.
    pub bind_probe: fn(SocketAddr) -> std::io::Result<()>,
}

impl System {
    /// The running machine.
    pub fn here() -> System {
        let memlock =
            match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK) {
                Ok((soft, _)) if soft == nix::sys::resource::RLIM_INFINITY => None,
                Ok((soft, _)) => Some(soft),
                Err(_) => Some(0),
            };
        let (doca, doca_devices) = doca_here();
        System {
            root: PathBuf::from("/"),
            memlock,
            doca,
            doca_devices,
            verbs: sta::verbs::available().map_err(|e| e.to_string()),
            bind_probe: bind_here,
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    fn read(&self, p: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(p).ok()
    }

    fn dir(&self, p: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

/// [`System::bind_probe`] on this machine.
fn bind_here(addr: SocketAddr) -> std::io::Result<()> {
    std::net::TcpListener::bind(addr).map(drop)
}

type DocaProbe = (
    Result<(Vec<PathBuf>, Option<String>, bool), String>,
    Result<Vec<(String, bool)>, String>,
);

#[cfg(feature = "doca")]
fn doca_here() -> DocaProbe {
    match sta::doca::library() {
        Ok(d) => (
            Ok((
                d.paths().to_vec(),
                sta::doca::library_version(),
                d.is_double(),
            )),
            sta::doca::devices()
                .map(|v| v.into_iter().map(|d| (d.ibdev, d.sta_capable)).collect())
                .map_err(|e| e.to_string()),
        ),
        Err(e) => (Err(e.to_string()), Err("no DOCA library".into())),
    }
}

#[cfg(not(feature = "doca"))]
fn doca_here() -> DocaProbe {
    let e = "this binary is built without the doca feature".to_string();
    (Err(e.clone()), Err(e))
}

/// Every check for `cfg` on `sys`.
pub fn run(cfg: &Config, sys: &System) -> Vec<Check> {
    let doca = cfg.engine == EngineKind::Doca;
    let rdma = cfg
        .listeners
        .iter()
        .any(|l| l.transport == TransportKind::Rdma);
    let nvme: Vec<&str> = cfg
        .backends
        .iter()
        .filter_map(|b| match &b.kind {
            BackendKind::Nvme { pci, .. } => Some(pci.as_str()),
            _ => None,
        })
        .collect();
    let mut out = vec![ok(
        "config",
        format!(
            "{}: engine {}, {} listener(s) ({} RDMA), {} NVMe drive backend(s)",
            cfg.source,
            cfg.engine,
            cfg.listeners.len(),
            cfg.listeners
                .iter()
                .filter(|l| l.transport == TransportKind::Rdma)
                .count(),
            nvme.len()
        ),
    )];
    out.extend(listener_addresses(cfg, sys));
    out.push(doca_library(doca, sys));
    out.extend(doca_devices(cfg, doca, sys));
    out.push(bluefield(doca, sys));
    out.push(rdma_devices(cfg, doca || rdma, sys));
    out.push(iommu(doca || !nvme.is_empty(), sys));
    out.extend(vfio(&nvme, sys));
    out.push(p2p_dmabuf(doca && !nvme.is_empty(), sys));
    out.push(hugepages(doca, sys));
    out.push(memlock(doca || rdma, sys));
    out
}

/// Whether each TCP listener's address is one of this host's, by binding port 0 on it:
/// the configured port is not tried, as the daemon may be running and hold it.
fn listener_addresses(cfg: &Config, sys: &System) -> Vec<Check> {
    const N: &str = "listener-address";
    let tcp: Vec<(usize, &crate::config::ListenerConfig)> = cfg
        .listeners
        .iter()
        .enumerate()
        .filter(|(_, l)| l.transport == TransportKind::Tcp)
        .collect();
    if tcp.is_empty() {
        return vec![skip(N, "no TCP listener")];
    }
    tcp.into_iter()
        .map(|(i, l)| {
            let (name, ip) = (&l.name, l.address);
            if ip.is_unspecified() {
                return ok(
                    N,
                    format!("listener {name}: {ip} (every address of this host)"),
                );
            }
            let mut addr = l.socket_addr();
            addr.set_port(0);
            match (sys.bind_probe)(addr) {
                Ok(()) => ok(
                    N,
                    format!("listener {name}: {ip} is an address of this host"),
                ),
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => fail(
                    N,
                    format!("listener {name}: {ip} is not an address of this host ({e})"),
                    format!(
                        "set listeners[{i}].address to one of this host's addresses \
                         (`ip -brief address`), or 0.0.0.0 / :: for all of them"
                    ),
                ),
                Err(e) => fail(
                    N,
                    format!("listener {name}: cannot bind {ip}: {e}"),
                    format!("check listeners[{i}].address against `ip -brief address`"),
                ),
            }
        })
        .collect()
}

fn doca_library(needed: bool, sys: &System) -> Check {
    const N: &str = "doca-library";
    match &sys.doca {
        Ok((paths, version, double)) => {
            let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            let what = if *double {
                "the workspace's DOCA test double, not NVIDIA's DOCA: runs here, proves nothing about a BlueField"
            } else {
                "NVIDIA DOCA"
            };
            ok(
                N,
                format!(
                    "{} ({what}, version {})",
                    files.join(", "),
                    version.as_deref().unwrap_or("unknown")
                ),
            )
        }
        Err(e) if needed => fail(
            N,
            e.clone(),
            "install DOCA with STA (packages doca-sdk-sta / libdoca-sdk-sta-dev, BlueField \
             bundle 3.3) or set NVMF_DOCA_LIB_DIR to the directory with libdoca_sta.so",
        ),
        Err(e) => skip(N, format!("engine soft does not use DOCA ({e})")),
    }
}

fn doca_devices(cfg: &Config, needed: bool, sys: &System) -> Vec<Check> {
    const N: &str = "doca-devices";
    if !needed {
        return vec![skip(N, "engine soft does not use DOCA devices")];
    }
    let devs = match &sys.doca_devices {
        Ok(d) => d,
        Err(e) => return vec![skip(N, format!("cannot list them: {e}"))],
    };
    let listed = if devs.is_empty() {
        "none".to_string()
    } else {
        devs.iter()
            .map(|(n, sta)| format!("{n}{}", if *sta { " (STA)" } else { "" }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(s) = &cfg.doca else {
        return vec![fail(
            N,
            format!("no `doca:` section; DOCA lists {listed}"),
            "add `doca: { sta_device: <ibdev>, net_devices: [<ibdev>] }`",
        )];
    };
    let mut out = Vec::new();
    let find = |n: &str| devs.iter().find(|(d, _)| d == n);
    match find(&s.sta_device) {
        Some((_, true)) => out.push(ok(
            "doca-sta-device",
            format!("{} can run STA", s.sta_device),
        )),
        Some((_, false)) => out.push(fail(
            "doca-sta-device",
            format!(
                "{} cannot run STA (doca_sta_cap_is_supported)",
                s.sta_device
            ),
            "name the BlueField-3 function that owns the DPA (SPDK's default: mlx5_0)",
        )),
        None => out.push(fail(
            "doca-sta-device",
            format!("{} not found; DOCA lists {listed}", s.sta_device),
            "set doca.sta_device to one of the devices DOCA lists",
        )),
    }
    for n in &s.net_devices {
        out.push(match find(n) {
            Some(_) => ok("doca-net-device", format!("{n} listed by DOCA")),
            None => fail(
                "doca-net-device",
                format!("{n} not found; DOCA lists {listed}"),
                "set doca.net_devices to RDMA devices DOCA lists (the BlueField's PF or SF)",
            ),
        });
    }
    out
}

/// PCI device IDs of BlueField-3's integrated ConnectX-7 functions (vendor 15b3).
const BLUEFIELD3: &[&str] = &["0xa2dc"];

fn bluefield(needed: bool, sys: &System) -> Check {
    const N: &str = "bluefield-dpa";
    if !needed {
        return skip(N, "engine soft does not use a DPA");
    }
    let pci = sys.path("/sys/bus/pci/devices");
    let found: Vec<String> = sys
        .dir(&pci)
        .into_iter()
        .filter(|d| {
            let v = sys.read(pci.join(d).join("vendor")).unwrap_or_default();
            let id = sys.read(pci.join(d).join("device")).unwrap_or_default();
            v.trim() == "0x15b3" && BLUEFIELD3.contains(&id.trim())
        })
        .collect();
    if found.is_empty() {
        fail(
            N,
            "no BlueField-3 function (PCI 15b3:a2dc) on this machine: DOCA STA's offload \
             runs on a BlueField-3 DPA",
            "run on a BlueField-3 (or its host) with the DPA enabled, or use `engine: soft`",
        )
    } else {
        ok(N, format!("BlueField-3 at {}", found.join(", ")))
    }
}

fn rdma_devices(cfg: &Config, needed: bool, sys: &System) -> Check {
    const N: &str = "rdma-devices";
    if !needed {
        return skip(N, "no RDMA listener and engine soft");
    }
    let ib = sys.path("/sys/class/infiniband");
    let mut ports = Vec::new();
    let mut active = Vec::new();
    for dev in sys.dir(&ib) {
        for port in sys.dir(&ib.join(&dev).join("ports")) {
            let state = sys
                .read(ib.join(&dev).join("ports").join(&port).join("state"))
                .unwrap_or_default();
            // "4: ACTIVE"
            let st = state.split(':').nth(1).unwrap_or("?").trim().to_string();
            if st == "ACTIVE" {
                active.push(dev.clone());
            }
            ports.push(format!("{dev} port {port} {st}"));
        }
    }
    let verbs = match &sys.verbs {
        Ok(_) => "rdma-core loaded".to_string(),
        Err(e) => e.clone(),
    };
    if let Err(e) = &sys.verbs {
        let fix = if e.contains("cannot load") {
            "install rdma-core (libibverbs1, librdmacm1)"
        } else {
            "load the NIC's RDMA driver (mlx5_ib), or for Soft-RoCE: \
             `rdma link add rxe0 type rxe netdev <if>`"
        };
        return fail(N, e.clone(), fix);
    }
    if ports.is_empty() {
        return fail(
            N,
            format!("no RDMA device in /sys/class/infiniband ({verbs})"),
            "load the NIC's RDMA driver (mlx5_ib), or for Soft-RoCE: \
             `rdma link add rxe0 type rxe netdev <if>`",
        );
    }
    let wanted: Vec<&String> = cfg.doca.iter().flat_map(|d| &d.net_devices).collect();
    let missing: Vec<&String> = wanted
        .iter()
        .copied()
        .filter(|w| !active.contains(w))
        .collect();
    if active.is_empty() || (cfg.engine == EngineKind::Doca && !missing.is_empty()) {
        let what = if missing.is_empty() {
            "no port is ACTIVE".to_string()
        } else {
            format!(
                "no ACTIVE port on {}",
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return fail(
            N,
            format!("{what} ({})", ports.join(", ")),
            "bring the link up (cable, switch, `ip link set <if> up`) and check `rdma link`",
        );
    }
    ok(N, ports.join(", "))
}

fn iommu(needed: bool, sys: &System) -> Check {
    const N: &str = "iommu";
    let units = sys.dir(&sys.path("/sys/class/iommu"));
    if !units.is_empty() {
        return ok(N, format!("IOMMU units: {}", units.join(", ")));
    }
    if !needed {
        return skip(N, "no NVMe drive backend and engine soft (no IOMMU found)");
    }
    fail(
        N,
        "no IOMMU (empty /sys/class/iommu): VFIO cannot give NVMe drives to user space, and \
         the doca engine's DMA addresses are IOVAs",
        "enable VT-d/AMD-Vi in the firmware and boot with intel_iommu=on iommu=pt (or amd_iommu=on)",
    )
}

fn vfio(nvme: &[&str], sys: &System) -> Vec<Check> {
    const N: &str = "vfio";
    if nvme.is_empty() {
        return vec![skip(N, "no NVMe drive backend configured")];
    }
    nvme.iter()
        .map(|pci| {
            let dev = sys.path("/sys/bus/pci/devices").join(pci);
            if !dev.exists() {
                return fail(
                    N,
                    format!("{pci}: no such PCI device"),
                    "check the backend's `pci:` address (`lspci -D`)",
                );
            }
            let driver = std::fs::read_link(dev.join("driver"))
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
            match driver.as_deref() {
                Some("vfio-pci") => ok(N, format!("{pci} bound to vfio-pci")),
                Some(other) => fail(
                    N,
                    format!("{pci} is bound to {other}, not vfio-pci"),
                    format!("driverctl set-override {pci} vfio-pci"),
                ),
                None => fail(
                    N,
                    format!("{pci} has no driver"),
                    format!("modprobe vfio-pci && driverctl set-override {pci} vfio-pci"),
                ),
            }
        })
        .collect()
}

fn kernel_config(sys: &System) -> Option<String> {
    let release = sys
        .read(sys.path("/proc/sys/kernel/osrelease"))
        .map(|s| s.trim().to_string())?;
    sys.read(sys.path(&format!("/boot/config-{release}")))
        .map(|c| format!("{release}\n{c}"))
}

fn p2p_dmabuf(needed: bool, sys: &System) -> Check {
    const N: &str = "p2p-dmabuf";
    if !needed {
        return skip(N, "needed only by engine doca with NVMe drive backends");
    }
    let Some(c) = kernel_config(sys) else {
        return skip(
            N,
            "kernel config not readable (/boot/config-<release>); the nvme backend still \
             probes the export when it hands a queue to the engine and logs what the kernel said",
        );
    };
    let release = c.lines().next().unwrap_or("?").to_string();
    let has = |opt: &str| c.lines().any(|l| l.trim() == format!("{opt}=y"));
    if has("CONFIG_VFIO_PCI_DMABUF") && has("CONFIG_PCI_P2PDMA") {
        ok(
            N,
            format!("kernel {release}: CONFIG_VFIO_PCI_DMABUF=y, CONFIG_PCI_P2PDMA=y"),
        )
    } else {
        fail(
            N,
            format!(
                "kernel {release} cannot export a VFIO BAR as a dma-buf (needs \
                 CONFIG_VFIO_PCI_DMABUF=y and CONFIG_PCI_P2PDMA=y, or NVIDIA's P2P kernel)"
            ),
            "use a kernel with upstream VFIO dma-buf export, NVIDIA's patched P2P kernel, or \
             this repository's kernel-patches/",
        )
    }
}

fn hugepages(needed: bool, sys: &System) -> Check {
    const N: &str = "hugepages";
    let total = sys
        .read(sys.path("/proc/meminfo"))
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("HugePages_Total:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap_or(0);
    if !needed {
        return skip(
            N,
            format!("engine soft does not use them ({total} reserved)"),
        );
    }
    if total > 0 {
        ok(N, format!("{total} reserved"))
    } else {
        fail(
            N,
            "none reserved; DOCA on a BlueField expects reserved hugepages (NVIDIA's setup guides)",
            "echo 2048 > /proc/sys/vm/nr_hugepages (or hugepages=2048 on the kernel command line)",
        )
    }
}

fn memlock(needed: bool, sys: &System) -> Check {
    const N: &str = "memlock";
    const ENOUGH: u64 = 1 << 30;
    let text = sys
        .memlock
        .map_or("unlimited".to_string(), |b| format!("{} KiB", b / 1024));
    if !needed {
        return skip(N, format!("no RDMA and engine soft (limit {text})"));
    }
    match sys.memlock {
        None => ok(N, "unlimited"),
        Some(b) if b >= ENOUGH => ok(N, text),
        Some(_) => fail(
            N,
            format!("limit {text}: RDMA memory registration and DOCA's pinned buffers need more"),
            "LimitMEMLOCK=infinity in the unit file (systemd/nvmf-target.service has it), or \
             `ulimit -l unlimited`",
        ),
    }
}

/// Print every check; the exit code: 0 if none failed.
pub fn report(checks: &[Check]) -> bool {
    for c in checks {
        println!("{c}");
    }
    let failed = checks.iter().filter(|c| c.outcome == Outcome::Fail).count();
    if failed == 0 {
        println!("preflight: the config can run here");
    } else {
        println!("preflight: {failed} check(s) failed: the config cannot run here as it is");
    }
    failed == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sys(root: &Path) -> System {
        System {
            root: root.to_path_buf(),
            memlock: Some(8 << 20),
            doca: Err("DOCA STA library (libdoca_sta.so) not found; searched /opt/mellanox/doca/lib/x86_64-linux-gnu".into()),
            doca_devices: Err("no DOCA library".into()),
            verbs: Ok(1),
            bind_probe: only_some_addresses,
        }
    }

    /// This test machine has 127.0.0.1 and 10.0.0.1, nothing else.
    fn only_some_addresses(addr: SocketAddr) -> std::io::Result<()> {
        match addr.ip().to_string().as_str() {
            "127.0.0.1" | "10.0.0.1" => Ok(()),
            _ => Err(std::io::Error::from_raw_os_error(libc::EADDRNOTAVAIL)),
        }
    }

    fn put(root: &Path, p: &str, text: &str) {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn cfg(yaml: &str) -> Config {
        Config::parse(yaml, "t.yaml").unwrap()
    }

    const DOCA: &str = "\
engine: doca
doca: {sta_device: mlx5_0, net_devices: [mlx5_2]}
listeners:
  - {name: l, transport: rdma, address: 10.0.0.1, port: 4420}
backends:
  - {name: d, type: nvme, pci: '0000:03:00.0'}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    namespaces:
      - {nsid: 1, backend: d}
";

    fn find<'a>(v: &'a [Check], name: &str) -> &'a Check {
        v.iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name} in {v:#?}"))
    }

    #[test]
    fn a_machine_without_doca_fails_the_doca_checks_with_their_fix() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        put(
            r,
            "proc/meminfo",
            "MemTotal: 1 kB\nHugePages_Total:       0\n",
        );
        put(r, "sys/bus/pci/devices/0000:03:00.0/vendor", "0x1b36\n");
        std::os::unix::fs::symlink(
            "../../../../bus/pci/drivers/nvme",
            r.join("sys/bus/pci/devices/0000:03:00.0/driver"),
        )
        .unwrap();
        let v = run(&cfg(DOCA), &sys(r));
        let lines: Vec<String> = v.iter().map(ToString::to_string).collect();
        let lib = find(&v, "doca-library");
        assert_eq!(lib.outcome, Outcome::Fail, "{lines:#?}");
        assert!(
            lib.to_string().contains("searched /opt/mellanox/doca/lib"),
            "{lib}"
        );
        assert!(lib.to_string().contains("NVMF_DOCA_LIB_DIR"), "{lib}");
        assert_eq!(find(&v, "doca-devices").outcome, Outcome::Skip);
        let bf = find(&v, "bluefield-dpa");
        assert!(
            bf.outcome == Outcome::Fail && bf.detail.contains("15b3:a2dc"),
            "{bf}"
        );
        let rd = find(&v, "rdma-devices");
        assert!(
            rd.outcome == Outcome::Fail && rd.to_string().contains("rdma link add"),
            "{rd}"
        );
        let io = find(&v, "iommu");
        assert!(
            io.outcome == Outcome::Fail && io.to_string().contains("intel_iommu=on"),
            "{io}"
        );
        let vf = find(&v, "vfio");
        assert!(
            vf.outcome == Outcome::Fail
                && vf.to_string().contains("bound to nvme")
                && vf
                    .to_string()
                    .contains("driverctl set-override 0000:03:00.0 vfio-pci"),
            "{vf}"
        );
        assert_eq!(
            find(&v, "p2p-dmabuf").outcome,
            Outcome::Skip,
            "no kernel config here"
        );
        assert_eq!(find(&v, "hugepages").outcome, Outcome::Fail);
        let ml = find(&v, "memlock");
        assert!(
            ml.outcome == Outcome::Fail && ml.to_string().contains("8192 KiB"),
            "{ml}"
        );
        assert!(!report(&v));
    }

    #[test]
    fn a_ready_machine_passes() {
        let t = tempfile::tempdir().unwrap();
        let r = t.path();
        put(r, "proc/meminfo", "HugePages_Total:    2048\n");
        put(r, "proc/sys/kernel/osrelease", "6.19.0\n");
        put(
            r,
            "boot/config-6.19.0",
            "CONFIG_VFIO_PCI_DMABUF=y\nCONFIG_PCI_P2PDMA=y\n",
        );
        put(r, "sys/class/iommu/dmar0/x", "");
        put(
            r,
            "sys/class/infiniband/mlx5_2/ports/1/state",
            "4: ACTIVE\n",
        );
        put(r, "sys/bus/pci/devices/0000:03:00.0/vendor", "0x144d\n");
        put(r, "sys/bus/pci/devices/0000:08:00.0/vendor", "0x15b3\n");
        put(r, "sys/bus/pci/devices/0000:08:00.0/device", "0xa2dc\n");
        std::fs::create_dir_all(r.join("sys/bus/pci/drivers/vfio-pci")).unwrap();
        std::os::unix::fs::symlink(
            r.join("sys/bus/pci/drivers/vfio-pci"),
            r.join("sys/bus/pci/devices/0000:03:00.0/driver"),
        )
        .unwrap();
        let mut s = sys(r);
        s.memlock = None;
        s.doca = Ok((
            vec!["/opt/mellanox/doca/lib/libdoca_sta.so".into()],
            Some("3.3.0109".into()),
            false,
        ));
        s.doca_devices = Ok(vec![("mlx5_0".into(), true), ("mlx5_2".into(), false)]);
        let v = run(&cfg(DOCA), &s);
        // Its one listener is RDMA: no TCP address to try.
        assert_eq!(find(&v, "listener-address").outcome, Outcome::Skip);
        for c in v.iter().filter(|c| c.name != "listener-address") {
            assert_eq!(c.outcome, Outcome::Ok, "{c}");
        }
        assert!(report(&v));
        // The link going down is named.
        put(r, "sys/class/infiniband/mlx5_2/ports/1/state", "1: DOWN\n");
        let rd = find(&run(&cfg(DOCA), &s), "rdma-devices").clone();
        assert!(
            rd.outcome == Outcome::Fail && rd.detail.contains("no ACTIVE port on mlx5_2"),
            "{rd}"
        );
    }

    #[test]
    fn a_soft_tcp_config_needs_none_of_it() {
        let t = tempfile::tempdir().unwrap();
        let v = run(&Config::embedded_default(), &sys(t.path()));
        assert_eq!(
            find(&v, "listener-address").to_string(),
            "OK   listener-address: listener tcp0: 127.0.0.1 is an address of this host"
        );
        for c in v[1..].iter().filter(|c| c.name != "listener-address") {
            assert_eq!(c.outcome, Outcome::Skip, "{c}");
        }
        assert!(report(&v));
    }

    #[test]
    fn a_listener_address_this_host_lacks_fails() {
        let t = tempfile::tempdir().unwrap();
        let yaml = "\
listeners:
  - {name: here, transport: tcp, address: 127.0.0.1, port: 4420}
  - {name: away, transport: tcp, address: 10.99.99.99, port: 4420}
  - {name: all, transport: tcp, address: '::', port: 4421}
subsystems:
  - nqn: nqn.2026-11.dev.example:s
    allow_any_host: true
";
        let v = run(&cfg(yaml), &sys(t.path()));
        let lines: Vec<String> = v
            .iter()
            .filter(|c| c.name == "listener-address")
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            lines,
            [
                "OK   listener-address: listener here: 127.0.0.1 is an address of this host",
                "FAIL listener-address: listener away: 10.99.99.99 is not an address of this \
                 host (Cannot assign requested address (os error 99)); fix: set \
                 listeners[1].address to one of this host's addresses (`ip -brief address`), \
                 or 0.0.0.0 / :: for all of them",
                "OK   listener-address: listener all: :: (every address of this host)",
            ]
        );
        assert!(!report(&v));
        // An RDMA-only config has nothing to bind here.
        let v = run(&cfg(DOCA), &sys(t.path()));
        assert_eq!(find(&v, "listener-address").outcome, Outcome::Skip);
    }

    #[test]
    fn the_real_probe_tells_a_local_address_from_a_foreign_one() {
        bind_here("127.0.0.1:0".parse().unwrap()).expect("loopback is on every host");
        // 192.0.2.0/24 is TEST-NET-1 (RFC 5737), on no real host.
        let e = bind_here("192.0.2.1:0".parse().unwrap()).expect_err("not on this host");
        assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL), "{e}");
    }
}

//! The reservation state file (Persist Through Power Loss, NVMe Base 2.0 section 8.19.10):
//! every namespace whose PTPL state is on has its registrants, reservation and generation
//! here, so a restarted daemon gives hosts back what they had.
//!
//! Written atomically: the whole state goes to `<file>.tmp`, which is fsynced, renamed
//! over the file, and the directory is fsynced, so the file is always either the old
//! state or the new one. The write happens before the completion of the command that
//! changed the state is sent, so a host never sees a reservation succeed that a restart
//! would lose. Writers from several IO threads are ordered by the target's PTPL version:
//! a snapshot older than the one on disk is not written.
//!
//! Format: YAML (`format: nvmf-target-ptpl/1`, then one entry per namespace), readable by
//! an operator. At start-up a missing file and an unreadable one are handled as the config
//! says (`reservations.if_missing`, `reservations.if_corrupt`): start with no
//! reservations, or refuse to start naming the file and the problem.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nvmf::target::reservation::{Held, Registrant, ReservationType, Reservations};
use nvmf::target::PersistedReservation;
use serde::{Deserialize, Serialize};

use crate::config::StartPolicy;

const FORMAT: &str = "nvmf-target-ptpl/1";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileV1 {
    format: String,
    #[serde(default)]
    namespaces: Vec<NsV1>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NsV1 {
    subsystem: String,
    nsid: u32,
    generation: u32,
    /// Reservation type 1..=6, absent when none is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rtype: Option<u8>,
    /// Host Identifier of the holder, 32 hex digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    #[serde(default)]
    registrants: Vec<RegV1>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegV1 {
    host_id: String,
    key: u64,
}

fn hex(b: &[u8; 16]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The file's text for these namespaces.
pub fn encode(entries: &[PersistedReservation]) -> String {
    let f = FileV1 {
        format: FORMAT.to_string(),
        namespaces: entries
            .iter()
            .map(|e| NsV1 {
                subsystem: e.subnqn.clone(),
                nsid: e.nsid,
                generation: e.state.generation,
                rtype: e.state.held.map(|h| h.rtype as u8),
                holder: e.state.held.map(|h| hex(&h.holder)),
                registrants: e
                    .state
                    .registrants
                    .iter()
                    .map(|r| RegV1 {
                        host_id: hex(&r.host_id),
                        key: r.key,
                    })
                    .collect(),
            })
            .collect(),
    };
    serde_saphyr::to_string(&f).unwrap_or_default()
}

/// Parses the file's text; every inconsistency is an error naming the entry.
pub fn decode(text: &str) -> Result<Vec<PersistedReservation>, String> {
    let f: FileV1 = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    if f.format != FORMAT {
        return Err(format!(
            "unknown format {:?} (expected {FORMAT:?})",
            f.format
        ));
    }
    let mut out = Vec::new();
    for (i, n) in f.namespaces.into_iter().enumerate() {
        let at = format!("namespaces[{i}] ({} nsid {})", n.subsystem, n.nsid);
        let mut registrants = Vec::new();
        for r in &n.registrants {
            let host_id =
                unhex(&r.host_id).ok_or_else(|| format!("{at}: bad host_id {:?}", r.host_id))?;
            if registrants
                .iter()
                .any(|x: &Registrant| x.host_id == host_id)
            {
                return Err(format!("{at}: host {} registered twice", r.host_id));
            }
            registrants.push(Registrant::new(host_id, r.key));
        }
        let held = match (n.rtype, n.holder.as_deref()) {
            (None, None) => None,
            (Some(t), Some(h)) => {
                let rtype = ReservationType::from_u8(t)
                    .ok_or_else(|| format!("{at}: bad reservation type {t}"))?;
                let holder = unhex(h).ok_or_else(|| format!("{at}: bad holder {h:?}"))?;
                if !registrants.iter().any(|r| r.host_id == holder) {
                    return Err(format!("{at}: the holder is not a registrant"));
                }
                Some(Held { rtype, holder })
            }
            _ => return Err(format!("{at}: rtype and holder go together")),
        };
        out.push(PersistedReservation {
            subnqn: n.subsystem,
            nsid: n.nsid,
            state: Reservations {
                generation: n.generation,
                registrants,
                held,
                ptpl: true,
            },
        });
    }
    Ok(out)
}

/// The state file and the version last written.
pub struct PtplStore {
    path: PathBuf,
    written: Mutex<u64>,
}

impl PtplStore {
    pub fn new(path: PathBuf) -> PtplStore {
        PtplStore {
            path,
            written: Mutex::new(0),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn tmp(&self) -> PathBuf {
        let mut s = self.path.as_os_str().to_owned();
        s.push(".tmp");
        PathBuf::from(s)
    }

    /// Whether the file can be written (its directory takes a new file).
    pub fn probe(&self) -> std::io::Result<()> {
        let tmp = self.tmp();
        File::create(&tmp)?;
        std::fs::remove_file(&tmp)
    }

    /// Reads the file at start-up, as `if_missing` / `if_corrupt` say.
    pub fn load(
        &self,
        if_missing: StartPolicy,
        if_corrupt: StartPolicy,
    ) -> Result<Vec<PersistedReservation>, String> {
        let shown = self.path.display();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return match if_missing {
                    StartPolicy::StartClean => {
                        tracing::info!("reservations: {shown} does not exist; no persisted reservations");
                        Ok(Vec::new())
                    }
                    StartPolicy::Fail => Err(format!(
                        "reservations: state file {shown} does not exist (reservations.if_missing: fail)"
                    )),
                };
            }
            Err(e) => return self.corrupt(if_corrupt, &format!("cannot read it: {e}")),
        };
        match decode(&text) {
            Ok(v) => Ok(v),
            Err(e) => self.corrupt(if_corrupt, &e),
        }
    }

    fn corrupt(&self, policy: StartPolicy, why: &str) -> Result<Vec<PersistedReservation>, String> {
        let shown = self.path.display();
        match policy {
            StartPolicy::Fail => Err(format!(
                "reservations: state file {shown} is unusable: {why} (reservations.if_corrupt: \
                 fail; fix or remove the file, or set if_corrupt: start_clean)"
            )),
            StartPolicy::StartClean => {
                tracing::error!(
                    "reservations: state file {shown} is unusable: {why}; starting with no \
                     persisted reservations (reservations.if_corrupt: start_clean)"
                );
                Ok(Vec::new())
            }
        }
    }

    /// Writes `entries` as version `version` unless a later version is on disk already.
    pub fn save(&self, version: u64, entries: &[PersistedReservation]) -> std::io::Result<()> {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        if version <= *written {
            return Ok(());
        }
        let tmp = self.tmp();
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(encode(entries).as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &self.path)?;
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(dir)?.sync_all()?;
        *written = version;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<PersistedReservation> {
        vec![PersistedReservation {
            subnqn: "nqn.2026-11.dev.test:a".into(),
            nsid: 3,
            state: Reservations {
                generation: 7,
                registrants: vec![
                    Registrant::new([0xab; 16], 0x1234),
                    Registrant::new([0x01; 16], u64::MAX),
                ],
                held: Some(Held {
                    rtype: ReservationType::WriteExclusiveRegistrantsOnly,
                    holder: [0xab; 16],
                }),
                ptpl: true,
            },
        }]
    }

    #[test]
    fn roundtrip_and_atomic_save() {
        let dir = tempfile::tempdir().unwrap();
        let store = PtplStore::new(dir.path().join("state.ptpl"));
        store.probe().unwrap();
        assert_eq!(
            store.load(StartPolicy::StartClean, StartPolicy::Fail),
            Ok(vec![])
        );
        assert!(store
            .load(StartPolicy::Fail, StartPolicy::Fail)
            .unwrap_err()
            .contains("does not exist"));
        store.save(2, &sample()).unwrap();
        assert_eq!(
            store.load(StartPolicy::Fail, StartPolicy::Fail).unwrap(),
            sample()
        );
        // An older version is not written over a newer one.
        store.save(1, &[]).unwrap();
        assert_eq!(
            store
                .load(StartPolicy::Fail, StartPolicy::Fail)
                .unwrap()
                .len(),
            1
        );
        assert!(!store.tmp().exists());
    }

    #[test]
    fn corrupt_files_fail_or_start_clean() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.ptpl");
        let store = PtplStore::new(path.clone());
        for bad in [
            "not: [valid",
            "format: something-else\n",
            "format: nvmf-target-ptpl/1\nnamespaces:\n  - {subsystem: s, nsid: 1, generation: 1, rtype: 9, holder: '00000000000000000000000000000000', registrants: [{host_id: '00000000000000000000000000000000', key: 1}]}\n",
            "format: nvmf-target-ptpl/1\nnamespaces:\n  - {subsystem: s, nsid: 1, generation: 1, rtype: 1, holder: '11111111111111111111111111111111', registrants: []}\n",
            "format: nvmf-target-ptpl/1\nnamespaces:\n  - {subsystem: s, nsid: 1, generation: 1, registrants: [{host_id: 'xyz', key: 1}]}\n",
        ] {
            std::fs::write(&path, bad).unwrap();
            let e = store
                .load(StartPolicy::StartClean, StartPolicy::Fail)
                .unwrap_err();
            assert!(e.contains("state.ptpl") && e.contains("unusable"), "{e}");
            assert_eq!(
                store.load(StartPolicy::Fail, StartPolicy::StartClean),
                Ok(vec![])
            );
        }
    }
}

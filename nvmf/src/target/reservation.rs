//! Reservations (NVMe Base 2.0 section 8.19; commands in section 7.4-7.7 of the NVM
//! Command Set: Reservation Register 0Dh, Report 0Eh, Acquire 11h, Release 15h).
//!
//! One [`Reservations`] per namespace. Registrants are keyed by Host Identifier (the
//! 128-bit HOSTID of the controller's admin Connect), so every controller of one host
//! shares one registration, as the spec, nvmet and SPDK have it. There is no registrant
//! cap: each registrant is 24 bytes of memory and only hosts allowed on the subsystem can
//! register.
//!
//! The rules where implementations differ follow the spec and, where it leaves room,
//! nvmet (drivers/nvme/target/pr.c):
//! - Release with a type that does not match the reservation: Invalid Field (SPDK and the
//!   spec's "the Reservation Type field ... shall match"; nvmet answers Conflict).
//! - Preempt with PRKEY 0 that is not the holder's key (not an All Registrants type):
//!   Invalid Field (nvmet and the spec).
//! - Preempt with no reservation held and a PRKEY that no registrant has: Reservation
//!   Conflict (nvmet and the spec; SPDK succeeds).
//! - Reservation Report with EDS cleared: Host Identifier Inconsistent, because every
//!   fabrics Host Identifier is 128 bits and the non-extended structure holds 64 (NVMe
//!   Base 2.0 section 7.6: "if a 128-bit Host Identifier is in use"; nvmet and SPDK
//!   answer the same). Both layouts are encoded here ([`report`]) and tested.
//! - Preempt and Abort preempts like Preempt, and its completion waits, as nvmet's does,
//!   for the preempted hosts' commands already running: the new access view is published
//!   before the command completes, so every command the engine takes after that point
//!   is checked against the new state (see `access`), and so is a write taken before it
//!   whose host data arrives after it (the soft engine checks again when the data is
//!   in); the daemon answers only once the engine's fence on the namespace
//!   (`sta::IoContext::ns_fence`) says the backend requests in flight when it was
//!   published are done.
//!
//! Nothing here knows about controllers: commands return the [`Notify`] list (which host
//! gets which reservation notification) and whether the state changed, and the target
//! turns those into log entries, AENs, a new access view and a PTPL write.

use crate::spec::Status;

/// A 128-bit Host Identifier.
pub type HostId = [u8; 16];

/// Reservation types (NVMe Base 2.0 Figure 558 / NVM Command Set "Reservation Type
/// Encoding").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReservationType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    pub const ALL: [ReservationType; 6] = [
        ReservationType::WriteExclusive,
        ReservationType::ExclusiveAccess,
        ReservationType::WriteExclusiveRegistrantsOnly,
        ReservationType::ExclusiveAccessRegistrantsOnly,
        ReservationType::WriteExclusiveAllRegistrants,
        ReservationType::ExclusiveAccessAllRegistrants,
    ];

    pub fn from_u8(v: u8) -> Option<ReservationType> {
        ReservationType::ALL
            .get((v as usize).wrapping_sub(1))
            .copied()
    }
    /// Every registrant is a holder (types 5h and 6h).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ReservationType::WriteExclusiveAllRegistrants
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }
    /// Registrants may access as the holder does (types 3h-6h).
    fn registrants_may_access(self) -> bool {
        !matches!(
            self,
            ReservationType::WriteExclusive | ReservationType::ExclusiveAccess
        )
    }
    /// Reads by hosts without access are refused too (the "Exclusive Access" types).
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            ReservationType::ExclusiveAccess
                | ReservationType::ExclusiveAccessRegistrantsOnly
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }
}

/// What a command does to the namespace's data, for reservation checks (NVM Command Set
/// 1.0 section 5.1.1 and NVMe Base 2.0 Figure "Command Behavior in the Presence of a
/// Reservation"): the read command group (Read, Compare, Verify) and the write command
/// group (Write, Write Zeroes, Dataset Management, Write Uncorrectable, Copy, and Flush,
/// which nvmet and SPDK put there too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    Read,
    Write,
}

/// Whether a host that is (`holder`, `registrant`) may run an `access` command under a
/// reservation of type `rtype`: the spec's table, row by row.
pub fn allowed(rtype: ReservationType, holder: bool, registrant: bool, access: Access) -> bool {
    if holder || (registrant && rtype.registrants_may_access()) {
        return true;
    }
    match access {
        Access::Write => false,
        Access::Read => !rtype.exclusive_access(),
    }
}

/// A registered host and its key.
#[derive(Clone, Copy, Debug, Eq)]
pub struct Registrant {
    pub host_id: HostId,
    pub key: u64,
    /// Who registered it (for the per-host and per-address quotas; not state the spec
    /// knows, so not compared and not persisted).
    pub by: RegisteredBy,
}

impl PartialEq for Registrant {
    fn eq(&self, o: &Registrant) -> bool {
        self.host_id == o.host_id && self.key == o.key
    }
}

impl Registrant {
    pub fn new(host_id: HostId, key: u64) -> Registrant {
        Registrant {
            host_id,
            key,
            by: RegisteredBy::default(),
        }
    }
}

/// Who registered a registrant: hashes of the controller's host NQN and of its peer
/// address. 0 is unknown (a registrant restored from a PTPL file, or a queue with no
/// address) and counts against no quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisteredBy {
    pub hostnqn: u64,
    pub peer: u64,
}

impl RegisteredBy {
    pub fn new(hostnqn: &str, peer: Option<std::net::IpAddr>) -> RegisteredBy {
        fn hash_of<T: std::hash::Hash + ?Sized>(x: &T) -> u64 {
            use std::hash::Hasher;
            let mut s = std::hash::DefaultHasher::new();
            x.hash(&mut s);
            s.finish().max(1)
        }
        RegisteredBy {
            hostnqn: hash_of(hostnqn),
            peer: peer.map_or(0, |p| hash_of(&p.to_canonical())),
        }
    }
}

/// Why a Register that would add a registrant is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistrantsRefusal {
    /// The namespace holds [`MAX_REGISTRANTS`].
    Full,
    /// Registrants registered by this host NQN: [`MAX_REGISTRANTS_PER_HOST`].
    HostQuota,
    /// Registrants registered from this peer address: [`MAX_REGISTRANTS_PER_HOST`].
    PeerQuota,
}

/// The reservation held on a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub rtype: ReservationType,
    /// The host that acquired it. For All Registrants types every registrant holds it;
    /// this one is still reported as the acquirer and kept as long as it is registered.
    pub holder: HostId,
}

/// Reservation Notification log page types (NVMe Base 2.0 Figure 244).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotificationType {
    RegistrationPreempted = 1,
    ReservationReleased = 2,
    ReservationPreempted = 3,
}

impl NotificationType {
    /// The Reservation Notification Mask (feature 82h) bit that masks it.
    pub fn mask_bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// Reservation Notification Mask bits that exist (REGPRE, RESREL, RESPRE).
pub const NOTIFICATION_MASK_ALL: u32 = 0b1110;

/// A notification for every controller of one host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notify {
    pub host_id: HostId,
    pub kind: NotificationType,
}

/// The reservation state of one namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservations {
    /// PRGEN: bumped by every successful Register, Preempt and Clear.
    pub generation: u32,
    /// In registration order (the order Reservation Report lists them).
    pub registrants: Vec<Registrant>,
    pub held: Option<Held>,
    /// Persist Through Power Loss state (PTPLS).
    pub ptpl: bool,
}

/// What a state-changing command did beyond its status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Registrants or the reservation changed: publish a new access view, persist.
    pub changed: bool,
    /// The PTPL state changed.
    pub ptpl_changed: bool,
    pub notify: Vec<Notify>,
}

/// Reservation Register action (CDW10 bits 2:0).
const RREGA_REGISTER: u32 = 0;
const RREGA_UNREGISTER: u32 = 1;
const RREGA_REPLACE: u32 = 2;
/// Reservation Acquire action.
const RACQA_ACQUIRE: u32 = 0;
const RACQA_PREEMPT: u32 = 1;
const RACQA_PREEMPT_ABORT: u32 = 2;
/// Reservation Release action.
const RRELA_RELEASE: u32 = 0;
const RRELA_CLEAR: u32 = 1;
/// CPTPL (Register CDW10 bits 31:30): 10b clear PTPL, 11b set it.
const CPTPL_CLEAR: u32 = 0b10;
const CPTPL_SET: u32 = 0b11;

/// Bytes of host data each command carries: Register CRKEY + NRKEY, Acquire CRKEY +
/// PRKEY, Release CRKEY.
pub const REGISTER_DATA_LEN: usize = 16;

/// Registrants one namespace keeps at most (SPDK keeps 16; a registration outlives its
/// controller and needs only a Host ID the host chooses, so without a bound one host could
/// grow the list, which every I/O under a reservation consults, without end).
pub const MAX_REGISTRANTS: usize = 1024;

/// Registrants one host NQN, and one peer address, may add to a namespace. A host
/// registers one Host ID; without this a single peer that makes up Host IDs (each
/// Connect may bring a new one, and registrations outlive their controllers) fills the
/// namespace's list, and no other host can ever register there again.
pub const MAX_REGISTRANTS_PER_HOST: usize = 64;

/// What Register answers when it would add a registrant past [`MAX_REGISTRANTS`] (SPDK
/// answers Internal Device Error when its list is full; DNR here: trying again cannot
/// help), and nothing else.
pub const REGISTRANTS_FULL: Status = Status::INTERNAL_ERROR.with_dnr(true);
pub const ACQUIRE_DATA_LEN: usize = 16;
pub const RELEASE_DATA_LEN: usize = 8;

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn iekey(cdw10: u32) -> bool {
    cdw10 & (1 << 3) != 0
}

impl Reservations {
    fn find(&self, host: &HostId) -> Option<usize> {
        self.registrants.iter().position(|r| &r.host_id == host)
    }
    pub fn is_registrant(&self, host: &HostId) -> bool {
        self.find(host).is_some()
    }
    /// Whether a Reservation Register with `cdw10` from `host` (registered by `by`)
    /// would add a registrant past [`MAX_REGISTRANTS`] or past `by`'s quota
    /// ([`MAX_REGISTRANTS_PER_HOST`]), and which.
    pub fn refuse_new(
        &self,
        host: &HostId,
        cdw10: u32,
        by: RegisteredBy,
    ) -> Option<RegistrantsRefusal> {
        let adds = match cdw10 & 7 {
            RREGA_REGISTER => true,
            RREGA_REPLACE => iekey(cdw10),
            _ => false,
        };
        if !adds || self.find(host).is_some() {
            return None;
        }
        let held = |f: &dyn Fn(&RegisteredBy) -> u64, me: u64| {
            me != 0
                && self.registrants.iter().filter(|r| f(&r.by) == me).count()
                    >= MAX_REGISTRANTS_PER_HOST
        };
        if self.registrants.len() >= MAX_REGISTRANTS {
            Some(RegistrantsRefusal::Full)
        } else if held(&|b| b.hostnqn, by.hostnqn) {
            Some(RegistrantsRefusal::HostQuota)
        } else if held(&|b| b.peer, by.peer) {
            Some(RegistrantsRefusal::PeerQuota)
        } else {
            None
        }
    }
    /// Removes the oldest registrant that `by`'s host NQN registered, that no live
    /// controller has as its Host ID (`live`) and that holds no reservation: a host NQN at
    /// its quota replaces its own stale registrations. Returns whether one went.
    pub fn evict_stale(
        &mut self,
        by: RegisteredBy,
        live: &std::collections::HashSet<HostId>,
    ) -> bool {
        if by.hostnqn == 0 {
            return false;
        }
        let stale = self.registrants.iter().position(|r| {
            r.by.hostnqn == by.hostnqn && !live.contains(&r.host_id) && !self.is_holder(&r.host_id)
        });
        match stale {
            Some(i) => {
                self.remove(i);
                true
            }
            None => false,
        }
    }
    #[cfg(test)]
    fn full_for(&self, host: &HostId, cdw10: u32) -> bool {
        self.refuse_new(host, cdw10, RegisteredBy::default())
            .is_some()
    }
    /// Whether `host` holds the reservation (any registrant does for All Registrants).
    pub fn is_holder(&self, host: &HostId) -> bool {
        match self.held {
            Some(h) if h.rtype.all_registrants() => self.is_registrant(host),
            Some(h) => &h.holder == host,
            None => false,
        }
    }
    /// Whether `host` may run an `access` command now.
    pub fn check(&self, host: &HostId, access: Access) -> Result<(), Status> {
        match self.held {
            None => Ok(()),
            Some(h) => {
                if allowed(
                    h.rtype,
                    self.is_holder(host),
                    self.is_registrant(host),
                    access,
                ) {
                    Ok(())
                } else {
                    Err(Status::RESERVATION_CONFLICT)
                }
            }
        }
    }

    /// Registrant hosts other than `host`.
    fn others(&self, host: &HostId) -> Vec<HostId> {
        self.registrants
            .iter()
            .filter(|r| &r.host_id != host)
            .map(|r| r.host_id)
            .collect()
    }

    /// Removes registrant `i`; a reservation it held goes with it (an All Registrants
    /// reservation stays while any registrant is left). Returns whether a Registrants
    /// Only reservation was released that way (the others get Reservation Released).
    fn remove(&mut self, i: usize) -> bool {
        let r = self.registrants.remove(i);
        let Some(h) = self.held else {
            return false;
        };
        if h.rtype.all_registrants() {
            if self.registrants.is_empty() {
                self.held = None;
            } else if h.holder == r.host_id {
                self.held = Some(Held {
                    holder: self.registrants[0].host_id,
                    ..h
                });
            }
            false
        } else if h.holder == r.host_id {
            self.held = None;
            matches!(
                h.rtype,
                ReservationType::WriteExclusiveRegistrantsOnly
                    | ReservationType::ExclusiveAccessRegistrantsOnly
            )
        } else {
            false
        }
    }

    /// Reservation Register (NVMe Base 2.0 section 8.19.4/8.19.5). `ptpl_capable`: the
    /// target can persist this namespace's state (CPTPL 11b is Invalid Field otherwise).
    pub fn register(
        &mut self,
        host: &HostId,
        cdw10: u32,
        data: &[u8],
        ptpl_capable: bool,
    ) -> Result<Effects, Status> {
        self.register_by(host, cdw10, data, ptpl_capable, RegisteredBy::default())
    }

    /// [`Reservations::register`] from a controller of `by`: a registrant it adds is
    /// counted against `by`'s quotas.
    pub fn register_by(
        &mut self,
        host: &HostId,
        cdw10: u32,
        data: &[u8],
        ptpl_capable: bool,
        by: RegisteredBy,
    ) -> Result<Effects, Status> {
        if data.len() < REGISTER_DATA_LEN {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        let (crkey, nrkey) = (le64(&data[0..8]), le64(&data[8..16]));
        let cptpl = cdw10 >> 30;
        if cptpl == 0b01 || (cptpl == CPTPL_SET && !ptpl_capable) {
            return Err(Status::INVALID_FIELD);
        }
        if self.refuse_new(host, cdw10, by).is_some() {
            return Err(REGISTRANTS_FULL);
        }
        let mut fx = Effects::default();
        match cdw10 & 7 {
            RREGA_REGISTER => match self.find(host) {
                // Registering again with the key it has is not an error.
                Some(i) if self.registrants[i].key == nrkey => {}
                Some(_) => return Err(Status::RESERVATION_CONFLICT),
                None => {
                    self.registrants.push(Registrant {
                        host_id: *host,
                        key: nrkey,
                        by,
                    });
                    fx.changed = true;
                }
            },
            RREGA_UNREGISTER => {
                let i = self.find(host).ok_or(Status::RESERVATION_CONFLICT)?;
                if !iekey(cdw10) && self.registrants[i].key != crkey {
                    return Err(Status::RESERVATION_CONFLICT);
                }
                let others = self.others(host);
                if self.remove(i) {
                    fx.notify.extend(others.into_iter().map(|host_id| Notify {
                        host_id,
                        kind: NotificationType::ReservationReleased,
                    }));
                }
                fx.changed = true;
            }
            RREGA_REPLACE => match self.find(host) {
                Some(i) => {
                    if !iekey(cdw10) && self.registrants[i].key != crkey {
                        return Err(Status::RESERVATION_CONFLICT);
                    }
                    self.registrants[i].key = nrkey;
                    fx.changed = true;
                }
                // Replace with IEKEY by a host that is not registered registers it (the
                // spec: "...the controller shall register the host with NRKEY").
                None if iekey(cdw10) => {
                    self.registrants.push(Registrant {
                        host_id: *host,
                        key: nrkey,
                        by,
                    });
                    fx.changed = true;
                }
                None => return Err(Status::RESERVATION_CONFLICT),
            },
            _ => return Err(Status::INVALID_FIELD),
        }
        self.generation = self.generation.wrapping_add(1);
        match cptpl {
            CPTPL_CLEAR if self.ptpl => {
                self.ptpl = false;
                fx.ptpl_changed = true;
            }
            CPTPL_SET if !self.ptpl => {
                self.ptpl = true;
                fx.ptpl_changed = true;
            }
            _ => {}
        }
        Ok(fx)
    }

    /// Unregisters every registrant with key `prkey` (other than `keep`, if given) and
    /// returns the hosts removed; for each a Registration Preempted notice unless it is
    /// the host that asked.
    fn unregister_key(
        &mut self,
        prkey: u64,
        keep: Option<&HostId>,
        asker: &HostId,
        fx: &mut Effects,
    ) -> usize {
        let mut n = 0;
        while let Some(i) = self
            .registrants
            .iter()
            .position(|r| r.key == prkey && Some(&r.host_id) != keep)
        {
            let host_id = self.registrants[i].host_id;
            let others = self.others(&host_id);
            if self.remove(i) {
                for o in others.into_iter().filter(|o| o != asker) {
                    fx.notify.push(Notify {
                        host_id: o,
                        kind: NotificationType::ReservationReleased,
                    });
                }
            }
            if &host_id != asker {
                fx.notify.push(Notify {
                    host_id,
                    kind: NotificationType::RegistrationPreempted,
                });
            }
            n += 1;
        }
        n
    }

    /// Reservation Acquire (sections 8.19.6, 8.19.7).
    pub fn acquire(&mut self, host: &HostId, cdw10: u32, data: &[u8]) -> Result<Effects, Status> {
        if data.len() < ACQUIRE_DATA_LEN {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        let (crkey, prkey) = (le64(&data[0..8]), le64(&data[8..16]));
        // IEKEY is reserved for Acquire in NVMe 2.0; nvmet and SPDK refuse it.
        if iekey(cdw10) {
            return Err(Status::INVALID_FIELD);
        }
        let action = cdw10 & 7;
        if action > RACQA_PREEMPT_ABORT {
            return Err(Status::INVALID_FIELD);
        }
        let rtype = ReservationType::from_u8((cdw10 >> 8) as u8).ok_or(Status::INVALID_FIELD)?;
        let me = self.find(host).ok_or(Status::RESERVATION_CONFLICT)?;
        if self.registrants[me].key != crkey {
            return Err(Status::RESERVATION_CONFLICT);
        }
        let mut fx = Effects::default();
        if action == RACQA_ACQUIRE {
            match self.held {
                None => {
                    self.held = Some(Held {
                        rtype,
                        holder: *host,
                    });
                    fx.changed = true;
                }
                // The holder acquiring the same type again is not an error.
                Some(h) if h.rtype == rtype && self.is_holder(host) => {}
                Some(_) => return Err(Status::RESERVATION_CONFLICT),
            }
            return Ok(fx);
        }
        debug_assert!(action == RACQA_PREEMPT || action == RACQA_PREEMPT_ABORT);
        match self.held {
            None => {
                if self.unregister_key(prkey, None, host, &mut fx) == 0 {
                    return Err(Status::RESERVATION_CONFLICT);
                }
            }
            Some(h) if h.rtype.all_registrants() => {
                if prkey == 0 {
                    // Every other registrant goes; the preempting host holds the new one.
                    self.held = Some(Held {
                        rtype,
                        holder: *host,
                    });
                    for other in self.others(host) {
                        if let Some(i) = self.find(&other) {
                            self.registrants.remove(i);
                        }
                        fx.notify.push(Notify {
                            host_id: other,
                            kind: NotificationType::RegistrationPreempted,
                        });
                    }
                } else if self.unregister_key(prkey, None, host, &mut fx) == 0 {
                    return Err(Status::RESERVATION_CONFLICT);
                }
            }
            Some(h) => {
                let holder_key = self
                    .find(&h.holder)
                    .map(|i| self.registrants[i].key)
                    .unwrap_or_default();
                if prkey == holder_key {
                    let changed_type = h.rtype != rtype;
                    if h.holder != *host {
                        self.held = Some(Held {
                            rtype,
                            holder: *host,
                        });
                        self.unregister_key(prkey, Some(host), host, &mut fx);
                    } else {
                        self.held = Some(Held { rtype, ..h });
                    }
                    if changed_type {
                        for o in self.others(host) {
                            fx.notify.push(Notify {
                                host_id: o,
                                kind: NotificationType::ReservationReleased,
                            });
                        }
                    }
                } else if prkey == 0 {
                    return Err(Status::INVALID_FIELD);
                } else if self.unregister_key(prkey, None, host, &mut fx) == 0 {
                    return Err(Status::RESERVATION_CONFLICT);
                }
            }
        }
        // A host preempting itself keeps its registration; nobody else's notice is the
        // asker's.
        fx.notify.retain(|n| n.host_id != *host);
        fx.changed = true;
        self.generation = self.generation.wrapping_add(1);
        Ok(fx)
    }

    /// Reservation Release (section 8.19.8, 8.19.9).
    pub fn release(&mut self, host: &HostId, cdw10: u32, data: &[u8]) -> Result<Effects, Status> {
        if data.len() < RELEASE_DATA_LEN {
            return Err(Status::DATA_SGL_LENGTH_INVALID);
        }
        let crkey = le64(&data[0..8]);
        if iekey(cdw10) {
            return Err(Status::INVALID_FIELD);
        }
        let action = cdw10 & 7;
        if action > RRELA_CLEAR {
            return Err(Status::INVALID_FIELD);
        }
        let me = self.find(host).ok_or(Status::RESERVATION_CONFLICT)?;
        if self.registrants[me].key != crkey {
            return Err(Status::RESERVATION_CONFLICT);
        }
        let mut fx = Effects::default();
        let others = self.others(host);
        if action == RRELA_CLEAR {
            self.held = None;
            self.registrants.clear();
            fx.notify.extend(others.into_iter().map(|host_id| Notify {
                host_id,
                kind: NotificationType::ReservationPreempted,
            }));
            fx.changed = true;
            self.generation = self.generation.wrapping_add(1);
            return Ok(fx);
        }
        debug_assert_eq!(action, RRELA_RELEASE);
        let Some(h) = self.held else {
            return Ok(fx);
        };
        if (cdw10 >> 8) as u8 != h.rtype as u8 {
            return Err(Status::INVALID_FIELD);
        }
        // A registrant that does not hold it: success, no effect.
        if !self.is_holder(host) {
            return Ok(fx);
        }
        self.held = None;
        fx.changed = true;
        if h.rtype.registrants_may_access() {
            fx.notify.extend(others.into_iter().map(|host_id| Notify {
                host_id,
                kind: NotificationType::ReservationReleased,
            }));
        }
        Ok(fx)
    }
}

/// Reservation Report (section 7.6): the Reservation Status data structure, extended
/// (`eds`: 64-byte header, 64-byte Registered Controller Extended entries with the 128-bit
/// Host Identifier) or not (24-byte header, 24-byte entries with a 64-bit Host
/// Identifier, here its first 8 bytes). Every registrant is one entry with CNTLID FFFFh,
/// the value the spec gives for the dynamic controller model; RCSTS bit 0 marks holders.
pub fn report(r: &Reservations, eds: bool) -> Vec<u8> {
    let (head, entry) = if eds { (64, 64) } else { (24, 24) };
    let mut out = vec![0u8; head + entry * r.registrants.len()];
    out[0..4].copy_from_slice(&r.generation.to_le_bytes());
    out[4] = r.held.map_or(0, |h| h.rtype as u8);
    let regctl = r.registrants.len().min(u16::MAX as usize) as u16;
    out[5..7].copy_from_slice(&regctl.to_le_bytes());
    out[9] = r.ptpl as u8;
    for (i, reg) in r.registrants.iter().enumerate() {
        let e = &mut out[head + i * entry..head + (i + 1) * entry];
        e[0..2].copy_from_slice(&0xffffu16.to_le_bytes());
        e[2] = r.is_holder(&reg.host_id) as u8;
        if eds {
            e[8..16].copy_from_slice(&reg.key.to_le_bytes());
            e[16..32].copy_from_slice(&reg.host_id);
        } else {
            e[8..16].copy_from_slice(&reg.host_id[..8]);
            e[16..24].copy_from_slice(&reg.key.to_le_bytes());
        }
    }
    out
}

/// One Reservation Notification log page (LID 80h, NVMe Base 2.0 Figure 243), 64 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotificationEntry {
    /// Log Page Count: 1-based, wraps past 0.
    pub count: u64,
    /// 0 when the log is empty.
    pub kind: u8,
    pub nsid: u32,
}

impl NotificationEntry {
    /// The 64 bytes, with `available`: the Number of Available Log Pages after this one.
    pub fn encode(&self, available: u8) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..8].copy_from_slice(&self.count.to_le_bytes());
        b[8] = self.kind;
        b[9] = available;
        b[12..16].copy_from_slice(&self.nsid.to_le_bytes());
        b
    }
}

#[cfg(test)]
mod tests;

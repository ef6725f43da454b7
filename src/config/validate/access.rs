//! The sections of the configuration that say who may do what: `hosts[]` (DH-HMAC-CHAP
//! secrets and TLS PSKs, inline or from owner-only files), `require_auth` against them,
//! `reservations:`, `referrals[]` and a subsystem's `ana_groups[]`. Part of the one
//! `Checker` walk of `validate.rs`, kept apart for length.

use super::*;

impl Checker<'_> {
    /// `hosts[]`: NQNs, secrets (inline or from owner-only files), algorithm lists.
    pub(super) fn hosts(&mut self, raw: &[Spanned<RawHost>]) -> Vec<HostConfig> {
        let mut seen: HashMap<String, Seen> = HashMap::new();
        let mut out = Vec::new();
        for (i, h) in raw.iter().enumerate() {
            let p = format!("hosts[{i}]");
            let h = &h.value;
            if let Err(msg) = check_nqn(&h.nqn.value) {
                self.error(&h.nqn, format!("{p}.nqn"), msg.to_string());
            } else if h.nqn.value == DISCOVERY_NQN {
                self.error(
                    &h.nqn,
                    format!("{p}.nqn"),
                    "the discovery NQN is not a host",
                );
            }
            if let Some(first) = seen.get(&h.nqn.value) {
                let msg = format!("host {:?} is listed twice (first: {first})", h.nqn.value);
                self.error(&h.nqn, format!("{p}.nqn"), msg);
            } else {
                seen.insert(h.nqn.value.clone(), Seen::new(format!("{p}.nqn"), &h.nqn));
            }
            let secret = self
                .secret_text(&h.dhchap_secret, &h.dhchap_secret_file, &p, "dhchap_secret")
                .and_then(|(text, at, field)| {
                    nvmf::auth::key::DhchapKey::parse(&text)
                        .map_err(|e| self.error_at(at, field, e.to_string()))
                        .ok()
                });
            let ctrl_secret = self
                .secret_text(
                    &h.dhchap_ctrl_secret,
                    &h.dhchap_ctrl_secret_file,
                    &p,
                    "dhchap_ctrl_secret",
                )
                .and_then(|(text, at, field)| {
                    nvmf::auth::key::DhchapKey::parse(&text)
                        .map_err(|e| self.error_at(at, field, e.to_string()))
                        .ok()
                });
            let has_secret = h.dhchap_secret.is_some() || h.dhchap_secret_file.is_some();
            let has_ctrl = h.dhchap_ctrl_secret.is_some() || h.dhchap_ctrl_secret_file.is_some();
            if has_ctrl && !has_secret {
                let at = h
                    .dhchap_ctrl_secret
                    .as_ref()
                    .or(h.dhchap_ctrl_secret_file.as_ref())
                    .map_or(h.nqn.referenced, |s| s.referenced);
                self.error_at(
                    at,
                    format!("{p}.dhchap_ctrl_secret"),
                    "a controller secret needs a host secret (dhchap_secret) too",
                );
            }
            let hashes = match &h.dhchap_hashes {
                None => nvmf::auth::HashId::ALL.to_vec(),
                Some(list) => self.names(
                    list,
                    &format!("{p}.dhchap_hashes"),
                    nvmf::auth::HashId::from_name,
                    "sha256, sha384, sha512",
                ),
            };
            let dhgroups = match &h.dhchap_dhgroups {
                None => nvmf::auth::ctrl::Policy::default().dhgroups,
                Some(list) => self.names(
                    list,
                    &format!("{p}.dhchap_dhgroups"),
                    nvmf::auth::DhGroup::from_name,
                    "null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144, ffdhe8192",
                ),
            };
            if !has_secret && (h.dhchap_hashes.is_some() || h.dhchap_dhgroups.is_some()) {
                self.error(
                    &h.nqn,
                    format!("{p}.dhchap_hashes"),
                    "DH-HMAC-CHAP settings without a dhchap_secret",
                );
            }
            let tls_psk = self
                .secret_text(&h.tls_psk, &h.tls_psk_file, &p, "tls_psk")
                .and_then(|(text, at, field)| {
                    nvmf::auth::tls::ConfiguredPsk::parse(&text)
                        .map_err(|e| self.error_at(at, field, e.to_string()))
                        .ok()
                });
            let tls_derivation = match &h.tls_psk_derivation {
                None => nvmf::auth::tls::Derivation::Rfc8446,
                Some(d) => match d.value.as_str() {
                    "rfc8446" => nvmf::auth::tls::Derivation::Rfc8446,
                    "libnvme-compat" => nvmf::auth::tls::Derivation::LibnvmeCompat,
                    other => {
                        self.error(
                            d,
                            format!("{p}.tls_psk_derivation"),
                            format!("unknown {other:?}; known: rfc8446, libnvme-compat"),
                        );
                        nvmf::auth::tls::Derivation::Rfc8446
                    }
                },
            };
            out.push(HostConfig {
                nqn: h.nqn.value.clone(),
                tls_derivation,
                dhchap: secret.map(|secret| DhchapConfig {
                    secret,
                    ctrl_secret,
                    hashes,
                    dhgroups,
                }),
                tls_psk,
            });
        }
        out
    }

    /// A list of algorithm names, each known and listed once.
    fn names<T: PartialEq>(
        &mut self,
        list: &Spanned<Vec<Spanned<String>>>,
        field: &str,
        parse: impl Fn(&str) -> Option<T>,
        known: &str,
    ) -> Vec<T> {
        if list.value.is_empty() {
            self.error(list, field, format!("must name at least one of {known}"));
        }
        let mut out = Vec::new();
        for (i, n) in list.value.iter().enumerate() {
            match parse(&n.value) {
                Some(v) if out.contains(&v) => self.error(
                    n,
                    format!("{field}[{i}]"),
                    format!("{:?} is listed twice", n.value),
                ),
                Some(v) => out.push(v),
                None => self.error(
                    n,
                    format!("{field}[{i}]"),
                    format!("unknown {:?}; known: {known}", n.value),
                ),
            }
        }
        out
    }

    /// A secret given inline (`name`) or in a file (`name_file`): its text, where to
    /// point errors about its content, and the field name. Files must not be readable or
    /// writable by group or others.
    fn secret_text(
        &mut self,
        inline: &Option<Spanned<String>>,
        file: &Option<Spanned<String>>,
        p: &str,
        name: &str,
    ) -> Option<(String, Location, String)> {
        match (inline, file) {
            (Some(_), Some(f)) => {
                self.error(
                    f,
                    format!("{p}.{name}_file"),
                    format!("give {name} or {name}_file, not both"),
                );
                None
            }
            (Some(s), None) => Some((s.value.clone(), s.referenced, format!("{p}.{name}"))),
            (None, Some(f)) => {
                use std::os::unix::fs::PermissionsExt;
                let field = format!("{p}.{name}_file");
                let resolved = self.resolve(&f.value);
                let shown = resolved.display().to_string();
                let meta = match std::fs::metadata(&resolved) {
                    Ok(m) => m,
                    Err(e) => {
                        self.error(f, field, format!("cannot read {shown}: {e}"));
                        return None;
                    }
                };
                let mode = meta.permissions().mode() & 0o777;
                if !meta.is_file() {
                    self.error(f, field, format!("{shown} is not a regular file"));
                    return None;
                }
                if mode & 0o077 != 0 {
                    self.error(
                        f,
                        field,
                        format!(
                            "{shown} has mode {mode:04o}: a secret must not be readable or \
                             writable by group or others (chmod 600 {shown})"
                        ),
                    );
                    return None;
                }
                match std::fs::read_to_string(&resolved) {
                    Ok(text) => Some((text, f.referenced, field)),
                    Err(e) => {
                        self.error(f, field, format!("cannot read {shown}: {e}"));
                        None
                    }
                }
            }
            (None, None) => None,
        }
    }

    /// `require_auth` subsystems: every host they list needs a DH-HMAC-CHAP secret.
    pub(super) fn auth_consistency(&mut self, raw: &[Spanned<RawSubsystem>], hosts: &[HostConfig]) {
        for (i, s) in raw.iter().enumerate() {
            let s = &s.value;
            if !s.require_auth {
                continue;
            }
            for (j, h) in s.hosts.iter().enumerate() {
                if !hosts.iter().any(|c| c.nqn == h.value && c.dhchap.is_some()) {
                    self.error(
                        h,
                        format!("subsystems[{i}].hosts[{j}]"),
                        format!(
                            "the subsystem requires authentication and host {:?} has no \
                             dhchap_secret in hosts[]; it could never connect",
                            h.value
                        ),
                    );
                }
            }
        }
    }

    pub(super) fn reservations(&mut self, r: &RawReservations) -> ReservationsConfig {
        let d = ReservationsConfig::default();
        let state_file = r.state_file.as_ref().and_then(|f| {
            if f.value.trim().is_empty() {
                self.error(f, "reservations.state_file", "must not be empty");
                return None;
            }
            Some(self.resolve(&f.value))
        });
        ReservationsConfig {
            state_file,
            if_missing: r.if_missing.as_ref().map_or(d.if_missing, |v| v.value),
            if_corrupt: r.if_corrupt.as_ref().map_or(d.if_corrupt, |v| v.value),
        }
    }

    pub(super) fn referrals(&mut self, raw: &[Spanned<RawReferral>]) -> Vec<ReferralConfig> {
        let mut out: Vec<ReferralConfig> = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let p = format!("referrals[{i}]");
            let r = &r.value;
            let address = match r.address.value.trim().parse::<IpAddr>() {
                Ok(a) if !a.is_unspecified() => Some(a),
                Ok(_) => {
                    let msg = "a referral needs an address hosts can reach, not a wildcard";
                    self.error(&r.address, format!("{p}.address"), msg);
                    None
                }
                Err(_) => {
                    let msg = format!(
                        "invalid IP address {:?}: expected an IPv4 or IPv6 literal",
                        r.address.value
                    );
                    self.error(&r.address, format!("{p}.address"), msg);
                    None
                }
            };
            let port = self.port(&r.port, &format!("{p}.port"));
            if let (Some(address), Some(port)) = (address, port) {
                let c = ReferralConfig {
                    transport: r.transport.value,
                    address,
                    port,
                };
                if out.contains(&c) {
                    self.error(
                        &r.port,
                        format!("{p}.port"),
                        "the same referral is listed twice",
                    );
                } else {
                    out.push(c);
                }
            }
        }
        out
    }

    /// `subsystems[].ana_groups`: IDs 1..=128, once each; states name listeners the
    /// subsystem is on.
    pub(super) fn ana_groups(
        &mut self,
        raw: &[Spanned<RawAnaGroup>],
        p: &str,
        listeners: &[String],
    ) -> Vec<AnaGroupConfig> {
        let mut seen: HashMap<u64, Seen> = HashMap::new();
        let mut out = Vec::new();
        for (i, g) in raw.iter().enumerate() {
            let gp = format!("{p}.ana_groups[{i}]");
            let id = &g.value.id;
            if !(1..=u64::from(ANA_GROUP_MAX)).contains(&id.value) {
                let msg = format!("must be 1..={ANA_GROUP_MAX}, got {}", id.value);
                self.error(id, format!("{gp}.id"), msg);
                continue;
            }
            if let Some(first) = seen.get(&id.value) {
                let msg = format!("ANA group {} is defined twice (first: {first})", id.value);
                self.error(id, format!("{gp}.id"), msg);
                continue;
            }
            seen.insert(id.value, Seen::new(gp.clone(), id));
            let mut states = Vec::new();
            for (name, state) in &g.value.states {
                if !listeners.contains(name) {
                    let msg = format!(
                        "listener {name:?} is not one of this subsystem's {}",
                        known("listeners", listeners)
                    );
                    self.error(state, format!("{gp}.states.{name}"), msg);
                    continue;
                }
                states.push((name.clone(), state.value));
            }
            out.push(AnaGroupConfig {
                id: id.value as u32,
                states,
            });
        }
        out.sort_by_key(|g| g.id);
        out
    }
}

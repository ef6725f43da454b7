//! `control:`: where the daemon's control socket lives and who may use it.
//!
//! ```yaml
//! control:
//!   path: /run/nvmf-target/control.sock   # default, see below
//!   mode: "0600"                          # file mode of the socket (default 0600)
//!   group: nvmf-admin                     # optional: peers of this primary group may use it
//!   enabled: true                         # false: no control socket at all
//! ```
//!
//! Without `path`, the socket is at [`default_socket_path`]: `/run/nvmf-target/control.sock`
//! when the daemon runs as root (the unit's `RuntimeDirectory=nvmf-target` creates the
//! directory), `$XDG_RUNTIME_DIR/nvmf-target/control.sock` otherwise, and
//! `/tmp/nvmf-target-<uid>/control.sock` when that variable is not set. `nvmf-target ctl`
//! computes the same default, so a client run by the same user finds the daemon.

use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

/// The control socket as configured (every default resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlConfig {
    /// Absolute path of the Unix socket.
    pub path: PathBuf,
    /// Permission bits of the socket file (0600 unless configured).
    pub mode: u32,
    /// A group whose members (by the peer's primary group) may use the socket, besides
    /// root and the daemon's own user.
    pub group: Option<String>,
    /// The path came from the file: failing to bind it stops the start-up. A default
    /// path that is busy or cannot be created is only a warning (tests and ad-hoc runs
    /// start many daemons at once; none of them should fail over the operator socket).
    pub explicit: bool,
}

/// Default permission bits of the socket.
pub const DEFAULT_MODE: u32 = 0o600;

/// Longest socket path Linux takes (`sun_path` is 108 bytes with its NUL).
const SUN_PATH_MAX: usize = 107;

/// The socket path used when the config does not name one (see the module docs).
pub fn default_socket_path() -> PathBuf {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from("/run/nvmf-target/control.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => Path::new(&dir).join("nvmf-target/control.sock"),
        None => PathBuf::from(format!("/tmp/nvmf-target-{uid}/control.sock")),
    }
}

impl ControlConfig {
    /// The default: enabled at [`default_socket_path`], mode 0600, no group.
    pub fn default_for_this_user() -> ControlConfig {
        ControlConfig {
            path: default_socket_path(),
            mode: DEFAULT_MODE,
            group: None,
            explicit: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawControl {
    pub enabled: Option<Spanned<bool>>,
    pub path: Option<Spanned<String>>,
    pub mode: Option<Spanned<RawMode>>,
    pub group: Option<Spanned<String>>,
}

/// A mode as written: `"0660"` (a string of octal digits), or an integer whose decimal
/// digits are read as octal (`mode: 660`). YAML readers disagree on whether `0660` is
/// octal, so the string form is the one the docs show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RawMode {
    Int(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ModeVisitor;
        impl Visitor<'_> for ModeVisitor {
            type Value = RawMode;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a file mode in octal, e.g. \"0600\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawMode, E> {
                Ok(RawMode::Int(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawMode, E> {
                u64::try_from(v)
                    .map(RawMode::Int)
                    .map_err(|_| E::custom(format!("a mode cannot be negative, got {v}")))
            }
            /// serde-saphyr reads an unquoted `0600` as the number 600 (decimal, with the
            /// leading zero): its digits are what the user wrote.
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawMode, E> {
                if v >= 0.0 && v.fract() == 0.0 && v < 1e6 {
                    Ok(RawMode::Int(v as u64))
                } else {
                    Err(E::custom(format!(
                        "{v} is not a file mode; write it as \"0600\""
                    )))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawMode, E> {
                Ok(RawMode::Text(v.to_owned()))
            }
        }
        deserializer.deserialize_any(ModeVisitor)
    }
}

/// One problem found in `control:`: where, which field, what.
pub(super) type Problem = (Location, &'static str, String);

/// Checks `control:`; `None` in the result means the socket is disabled.
pub(super) fn check(raw: Option<&Spanned<RawControl>>) -> (Option<ControlConfig>, Vec<Problem>) {
    let mut problems = Vec::new();
    let Some(raw) = raw else {
        return (Some(ControlConfig::default_for_this_user()), problems);
    };
    let raw = &raw.value;
    let mut cfg = ControlConfig::default_for_this_user();
    if let Some(p) = &raw.path {
        let path = PathBuf::from(p.value.trim());
        if !path.is_absolute() {
            problems.push((
                p.referenced,
                "control.path",
                format!("must be an absolute path, got {:?}", p.value),
            ));
        } else if path.as_os_str().len() > SUN_PATH_MAX {
            problems.push((
                p.referenced,
                "control.path",
                format!(
                    "is {} bytes long; a Unix socket path is at most {SUN_PATH_MAX} bytes",
                    path.as_os_str().len()
                ),
            ));
        }
        cfg.path = path;
        cfg.explicit = true;
    }
    if let Some(m) = &raw.mode {
        let digits = match &m.value {
            RawMode::Int(n) => n.to_string(),
            RawMode::Text(t) => t.trim().trim_start_matches("0o").to_string(),
        };
        match u32::from_str_radix(&digits, 8) {
            Ok(mode) if mode <= 0o777 && !digits.is_empty() => cfg.mode = mode,
            _ => problems.push((
                m.referenced,
                "control.mode",
                format!(
                    "invalid mode {:?}: expected permission bits in octal, 0000..0777, \
                     written as a string such as \"0600\" or \"0660\"",
                    match &m.value {
                        RawMode::Int(n) => n.to_string(),
                        RawMode::Text(t) => t.clone(),
                    }
                ),
            )),
        }
    }
    if let Some(g) = &raw.group {
        let name = g.value.trim();
        if name.is_empty() {
            problems.push((g.referenced, "control.group", "must not be empty".into()));
        } else {
            cfg.group = Some(name.to_string());
        }
    }
    let enabled = raw.enabled.as_ref().is_none_or(|e| e.value);
    (enabled.then_some(cfg), problems)
}

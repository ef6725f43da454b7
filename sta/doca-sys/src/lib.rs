//! `doca-sys`: Rust bindings of NVIDIA DOCA STA (DOCA 3.3) and of the DOCA Core calls the
//! STA flow needs, with the libraries loaded at run time.
//!
//! - The bindings are bindgen's output for the 94 `doca_sta_*` functions and the 40 Core
//!   functions listed in `core-functions.txt` (`shared/doca-sta-api.md` sections 4 and 6),
//!   with their types. `src/bindings.rs` is committed; its first lines give the exact
//!   command that produced it (`regen.sh`). With the `bindgen` feature and a DOCA SDK
//!   (`DOCA_SDK_ROOT`, or `pkg-config doca-common`), build.rs regenerates them from the
//!   SDK's own headers instead. NVIDIA's headers are not part of this repository.
//! - No function is linked. bindgen emits [`DocaLib`], a table of function pointers whose
//!   field types are the bindgen prototypes themselves, so a caller cannot call a DOCA
//!   function with a signature other than the header's. [`Doca::load`] opens the
//!   libraries with `dlopen` and fills the table; a machine without DOCA builds and runs
//!   the daemon, and asking for DOCA there gives an error naming what is missing.
//! - Corrections to what bindgen produces: [`DOCA_STA_VTOPHYS_ERROR`] (bindgen types the
//!   macro as `i32 = -1`; it is `u64::MAX`), and `struct rdma_cm_id` stays opaque
//!   (librdmacm's layout is not DOCA's to define; `sta::verbs::ffi` has the fields we read).
//!
//! Libraries and search path (first hit wins):
//! 1. every directory in `NVMF_DOCA_LIB_DIR` (colon-separated);
//! 2. `$DOCA_SDK_ROOT/lib/<arch>-linux-gnu`, `$DOCA_SDK_ROOT/lib`;
//! 3. `/opt/mellanox/doca/lib/<arch>-linux-gnu` (where the DOCA packages install);
//! 4. the dynamic loader's own search (`LD_LIBRARY_PATH`, ld.so.cache) for `libdoca_sta.so`;
//! 5. the directory of the running executable and its parent (a cargo build puts the
//!    workspace's test double, `sta/doca-double`, there as `libdoca_sta.so`).
//!
//! In a directory, `libdoca_common.so` (if present) is loaded first, then `libdoca_sta.so`
//! (else the first `libdoca_sta.so.*`), both `RTLD_NOW | RTLD_GLOBAL`, and the table is
//! resolved in the process's global scope, so a function may live in either library (the
//! double exports all of them from one). A missing symbol fails the load with its name.
//!
//! Not here: a safe wrapper (that is the `doca` engine's job), DOCA Core beyond the STA
//! flow, `doca_buf`.

// `unsafe` allowed here: the whole crate is FFI: bindgen's declarations of DOCA's C API and
// the dlopen/dlsym that fill its function table.
#![allow(unsafe_code)]

use std::ffi::{c_char, CStr};
use std::path::{Path, PathBuf};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod generated {
    #[cfg(doca_sys_regenerated)]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
    #[cfg(not(doca_sys_regenerated))]
    include!("bindings.rs");
}

pub use generated::*;

/// `doca_sta_vtophys_cb_t`'s failure value (`doca_sta_mem.h`: `0xFFFFFFFFFFFFFFFFULL`).
pub const DOCA_STA_VTOPHYS_ERROR: u64 = u64::MAX;

/// Whether the bindings in use were regenerated from an SDK at build time (else they are
/// the committed ones, from the public DOCA 3.3 headers).
pub const REGENERATED: bool = cfg!(doca_sys_regenerated);

/// The environment variable naming directories to search first.
pub const LIB_DIR_ENV: &str = "NVMF_DOCA_LIB_DIR";

/// Where the DOCA packages put the libraries on this architecture.
pub fn sdk_lib_dir() -> PathBuf {
    PathBuf::from(format!(
        "/opt/mellanox/doca/lib/{}-linux-gnu",
        std::env::consts::ARCH
    ))
}

/// Why DOCA could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// No directory had `libdoca_sta.so`; lists where we looked.
    NotFound { searched: Vec<PathBuf> },
    /// A library was found but `dlopen` refused it (a missing dependency, wrong arch).
    Open { path: PathBuf, reason: String },
    /// The libraries loaded but a function of the table is missing.
    Symbol { path: PathBuf, reason: String },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound { searched } => {
                write!(f, "DOCA STA library (libdoca_sta.so) not found; searched ")?;
                for (i, d) in searched.iter().enumerate() {
                    write!(f, "{}{}", if i > 0 { ", " } else { "" }, d.display())?;
                }
                write!(
                    f,
                    " and the dynamic loader's path; install the DOCA SDK with STA \
                     (doca-sdk-sta) or set {LIB_DIR_ENV} to the directory holding it"
                )
            }
            LoadError::Open { path, reason } => {
                write!(f, "cannot load {}: {reason}", path.display())
            }
            LoadError::Symbol { path, reason } => write!(
                f,
                "{} lacks a DOCA function the engine needs ({reason}); DOCA 3.3 or a \
                 compatible STA is required",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// The loaded DOCA libraries and their function table.
pub struct Doca {
    lib: DocaLib,
    paths: Vec<PathBuf>,
    double: bool,
    _handles: Vec<libloading::Library>,
}

impl std::ops::Deref for Doca {
    type Target = DocaLib;
    fn deref(&self) -> &DocaLib {
        &self.lib
    }
}

impl std::fmt::Debug for Doca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doca")
            .field("paths", &self.paths)
            .field("double", &self.double)
            .finish()
    }
}

fn find_in(dir: &Path, stem: &str) -> Option<PathBuf> {
    let exact = dir.join(format!("{stem}.so"));
    if exact.is_file() {
        return Some(exact);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{stem}.so.")))
        })
        .collect();
    v.sort();
    v.into_iter().next()
}

/// The directories searched, in order (see the crate docs).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(s) = std::env::var_os(LIB_DIR_ENV) {
        v.extend(std::env::split_paths(&s).filter(|p| !p.as_os_str().is_empty()));
    }
    if let Some(root) = std::env::var_os("DOCA_SDK_ROOT") {
        let root = PathBuf::from(root);
        v.push(root.join(format!("lib/{}-linux-gnu", std::env::consts::ARCH)));
        v.push(root.join("lib"));
    }
    v.push(sdk_lib_dir());
    v
}

fn exe_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        if let Some(p) = d.parent() {
            v.push(d.clone());
            v.push(p.to_path_buf());
        } else {
            v.push(d);
        }
    }
    v
}

fn open_global(path: &Path) -> Result<libloading::Library, LoadError> {
    // SAFETY: loading a shared library runs its initialisers; DOCA's and the double's
    // have no preconditions. RTLD_GLOBAL puts its symbols in the global scope that the
    // table is resolved from.
    unsafe {
        libloading::os::unix::Library::open(
            Some(path),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .map(Into::into)
    .map_err(|e| LoadError::Open {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

impl Doca {
    /// Load from the search path (crate docs).
    pub fn load() -> Result<Doca, LoadError> {
        let mut searched = search_dirs();
        for d in &searched {
            if let Some(sta) = find_in(d, "libdoca_sta") {
                return Doca::load_files(find_in(d, "libdoca_common").as_deref(), &sta);
            }
        }
        // The dynamic loader's own search, by name.
        if let Ok(h) = open_global(Path::new("libdoca_sta.so")) {
            let mut d = Doca::from_handles(vec![h], vec![PathBuf::from("libdoca_sta.so")])?;
            if let Some(p) = d.symbol_file() {
                d.paths = vec![p];
            }
            return Ok(d);
        }
        for d in exe_dirs() {
            if let Some(sta) = find_in(&d, "libdoca_sta") {
                return Doca::load_files(find_in(&d, "libdoca_common").as_deref(), &sta);
            }
            searched.push(d);
        }
        Err(LoadError::NotFound { searched })
    }

    /// Load `libdoca_sta` (and first `libdoca_common`, when given) from these files.
    pub fn load_files(common: Option<&Path>, sta: &Path) -> Result<Doca, LoadError> {
        let mut handles = Vec::new();
        let mut paths = Vec::new();
        if let Some(c) = common {
            handles.push(open_global(c)?);
            paths.push(c.to_path_buf());
        }
        handles.push(open_global(sta)?);
        paths.push(sta.to_path_buf());
        Doca::from_handles(handles, paths)
    }

    fn from_handles(
        handles: Vec<libloading::Library>,
        paths: Vec<PathBuf>,
    ) -> Result<Doca, LoadError> {
        let last = paths.last().cloned().unwrap_or_default();
        // SAFETY: dlopen(NULL) gives the global scope; every symbol the table resolves
        // there has the prototype bindgen read from the DOCA headers (that is what the
        // libraries export), and the libraries stay loaded as long as `Doca` lives.
        let lib = unsafe { DocaLib::from_library(libloading::os::unix::Library::this()) }.map_err(
            |e| LoadError::Symbol {
                path: last.clone(),
                reason: e.to_string(),
            },
        )?;
        let double = handles.iter().any(|h| {
            // SAFETY: only the presence of the symbol is checked; it is not called.
            unsafe { h.get::<*const u8>(b"doca_double_version\0") }.is_ok()
        });
        Ok(Doca {
            lib,
            paths,
            double,
            _handles: handles,
        })
    }

    /// The file that defines `doca_sta_create` (dladdr), for a library found by name.
    fn symbol_file(&self) -> Option<PathBuf> {
        let mut info = libc::Dl_info {
            dli_fname: std::ptr::null(),
            dli_fbase: std::ptr::null_mut(),
            dli_sname: std::ptr::null(),
            dli_saddr: std::ptr::null_mut(),
        };
        // SAFETY: dladdr only inspects the address; `info` is a valid out parameter.
        let ok = unsafe {
            libc::dladdr(
                self.lib.doca_sta_create as *const std::ffi::c_void,
                &mut info,
            )
        };
        if ok == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated path owned by the dynamic loader, copied at once.
        let s = unsafe { CStr::from_ptr(info.dli_fname) };
        Some(PathBuf::from(s.to_string_lossy().into_owned()))
    }

    /// The library files loaded, `libdoca_sta` last.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Whether the library is the workspace's test double rather than NVIDIA's.
    pub fn is_double(&self) -> bool {
        self.double
    }

    /// `doca_error_get_name` as a Rust string.
    pub fn error_name(&self, e: doca_error_t) -> String {
        // SAFETY: doca_error_get_name returns NULL or a static NUL-terminated string.
        cstr(unsafe { (self.lib.doca_error_get_name)(e) })
    }

    /// `doca_error_get_descr` as a Rust string.
    pub fn error_descr(&self, e: doca_error_t) -> String {
        // SAFETY: as above.
        cstr(unsafe { (self.lib.doca_error_get_descr)(e) })
    }
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return "(null)".into();
    }
    // SAFETY: non-NULL, NUL-terminated, static (DOCA's contract for these getters).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `union doca_data` holding a 64-bit value.
pub fn data_u64(v: u64) -> doca_data {
    doca_data { u64_: v }
}

/// `union doca_data` holding a pointer.
pub fn data_ptr(p: *mut std::ffi::c_void) -> doca_data {
    doca_data { ptr: p }
}

/// The 64-bit view of a `union doca_data`.
pub fn data_as_u64(d: doca_data) -> u64 {
    // SAFETY: both fields are 8 bytes of plain data; any bit pattern is a valid u64.
    unsafe { d.u64_ }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_named_with_where_we_looked() {
        let e = Doca::load_files(None, Path::new("/nonexistent/libdoca_sta.so")).unwrap_err();
        assert!(
            matches!(&e, LoadError::Open { path, .. } if path.ends_with("libdoca_sta.so")),
            "{e:?}"
        );
        let nf = LoadError::NotFound {
            searched: vec![sdk_lib_dir()],
        };
        let s = nf.to_string();
        assert!(
            s.contains("/opt/mellanox/doca/lib/") && s.contains(LIB_DIR_ENV),
            "{s}"
        );
    }

    #[test]
    fn vtophys_error_is_all_ones() {
        assert_eq!(DOCA_STA_VTOPHYS_ERROR, 0xFFFF_FFFF_FFFF_FFFF);
        assert_eq!(std::mem::size_of::<doca_sta_nvme_completion_t>(), 16);
        assert_eq!(DOCA_STA_COMPLETION_SIZE, 16);
    }

    #[test]
    fn doca_data_round_trips() {
        assert_eq!(
            data_as_u64(data_u64(0xdead_beef_0000_0001)),
            0xdead_beef_0000_0001
        );
        let p = 0x1234usize as *mut std::ffi::c_void;
        assert_eq!(data_as_u64(data_ptr(p)), 0x1234);
    }
}

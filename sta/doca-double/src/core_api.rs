//! DOCA Core calls of the STA flow other than PE/ctx/task: error names, devices, mmaps,
//! logging (doca-sta-api.md section 6).
//!
//! Devices are the machine's RDMA verbs devices (rdma-core loaded at run time; Soft-RoCE
//! `rxe0` in the interop VM), plus the names in `DOCA_DOUBLE_TEST_DEVICES`
//! (comma-separated): test devices without verbs, so the control plane can be exercised
//! where no RDMA device exists. Every device reports STA support. A device info object
//! lives as long as the process; `doca_devinfo_destroy_list` frees the array only.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, CStr};

use doca_sys::*;

use crate::contract::{self, broken, code, finish, Res};
use crate::out;
use crate::world::{ptr, world, Dev, DevInfo, Kind, Mmap, World};

macro_rules! errors {
    ($($v:ident => $name:literal, $descr:literal;)*) => {
        fn error_strings(e: doca_error_t) -> (&'static CStr, &'static CStr) {
            match e {
                $($v => ($name, $descr),)*
                _ => (c"DOCA_ERROR_UNKNOWN", c"Unknown error"),
            }
        }
    };
}

errors! {
    DOCA_SUCCESS => c"DOCA_SUCCESS", c"Success";
    DOCA_ERROR_UNKNOWN => c"DOCA_ERROR_UNKNOWN", c"Unknown error";
    DOCA_ERROR_NOT_PERMITTED => c"DOCA_ERROR_NOT_PERMITTED", c"Operation not permitted";
    DOCA_ERROR_IN_USE => c"DOCA_ERROR_IN_USE", c"Resource in use";
    DOCA_ERROR_NOT_SUPPORTED => c"DOCA_ERROR_NOT_SUPPORTED", c"Operation not supported";
    DOCA_ERROR_AGAIN => c"DOCA_ERROR_AGAIN", c"Resource temporarily unavailable, try again";
    DOCA_ERROR_INVALID_VALUE => c"DOCA_ERROR_INVALID_VALUE", c"Invalid input";
    DOCA_ERROR_NO_MEMORY => c"DOCA_ERROR_NO_MEMORY", c"Memory allocation failure";
    DOCA_ERROR_INITIALIZATION => c"DOCA_ERROR_INITIALIZATION", c"Resource initialization failure";
    DOCA_ERROR_TIME_OUT => c"DOCA_ERROR_TIME_OUT", c"Timer expired waiting for resource";
    DOCA_ERROR_SHUTDOWN => c"DOCA_ERROR_SHUTDOWN", c"Shut down in process or completed";
    DOCA_ERROR_CONNECTION_RESET => c"DOCA_ERROR_CONNECTION_RESET", c"Connection reset by peer";
    DOCA_ERROR_CONNECTION_ABORTED => c"DOCA_ERROR_CONNECTION_ABORTED", c"Connection aborted";
    DOCA_ERROR_CONNECTION_INPROGRESS => c"DOCA_ERROR_CONNECTION_INPROGRESS", c"Connection in progress";
    DOCA_ERROR_NOT_CONNECTED => c"DOCA_ERROR_NOT_CONNECTED", c"Not connected";
    DOCA_ERROR_NO_LOCK => c"DOCA_ERROR_NO_LOCK", c"Unable to acquire the required lock";
    DOCA_ERROR_NOT_FOUND => c"DOCA_ERROR_NOT_FOUND", c"Resource not found";
    DOCA_ERROR_IO_FAILED => c"DOCA_ERROR_IO_FAILED", c"Input/output operation failed";
    DOCA_ERROR_BAD_STATE => c"DOCA_ERROR_BAD_STATE", c"Bad state";
    DOCA_ERROR_UNSUPPORTED_VERSION => c"DOCA_ERROR_UNSUPPORTED_VERSION", c"Unsupported version";
    DOCA_ERROR_OPERATING_SYSTEM => c"DOCA_ERROR_OPERATING_SYSTEM", c"Operating system call failure";
    DOCA_ERROR_DRIVER => c"DOCA_ERROR_DRIVER", c"Driver call failure";
    DOCA_ERROR_UNEXPECTED => c"DOCA_ERROR_UNEXPECTED", c"Unexpected result";
    DOCA_ERROR_ALREADY_EXIST => c"DOCA_ERROR_ALREADY_EXIST", c"Resource already exists";
    DOCA_ERROR_FULL => c"DOCA_ERROR_FULL", c"No more space in resource";
    DOCA_ERROR_EMPTY => c"DOCA_ERROR_EMPTY", c"No entry is available in resource";
    DOCA_ERROR_IN_PROGRESS => c"DOCA_ERROR_IN_PROGRESS", c"Operation is in progress";
    DOCA_ERROR_TOO_BIG => c"DOCA_ERROR_TOO_BIG", c"Requested operation too big to be contained";
    DOCA_ERROR_AUTHENTICATION => c"DOCA_ERROR_AUTHENTICATION", c"Authentication failure";
    DOCA_ERROR_BAD_CONFIG => c"DOCA_ERROR_BAD_CONFIG", c"Configuration is not valid";
    DOCA_ERROR_SKIPPED => c"DOCA_ERROR_SKIPPED", c"Result is valid, but some previous output data was dropped";
    DOCA_ERROR_DEVICE_FATAL_ERROR => c"DOCA_ERROR_DEVICE_FATAL_ERROR", c"Device experienced a fatal error";
}

#[no_mangle]
pub extern "C" fn doca_error_get_name(e: doca_error_t) -> *const c_char {
    error_strings(e).0.as_ptr()
}

#[no_mangle]
pub extern "C" fn doca_error_get_descr(e: doca_error_t) -> *const c_char {
    error_strings(e).1.as_ptr()
}

// --- devices ----------------------------------------------------------------------------

fn read_trim(p: &str) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Names of the verbs devices (empty without rdma-core or without devices).
fn verbs_devices() -> Vec<String> {
    let Ok(lib) = sta::verbs::lib() else {
        return Vec::new();
    };
    // ibv_get_device_name is not in sta's table; look it up in the same library.
    // SAFETY: libibverbs is already loaded (sta::verbs::lib succeeded); opening it again
    // only takes a reference.
    let Ok(verbs) = (unsafe { libloading::Library::new("libibverbs.so.1") }) else {
        return Vec::new();
    };
    // SAFETY: ibv_get_device_name(struct ibv_device *) -> const char *, rdma-core 44 ABI.
    let Ok(name_of) = (unsafe {
        verbs.get::<unsafe extern "C" fn(*mut std::ffi::c_void) -> *const c_char>(
            b"ibv_get_device_name\0",
        )
    }) else {
        return Vec::new();
    };
    let mut n = 0;
    // SAFETY: writes the count; returns a NULL-terminated array freed below.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut v = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` has `n` entries; each name is a NUL-terminated string owned by
        // the device, copied at once.
        unsafe {
            let d = *list.add(i);
            let p = name_of(d);
            if !p.is_null() {
                v.push(CStr::from_ptr(p).to_string_lossy().into_owned());
            }
        }
    }
    // SAFETY: freed once.
    unsafe { (lib.free_device_list)(list) };
    v
}

fn devinfo_for(w: &mut World, name: &str, verbs: bool) -> u64 {
    if let Some(&id) = w.devinfo_by_name.get(name) {
        return id;
    }
    let sys = format!("/sys/class/infiniband/{name}");
    let iface = read_trim(&format!("{sys}/ports/1/gid_attrs/ndevs/0"))
        .or_else(|| {
            std::fs::read_dir(format!("{sys}/device/net"))
                .ok()?
                .flatten()
                .next()
                .map(|e| e.file_name().to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let pci = std::fs::read_link(format!("{sys}/device"))
        .ok()
        .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .filter(|s| s.len() == 12 && s.as_bytes()[4] == b':' && s.as_bytes()[7] == b':');
    let id = w.new_id(Kind::DevInfo);
    w.devinfos.insert(
        id,
        DevInfo {
            name: name.to_string(),
            iface,
            pci,
            verbs,
        },
    );
    w.devinfo_by_name.insert(name.to_string(), id);
    id
}

#[no_mangle]
pub unsafe extern "C" fn doca_devinfo_create_list(
    list: *mut *mut *mut doca_devinfo,
    nb: *mut u32,
) -> doca_error_t {
    finish(
        "doca_devinfo_create_list",
        (|| {
            out::check(list, "dev_list")?;
            out::check(nb, "nb_devs")?;
            let names = verbs_devices();
            let tests: Vec<String> = std::env::var("DOCA_DOUBLE_TEST_DEVICES")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let mut w = world();
            let mut ids: Vec<*mut doca_devinfo> = Vec::new();
            for n in &names {
                ids.push(ptr(Kind::DevInfo, devinfo_for(&mut w, n, true)));
            }
            for n in &tests {
                if !names.contains(n) {
                    ids.push(ptr(Kind::DevInfo, devinfo_for(&mut w, n, false)));
                }
            }
            let count = ids.len() as u32;
            ids.push(std::ptr::null_mut());
            let b = ids.into_boxed_slice();
            let p = b.as_ptr() as *mut *mut doca_devinfo;
            w.lists.insert(p as usize, b);
            out::put(list, p)?;
            out::put(nb, count)
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_devinfo_destroy_list(list: *mut *mut doca_devinfo) -> doca_error_t {
    finish(
        "doca_devinfo_destroy_list",
        (|| {
            let mut w = world();
            if w.lists.remove(&(list as usize)).is_none() {
                return broken(
                    &contract::HANDLE,
                    "not a list from doca_devinfo_create_list (or destroyed already)",
                );
            }
            Ok(())
        })(),
    )
}

unsafe fn copy_str(s: &str, buf: *mut c_char, size: u32) -> Res<()> {
    out::check(buf, "buffer")?;
    if s.len() + 1 > size as usize {
        return code(DOCA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller gives `size` writable bytes at `buf` (checked non-NULL);
    // len + 1 <= size.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
        *buf.add(s.len()) = 0;
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn doca_devinfo_get_ibdev_name(
    d: *const doca_devinfo,
    buf: *mut c_char,
    size: u32,
) -> doca_error_t {
    finish(
        "doca_devinfo_get_ibdev_name",
        (|| {
            let mut w = world();
            let (_, i) = w.devinfo(d)?;
            let n = i.name.clone();
            // SAFETY: see copy_str.
            unsafe { copy_str(&n, buf, size) }
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_devinfo_get_iface_name(
    d: *const doca_devinfo,
    buf: *mut c_char,
    size: u32,
) -> doca_error_t {
    finish(
        "doca_devinfo_get_iface_name",
        (|| {
            let mut w = world();
            let (_, i) = w.devinfo(d)?;
            let n = i.iface.clone();
            // SAFETY: see copy_str.
            unsafe { copy_str(&n, buf, size) }
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_devinfo_get_pci_addr_str(
    d: *const doca_devinfo,
    buf: *mut c_char,
) -> doca_error_t {
    finish(
        "doca_devinfo_get_pci_addr_str",
        (|| {
            let mut w = world();
            let (_, i) = w.devinfo(d)?;
            let Some(p) = i.pci.clone() else {
                // Soft-RoCE and test devices have no PCI function.
                return code(DOCA_ERROR_NOT_FOUND);
            };
            // SAFETY: the header documents a DOCA_DEVINFO_PCI_ADDR_SIZE buffer.
            unsafe { copy_str(&p, buf, DOCA_DEVINFO_PCI_ADDR_SIZE) }
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_dev_open(
    d: *mut doca_devinfo,
    dev: *mut *mut doca_dev,
) -> doca_error_t {
    finish(
        "doca_dev_open",
        (|| {
            out::check(dev, "dev")?;
            let mut w = world();
            let (info, _) = w.devinfo(d)?;
            let id = w.new_id(Kind::Dev);
            w.devs.insert(id, Dev { info });
            out::put(dev, ptr(Kind::Dev, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_dev_close(dev: *mut doca_dev) -> doca_error_t {
    finish(
        "doca_dev_close",
        (|| {
            let mut w = world();
            let (id, _) = w.dev(dev)?;
            let user = if w
                .stas
                .values()
                .any(|s| s.dev == id || s.net_devs.contains(&id))
            {
                Some("a doca_sta")
            } else if w.mmaps.values().any(|m| m.devs.contains(&id)) {
                Some("a doca_mmap")
            } else if w.subs.values().any(|s| s.devs.contains(&id)) {
                Some("a subsystem")
            } else if w.qps.values().any(|q| q.dev == id) {
                Some("a QP")
            } else {
                None
            };
            if let Some(u) = user {
                return broken(
                    &contract::TEARDOWN,
                    format!("device #{id} closed while {u} still uses it"),
                );
            }
            w.devs.remove(&id);
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_dev_as_devinfo(dev: *const doca_dev) -> *mut doca_devinfo {
    let mut w = world();
    match w.dev(dev) {
        Ok((_, d)) => ptr(Kind::DevInfo, d.info),
        Err(b) => {
            drop(w);
            contract::violation("doca_dev_as_devinfo", b.rule, b.detail);
            std::ptr::null_mut()
        }
    }
}

// --- mmap -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_create(m: *mut *mut doca_mmap) -> doca_error_t {
    finish(
        "doca_mmap_create",
        (|| {
            out::check(m, "mmap")?;
            let mut w = world();
            let id = w.new_id(Kind::Mmap);
            w.mmaps.insert(
                id,
                Mmap {
                    devs: Vec::new(),
                    addr: 0,
                    len: 0,
                    dmabuf: false,
                    perms: DOCA_ACCESS_FLAG_LOCAL_READ_ONLY,
                    started: false,
                    users: 0,
                },
            );
            out::put(m, ptr(Kind::Mmap, id))
        })(),
    )
}

pub(crate) fn configurable(w: &mut World, m: *mut doca_mmap) -> Res<u64> {
    let (id, x) = w.mmap(m)?;
    if x.started {
        return broken(
            &contract::MMAP_STATE,
            "mmap configured after doca_mmap_start",
        );
    }
    Ok(id)
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_add_dev(m: *mut doca_mmap, dev: *mut doca_dev) -> doca_error_t {
    finish(
        "doca_mmap_add_dev",
        (|| {
            let mut w = world();
            let id = configurable(&mut w, m)?;
            let (d, _) = w.dev(dev)?;
            let x = w.mmaps.get_mut(&id).expect("live");
            if !x.devs.contains(&d) {
                x.devs.push(d);
            }
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_set_memrange(
    m: *mut doca_mmap,
    addr: *mut std::ffi::c_void,
    len: usize,
) -> doca_error_t {
    finish(
        "doca_mmap_set_memrange",
        (|| {
            let mut w = world();
            let id = configurable(&mut w, m)?;
            if addr.is_null() || len == 0 {
                return broken(
                    &contract::NULL_ARG,
                    "memory range with a NULL address or zero length",
                );
            }
            let x = w.mmaps.get_mut(&id).expect("live");
            x.addr = addr as usize;
            x.len = len;
            x.dmabuf = false;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_set_dmabuf_memrange(
    m: *mut doca_mmap,
    fd: std::ffi::c_int,
    addr: *mut std::ffi::c_void,
    _off: usize,
    len: usize,
) -> doca_error_t {
    finish(
        "doca_mmap_set_dmabuf_memrange",
        (|| {
            let mut w = world();
            let id = configurable(&mut w, m)?;
            if addr.is_null() || len == 0 || fd < 0 {
                return broken(
                    &contract::NULL_ARG,
                    "dmabuf range with a bad descriptor, NULL address or zero length",
                );
            }
            let x = w.mmaps.get_mut(&id).expect("live");
            x.addr = addr as usize;
            x.len = len;
            x.dmabuf = true;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_set_permissions(m: *mut doca_mmap, mask: u32) -> doca_error_t {
    finish(
        "doca_mmap_set_permissions",
        (|| {
            let mut w = world();
            let id = configurable(&mut w, m)?;
            w.mmaps.get_mut(&id).expect("live").perms = mask;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_start(m: *mut doca_mmap) -> doca_error_t {
    finish(
        "doca_mmap_start",
        (|| {
            let mut w = world();
            let id = configurable(&mut w, m)?;
            let x = w.mmaps.get_mut(&id).expect("live");
            if x.len == 0 {
                return broken(
                    &contract::MMAP_STATE,
                    "doca_mmap_start without a memory range",
                );
            }
            if x.devs.is_empty() {
                return broken(
                    &contract::MMAP_STATE,
                    "doca_mmap_start without a device (doca_mmap_add_dev)",
                );
            }
            x.started = true;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_stop(m: *mut doca_mmap) -> doca_error_t {
    finish(
        "doca_mmap_stop",
        (|| {
            let mut w = world();
            let (_, x) = w.mmap(m)?;
            if !x.started {
                return broken(
                    &contract::MMAP_STATE,
                    "doca_mmap_stop of an mmap that is not started",
                );
            }
            if x.users > 0 {
                return broken(
                    &contract::MMAP_STATE,
                    "doca_mmap_stop while a backend queue uses the mmap",
                );
            }
            x.started = false;
            Ok(())
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_mmap_destroy(m: *mut doca_mmap) -> doca_error_t {
    finish(
        "doca_mmap_destroy",
        (|| {
            let mut w = world();
            let (id, x) = w.mmap(m)?;
            if x.users > 0 {
                return broken(
                    &contract::MMAP_STATE,
                    "doca_mmap_destroy while a backend queue uses the mmap",
                );
            }
            w.mmaps.remove(&id);
            Ok(())
        })(),
    )
}

// --- log --------------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn doca_log_backend_create_standard() -> doca_error_t {
    DOCA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn doca_log_backend_create_with_file_sdk(
    f: *mut FILE,
    b: *mut *mut doca_log_backend,
) -> doca_error_t {
    finish(
        "doca_log_backend_create_with_file_sdk",
        (|| {
            out::check(f, "fptr")?;
            out::check(b, "backend")?;
            let mut w = world();
            let id = w.new_id(Kind::LogBackend);
            w.logs.insert(id, ());
            out::put(b, ptr(Kind::LogBackend, id))
        })(),
    )
}

#[no_mangle]
pub unsafe extern "C" fn doca_log_backend_set_sdk_level(
    b: *mut doca_log_backend,
    level: u32,
) -> doca_error_t {
    finish(
        "doca_log_backend_set_sdk_level",
        (|| {
            let w = world();
            let id = w.id_of(Kind::LogBackend, b as u64)?;
            if !w.logs.contains_key(&id) {
                return Err(w.missing(Kind::LogBackend, id).into());
            }
            if !(DOCA_LOG_LEVEL_DISABLE..=DOCA_LOG_LEVEL_TRACE).contains(&level)
                || !level.is_multiple_of(10)
            {
                return broken(
                    &contract::RANGE,
                    format!("log level {level} is not a doca_log_level"),
                );
            }
            Ok(())
        })(),
    )
}

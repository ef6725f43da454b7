//! Picks the bindings: regenerated from a real DOCA SDK when one is found and the
//! `bindgen` feature is on, else the committed `src/bindings.rs` (see regen.sh, which
//! produced it with the same options as `generate` below).

use std::path::PathBuf;
use std::process::Command;

/// The include directory of a DOCA SDK: `$DOCA_SDK_ROOT/include`, or what
/// `pkg-config --cflags-only-I doca-common` names; only if it holds doca_sta.h.
fn sdk_include() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Some(root) = std::env::var_os("DOCA_SDK_ROOT") {
        cands.push(PathBuf::from(root).join("include"));
    }
    if let Ok(out) = Command::new("pkg-config")
        .args(["--cflags-only-I", "doca-common"])
        .output()
    {
        if out.status.success() {
            for w in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(p) = w.strip_prefix("-I") {
                    cands.push(PathBuf::from(p));
                }
            }
        }
    }
    cands.into_iter().find(|d| d.join("doca_sta.h").is_file())
}

#[cfg(feature = "bindgen")]
fn generate(inc: &std::path::Path, out: &std::path::Path) {
    let core: Vec<String> = std::fs::read_to_string("core-functions.txt")
        .expect("core-functions.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    let b = bindgen::Builder::default()
        .header("wrapper.h")
        .dynamic_library_name("DocaLib")
        .dynamic_link_require_all(true)
        .generate_comments(false)
        .allowlist_function(format!("doca_sta_.*|{}", core.join("|")))
        .allowlist_type(
            "doca_sta_.*|dpa_sta_.*|doca_ctx_states|doca_access_flag|doca_log_level|doca_data|doca_error",
        )
        .allowlist_var("DOCA_STA_.*|DOCA_DEVINFO_.*_SIZE")
        .blocklist_item("DOCA_STA_VTOPHYS_ERROR")
        .opaque_type("FILE|_IO_FILE")
        .prepend_enum_name(false)
        .clang_arg("-DDOCA_ALLOW_EXPERIMENTAL_API")
        .clang_arg(format!("-I{}", inc.display()));
    let bindings = b.generate().unwrap_or_else(|e| {
        panic!(
            "doca-sys: bindgen failed on the DOCA headers in {}: {e}",
            inc.display()
        )
    });
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(doca_sys_regenerated)");
    println!("cargo::rerun-if-env-changed=DOCA_SDK_ROOT");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-changed=wrapper.h");
    println!("cargo::rerun-if-changed=core-functions.txt");
    println!("cargo::rerun-if-changed=src/bindings.rs");
    let Some(inc) = sdk_include() else { return };
    #[cfg(feature = "bindgen")]
    {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        generate(&inc, &out);
        println!("cargo::rustc-cfg=doca_sys_regenerated");
        println!(
            "cargo::warning=doca-sys: bindings regenerated from the DOCA SDK headers in {}",
            inc.display()
        );
    }
    #[cfg(not(feature = "bindgen"))]
    println!(
        "cargo::warning=doca-sys: a DOCA SDK is at {} but the `bindgen` feature is off; \
         using the committed bindings (DOCA 3.3 headers)",
        inc.display()
    );
}

//! Our headers (include/) declare exactly the functions NVIDIA's DOCA 3.3 headers do:
//! bindgen, run on ours with the command recorded at the top of doca-sys's committed
//! bindings (which came from NVIDIA's), must produce the same function table, field by
//! field. Needs bindgen-cli and libclang; without them the test is SKIPPED
//! (`skip/mod.rs`): the probe runs bindgen on a one-line header first.

#[path = "../../../tests/common/skip.rs"]
mod skip;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn table(src: &str) -> BTreeMap<String, String> {
    let body = src
        .split("pub struct DocaLib {")
        .nth(1)
        .expect("DocaLib")
        .split("\n}")
        .next()
        .expect("end");
    let flat = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = BTreeMap::new();
    for part in flat.split(" pub ").map(|p| p.trim_start_matches("pub ")) {
        if let Some((name, ty)) = part.split_once(": ") {
            if name.starts_with("doca_") {
                out.insert(name.to_string(), ty.trim_end_matches(',').to_string());
            }
        }
    }
    out
}

fn main() {
    skip::run(vec![skip::trial(
        "bindgen_over_our_headers_gives_the_same_table",
        bindgen_works().err(),
        bindgen_over_our_headers_gives_the_same_table,
    )]);
}

/// bindgen-cli is installed and finds libclang: it translates a one-line header.
fn bindgen_works() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("doca-double-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let h = dir.join("probe.h");
    std::fs::write(&h, "int probe(int x);\n").map_err(|e| e.to_string())?;
    let r = match Command::new("bindgen").arg(&h).output() {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("probe") => {
            Ok(())
        }
        Ok(o) => Err(format!(
            "bindgen cannot run here: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )),
        Err(e) => Err(format!("bindgen-cli not installed ({e})")),
    };
    // Best effort: a leftover probe file in the temp directory harms nothing.
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("removing {}: {e}", dir.display());
    }
    r
}

fn bindgen_over_our_headers_gives_the_same_table() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let committed = std::fs::read_to_string(root.join("sta/doca-sys/src/bindings.rs")).unwrap();
    let cmd = committed
        .lines()
        .find(|l| l.starts_with("//   bindgen "))
        .expect("the recorded command");
    let args: Vec<String> = cmd
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect();
    let ours = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include");
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            if a == "-I<doca-include-dir>" {
                format!("-I{}", ours.display())
            } else {
                a
            }
        })
        .collect();
    let out = match Command::new("bindgen")
        .current_dir(&root)
        .arg("sta/doca-sys/wrapper.h")
        .args(
            &args[..args
                .iter()
                .position(|a| a == "-DDOCA_ALLOW_EXPERIMENTAL_API")
                .unwrap()],
        )
        .arg("--")
        .args(
            &args[args
                .iter()
                .position(|a| a == "-DDOCA_ALLOW_EXPERIMENTAL_API")
                .unwrap()..],
        )
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("bindgen ran for the probe but not now: {e}"),
    };
    assert!(
        out.status.success(),
        "bindgen over our headers failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = table(&committed);
    let b = table(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(a.len(), 134);
    for (k, v) in &a {
        assert_eq!(b.get(k), Some(v), "{k}");
    }
    assert_eq!(a.len(), b.len());
}

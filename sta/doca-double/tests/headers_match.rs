//! Our headers (include/) declare exactly the functions NVIDIA's DOCA 3.3 headers do:
//! bindgen, run on ours with the command recorded at the top of doca-sys's committed
//! bindings (which came from NVIDIA's), must produce the same function table, field by
//! field. Needs bindgen-cli and libclang; without them the test says SKIPPED.

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

#[test]
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
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            println!(
                "SKIPPED: bindgen could not run here: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
            );
            return;
        }
        Err(e) => {
            println!("SKIPPED: bindgen-cli not installed ({e})");
            return;
        }
    };
    let a = table(&committed);
    let b = table(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(a.len(), 134);
    for (k, v) in &a {
        assert_eq!(b.get(k), Some(v), "{k}");
    }
    assert_eq!(a.len(), b.len());
}

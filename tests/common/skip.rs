//! The skip convention for tests whose precondition is known only at run time (a device,
//! a tool, a privilege). libtest has no "skipped": a test that returns early is counted
//! as passed. So such tests live in test targets with `harness = false` run by
//! libtest-mimic: the precondition is checked when the list is built; when it is
//! missing, the test is listed as `ignored` (never `ok`, and counted under "ignored" in
//! the summary) and `SKIPPED: <test>: <reason>` goes to stderr, where
//! the workspace's `tests/run-all.sh` collects it for its list of skipped tests. Forced with
//! `--ignored`, a skipped test fails, saying what is missing.
//!
//! Tests whose precondition is known when they are written are `#[ignore = "reason"]`.

use libtest_mimic::{Arguments, Failed, Trial};

/// Test `name`: it runs when `missing` is `None`, and is skipped with that reason
/// otherwise. A panic in `test` fails it.
pub fn trial(name: &str, missing: Option<String>, test: fn()) -> Trial {
    match missing {
        None => Trial::test(name, move || {
            test();
            Ok(())
        }),
        Some(why) => {
            eprintln!("SKIPPED: {name}: {why}");
            Trial::test(name, move || {
                Err(Failed::from(format!("cannot run here: {why}")))
            })
            .with_ignored_flag(true)
        }
    }
}

/// Run the trials as libtest would (same arguments, same summary line).
pub fn run(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}

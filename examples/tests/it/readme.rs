//! The README's program is a real program: the block in README.md is
//! `examples/src/bin/readme.rs` exactly, and it runs as written on the
//! embedded default — twice, the second run finding only duplicates.

use std::process::Command;

/// The first ```rust block of the README.
fn readme_block() -> String {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("```rust\n")
        .expect("the README has a ```rust block")
        + "```rust\n".len();
    let length = readme[start..].find("```\n").expect("the block ends");
    readme[start..start + length].to_owned()
}

/// `readme.rs` without its `//!` header (how to run it) and the blank line after it.
fn example_body() -> String {
    let source = include_str!("../../src/bin/readme.rs");
    let body: Vec<&str> = source
        .lines()
        .skip_while(|line| line.starts_with("//!"))
        .collect();
    let body = body
        .strip_prefix(&[""][..])
        .expect("a blank line after the header");
    let mut joined = body.join("\n");
    joined.push('\n');
    joined
}

#[test]
fn the_readme_block_is_the_example_exactly() {
    let (readme, example) = (readme_block(), example_body());
    if readme != example {
        let first_difference = readme
            .lines()
            .zip(example.lines())
            .enumerate()
            .find(|(_, (a, b))| a != b);
        panic!(
            "README.md's ```rust block and examples/src/bin/readme.rs differ (first at {first_difference:?}); \
             copy the example into the README after `cargo fmt`"
        );
    }
}

#[test]
fn the_readme_program_runs_as_written_and_a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = || {
        let output = Command::new(env!("CARGO_BIN_EXE_readme"))
            .current_dir(dir.path())
            .output()
            .expect("run the README program");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "the README program failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    };

    let first = run();
    assert!(first.contains("evt_1: New"), "{first}");
    assert!(first.contains("evt_1: Duplicate"), "{first}");
    assert!(
        first.contains("Idempotency-Key: stripe:evt_1:send_receipt"),
        "{first}"
    );
    for step in ["credit_account", "send_receipt"] {
        assert!(
            first.contains(&format!(
                "{step:<15} done  attempts 1  key stripe:evt_1:{step}"
            )),
            "{step} done once:\n{first}"
        );
    }
    assert!(first.contains("cus_1 balance: 1200"), "{first}");
    assert!(dir.path().join("app.db").exists());

    let second = run();
    assert_eq!(second.matches("evt_1: Duplicate").count(), 2, "{second}");
    assert!(
        !second.contains("receipt for"),
        "no step ran again:\n{second}"
    );
    assert!(
        second.contains("cus_1 balance: 1200"),
        "credited once:\n{second}"
    );
}

//! The README's first command must work: the quick start runs, crashes a
//! worker process, resumes, and its own checks pass.

use std::process::Command;

#[test]
fn the_quick_start_resumes_after_a_crash_and_every_effect_happens_once() {
    let dir = std::env::temp_dir().join(format!("tickmark-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .current_dir(&dir)
        .output()
        .expect("run the quick start");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "quick start failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("exited with exit status: 70"), "{stdout}");
    assert!(stdout.contains("interrupted"), "{stdout}");
    assert!(stdout.contains("1 lease taken over"), "{stdout}");
    assert!(
        stdout.contains("evt_3   charge_card    done                2"),
        "{stdout}"
    );
    for check in [
        "ok   stock reserved once per order (transactional step): 5 rows for 5 orders",
        "ok   `charge_card` called 6 times for 5 orders",
        "ok   `send_receipt` called 5 times for 5 orders",
        "ok   charged 15000 in all for orders worth 15000",
    ] {
        assert!(stdout.contains(check), "{check}:\n{stdout}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}");
    assert!(stdout.contains("All checks passed"), "{stdout}");
    assert!(dir.join("quickstart.db").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

//! The media example: a worker process killed halfway through a long step;
//! the resumed run finishes and continues from the last finished chunk.

use std::process::Command;

#[test]
fn a_killed_long_step_resumes_from_its_last_chunk() {
    let dir = std::env::temp_dir().join(format!("tickmark-media-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_media"))
        .args(["--seconds-per-step", "2", "--dir"])
        .arg(&dir)
        .output()
        .expect("run the media example");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "media demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("transcoding (1080p) chunk"),
        "progress was shown:\n{stdout}"
    );
    assert!(stdout.contains("1 lease taken over"), "{stdout}");
    assert!(!stdout.contains("resumed from chunk 0 of"), "{stdout}");
    assert!(dir.join("job_42.published.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

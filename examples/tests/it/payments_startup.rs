//! What `payments` says before it serves: `--help` lists the receiver's
//! limit flags, and start-up warns (naming the source, never the secret)
//! about a short signing secret and a Twilio source without `--public-url`,
//! lists the kinds each mounted source has handlers for, and notes a source
//! the handlers name that is not mounted.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

#[test]
fn help_lists_the_limit_flags() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_payments"))
        .arg("--help")
        .output()
        .expect("run payments --help");
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--header-read-timeout <SECS>",
        "--body-read-timeout <SECS>",
        "--max-connections <N>",
        "--max-connection-age <SECS>",
        "--max-in-flight <N>",
        "--body-limit <BYTES>",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(help.contains("[default: 10]"), "{help}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_warns_about_short_secrets_and_twilio_without_a_public_url() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("payments.log");
    let database_url = format!("sqlite://{}", dir.path().join("payments.db").display());
    let short_secret = "tw-short";
    let mut child = Command::new(env!("CARGO_BIN_EXE_payments"))
        .current_dir(dir.path())
        .args(["--database-url", &database_url, "--listen", "127.0.0.1:0"])
        .env("TWILIO_AUTH_TOKEN", short_secret)
        .env("GITHUB_WEBHOOK_SECRET", "a-github-secret-long-enough-0123")
        .env_remove("STRIPE_WEBHOOK_SECRET")
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start payments");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("payments: listening on") {
                return;
            }
        }
        panic!("payments exited before listening");
    })
    .await
    .expect("payments starts within a minute");
    // The warnings come as the receiver starts serving, just after that
    // line; the note about unmounted sources comes last.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("does not mount")
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().await.unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("source `twilio`"))
        .collect();
    assert!(
        warnings.iter().any(|line| line.contains("8 bytes long")),
        "a short-secret warning for twilio in:\n{text}"
    );
    assert!(
        warnings.iter().any(|line| line.contains("no public URL")),
        "a public-URL warning for twilio in:\n{text}"
    );
    assert!(
        !text.contains(short_secret),
        "the secret itself is never logged:\n{text}"
    );
    assert!(
        !text
            .lines()
            .any(|line| line.contains("WARN") && line.contains("source `github`")),
        "a long secret draws no warning:\n{text}"
    );
    // Each mounted source with the kinds a handler takes (`*` here).
    assert!(
        text.lines()
            .any(|line| line.contains("webhook source mounted")
                && line.contains("github")
                && line.contains("every kind")),
        "github's handled kinds in:\n{text}"
    );
    // Stripe's handler is registered, but its secret is unset: a note, not
    // a warning (another process may receive it).
    assert!(
        text.lines().any(|line| line.contains("INFO")
            && line.contains("source `stripe`")
            && line.contains("does not mount")),
        "a note that stripe has handlers but is not mounted, in:\n{text}"
    );
}

//! A multi-minute handler: a media job with three long steps that report
//! progress, run under timeouts, keep their lease by heartbeat, and resume
//! after the process is killed — without redoing finished work.
//!
//! ```text
//! cargo run -p tickmark-examples --bin media                        # the demo, ~20 s
//! cargo run -p tickmark-examples --bin media -- --seconds-per-step 60   # three minutes
//! ```
//!
//! The demo submits one job, starts a worker **process**, SIGKILLs it in the
//! middle of `transcode`, then resumes in this process. `transcode` works in
//! chunks and keeps each finished chunk in a folder named after its
//! idempotency key, so the re-run continues from the last chunk instead of
//! starting over. While it runs, the step-status table shows each step's
//! progress (`progress`, `progress_message`); so does
//! `sqlite3 media.db 'SELECT step, state, progress, progress_message FROM tickmark_step_status'`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tickmark::{
    Engine, Handler, Handlers, NewEvent, RetryPolicy, Step, StepContext, StepError, StepOptions,
    StepResult, StepState, StepStatus, WorkerConfig,
};

/// A multi-minute media job on tickmark: progress, timeouts, heartbeats, resume.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// How long each of the three steps works (the demo kills the worker
    /// halfway through the second).
    #[arg(long, default_value_t = 6)]
    seconds_per_step: u64,
    /// Folder for the database and the outputs.
    #[arg(long, default_value = "media-demo")]
    dir: PathBuf,
    /// Internal: run as the worker process that the demo kills.
    #[arg(long, hide = true)]
    worker: bool,
}

/// Where the job's files go, and how long each step works (not stored in
/// plans: settings are resources).
struct Workshop {
    dir: PathBuf,
    step_time: Duration,
}

/// How many chunks each step's work is split into.
const CHUNKS: u32 = 10;

/// Work through `CHUNKS` chunks, reporting progress; a chunk already done by
/// an earlier (killed) attempt is skipped, because its marker is in a folder
/// named after the step's idempotency key.
async fn chunked_work(ctx: &StepContext<'_>, verb: &str) -> Result<u32, StepError> {
    let workshop = ctx.resource::<Workshop>()?;
    let folder = workshop
        .dir
        .join("work")
        .join(safe_name(ctx.idempotency_key()));
    tokio::fs::create_dir_all(&folder).await?;
    let mut resumed_from = 0;
    for chunk in 0..CHUNKS {
        let marker = folder.join(format!("chunk-{chunk:02}"));
        if tokio::fs::try_exists(&marker).await? {
            resumed_from = chunk + 1;
            continue;
        }
        if ctx.is_cancelled() {
            return Err(StepError::retryable(
                "cancelled: the lease was lost or the worker is stopping",
            ));
        }
        tokio::time::sleep(workshop.step_time / CHUNKS).await;
        tokio::fs::write(&marker, b"done").await?;
        let done = chunk + 1;
        ctx.progress(
            done as f32 / CHUNKS as f32,
            &format!("{verb} chunk {done} of {CHUNKS}"),
        )
        .await?;
    }
    Ok(resumed_from)
}

#[derive(Debug, Serialize, Deserialize)]
struct FetchSource;

#[typetag::serde(name = "media.fetch_source")]
#[async_trait::async_trait]
impl Step for FetchSource {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let resumed = chunked_work(ctx, "downloading").await?;
        Ok(json!({ "source": ctx.event().payload["url"], "resumed_from_chunk": resumed }))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Transcode {
    preset: String,
}

#[typetag::serde(name = "media.transcode")]
#[async_trait::async_trait]
impl Step for Transcode {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        let resumed = chunked_work(ctx, &format!("transcoding ({})", self.preset)).await?;
        Ok(json!({ "preset": self.preset, "resumed_from_chunk": resumed }))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Publish;

#[typetag::serde(name = "media.publish")]
#[async_trait::async_trait]
impl Step for Publish {
    async fn run(&self, ctx: &mut StepContext<'_>) -> StepResult {
        chunked_work(ctx, "uploading").await?;
        let workshop = ctx.resource::<Workshop>()?;
        let target = workshop
            .dir
            .join(format!("{}.published.json", safe_name(&ctx.event().id)));
        let temp = target.with_extension("tmp");
        let body = json!({
            "job": ctx.event().id,
            "transcode": ctx.output("transcode"),
        });
        tokio::fs::write(&temp, serde_json::to_vec_pretty(&body)?).await?;
        tokio::fs::rename(&temp, &target).await?;
        Ok(json!({ "published": target.display().to_string() }))
    }
}

fn safe_name(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn handlers(step_time: Duration) -> Handlers {
    // Each attempt may take at most three times the expected work.
    let timeout = StepOptions::timeout(step_time * 3 + Duration::from_secs(5));
    Handlers::new().on(
        "media",
        "job.submitted",
        Handler::new()
            .named_step_with("fetch_source", FetchSource, timeout)
            .named_step_with(
                "transcode",
                Transcode {
                    preset: "1080p".into(),
                },
                timeout.retry(RetryPolicy::attempts(3)),
            )
            .named_step_with("publish", Publish, timeout),
    )
}

fn worker_config(name: &str) -> WorkerConfig {
    WorkerConfig::default()
        .with_name(name)
        .with_lease(Duration::from_secs(3))
        .with_poll_every(Duration::from_millis(250))
}

async fn engine(args: &Args) -> Result<Engine, Box<dyn std::error::Error>> {
    let step_time = Duration::from_secs(args.seconds_per_step.max(1));
    let url = format!("sqlite://{}", args.dir.join("media.db").display());
    let store = tickmark::connect(&url).await?;
    Ok(
        Engine::new(store, handlers(step_time))?.with_resource(Workshop {
            dir: args.dir.clone(),
            step_time,
        }),
    )
}

/// One line: each step's state, and the running step's progress.
/// The job's step-status table, as `tickmark events show` prints it.
async fn job_steps(engine: &Engine) -> Result<Vec<StepStatus>, Box<dyn std::error::Error>> {
    let status = engine
        .event_status("media", "job_42")
        .await?
        .ok_or("job_42 was accepted, so it has a status")?;
    Ok(status.steps)
}

async fn print_progress(engine: &Engine) -> Result<(), Box<dyn std::error::Error>> {
    let parts: Vec<String> = job_steps(engine)
        .await?
        .into_iter()
        .map(
            |step| match (step.state, step.progress, step.progress_message) {
                (StepState::Running, Some(p), Some(m)) => {
                    format!(
                        "{} {:.0}% ({m}, attempt {})",
                        step.step,
                        p * 100.0,
                        step.attempts
                    )
                }
                (state, _, _) => format!("{} {state}", step.step),
            },
        )
        .collect();
    println!("    {}", parts.join(" | "));
    Ok(())
}

async fn demo(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir)?;
    let engine = engine(args).await?;
    let tickmark::Accepted::New { .. } = engine
        .accept(NewEvent::with_id(
            "media",
            "job_42",
            "job.submitted",
            json!({"url": "https://example.invalid/raw/holiday.mov"}),
        ))
        .await?
    else {
        return Err("the job was already submitted".into());
    };
    println!(
        "1. Submitted job_42: fetch_source → transcode → publish, {} s each.",
        args.seconds_per_step
    );

    println!("2. A worker process starts; we watch the step-status table and kill it halfway through transcode:");
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--worker",
            "--seconds-per-step",
            &args.seconds_per_step.to_string(),
            "--dir",
        ])
        .arg(&args.dir)
        .spawn()?;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let steps = job_steps(&engine).await?;
        let transcode = &steps[1];
        print_progress(&engine).await?;
        if transcode.state == StepState::Running && transcode.progress.unwrap_or(0.0) >= 0.5 {
            break;
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("the worker exited early: {status}").into());
        }
    }
    child.kill()?;
    let status = child.wait()?;
    println!("    worker killed ({status}); its lease on job_42 runs out in at most 3 s");

    println!("3. A new worker takes the job over and resumes at transcode, from its last finished chunk:");
    let worker = engine.worker(worker_config("rescuer"))?;
    let running = tokio::spawn(worker.run_until_idle());
    while !running.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        print_progress(&engine).await?;
    }
    let stats = running.await??;
    println!("    finished: {} lease taken over", stats.takeovers);

    let steps = job_steps(&engine).await?;
    let resumed = steps[1]
        .output
        .as_ref()
        .and_then(|o| o["resumed_from_chunk"].as_u64())
        .unwrap_or(0);
    let published = args.dir.join("job_42.published.json");
    println!("4. Result:");
    print_progress(&engine).await?;
    println!("    transcode resumed from chunk {resumed} of {CHUNKS} instead of starting over");
    println!("    published: {}", published.display());
    Ok(steps.iter().all(|s| s.state == StepState::Done) && resumed > 0 && published.exists())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.worker {
        let result = async {
            let engine = engine(&args).await?;
            engine
                .worker(worker_config("doomed"))?
                .run_until_idle()
                .await?;
            Ok::<_, Box<dyn std::error::Error>>(())
        }
        .await;
        return match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("worker failed: {error}");
                ExitCode::FAILURE
            }
        };
    }
    match demo(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("The job did not finish as expected.");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("The media demo failed: {error}");
            ExitCode::FAILURE
        }
    }
}

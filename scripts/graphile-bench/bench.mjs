// graphile-worker's throughput on the same PostgreSQL server, for
// scripts/bench-graphile (outside the test suite).
//
//   node bench.mjs --database-url URL --jobs N --concurrency C \
//       --options defaults|batched [--local-queue-size S] [--batch-delay MS]
//
// One run: a fresh schema (graphile_worker_bench_<pid>_<options>), migrated;
// N jobs of one no-op task queued with `addJobs` (timed apart, not counted);
// then `run()` at concurrency C, timed from the first job's task starting to
// the jobs table being empty (a job is done once its completion has
// committed, which with batched completion comes after the task returns);
// then `runner.stop()` and the schema dropped. Logs go to stderr; stdout gets
// one JSON line, with what the server spent per job from `run()` to the
// empty table (WAL bytes, the server's CPU) and this process's CPU per job,
// as tickmark's bench reports them per event.
//
// `defaults`: no batching (graphile-worker's defaults). `batched`: the
// batching options of graphile-worker's performance docs, in its preset, as
// in the configuration behind the docs' headline figure: `localQueue: { size }`
// (default 500, or C + 1 when larger), `completeJobBatchDelay` and
// `failJobBatchDelay` (default 0 ms). (The docs' "starting point" is size
// C + 1 and 250 ms: pass --local-queue-size and --batch-delay to try it; it
// is slower here.) Both: a pool of min(C + 1, 64) connections
// (graphile-worker warns when its pool is smaller than the concurrency),
// `pollInterval` 100 ms (as tickmark's bench), NO_LOG_SUCCESS (as
// graphile-worker's own perfTest: no log line per job).

import { EventEmitter } from "node:events";
import { readFileSync, readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";

// A first SIGINT or SIGTERM ends the run at its next step, which then stops
// the runner and drops the schema; a second one kills the process.
let interrupted = null;
let interrupt;
const interruption = new Promise((_, reject) => (interrupt = reject));
interruption.catch(() => {});
const checkInterrupted = () => {
  if (interrupted) throw new Error(`interrupted by ${interrupted}`);
};
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, () => {
    console.error(`bench.mjs: ${signal}; stopping and dropping the schema`);
    interrupted = signal;
    process.exitCode = 130;
    interrupt(new Error(`interrupted by ${signal}`));
  });
}

// Read at import time by graphile-worker, so set before importing it.
process.env.NO_LOG_SUCCESS = "1";
const { Logger, makeWorkerUtils, run } = await import("graphile-worker");

const version = JSON.parse(
  readFileSync(
    fileURLToPath(new URL("../package.json", import.meta.resolve("graphile-worker"))),
    "utf8",
  ),
).version;

function parseArgs(argv) {
  const args = {
    databaseUrl: process.env.DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test",
    jobs: 10000,
    concurrency: 16,
    options: "defaults",
    localQueueSize: null,
    batchDelay: 0,
    pool: null,
    pollInterval: 100,
    timeoutSecs: 600,
  };
  const numeric = {
    "--jobs": "jobs",
    "--concurrency": "concurrency",
    "--local-queue-size": "localQueueSize",
    "--batch-delay": "batchDelay",
    "--pool": "pool",
    "--poll-interval": "pollInterval",
    "--timeout-secs": "timeoutSecs",
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (flag === "--database-url" && value !== undefined) {
      args.databaseUrl = value;
      i++;
    } else if (flag === "--options" && (value === "defaults" || value === "batched")) {
      args.options = value;
      i++;
    } else if (flag in numeric && value !== undefined && Number.isInteger(Number(value))) {
      args[numeric[flag]] = Number(value);
      i++;
    } else {
      throw new Error(
        `bad argument ${JSON.stringify(flag)}; usage: bench.mjs [--database-url URL] ` +
          "[--jobs N] [--concurrency C] [--options defaults|batched] [--local-queue-size S] " +
          "[--batch-delay MS] [--pool P] [--poll-interval MS] [--timeout-secs S]",
      );
    }
  }
  if (args.jobs < 1 || args.concurrency < 1) throw new Error("--jobs and --concurrency must be at least 1");
  args.pool ??= Math.min(args.concurrency + 1, 64);
  args.localQueueSize ??= Math.max(500, args.concurrency + 1);
  return args;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// What the server spent over the drain, as tickmark's bench measures it
// (bench/src/bench/server_cost.rs): WAL as the distance between the flushed
// WAL positions, and the CPU of the server's processes from /proc (the
// postmaster, its exited children, its live ones), null when the server is
// not a process of this machine.
const procStat = (pid) => {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(")").pop().trim().split(/\s+/);
    const n = (i) => Number(fields[i]);
    return { parent: n(1), user: n(11), system: n(12), children: n(13) + n(14) };
  } catch {
    return null;
  }
};
const serverCpuTicks = (backend) => {
  const postmaster = procStat(backend)?.parent;
  let comm = "";
  try {
    comm = readFileSync(`/proc/${postmaster}/comm`, "utf8");
  } catch {}
  if (!comm.startsWith("postgres")) return null;
  const own = procStat(postmaster);
  let ticks = own.user + own.system + own.children;
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    const child = procStat(pid);
    if (child?.parent === postmaster) ticks += child.user + child.system;
  }
  return ticks;
};
async function serverSnapshot(utils) {
  const row = (
    await utils.withPgClient((client) =>
      client.query(
        "select pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::float8 as flushed, pg_backend_pid() as backend",
      ),
    )
  ).rows[0];
  return { wal: Number(row.flushed), cpuTicks: serverCpuTicks(row.backend), process: process.cpuUsage() };
}

// Warnings and errors to stderr; info and debug dropped.
const logger = new Logger((scope) => (level, message) => {
  if (level === "error" || level === "warning") {
    console.error(`[graphile-worker${scope.label ? ` ${scope.label}` : ""}] ${level}: ${message}`);
  }
});

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const schema = `graphile_worker_bench_${process.pid}_${args.options}`;
  const shared = { connectionString: args.databaseUrl, schema, logger };
  const preset =
    args.options === "batched"
      ? {
          worker: {
            localQueue: { size: args.localQueueSize },
            completeJobBatchDelay: args.batchDelay,
            failJobBatchDelay: args.batchDelay,
          },
        }
      : { worker: {} };

  checkInterrupted();
  const utils = await makeWorkerUtils({ ...shared, maxPoolSize: 2 });
  const count = async () =>
    Number(
      (await utils.withPgClient((client) => client.query(`select count(*) as n from "${schema}"._private_jobs`)))
        .rows[0].n,
    );
  let runner = null;
  const cleanup = async () => {
    try {
      if (runner) await runner.stop();
    } finally {
      await utils.withPgClient((client) => client.query(`drop schema if exists "${schema}" cascade`));
      await utils.release();
    }
  };
  try {
    await utils.migrate();
    checkInterrupted();

    const enqueueStarted = performance.now();
    const chunk = 1000;
    for (let queued = 0; queued < args.jobs; queued += chunk) {
      const specs = [];
      for (let n = queued; n < Math.min(queued + chunk, args.jobs); n++) {
        specs.push({ identifier: "noop", payload: { n } });
      }
      await utils.addJobs(specs);
      checkInterrupted();
    }
    const enqueueMs = performance.now() - enqueueStarted;
    const queued = await count();
    if (queued !== args.jobs) throw new Error(`queued ${queued} jobs, expected ${args.jobs}`);

    let done = 0;
    let firstStart = null;
    let allRan;
    const ran = new Promise((resolve) => (allRan = resolve));
    const events = new EventEmitter();
    let localQueue = false;
    events.on("localQueue:init", () => (localQueue = true));

    const before = await serverSnapshot(utils);
    const runStarted = performance.now();
    runner = await run({
      ...shared,
      maxPoolSize: args.pool,
      concurrency: args.concurrency,
      noHandleSignals: true,
      pollInterval: args.pollInterval,
      events,
      preset,
      taskList: {
        noop: async () => {
          firstStart ??= performance.now();
          if (++done === args.jobs) allRan();
        },
      },
    });

    checkInterrupted();
    const deadline = Date.now() + args.timeoutSecs * 1000;
    const progress = setInterval(() => console.error(`      ${done} / ${args.jobs} jobs run`), 5000);
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`timed out after ${args.timeoutSecs} s with ${done} / ${args.jobs} jobs run`)),
        args.timeoutSecs * 1000,
      );
    });
    try {
      await Promise.race([ran, timeout, interruption]);
      // Every task has returned; the last completions may still be in flight
      // (always fire-and-forget in graphile-worker, and batched here in
      // `batched`). Done once the jobs table is empty.
      while ((await count()) > 0) {
        checkInterrupted();
        if (Date.now() > deadline) throw new Error(`timed out with jobs left in ${schema}._private_jobs`);
        await sleep(1);
      }
    } finally {
      clearTimeout(timer);
      clearInterval(progress);
    }
    const finished = performance.now();
    const after = await serverSnapshot(utils);
    const seconds = (finished - firstStart) / 1000;
    const processCpu = process.cpuUsage(before.process);
    if (args.options === "batched" && !localQueue) throw new Error("localQueue was not enabled");

    console.log(
      JSON.stringify({
        system: "graphile-worker",
        version,
        options: args.options,
        concurrency: args.concurrency,
        jobs: args.jobs,
        jobs_per_s: args.jobs / seconds,
        seconds,
        startup_ms: firstStart - runStarted,
        enqueue_per_s: args.jobs / (enqueueMs / 1000),
        pool_size: args.pool,
        poll_interval_ms: args.pollInterval,
        local_queue_size: args.options === "batched" ? args.localQueueSize : null,
        complete_job_batch_delay_ms: args.options === "batched" ? args.batchDelay : null,
        fail_job_batch_delay_ms: args.options === "batched" ? args.batchDelay : null,
        // From run() to an empty jobs table, its start-up and the harness's
        // polling of the table's count included.
        db_wal_bytes_per_job: (after.wal - before.wal) / args.jobs,
        db_cpu_us_per_job:
          before.cpuTicks === null || after.cpuTicks === null
            ? null
            : ((after.cpuTicks - before.cpuTicks) * 10_000) / args.jobs,
        process_cpu_us_per_job: (processCpu.user + processCpu.system) / args.jobs,
        node: process.version,
      }),
    );
  } finally {
    await cleanup();
  }
}

main().catch((error) => {
  console.error(`bench.mjs: ${interrupted ? error?.message : (error?.stack ?? error)}`);
  process.exitCode ||= 1;
});

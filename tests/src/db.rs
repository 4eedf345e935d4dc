//! A fresh database for each test: a SQLite file in a temp dir, or a new
//! PostgreSQL schema (dropped afterwards) in the shared test database.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use sqlx::Connection;
use tickmark::store::postgres::{PostgresOptions, PostgresStore};
use tickmark::store::sqlite::SqliteStore;
use tickmark::{Backend, Store};
use tickmark_driver::store::EventRecord;

use crate::probe::Probe;

/// Where the PostgreSQL tests connect when `DATABASE_URL` is not set.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One test's database.
pub struct TestDb {
    /// The URL a worker process would use to reach exactly this database.
    pub url: String,
    /// The engine's store on it.
    pub store: Arc<dyn Store>,
    /// The probe (test tables and raw SQL) on it.
    pub probe: Probe,
    cleanup: Cleanup,
}

enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres {
        admin_url: String,
        schema: String,
    },
    PgBouncer {
        _bouncer: Box<crate::pgbouncer::PgBouncer>,
        store_url: String,
    },
}

impl TestDb {
    /// The record of event `id` from `source`; panics when there is none.
    pub async fn record_of(&self, source: &str, id: &str) -> EventRecord {
        self.store
            .event_find(source, id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("event {source}/{id} exists"))
    }

    /// A new database on `backend`, or `None` when PostgreSQL tests are skipped.
    pub async fn new(backend: Backend) -> Option<TestDb> {
        init_tracing();
        match backend {
            Backend::Sqlite => Some(Self::sqlite().await),
            Backend::Postgres => Self::postgres().await,
        }
    }

    /// A new SQLite file.
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("tickmark.db").display());
        let store = SqliteStore::connect(&url).await.expect("open SQLite");
        let probe = Probe::connect(&url).await;
        TestDb {
            url,
            store: Arc::new(store),
            probe,
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    /// A new schema in the PostgreSQL test database, or `None` when skipped.
    pub async fn postgres() -> Option<TestDb> {
        Self::postgres_with_settings(&[]).await
    }

    /// A new schema in the PostgreSQL test database whose connections (the
    /// store's, the probe's, and any made from [`url`](Self::url)) start
    /// with these server settings, as a role's `ALTER ROLE … SET` would set
    /// them, e.g. `("default_transaction_isolation", "repeatable read")`;
    /// `None` when skipped.
    pub async fn postgres_with_settings(settings: &[(&str, &str)]) -> Option<TestDb> {
        let admin_url = postgres_url()?;
        let (schema, mut url) = create_schema(&admin_url).await;
        for (name, value) in settings {
            // The server splits `options` at spaces unless escaped (`\ `).
            let value = value.replace(' ', "%5C%20");
            url.push_str(&format!("&options[{name}]={value}"));
        }
        let options = PostgresOptions {
            max_connections: 8,
            ..PostgresOptions::default()
        };
        let store = PostgresStore::connect_with(&url, options)
            .await
            .expect("open PostgreSQL store");
        let probe = Probe::connect(&url).await;
        Some(TestDb {
            url,
            store: Arc::new(store),
            probe,
            cleanup: Cleanup::Postgres { admin_url, schema },
        })
    }

    /// A new schema on the shared PostgreSQL server, whose store connects
    /// through a PgBouncer of its own in `mode` (with `listen_url` past it
    /// when `listen`), and whose probe and [`url`](Self::url) reach the
    /// same schema directly; the pooler's role defaults to `role_settings`.
    /// `None` when skipped (no PostgreSQL on purpose, or no PgBouncer).
    pub async fn through_pgbouncer(
        mode: crate::pgbouncer::PoolMode,
        listen: bool,
        role_settings: &[(&str, &str)],
    ) -> Option<TestDb> {
        init_tracing();
        let bouncer = crate::pgbouncer::PgBouncer::start(mode, role_settings).await?;
        let options = PostgresOptions {
            max_connections: 8,
            ..PostgresOptions::default()
        };
        let store_url = bouncer.url(listen);
        let store = PostgresStore::connect_with(&store_url, options)
            .await
            .unwrap_or_else(|e| panic!("open the store through PgBouncer: {e}\n{}", bouncer.log()));
        let url = bouncer.direct_url().to_owned();
        let probe = Probe::connect(&url).await;
        Some(TestDb {
            url,
            store: Arc::new(store),
            probe,
            cleanup: Cleanup::PgBouncer {
                _bouncer: Box::new(bouncer),
                store_url,
            },
        })
    }

    /// The store's URL through PgBouncer, when it goes through one
    /// ([`through_pgbouncer`](Self::through_pgbouncer)).
    pub fn pooled_url(&self) -> Option<String> {
        match &self.cleanup {
            Cleanup::PgBouncer { store_url, .. } => Some(store_url.clone()),
            _ => None,
        }
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        self.store.backend()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Cleanup::Postgres { admin_url, schema } = &self.cleanup {
            drop_schema(admin_url, schema);
        }
    }
}

/// A new, empty schema in the PostgreSQL test database, without a store
/// (nothing migrated yet), dropped with this: for tests that migrate it
/// their own way, as an older release did.
pub struct EmptySchema {
    /// A URL whose connections use the schema (`search_path`).
    pub url: String,
    admin_url: String,
    schema: String,
}

impl EmptySchema {
    /// A new schema, or `None` when PostgreSQL tests are skipped.
    pub async fn new() -> Option<EmptySchema> {
        init_tracing();
        let admin_url = postgres_url()?;
        let (schema, url) = create_schema(&admin_url).await;
        Some(EmptySchema {
            url,
            admin_url,
            schema,
        })
    }
}

impl Drop for EmptySchema {
    fn drop(&mut self) {
        drop_schema(&self.admin_url, &self.schema);
    }
}

/// A new uniquely named schema on the server at `admin_url`, and a URL
/// whose connections use it (`search_path`).
async fn create_schema(admin_url: &str) -> (String, String) {
    let schema = format!(
        "tm_{}_{}_{:04x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u16>()
    );
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {admin_url} is unreachable: {e}"));
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&mut admin)
        .await
        .expect("create test schema");
    let _ = admin.close().await;
    let separator = if admin_url.contains('?') { '&' } else { '?' };
    let url = format!("{admin_url}{separator}options[search_path]={schema}");
    (schema, url)
}

fn drop_schema(admin_url: &str, schema: &str) {
    let (admin_url, schema) = (admin_url.to_owned(), schema.to_owned());
    // Drop runs outside any runtime we may block, so use a thread of its own.
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
                let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .execute(&mut admin)
                    .await;
                let _ = admin.close().await;
            }
        });
    })
    .join();
}

/// The PostgreSQL URL for tests, or `None` when they are skipped on purpose.
pub fn postgres_url() -> Option<String> {
    let skip = std::env::var("TICKMARK_SKIP_POSTGRES").is_ok_and(|v| v == "1");
    if skip && crate::skip::in_ci() {
        panic!("TICKMARK_SKIP_POSTGRES=1 is refused when CI=true: CI must test PostgreSQL");
    }
    if skip {
        crate::skip::record(
            &crate::skip::current_test(),
            "TICKMARK_SKIP_POSTGRES=1: PostgreSQL tests skipped on purpose (unset it and run PostgreSQL at DATABASE_URL)",
        );
        return None;
    }
    Some(std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_POSTGRES_URL.to_owned()))
}

/// Log to the test's captured output; `RUST_LOG` picks the level (default warn).
pub fn init_tracing() {
    install_tracing(None);
}

/// [`init_tracing`], and traces exported as the `OTEL_*` variables say
/// (a test's worker process, pointed at a loopback collector): keep the
/// answer alive while the process runs.
pub fn init_tracing_and_traces(service_name: &str) -> Option<tickmark::otel::Traces> {
    let traces = tickmark::otel::Traces::from_env(service_name).expect("valid OTEL_* settings");
    install_tracing(traces.as_ref());
    traces
}

/// Make the process's global subscriber log as [`init_tracing`] says and,
/// given `traces`, export its spans; `false` when the process has a global
/// subscriber already (the first one stays).
pub fn install_tracing(traces: Option<&tickmark::otel::Traces>) -> bool {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(filter),
        )
        .with(traces.map(tickmark::otel::Traces::layer))
        .try_init()
        .is_ok()
}

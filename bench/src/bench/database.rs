//! A scratch database for one benchmark run: a temp SQLite file, or a fresh
//! PostgreSQL schema that is dropped afterwards.

use std::path::PathBuf;

/// Where a run writes, and how to clean up.
pub struct ScratchDatabase {
    /// The URL the engine and the naive SQL use.
    pub url: String,
    temp_dir: Option<PathBuf>,
    schema: Option<(String, String)>,
}

impl ScratchDatabase {
    /// A scratch database on `base` (None: a temp SQLite file).
    pub async fn create(base: Option<&str>, tag: &str) -> Result<Self, Box<dyn std::error::Error>> {
        match base {
            Some(url) if url.starts_with("postgres") => {
                let schema = format!("tickmark_bench_{}_{tag}", std::process::id());
                let admin = sqlx::PgPool::connect(url).await?;
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&admin)
                    .await?;
                admin.close().await;
                let separator = if url.contains('?') { '&' } else { '?' };
                Ok(Self {
                    url: format!("{url}{separator}options[search_path]={schema}"),
                    temp_dir: None,
                    schema: Some((url.to_owned(), schema)),
                })
            }
            Some(url) => Ok(Self {
                url: url.to_owned(),
                temp_dir: None,
                schema: None,
            }),
            None => {
                let dir = std::env::temp_dir()
                    .join(format!("tickmark-bench-{}-{tag}", std::process::id()));
                std::fs::create_dir_all(&dir)?;
                Ok(Self {
                    url: format!("sqlite://{}", dir.join("bench.db").display()),
                    temp_dir: Some(dir),
                    schema: None,
                })
            }
        }
    }

    /// Whether this is PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres")
    }

    /// Drop the schema or remove the temp folder.
    pub async fn remove(self) -> Result<(), Box<dyn std::error::Error>> {
        if let Some((base, schema)) = &self.schema {
            let admin = sqlx::PgPool::connect(base).await?;
            sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
                .execute(&admin)
                .await?;
            admin.close().await;
        }
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

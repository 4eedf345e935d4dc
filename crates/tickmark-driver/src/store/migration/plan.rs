//! What a migration run does, decided from the embedded migrations and the
//! recorded history alone (no database): which migrations to apply, which
//! old rows to adopt, and whether a schema is the one this build needs.

use sqlx::migrate::Migration;

use super::MigrationError;
use crate::store::Backend;

/// One row of a migration history: a migration recorded as applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The migration's number.
    pub version: i64,
    /// The checksum sqlx computed of its SQL (SHA-384).
    pub checksum: Vec<u8>,
}

/// Written out rather than derived: the derive is sqlx's `macros` feature,
/// which only the backend crates turn on (the root Cargo.toml says why).
impl<'r, R> sqlx::FromRow<'r, R> for Recorded
where
    R: sqlx::Row,
    &'static str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            version: row.try_get("version")?,
            checksum: row.try_get("checksum")?,
        })
    }
}

/// The up migrations of `migrator` (the embedded ones: `Migrator::iter().as_slice()`), in order.
pub fn embedded(migrator: &[Migration]) -> impl Iterator<Item = &Migration> {
    migrator
        .iter()
        .filter(|migration| !migration.migration_type.is_down_migration())
}

/// The newest migration `migrator` applies.
pub fn newest(migrator: &[Migration]) -> i64 {
    embedded(migrator).map(|m| m.version).max().unwrap_or(0)
}

/// The migrations still to apply, in order, given tickmark's own history
/// `recorded`; refused when the history names a migration this build does
/// not know (a newer tickmark's) or one whose SQL changed.
pub fn pending<'m>(
    backend: Backend,
    migrator: &'m [Migration],
    recorded: &[Recorded],
) -> Result<Vec<&'m Migration>, MigrationError> {
    check_known(backend, migrator, recorded)?;
    Ok(embedded(migrator)
        .filter(|migration| !recorded.iter().any(|r| r.version == migration.version))
        .collect())
}

/// Whether `recorded` is exactly this build's schema: every migration
/// applied, none unknown, none edited. A store on the application's pool
/// asks this instead of migrating.
pub fn current(
    backend: Backend,
    migrator: &[Migration],
    recorded: &[Recorded],
) -> Result<(), MigrationError> {
    if pending(backend, migrator, recorded)?.is_empty() {
        return Ok(());
    }
    Err(MigrationError::Unmigrated {
        backend,
        recorded: recorded.iter().map(|r| r.version).max(),
        needed: newest(migrator),
    })
}

/// The rows of the shared history (sqlx's `_sqlx_migrations`, where
/// tickmark recorded its migrations before it had a table of its own) that
/// are tickmark's: the same number *and* the same checksum as one of this
/// build's migrations. An application's own rows never match both.
pub fn adoptable<'m>(
    migrator: &'m [Migration],
    shared: &[Recorded],
) -> impl Iterator<Item = &'m Migration> {
    let shared = shared.to_vec();
    embedded(migrator).filter(move |migration| {
        shared
            .iter()
            .any(|r| r.version == migration.version && r.checksum[..] == migration.checksum[..])
    })
}

fn check_known(
    backend: Backend,
    migrator: &[Migration],
    recorded: &[Recorded],
) -> Result<(), MigrationError> {
    if let Some(unknown) = recorded
        .iter()
        .filter(|r| embedded(migrator).all(|m| m.version != r.version))
        .map(|r| r.version)
        .max()
    {
        return Err(MigrationError::NewerSchema {
            backend,
            recorded: unknown,
            known: newest(migrator),
        });
    }
    for row in recorded {
        if let Some(edited) = embedded(migrator)
            .find(|m| m.version == row.version && m.checksum[..] != row.checksum[..])
        {
            return Err(MigrationError::ChecksumMismatch {
                backend,
                version: edited.version,
                description: edited.description.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use sqlx::migrate::MigrationType;

    use super::*;

    fn migrator() -> Vec<Migration> {
        let migration = |version: i64, sql: &'static str| {
            Migration::new(
                version,
                Cow::Owned(format!("m{version}")),
                MigrationType::Simple,
                Cow::Borrowed(sql),
                false,
            )
        };
        vec![migration(1, "SELECT 1"), migration(2, "SELECT 2")]
    }

    fn row(migrator: &[Migration], version: i64) -> Recorded {
        let migration = embedded(migrator).find(|m| m.version == version).unwrap();
        Recorded {
            version,
            checksum: migration.checksum.to_vec(),
        }
    }

    #[test]
    fn only_the_unrecorded_migrations_are_pending() {
        let migrator = migrator();
        let one = row(&migrator, 1);
        let pending = pending(Backend::Sqlite, &migrator, std::slice::from_ref(&one)).unwrap();
        assert_eq!(pending.iter().map(|m| m.version).collect::<Vec<_>>(), [2]);
        assert!(matches!(
            current(Backend::Sqlite, &migrator, &[one]),
            Err(MigrationError::Unmigrated {
                recorded: Some(1),
                needed: 2,
                ..
            })
        ));
        let all = [row(&migrator, 1), row(&migrator, 2)];
        current(Backend::Sqlite, &migrator, &all).unwrap();
    }

    #[test]
    fn a_migration_this_build_does_not_know_is_a_newer_schema() {
        let migrator = migrator();
        let newer = Recorded {
            version: 7,
            checksum: vec![0],
        };
        let error = pending(Backend::Postgres, &migrator, &[row(&migrator, 1), newer]).unwrap_err();
        assert!(
            matches!(
                error,
                MigrationError::NewerSchema {
                    recorded: 7,
                    known: 2,
                    ..
                }
            ),
            "{error}"
        );
        let said = error.to_string();
        assert!(said.contains("Upgrade this binary"), "{said}");
    }

    #[test]
    fn an_edited_migration_is_named() {
        let migrator = migrator();
        let edited = Recorded {
            version: 2,
            checksum: vec![1, 2, 3],
        };
        let error = pending(Backend::Postgres, &migrator, &[edited]).unwrap_err();
        assert!(
            matches!(&error, MigrationError::ChecksumMismatch { version: 2, description, .. } if description == "m2"),
            "{error}"
        );
    }

    #[test]
    fn only_rows_with_tickmarks_number_and_checksum_are_adopted() {
        let migrator = migrator();
        let apps_own = Recorded {
            version: 2,
            checksum: vec![9],
        };
        let unrelated = Recorded {
            version: 20240101,
            checksum: vec![9],
        };
        let adopted: Vec<i64> = adoptable(&migrator, &[row(&migrator, 1), apps_own, unrelated])
            .map(|m| m.version)
            .collect();
        assert_eq!(adopted, [1]);
    }
}

//! Fair share across tenants on SQLite (docs/flow_control.md, "Fair share
//! across tenants"): the choice PostgreSQL's `tickmark_claimable_fair`
//! (migration 0018) makes, made here inside the claim's write transaction
//! (SQLite has one writer, and its statements run in this process, so a
//! statement per tenant costs microseconds). The arithmetic is in plain
//! functions below; the statements read each tenant's due events through
//! the tenant index.

use std::collections::HashMap;

use sqlx::SqliteConnection;
use tickmark_driver::store::StoreError;

use super::{due_rows, sql, ClaimBinds, DueRow};

/// A tenant with events due, as a claim weighs it.
#[derive(Debug)]
pub(crate) struct DueTenant {
    pub weight: f64,
    /// Its virtual time, or the clock if that is later.
    pub start: f64,
    /// Its first claimable due events, in due order (at most a batch).
    pub due: Vec<DueRow>,
}

/// How many events of each tenant a batch of `batch` takes: its share,
/// `ceil(batch * weight / total weight)`, and of what tenants with fewer
/// events due leave unused, a part by weight, as far as it has events.
pub(crate) fn takes(batch: usize, tenants: &[(f64, usize)]) -> Vec<usize> {
    let total: f64 = tenants.iter().map(|(weight, _)| weight).sum();
    let shares: Vec<usize> = tenants
        .iter()
        .map(|(weight, _)| (batch as f64 * weight / total).ceil() as usize)
        .collect();
    let used: usize = tenants
        .iter()
        .zip(&shares)
        .map(|((_, have), share)| (*have).min(*share))
        .sum();
    let slack = batch.saturating_sub(used);
    let filling: f64 = tenants
        .iter()
        .zip(&shares)
        .filter(|((_, have), share)| have >= share)
        .map(|((weight, _), _)| weight)
        .sum();
    tenants
        .iter()
        .zip(&shares)
        .map(|(&(weight, have), &share)| {
            if have < share {
                have
            } else {
                (share + (slack as f64 * weight / filling).ceil() as usize).min(have)
            }
        })
        .collect()
}

/// The candidates of a fair claim, best first: each tenant's events by
/// virtual finish time (`start + k / weight` for its k-th), the events
/// without a tenant as one more tenant of weight 1 starting at `clock`,
/// ties by rank (due time less head start) and row number.
pub(crate) fn in_fair_order(
    batch: usize,
    tenants: Vec<DueTenant>,
    untenanted: Vec<DueRow>,
    clock: f64,
) -> Vec<DueRow> {
    let counts: Vec<(f64, usize)> = tenants.iter().map(|t| (t.weight, t.due.len())).collect();
    let takes = takes(batch, &counts);
    let mut candidates: Vec<(f64, DueRow)> = Vec::new();
    for (tenant, take) in tenants.into_iter().zip(takes) {
        for (k, row) in tenant.due.into_iter().take(take).enumerate() {
            candidates.push((tenant.start + (k + 1) as f64 / tenant.weight, row));
        }
    }
    for (k, row) in untenanted.into_iter().enumerate() {
        candidates.push((clock + (k + 1) as f64, row));
    }
    candidates.sort_by(|(a_finish, a), (b_finish, b)| {
        a_finish
            .total_cmp(b_finish)
            .then_with(|| a.6.cmp(&b.6))
            .then_with(|| a.0.cmp(&b.0))
    });
    candidates.into_iter().map(|(_, row)| row).collect()
}

/// Whether an unfinished event has a tenant (then a batch claim is fair).
pub(crate) async fn any_tenant(conn: &mut SqliteConnection) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar::<_, i64>(sql::EVENT_ANY_TENANT)
        .fetch_optional(conn)
        .await?
        .is_some())
}

/// The due events of a fair batch claim, best first (the caller keeps
/// them within the concurrency limits and takes the batch), and the clock.
pub(crate) async fn choose(
    conn: &mut SqliteConnection,
    binds: &ClaimBinds<'_>,
) -> Result<(Vec<DueRow>, f64), StoreError> {
    let clock: f64 = sqlx::query_scalar(sql::FAIR_CLOCK)
        .fetch_one(&mut *conn)
        .await?;
    let mut tenants = Vec::new();
    let mut next: Option<String> = sqlx::query_scalar(sql::TENANT_FIRST_DUE)
        .bind(binds.now)
        .fetch_optional(&mut *conn)
        .await?;
    while let Some(key) = next {
        let (weight, pass): (f64, f64) = sqlx::query_as(sql::TENANT_WEIGHT)
            .bind(&key)
            .fetch_optional(&mut *conn)
            .await?
            .unwrap_or((1.0, 0.0));
        let due = due_rows(conn, sql::EVENT_DUE_OF_TENANT, binds, Some(&key)).await?;
        next = sqlx::query_scalar(sql::TENANT_NEXT_DUE)
            .bind(binds.now)
            .bind(&key)
            .fetch_optional(&mut *conn)
            .await?;
        tenants.push(DueTenant {
            weight,
            start: pass.max(clock),
            due,
        });
    }
    // Events without a tenant: those among the first batch due (the due
    // index, as an unfair claim reads it), as PostgreSQL's claim takes them.
    let first = due_rows(conn, sql::EVENT_DUE, binds, None).await?;
    let untenanted = first.into_iter().filter(|row| row.5.is_none()).collect();
    let batch = usize::try_from(binds.batch).unwrap_or(usize::MAX);
    Ok((in_fair_order(batch, tenants, untenanted, clock), clock))
}

/// Charge each tenant for the events claimed for it (`tenants`: the
/// claimed events' tenants), and move the clock to the start of the last
/// event served.
pub(crate) async fn charge(
    conn: &mut SqliteConnection,
    tenants: impl Iterator<Item = String>,
    clock: f64,
) -> Result<(), StoreError> {
    let mut served: HashMap<String, u32> = HashMap::new();
    for tenant in tenants {
        *served.entry(tenant).or_default() += 1;
    }
    let mut top_start = clock;
    for (tenant, count) in served {
        let last_start: f64 = sqlx::query_scalar(sql::TENANT_CHARGE)
            .bind(&tenant)
            .bind(clock)
            .bind(f64::from(count))
            .fetch_one(&mut *conn)
            .await?;
        top_start = top_start.max(last_start);
    }
    sqlx::query(sql::FAIR_CLOCK_MOVE)
        .bind(top_start)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_alone_takes_the_batch() {
        assert_eq!(takes(64, &[(1.0, 100)]), [64]);
    }

    #[test]
    fn weights_split_a_batch() {
        assert_eq!(takes(40, &[(3.0, 200), (1.0, 200)]), [30, 10]);
    }

    #[test]
    fn what_a_tenant_leaves_goes_to_the_others() {
        assert_eq!(takes(32, &[(1.0, 300), (1.0, 3)]), [29, 3]);
        assert_eq!(takes(20, &[(1.0, 2), (1.0, 2), (1.0, 0)]), [2, 2, 0]);
    }

    fn row(id: i64, due: &str, tenant: Option<&str>) -> DueRow {
        (
            id,
            "pending".to_owned(),
            None,
            None,
            0,
            tenant.map(str::to_owned),
            due.to_owned(),
        )
    }

    #[test]
    fn candidates_interleave_by_virtual_finish_time() {
        let loud = DueTenant {
            weight: 1.0,
            start: 10.0,
            due: (1..=5).map(|id| row(id, "t1", Some("loud"))).collect(),
        };
        let quiet = DueTenant {
            weight: 1.0,
            start: 10.0,
            due: vec![row(9, "t2", Some("quiet"))],
        };
        let order: Vec<i64> = in_fair_order(4, vec![loud, quiet], vec![], 10.0)
            .into_iter()
            .map(|row| row.0)
            .collect();
        // Loud's first and quiet's first both finish at 11: the older first.
        assert_eq!(order, [1, 9, 2, 3]);
    }
}

-- The shop service's own schema, migrated by its own `sqlx::migrate!`
-- (history in `_sqlx_migrations`), beside tickmark's (`tickmark_migrations`).
CREATE TABLE orders (
    id               TEXT PRIMARY KEY,
    customer         TEXT        NOT NULL,
    amount_cents     BIGINT      NOT NULL,
    shopify_order_id BIGINT UNIQUE,
    paid             BOOLEAN     NOT NULL DEFAULT false,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A customer's balance: credited by Stripe's paid invoices, once each.
CREATE TABLE customer_balances (
    customer      TEXT PRIMARY KEY,
    balance_cents BIGINT NOT NULL
);

-- One confirmation per order: a second insert would fail, so a confirmation
-- sent twice shows as an error, never as two rows.
CREATE TABLE order_confirmations (
    order_id TEXT PRIMARY KEY REFERENCES orders (id),
    sent_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

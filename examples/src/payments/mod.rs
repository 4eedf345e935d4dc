//! The `payments` example app: Stripe's `invoice.payment_succeeded` runs
//! three steps (credit the account in the database, POST a receipt, render an
//! invoice file); every other verified event from any source is recorded.
//!
//! The binary is `examples/src/bin/payments.rs`; the walkthrough is in
//! `docs/receiver.md`. Settings that are not part of an event (the receipt
//! URL, the output folder, how long rendering takes) are engine resources
//! ([`Settings`], [`ReceiptClient`]), never stored in a plan.

mod credit_account;
mod database;
mod invoice;
mod record;
mod render_invoice;
mod send_receipt;
mod settings;
mod sources;

pub use credit_account::CreditAccount;
pub use database::{open, AppDatabase};
pub use invoice::Invoice;
pub use record::Record;
pub use render_invoice::{invoice_file_name, RenderInvoice};
pub use send_receipt::{ReceiptClient, SendReceipt};
pub use settings::{ReceiptUrl, ReceiptUrlError, Settings};
pub use sources::{mount_sources, MountError, SourceSetup, SOURCES};

use tickmark::{Handler, Handlers, ANY};

/// The source and kind whose events run the three payment steps.
pub const INVOICE_PAID: (&str, &str) = ("stripe", "invoice.payment_succeeded");

/// The app's handlers: the payment steps for Stripe's
/// `invoice.payment_succeeded`, and `record` for everything else.
pub fn handlers() -> Handlers {
    let (source, kind) = INVOICE_PAID;
    Handlers::new()
        .on(
            source,
            kind,
            Handler::new()
                .named_step("credit_account", CreditAccount)
                .named_step("send_receipt", SendReceipt)
                .named_step("render_invoice", RenderInvoice),
        )
        .on(ANY, ANY, Handler::new().named_step("record", Record))
}

//! Rebuild when a migration file is added. `sqlx::migrate!` embeds the files
//! of `migrations/` (through this crate's `migrations` symlink) and Cargo
//! notices when one of them changes, but not when a new one appears: this is
//! the build script sqlx's documentation recommends for that.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! Rebuild when a migration file is added. `sqlx::migrate!` embeds the files
//! of `migrations/` (a symlink to this backend's folder of the workspace's
//! `migrations/`) and Cargo notices when one of them changes, but not when a
//! new one appears: this is the build script sqlx's documentation recommends
//! for that.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}

//! The crate-level error: what can fail when setting tickmark up and using it.

use crate::handler::ConfigError;
use crate::runner::WorkerConfigError;
use crate::store::StoreError;

/// Any tickmark error.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database failed or was unreachable.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A handler definition is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A worker's settings could never run.
    #[error(transparent)]
    WorkerConfig(#[from] WorkerConfigError),
}

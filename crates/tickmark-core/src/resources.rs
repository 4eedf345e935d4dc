//! Resources: the application's shared things (HTTP clients, pools, settings)
//! that steps use but that do not belong in a stored plan.
//!
//! A step's fields are stored with every event; a secret or a client must not
//! be. Register them on the engine once; steps borrow them by type.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A type map of shared values, cheap to clone.
///
/// ```
/// # use tickmark::Resources;
/// struct ReceiptUrl(String);
/// let mut resources = Resources::default();
/// resources.insert(ReceiptUrl("http://127.0.0.1:9000/receipts".into()));
/// assert_eq!(resources.get::<ReceiptUrl>().unwrap().0, "http://127.0.0.1:9000/receipts");
/// assert!(resources.get::<String>().is_none());
/// ```
#[derive(Clone, Default)]
pub struct Resources {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
    names: Vec<&'static str>,
}

impl Resources {
    /// Add (or replace) the value of type `T`.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        if self
            .values
            .insert(TypeId::of::<T>(), Arc::new(value))
            .is_none()
        {
            self.names.push(std::any::type_name::<T>());
        }
    }

    /// The value of type `T`, if one was added.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|value| value.downcast_ref::<T>())
    }
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(&self.names).finish()
    }
}

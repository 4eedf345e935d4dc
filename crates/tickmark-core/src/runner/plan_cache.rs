//! Decoded plans, by their stored text. Events of one handler share one plan,
//! so a worker decodes each distinct plan once instead of once per claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::plan::{Plan, PlanError};

/// Most distinct plans kept; past it the cache starts over (plans are few:
/// one per handler and deploy).
const MAX_PLANS: usize = 1024;

/// A worker's decoded plans.
#[derive(Debug, Default)]
pub struct PlanCache {
    plans: Mutex<HashMap<String, Arc<Plan>>>,
}

impl PlanCache {
    /// The decoded plan for `json`, decoding it on first sight. A plan that
    /// cannot be decoded is not cached (a later deploy may know its steps).
    pub fn get(&self, json: &str) -> Result<Arc<Plan>, PlanError> {
        if let Some(plan) = self.with(|plans| plans.get(json).cloned()) {
            return Ok(plan);
        }
        let plan = Arc::new(Plan::decode(json)?);
        self.with(|plans| {
            if plans.len() >= MAX_PLANS {
                plans.clear();
            }
            plans.insert(json.to_owned(), Arc::clone(&plan));
        });
        Ok(plan)
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Arc<Plan>>) -> T) -> T {
        f(&mut self.plans.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

//! What a test of a handler found: each broken promise, with the step to
//! blame and what to change.

use std::fmt;

use super::boundaries::Crash;

/// One way the handler broke a promise.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// The step to blame.
    pub step: String,
    /// The crash that showed it (`None`: the clean run).
    pub crash: Option<Crash>,
    /// The step that crash stopped, when it is not the step to blame (a
    /// later step that re-did its call after it ran again); `None`: the
    /// step to blame is the one that crashed.
    pub crashed_step: Option<String>,
    /// What went wrong.
    pub problem: String,
    /// What to change.
    pub fix: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = match self.crash {
            Some(Crash::BeforeMark) => "a crash after its effect, before its mark",
            Some(Crash::AfterMark) => "a crash after its mark",
            None => "one clean run",
        };
        match self
            .crashed_step
            .as_deref()
            .filter(|&other| other != self.step)
        {
            Some(other) => write!(
                f,
                "step `{}` (after step `{other}`'s {}): {}",
                self.step,
                when.trim_start_matches("a "),
                self.problem
            )?,
            None => write!(f, "step `{}` ({when}): {}", self.step, self.problem)?,
        }
        if !self.fix.is_empty() {
            write!(f, "\n    fix: {}", self.fix)?;
        }
        Ok(())
    }
}

/// Every [`Finding`] of a test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Findings {
    /// `source/id` of the event.
    pub event: String,
    /// What was found, in the order the runs found it.
    pub findings: Vec<Finding>,
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the handler of event {} is not idempotent:", self.event)?;
        for finding in &self.findings {
            write!(f, "\n  - {finding}")?;
        }
        Ok(())
    }
}

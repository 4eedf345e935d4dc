//! Deliberately broken variants of the engine's guarantees, built in the
//! simulator's own code (the engine is never changed), to show that the
//! invariants catch each kind of bug and how many seeds that takes.

/// Which store the simulated processes use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// The real store, unchanged.
    Correct,
    /// A mark that ignores the fencing token: before each mark, the
    /// simulator swaps the caller's token for the event's current one.
    MarkIgnoresFence,
    /// A claim that ignores lease expiry: before each claim, the simulator
    /// makes every running event's lease look expired.
    ClaimIgnoresExpiry,
    /// A transactional step whose effect commits on its own, before the
    /// step's mark and outside the engine's transaction.
    EffectCommitsApart,
    /// A takeover that charges every event a dead worker held, not only the
    /// one it held alone: before each claim, the simulator makes every
    /// running lease look claimed alone.
    ChargesTheBatch,
    /// A claim that ignores tenants and takes the oldest due events: before
    /// each claim, the simulator clears every event's tenant, so a flood
    /// of one tenant's events holds every other tenant's behind it.
    ClaimsInDueOrder,
}

impl Variant {
    /// Every broken variant.
    pub const BROKEN: [Variant; 5] = [
        Variant::MarkIgnoresFence,
        Variant::ClaimIgnoresExpiry,
        Variant::EffectCommitsApart,
        Variant::ChargesTheBatch,
        Variant::ClaimsInDueOrder,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Correct => "correct",
            Variant::MarkIgnoresFence => "mark-ignores-fence",
            Variant::ClaimIgnoresExpiry => "claim-ignores-expiry",
            Variant::EffectCommitsApart => "effect-commits-apart",
            Variant::ChargesTheBatch => "charges-the-batch",
            Variant::ClaimsInDueOrder => "claims-in-due-order",
        }
    }
}

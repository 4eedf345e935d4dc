//! The open connections of one listener, and who makes room for a newcomer
//! when they are at a cap.
//!
//! Refusing every newcomer at the cap hands the listener to whoever filled
//! it: 512 connections from four addresses, each sending `GET /healthz`
//! every 9 s and never reading the answers, meet no deadline (the keep-alive
//! timer restarts with every request, the answers fit in the socket
//! buffers) and locked every provider out for as long as they liked (issue
//! 41). So at a cap the table closes a connection that is doing nothing for
//! anyone, rather than the newcomer, and a few clients cannot hold the cap:
//!
//! - A connection is **busy** while the service works on a request of it
//!   (from hyper's first poll of the request's future to its answer: a
//!   body being read, a handler running), and **idle** otherwise: not yet
//!   sent a complete head (a silent or slowloris connection), between
//!   keep-alive requests, or with answers produced but not yet taken by the
//!   client (a pipelining client that never reads: hyper does not poll its
//!   next request until the answers before it are written). An idle
//!   connection is closed at no cost but a new handshake; a busy one would
//!   lose a request.
//! - A client's **fair share** at the cap is `max_connections` divided by
//!   the number of clients holding connections (the newcomer's included),
//!   at least one; a client is *over* it when it holds more.
//! - A newcomer whose client already holds
//!   [`Limits::max_connections_per_address`](super::Limits::max_connections_per_address),
//!   or (at the total cap) at least its fair share, may only **replace its
//!   own** connection idle the longest; with none idle it is refused. So a
//!   client cannot grow at the expense of others, while a reverse proxy (one
//!   address for every client) has its idle keep-alive connections replaced
//!   instead of its new ones refused.
//! - Any other newcomer at the total cap takes the place of, in this order:
//!   the connection idle the longest among clients over their fair share;
//!   else the connection idle the longest of anyone; else the connection
//!   busy the longest among clients over their fair share (its request is
//!   lost, and its client, a provider that retries or an attacker, holds
//!   more than its share). Only with every connection busy and no client
//!   over its share is the newcomer refused: then the listener is full of
//!   requests in progress from many clients, and each of those is bounded
//!   by the read and write deadlines.
//!
//! The replaced connection leaves the table at once (the newcomer has its
//! place, so the count never exceeds the cap) and its task is told to close
//! it; its socket closes when that task next runs, so for that moment the
//! process may hold a few more sockets than the cap. A provider's delivery
//! is busy from the moment its head is read, and a fresh connection is the
//! last idle one to be replaced, so a provider that sends its request
//! promptly is not cut off by the clients that made the cap full.
//!
//! Hand-written, as the caps were: tower's limits count requests inside a
//! service, this counts connections before any service sees them, and the
//! choice needs what only the accept loop knows (the client of each
//! connection, whether it is in a request). One map behind one mutex,
//! touched at accept, at close, and when a request enters and leaves the
//! service; choosing a place scans the open connections (at most
//! `max_connections`, 512 by default), only when a cap is reached. Time is
//! tokio's clock, so tests may pause it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client_key::ClientKey;

/// Why a newcomer was refused: every connection that could have made room
/// for it is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its client holds `max_connections_per_address`, each of them busy.
    AddressShare,
    /// The listener holds `max_connections` and the newcomer's client at
    /// least its fair share of them, each of its own busy.
    FairShare,
    /// The listener holds `max_connections`, each of them busy, and no
    /// client holds more than its fair share.
    Full,
}

impl Refusal {
    /// A few words for the log.
    pub fn why(self) -> &'static str {
        match self {
            Refusal::AddressShare => {
                "this address holds its share of connections, each with a request in progress"
            }
            Refusal::FairShare => {
                "at the cap this address holds its fair share, each with a request in progress"
            }
            Refusal::Full => "at the cap, every connection has a request in progress",
        }
    }
}

/// Which connection a newcomer replaces, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    /// Below both caps: just come in.
    Admit,
    /// Take the place of this connection, which is closed.
    Replace(ConnectionId),
    /// No room.
    Refuse(Refusal),
}

/// A connection's number in the table, never reused.
type ConnectionId = u64;

/// One open connection.
#[derive(Debug)]
struct Entry {
    client: ClientKey,
    /// Its requests inside the service now (hyper serves one at a time on
    /// HTTP/1, so 0 or 1 in practice).
    in_flight: usize,
    /// Idle since (accepted, or its last answer produced) when `in_flight`
    /// is 0; busy since (its request entered the service) otherwise.
    since: Instant,
    /// Cancelled when the connection is replaced: its task closes it.
    evicted: CancellationToken,
}

impl Entry {
    fn is_idle(&self) -> bool {
        self.in_flight == 0
    }
}

/// The open connections, and how many each client holds.
#[derive(Debug, Default)]
struct Table {
    next_id: ConnectionId,
    open: HashMap<ConnectionId, Entry>,
    per_client: HashMap<ClientKey, usize>,
}

impl Table {
    fn held(&self, client: ClientKey) -> usize {
        self.per_client.get(&client).copied().unwrap_or(0)
    }

    /// What a newcomer from `client` does, within `max_connections` in all
    /// and `max_per_client` per client (the rules are in the module's
    /// documentation).
    fn choose(&self, client: ClientKey, max_connections: usize, max_per_client: usize) -> Choice {
        let held = self.held(client);
        let own_idle = || self.longest(true, |entry| entry.client == client);
        if held >= max_per_client {
            return own_idle().map_or(Choice::Refuse(Refusal::AddressShare), Choice::Replace);
        }
        if self.open.len() < max_connections {
            return Choice::Admit;
        }
        let clients = self.per_client.len() + usize::from(held == 0);
        let fair_share = (max_connections / clients.max(1)).max(1);
        if held >= fair_share {
            return own_idle().map_or(Choice::Refuse(Refusal::FairShare), Choice::Replace);
        }
        let over_share = |entry: &Entry| self.held(entry.client) > fair_share;
        self.longest(true, over_share)
            .or_else(|| self.longest(true, |_| true))
            .or_else(|| self.longest(false, over_share))
            .map_or(Choice::Refuse(Refusal::Full), Choice::Replace)
    }

    /// Among the idle (or busy) connections that `pick` takes, the one idle
    /// (or busy) the longest; the lower number on a tie.
    fn longest(&self, idle: bool, pick: impl Fn(&Entry) -> bool) -> Option<ConnectionId> {
        self.open
            .iter()
            .filter(|(_, entry)| entry.is_idle() == idle && pick(entry))
            .min_by_key(|(id, entry)| (entry.since, **id))
            .map(|(id, _)| *id)
    }

    fn insert(&mut self, client: ClientKey, now: Instant) -> (ConnectionId, CancellationToken) {
        let id = self.next_id;
        self.next_id += 1;
        let evicted = CancellationToken::new();
        self.open.insert(
            id,
            Entry {
                client,
                in_flight: 0,
                since: now,
                evicted: evicted.clone(),
            },
        );
        *self.per_client.entry(client).or_insert(0) += 1;
        (id, evicted)
    }

    /// Take `id` out (if it is still in), and its client's count with it;
    /// a client leaves the map with its last connection.
    fn remove(&mut self, id: ConnectionId) -> Option<Entry> {
        let entry = self.open.remove(&id)?;
        if let Some(count) = self.per_client.get_mut(&entry.client) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_client.remove(&entry.client);
            }
        }
        Some(entry)
    }

    fn request_started(&mut self, id: ConnectionId, now: Instant) {
        if let Some(entry) = self.open.get_mut(&id) {
            if entry.in_flight == 0 {
                entry.since = now;
            }
            entry.in_flight += 1;
        }
    }

    fn request_ended(&mut self, id: ConnectionId, now: Instant) {
        if let Some(entry) = self.open.get_mut(&id) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            if entry.in_flight == 0 {
                entry.since = now;
            }
        }
    }
}

/// The open connections of one listener, within `max_connections` in all
/// and `max_connections_per_address` per client.
#[derive(Debug)]
pub struct ConnectionTable {
    max_connections: usize,
    max_per_client: usize,
    table: Arc<Mutex<Table>>,
}

/// A newcomer let in.
#[derive(Debug)]
pub struct Admitted {
    /// Its place in the table, given back when dropped.
    pub place: Place,
    /// Whether another connection was closed to make room for it.
    pub replaced_another: bool,
}

/// One open connection's place in the table; given back on drop (or taken
/// earlier, when another connection replaces it).
#[derive(Debug)]
pub struct Place {
    id: ConnectionId,
    evicted: CancellationToken,
    table: Arc<Mutex<Table>>,
}

/// Marks a connection's requests busy: [`Activity::request`] when one
/// enters the service; the guard is dropped when its answer is produced.
#[derive(Debug, Clone)]
pub struct Activity {
    id: ConnectionId,
    table: Arc<Mutex<Table>>,
}

/// A request inside the service: its connection is busy until this drops.
#[derive(Debug)]
pub struct InFlight {
    id: ConnectionId,
    table: Arc<Mutex<Table>>,
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // The table stays consistent whatever panicked while holding it: every
    // change is a single map operation.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ConnectionTable {
    /// A table of at most `max_connections` connections, at most
    /// `max_per_client` from one client (both at least 1).
    pub fn new(max_connections: usize, max_per_client: usize) -> Self {
        Self {
            max_connections: max_connections.max(1),
            max_per_client: max_per_client.max(1),
            table: Arc::default(),
        }
    }

    /// A place for a connection from `address`, replacing another
    /// connection if the caps say so (that one is told to close), or why
    /// there is none.
    pub fn admit(&self, address: IpAddr) -> Result<Admitted, Refusal> {
        let client = ClientKey::from(address);
        let mut table = lock(&self.table);
        let replaced_another = match table.choose(client, self.max_connections, self.max_per_client)
        {
            Choice::Refuse(refusal) => return Err(refusal),
            Choice::Admit => false,
            Choice::Replace(victim) => {
                if let Some(entry) = table.remove(victim) {
                    entry.evicted.cancel();
                }
                true
            }
        };
        let (id, evicted) = table.insert(client, Instant::now());
        Ok(Admitted {
            place: Place {
                id,
                evicted,
                table: Arc::clone(&self.table),
            },
            replaced_another,
        })
    }

    /// How many connections are open.
    pub fn len(&self) -> usize {
        lock(&self.table).open.len()
    }
}

impl Place {
    /// Cancelled when another connection takes this place: close the
    /// connection at once.
    pub fn evicted(&self) -> CancellationToken {
        self.evicted.clone()
    }

    /// What the service uses to mark this connection's requests busy.
    pub fn activity(&self) -> Activity {
        Activity {
            id: self.id,
            table: Arc::clone(&self.table),
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        lock(&self.table).remove(self.id);
    }
}

impl Activity {
    /// A request entered the service: the connection is busy until the
    /// guard is dropped.
    pub fn request(&self) -> InFlight {
        lock(&self.table).request_started(self.id, Instant::now());
        InFlight {
            id: self.id,
            table: Arc::clone(&self.table),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        lock(&self.table).request_ended(self.id, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn client(last: u8) -> ClientKey {
        ClientKey::from(IpAddr::from([192, 0, 2, last]))
    }

    /// A table whose connections opened a second apart, in this order.
    fn table_of(clients: &[ClientKey]) -> (Table, Instant) {
        let start = Instant::now();
        let mut table = Table::default();
        for (i, &client) in clients.iter().enumerate() {
            table.insert(client, start + Duration::from_secs(i as u64));
        }
        (table, start)
    }

    #[test]
    fn below_the_caps_everyone_comes_in() {
        let (table, _) = table_of(&[client(1), client(1)]);
        assert_eq!(table.choose(client(1), 4, 4), Choice::Admit);
        assert_eq!(table.choose(client(2), 4, 4), Choice::Admit);
    }

    #[test]
    fn at_the_cap_a_newcomer_replaces_the_idle_connection_of_a_client_over_its_share() {
        // Client 1 holds three (over its share of 4 / 3 clients), idle since
        // seconds 1, 2, 3; client 2 holds one idle since second 0 — idle the
        // longest, but within its share.
        let (table, _) = table_of(&[client(2), client(1), client(1), client(1)]);
        assert_eq!(table.choose(client(3), 4, 4), Choice::Replace(1));
    }

    #[test]
    fn four_clients_holding_the_cap_cannot_keep_out_a_fifth() {
        // The attack, scaled down: 4 clients x 4 connections fill a
        // cap of 16 and a per-client cap of 4; all idle.
        let clients: Vec<_> = (1..=4).flat_map(|c| [client(c); 4]).collect();
        let (mut table, start) = table_of(&clients);
        assert_eq!(table.choose(client(9), 16, 4), Choice::Replace(0));
        // With requests in flight on all of them, the one busy the longest
        // of a client over its share (16 / 5 = 3) makes room.
        for id in 0..16 {
            table.request_started(id, start + Duration::from_secs(100 - id));
        }
        assert_eq!(table.choose(client(9), 16, 4), Choice::Replace(15));
        // But none of the four may take another's place: each holds its share.
        assert_eq!(
            table.choose(client(1), 16, 4),
            Choice::Refuse(Refusal::AddressShare)
        );
        assert_eq!(
            table.choose(client(1), 16, 8),
            Choice::Refuse(Refusal::FairShare)
        );
    }

    #[test]
    fn with_many_clients_the_connection_idle_longest_makes_room() {
        // One connection each from eight clients: no one is over its share.
        let clients: Vec<_> = (1..=8).map(client).collect();
        let (mut table, start) = table_of(&clients);
        // The oldest is busy; the next oldest idle one goes.
        table.request_started(0, start + Duration::from_secs(50));
        assert_eq!(table.choose(client(9), 8, 2), Choice::Replace(1));
        // The second one's request came later, and ended: idle since then.
        table.request_started(1, start + Duration::from_secs(60));
        table.request_ended(1, start + Duration::from_secs(61));
        assert_eq!(table.choose(client(9), 8, 2), Choice::Replace(2));
        // All busy, no one over its share: refused.
        for id in 0..8 {
            table.request_started(id, start + Duration::from_secs(70));
        }
        assert_eq!(table.choose(client(9), 8, 2), Choice::Refuse(Refusal::Full));
    }

    #[test]
    fn at_its_own_share_a_client_replaces_only_its_own_idle_connection() {
        // Client 1 at its share of 2; client 2's connection is idle longer.
        let (mut table, start) = table_of(&[client(2), client(1), client(1)]);
        assert_eq!(table.choose(client(1), 16, 2), Choice::Replace(1));
        table.request_started(1, start + Duration::from_secs(10));
        assert_eq!(table.choose(client(1), 16, 2), Choice::Replace(2));
        table.request_started(2, start + Duration::from_secs(10));
        assert_eq!(
            table.choose(client(1), 16, 2),
            Choice::Refuse(Refusal::AddressShare)
        );
        // Behind a reverse proxy: one client, the share is the cap.
        let (table, _) = table_of(&[client(1); 4]);
        assert_eq!(table.choose(client(1), 4, 4), Choice::Replace(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_replaced_connection_is_told_to_close_and_its_place_is_taken_at_once() {
        let connections = ConnectionTable::new(2, 2);
        let first = connections.admit(IpAddr::from([192, 0, 2, 1])).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = connections.admit(IpAddr::from([192, 0, 2, 2])).unwrap();
        let in_flight = second.place.activity().request();
        tokio::time::advance(Duration::from_secs(1)).await;
        let third = connections.admit(IpAddr::from([192, 0, 2, 3])).unwrap();
        assert!(third.replaced_another);
        assert!(first.place.evicted().is_cancelled());
        assert!(!second.place.evicted().is_cancelled());
        assert_eq!(connections.len(), 2);
        // The replaced connection's task ends later: its place is not given
        // back twice.
        drop(first);
        assert_eq!(connections.len(), 2);
        // The busy one becomes idle when its answer is produced, later than
        // the third came in: the third is now the one idle the longest.
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(in_flight);
        let _fourth = connections.admit(IpAddr::from([192, 0, 2, 4])).unwrap();
        assert!(!second.place.evicted().is_cancelled());
        assert!(third.place.evicted().is_cancelled());
    }

    #[test]
    fn the_maps_hold_only_open_connections() {
        let connections = ConnectionTable::new(1000, 4);
        let admitted: Vec<_> = (0..100u8)
            .map(|i| connections.admit(IpAddr::from([10, 0, 0, i])).unwrap())
            .collect();
        assert_eq!(lock(&connections.table).per_client.len(), 100);
        drop(admitted);
        let table = lock(&connections.table);
        assert!(table.open.is_empty() && table.per_client.is_empty());
    }
}

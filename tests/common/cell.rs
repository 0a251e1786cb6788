//! A lock key's value as the runtime's scripts lay it out (`runtime/src/engines/redis/scripts/acquire.lua`):
//! `L<token> <owner>[ <label>]` held, `W<token> <owner>[ <label>]` held and waited on, `F<token>` free (the marker a
//! release leaves so the next token is larger), `P<token> <until>` free and left to the waiters
//! the release notified until then (`Q`: and someone was turned away meanwhile).

use distlock_test_support::RedisServer;

/// What one server holds under a lock key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// No key: never used, or expired.
    Absent,
    /// Released; the next token must exceed `last_token`.
    Free { last_token: u64 },
    /// Held by `owner` with `token`; `waited` once someone was told it is busy; `label` the
    /// holder label written with it (empty: none).
    Held {
        token: u64,
        owner: String,
        label: String,
        waited: bool,
    },
}

impl Cell {
    /// The token the key records, held or free.
    pub fn token(&self) -> Option<u64> {
        match self {
            Cell::Absent => None,
            Cell::Free { last_token } => Some(*last_token),
            Cell::Held { token, .. } => Some(*token),
        }
    }

    pub fn is_held(&self) -> bool {
        matches!(self, Cell::Held { .. })
    }

    pub fn owner(&self) -> Option<&str> {
        match self {
            Cell::Held { owner, .. } => Some(owner),
            _ => None,
        }
    }
}

/// Reads the lock key `server_key` (already prefixed) on `server`.
pub fn read_cell(server: &RedisServer, server_key: &str) -> Cell {
    let reply = server.command(&["GET", server_key]);
    if reply.is_nil() {
        return Cell::Absent;
    }
    parse(&reply.as_str().expect("a lock key holds a string"))
}

/// Parses a lock key's value; panics on anything the scripts do not write.
pub fn parse(value: &str) -> Cell {
    let (state, rest) = value.split_at(1);
    match state {
        "F" => Cell::Free {
            last_token: rest.parse().expect("a marker holds a token"),
        },
        // Released to notified waiters for a moment: `P<token> <until µs>` (`Q`: and someone was
        // turned away meanwhile).
        "P" | "Q" | "V" => Cell::Free {
            last_token: rest
                .split_once(' ')
                .and_then(|(token, _)| token.parse().ok())
                .expect("`<token> <until>`"),
        },
        // `H`: waited on by the lock's next waiter alone; `W`: by others too.
        "L" | "W" | "H" => {
            let (token, owner) = rest.split_once(' ').expect("`<token> <owner>`");
            let (owner, label) = owner.split_once(' ').unwrap_or((owner, ""));
            Cell::Held {
                token: token.parse().expect("a numeric token"),
                owner: owner.to_owned(),
                label: label.to_owned(),
                waited: state != "L",
            }
        }
        _ => panic!("not a lock value: {value:?}"),
    }
}

/// The value of a free lock key whose last token was `token` (what a release leaves).
pub fn marker(token: u64) -> String {
    format!("F{token}")
}

//! What the database stores share: their connections (`connection.rs`), the bookkeeping of
//! their fenced writes (`fenced.rs`), statements with their values written in (`render.rs`) and
//! the keys of the lock names they read back (`keys.rs`). PostgreSQL's and
//! MySQL's directories hold only what each database does differently.

pub(crate) mod connection;
pub(crate) mod fenced;
pub(crate) mod keys;
pub(crate) mod render;

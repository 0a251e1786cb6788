//! What the database stores share: their connections (`connection.rs`) and the bookkeeping of
//! their fenced writes (`fenced.rs`). PostgreSQL's and
//! MySQL's directories hold only what each database does differently.

pub(crate) mod connection;
pub(crate) mod fenced;

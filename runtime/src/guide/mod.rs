//! The guide: how to use distlock, one chapter per question.
//!
//! Read [`deployments`] first if the lock protects data: it decides which server your locks
//! should live on. Every example in these chapters is compiled as a doc test.
//!
//! | chapter | answers |
//! |---|---|
//! | [`attribute`] | `#[distributed_lock]`: keys, waiting, leases, what happens when a lease is lost |
//! | [`lock_api`] | [`Lock`](crate::Lock) and [`LockGuard`](crate::LockGuard): the same locks by hand |
//! | [`configuration`] | every URL form, environment variable and feature |
//! | [`deployments`] | choosing a deployment: what each survives, loses and costs |
//! | [`kinds`] | read/write locks and semaphores |
//! | [`fencing`] | making a lock exact: tokens the resource checks |
//! | [`operating`] | the CLI, metrics, tracing, readiness and shutdown |
//! | [`testing`] | testing your own code without a server |
//! | [`cancellation`] | what a dropped call leaves behind |

#[doc = include_str!("attribute.md")]
pub mod attribute {}

#[doc = include_str!("lock_api.md")]
pub mod lock_api {}

#[doc = include_str!("configuration.md")]
pub mod configuration {}

#[doc = include_str!("deployments.md")]
pub mod deployments {}

#[doc = include_str!("kinds.md")]
pub mod kinds {}

#[doc = include_str!("fencing.md")]
pub mod fencing {}

#[doc = include_str!("operating.md")]
pub mod operating {}

#[doc = include_str!("testing.md")]
pub mod testing {}

#[doc = include_str!("cancellation.md")]
pub mod cancellation {}

//! Following one lock key on one server through Redis keyspace notifications
//! (`__keyspace@<db>__:<key>`), for `distlock watch` and [`Backend::events`](crate::Backend::events).
//!
//! Notifications are a server setting (`notify-keyspace-events`, off by default). The follower
//! checks it before subscribing and, unless asked to enable it, fails naming the flags to add: an
//! operator who runs `watch` against a server that announces nothing must not stare at a silent
//! screen.

use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use crate::operating::key_events::{KeyEvent, KeyEventSender, Notifications};
use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// The `notify-keyspace-events` flags a follower needs: `K` keyspace channels, `$` string
/// commands (`SET`, `SETRANGE`: acquire, release, a busy mark), `g` generic ones (`EXPIRE`: a
/// renewal, `DEL`), `x` expiry, `e` eviction.
const NEEDED_FLAGS: [char; 5] = ['K', '$', 'g', 'x', 'e'];

/// Opens a client to the server to follow (for Sentinel: the primary named now).
pub(crate) type ClientSource =
    Arc<dyn Fn() -> BoxFuture<'static, redis::RedisResult<redis::Client>> + Send + Sync>;

/// The longest pause between two attempts to restore a lost subscription.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Subscribes to `lock`'s notifications on the server `source` names and forwards them to
/// `events` in a background task until nobody listens; a lost subscription is restored (on the
/// server `source` names then) and reported as [`KeyEvent::Interrupted`] and
/// [`KeyEvent::Resubscribed`].
///
/// Resolves once the subscription is in force. With `tolerate_unreachable` (Redlock: one master
/// of several may be down), a server that cannot be reached is followed in the background from
/// the start; its notifications being off is an error either way.
///
/// # Cancel safety
/// Cancel safe.
/// Dropping the future before it resolves drops the connection it opened; no task is left.
pub(crate) async fn follow(
    source: ClientSource,
    lock: String,
    notifications: Notifications,
    timeouts: Timeouts,
    tolerate_unreachable: bool,
    events: KeyEventSender,
) -> EngineResult<()> {
    let first = subscribe(&source, &lock, notifications, timeouts).await;
    let subscribed = match first {
        Ok(subscribed) => Some(subscribed),
        Err(Failure::Refused(failure)) => return Err(failure),
        Err(Failure::Unreachable(failure)) if !tolerate_unreachable => return Err(failure),
        Err(Failure::Unreachable(failure)) => {
            events.send(KeyEvent::Interrupted {
                server: "a server".into(),
                reason: failure.source.to_string(),
            });
            None
        }
    };
    tokio::spawn(forward(
        source,
        lock,
        notifications,
        timeouts,
        subscribed,
        events,
    ));
    Ok(())
}

/// Why a subscription could not be made.
enum Failure {
    /// The server refused (notifications off, `CONFIG` or `SUBSCRIBE` not allowed): trying
    /// again does not help.
    Refused(EngineFailure),
    /// The server could not be reached or did not answer in time.
    Unreachable(EngineFailure),
}

struct Subscribed {
    pubsub: redis::aio::PubSub,
    server: String,
    channel: String,
}

/// `subscribe_now` within the connect timeout and three response timeouts; no answer in time
/// is `Failure::Unreachable`.
///
/// # Cancel safety
/// Cancel safe, as `subscribe_now`.
/// As `subscribe_now`, which the timeout drops when it fires.
async fn subscribe(
    source: &ClientSource,
    lock: &str,
    notifications: Notifications,
    timeouts: Timeouts,
) -> Result<Subscribed, Failure> {
    let budget = timeouts.connect + timeouts.response * 3;
    match tokio::time::timeout(budget, subscribe_now(source, lock, notifications)).await {
        Ok(result) => result,
        Err(_) => Err(Failure::Unreachable(failure(format!(
            "no answer within {} while subscribing to keyspace notifications",
            humantime::format_duration(budget)
        )))),
    }
}

/// Checks (with [`Notifications::Enable`]: sets) `notify-keyspace-events` on the server
/// `source` names, then subscribes to `lock`'s keyspace channel on a connection of its own.
///
/// # Cancel safety
/// Cancel safe.
/// Dropping the future drops the connections it opened, and the subscription with them; a
/// `CONFIG SET` already sent may still enable the notifications, as asked.
async fn subscribe_now(
    source: &ClientSource,
    lock: &str,
    notifications: Notifications,
) -> Result<Subscribed, Failure> {
    let classify = |err: redis::RedisError| {
        if super::diagnose::is_permanent(&err) {
            Failure::Refused(failure(err.to_string()))
        } else {
            Failure::Unreachable(failure(err.to_string()))
        }
    };
    let client = source().await.map_err(classify)?;
    let server = client.get_connection_info().addr().to_string();
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(classify)?;
    let setting: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(&mut conn)
        .await
        .map_err(|err| match super::diagnose::is_permanent(&err) {
            true => Failure::Refused(failure(format!(
                "cannot read notify-keyspace-events on {server} ({err}); following a lock needs \
                 keyspace notifications: have an administrator run `CONFIG SET \
                 notify-keyspace-events K$gxe` there, or grant the user `+config|get`"
            ))),
            false => classify(err),
        })?;
    let current = setting.get(1).cloned().unwrap_or_default();
    let missing = missing_flags(&current);
    if !missing.is_empty() {
        let wanted = format!("{current}{missing}");
        if notifications == Notifications::Require {
            return Err(Failure::Refused(failure(format!(
                "keyspace notifications are off on {server} (notify-keyspace-events is \
                 `{current}`; following a lock needs the flags K$gxe): run `CONFIG SET \
                 notify-keyspace-events {wanted}` there, or `distlock watch \
                 --enable-notifications`"
            ))));
        }
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(&wanted)
            .query_async::<()>(&mut conn)
            .await
            .map_err(|err| match super::diagnose::is_permanent(&err) {
                true => Failure::Refused(failure(format!(
                    "cannot enable keyspace notifications on {server} ({err}); have an \
                     administrator run `CONFIG SET notify-keyspace-events {wanted}` there"
                ))),
                false => classify(err),
            })?;
    }
    let db = client.get_connection_info().redis_settings().db();
    let mut pubsub = client.get_async_pubsub().await.map_err(classify)?;
    let channel = format!("__keyspace@{db}__:{lock}");
    pubsub.subscribe(&channel).await.map_err(classify)?;
    Ok(Subscribed {
        pubsub,
        server,
        channel,
    })
}

/// The flags `current` lacks, in the order `NEEDED_FLAGS` lists them (`A` stands for every
/// event class, `K` and `E` excepted).
fn missing_flags(current: &str) -> String {
    NEEDED_FLAGS
        .iter()
        .filter(|flag| !(current.contains(**flag) || (**flag != 'K' && current.contains('A'))))
        .collect()
}

/// The follower's task: forwards notifications, restores lost subscriptions, and stops when
/// nobody listens.
///
/// # Cancel safety
/// Never dropped by a caller.
/// A spawned task, never dropped by a caller: it ends once nobody listens (`events` closed),
/// at the latest after the subscription attempt under way (or the `UNSUBSCRIBE` it then sends,
/// within the response timeout), and its connection and subscription end with it.
async fn forward(
    source: ClientSource,
    lock: String,
    notifications: Notifications,
    timeouts: Timeouts,
    mut subscribed: Option<Subscribed>,
    events: KeyEventSender,
) {
    let mut delay = Duration::from_millis(50);
    loop {
        if let Some(Subscribed {
            mut pubsub,
            server,
            channel,
        }) = subscribed.take()
        {
            delay = Duration::from_millis(50);
            let mut messages = pubsub.on_message();
            loop {
                tokio::select! {
                    () = events.closed() => {
                        drop(messages);
                        // Said, not left to the connection's close: the subscription ends at
                        // once even where the close reaches the server late, and the server
                        // shows it (an `UNSUBSCRIBE`). A server that does not answer within
                        // the response timeout gets the close instead.
                        let unsubscribe = pubsub.unsubscribe(&channel);
                        let _ = tokio::time::timeout(timeouts.response, unsubscribe).await;
                        return;
                    }
                    message = messages.next() => match message {
                        Some(message) => {
                            let event = message.get_payload::<String>().unwrap_or_default();
                            let notified = KeyEvent::Notified { server: server.clone(), event };
                            if !events.send(notified) {
                                return;
                            }
                        }
                        None => break,
                    },
                }
            }
            let lost = KeyEvent::Interrupted {
                server,
                reason: "the connection was lost".into(),
            };
            if !events.send(lost) {
                return;
            }
        }
        tokio::select! {
            () = events.closed() => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY_DELAY);
        // A restarted (or newly promoted) server may lack the setting: enabled again only if
        // the caller asked for that, otherwise reported until an administrator does.
        match subscribe(&source, &lock, notifications, timeouts).await {
            Ok(again) => {
                if !events.send(KeyEvent::Resubscribed {
                    server: again.server.clone(),
                }) {
                    return;
                }
                subscribed = Some(again);
            }
            Err(Failure::Refused(failure)) | Err(Failure::Unreachable(failure)) => {
                let reason = failure.source.to_string();
                if !events.send(KeyEvent::Interrupted {
                    server: "a server".into(),
                    reason,
                }) {
                    return;
                }
            }
        }
    }
}

fn failure(message: String) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::missing_flags;

    #[test]
    fn missing_flags_are_named_and_a_covers_the_classes() {
        assert_eq!(missing_flags(""), "K$gxe");
        assert_eq!(missing_flags("KEA"), "");
        assert_eq!(missing_flags("Ex"), "K$ge");
        assert_eq!(missing_flags("AE"), "K");
        assert_eq!(missing_flags("K$gxe"), "");
    }
}

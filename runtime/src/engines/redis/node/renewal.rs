//! Lease renewal (`renew.lua`) as typed calls: the watchdog's batches, and the command the
//! cluster engine pipelines itself.

use super::{ms_arg, unexpected, Node};
use crate::engines::engine::{EngineFailure, EngineResult, Ownership, Renewal};
use crate::engines::redis::protocol::Renew;
use crate::engines::redis::scripts::RENEW;
use redis::{FromRedisValue, Value};

impl Node {
    /// `renew.lua` for a batch whose keys are already prefixed: one answer per lease; `None` for
    /// a lease extended on the primary but not acknowledged by the replicas wanted.
    ///
    /// # Cancel safety
    /// Cancel safe: no lease relies on a renewal that was not confirmed.
    /// As [`invoke`](Self::invoke): a renewal already sent may still extend the leases; the
    /// watchdog counts only confirmed renewals, so no lease relies on it.
    pub(crate) async fn renew(
        &self,
        locks: &[String],
        batch: &[Renewal<'_>],
    ) -> EngineResult<Vec<Option<Ownership>>> {
        let keys: Vec<&str> = locks.iter().map(String::as_str).collect();
        let owned = self.renew_args(batch);
        let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let (codes, acknowledged): (Vec<i64>, _) = self
            .invoke_acked(&RENEW, &keys, &args, self.replica_ack)
            .await?;
        if codes.len() != batch.len() {
            return Err(unexpected("renew", codes));
        }
        let confirmed = match (self.replica_ack, acknowledged) {
            (Some(ack), Some(acknowledged)) => acknowledged >= ack.replicas,
            _ => true,
        };
        codes
            .into_iter()
            .map(|code| {
                let found = renewed(code)?;
                // An extension the replicas did not confirm is not one the lease may count on.
                Ok((confirmed || found != Ownership::Ours).then_some(found))
            })
            .collect()
    }

    /// The `renew.lua` call (by SHA) for leases whose keys are already prefixed, for callers
    /// that send it themselves (the cluster engine pipelines one per slot to each node).
    /// `with_source`: `EVAL` with the script's source, which also loads it on the node.
    pub(crate) fn renew_command(
        &self,
        locks: &[String],
        batch: &[Renewal<'_>],
        with_source: bool,
    ) -> redis::Cmd {
        let keys: Vec<&str> = locks.iter().map(String::as_str).collect();
        let owned = self.renew_args(batch);
        let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        if with_source {
            RENEW.eval(&keys, &args)
        } else {
            RENEW.evalsha(&keys, &args)
        }
    }

    /// The answers in a `renew.lua` reply for `count` leases; a server error (`MOVED`,
    /// `NOSCRIPT`, …) is the failure.
    pub(crate) fn renew_answers(reply: Value, count: usize) -> EngineResult<Vec<Ownership>> {
        let reply = reply.extract_error().map_err(|err| EngineFailure {
            ambiguous: false,
            source: err.into(),
        })?;
        let codes = Vec::<i64>::from_redis_value(reply)
            .map_err(|err| unexpected("renew", err.to_string()))?;
        if codes.len() != count {
            return Err(unexpected("renew", codes));
        }
        codes.into_iter().map(renewed).collect()
    }

    /// `renew.lua`'s arguments: per lease its owner (a shared holder: `~<owner> <label>`, its
    /// member among the key's holders) and TTL.
    fn renew_args(&self, batch: &[Renewal<'_>]) -> Vec<Vec<u8>> {
        let mut args = Vec::with_capacity(batch.len() * 2);
        for item in batch {
            args.push(match item.kind.is_shared() {
                true => [&b"~"[..], &self.member(item.owner)].concat(),
                false => item.owner.as_bytes().to_vec(),
            });
            args.push(ms_arg(item.ttl));
        }
        args
    }
}

/// What `renew.lua`'s `code` for one lease found.
fn renewed(code: i64) -> EngineResult<Ownership> {
    Ok(Renew::decode(code)?.into())
}

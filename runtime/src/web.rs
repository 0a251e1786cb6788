//! `impl IntoResponse for LockError` (feature `axum`): a handler returning
//! `Result<T, LockError>` — or an error type that wraps it and delegates — answers as a service
//! should.

use crate::error::LockError;
use axum_core::response::{IntoResponse, Response};
use http::{header, StatusCode};

/// The HTTP answer to a lock failure, its body the error's message:
/// - [`Busy`](LockError::Busy): **409 Conflict**, with `Retry-After` in whole seconds (rounded up,
///   at least 1) from [`retry_after`](LockError::retry_after) — omitted when no server said
///   when (the call waited for another task of this process);
/// - a backend that failed or is shutting down, a lease lost mid-request, replicas that did not
///   acknowledge: **503 Service Unavailable** (the request may succeed later; nothing of it was
///   done under a lock it no longer holds);
/// - anything else (not configured, invalid settings or keys, misnested locks): **500 Internal
///   Server Error** — the deployment or the code is wrong, not the request.
///
/// ```
/// # #[cfg(feature = "axum")] {
/// use axum_core::response::IntoResponse;
/// use distlock::LockError;
/// use std::time::Duration;
///
/// let busy = LockError::Busy {
///     key: "account:1".into(),
///     waited: Duration::ZERO,
///     retry_after: Some(Duration::from_millis(2_300)),
/// };
/// let response = busy.into_response();
/// assert_eq!(response.status(), 409);
/// assert_eq!(response.headers()["retry-after"], "3");
/// # }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for LockError {
    fn into_response(self) -> Response {
        let status = match &self {
            LockError::Busy { .. } => StatusCode::CONFLICT,
            LockError::Backend(_)
            | LockError::Lost { .. }
            | LockError::ReplicasNotAcknowledged { .. }
            | LockError::ShutDown { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let retry_after = self
            .retry_after()
            .map(|left| left.as_millis().div_ceil(1000).max(1).to_string());
        let mut response = (status, self.to_string()).into_response();
        if let Some(seconds) = retry_after {
            if let Ok(value) = header::HeaderValue::from_str(&seconds) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LostReason;
    use std::time::Duration;

    fn answer(err: LockError) -> (u16, Option<String>) {
        let response = err.into_response();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|value| value.to_str().unwrap().to_owned());
        (response.status().as_u16(), retry_after)
    }

    #[test]
    fn each_failure_answers_its_status() {
        let busy = |retry_after| LockError::Busy {
            key: "k".into(),
            waited: Duration::ZERO,
            retry_after,
        };
        assert_eq!(
            answer(busy(Some(Duration::from_millis(1)))),
            (409, Some("1".into()))
        );
        assert_eq!(
            answer(busy(Some(Duration::from_millis(30_000)))),
            (409, Some("30".into()))
        );
        assert_eq!(answer(busy(None)), (409, None));
        let lost = LockError::Lost {
            key: "k".into(),
            reason: LostReason::Expired,
        };
        assert_eq!(answer(lost), (503, None));
        let down = LockError::ShutDown {
            backend: "default".into(),
        };
        assert_eq!(answer(down), (503, None));
        assert_eq!(
            answer(LockError::invalid_config("url", "is wrong")),
            (500, None)
        );
    }
}

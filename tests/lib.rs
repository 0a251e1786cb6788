//! Shared helpers of the integration tests live in `distlock-test-support`; this crate only holds test targets.

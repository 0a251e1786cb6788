//! The lock value's grammar: its [`State`] letter and its fields ([`LockValue`]).

/// What a lock key's value says of the lock: its first byte (the table in the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// `L`: held; nobody was told it is busy.
    Held,
    /// `H`: held; only queued processes were told it is busy.
    HeldQueued,
    /// `W`: held; someone unqueued was told it is busy.
    HeldWaitedOn,
    /// `F`: free, the last token kept as the marker.
    Free,
    /// `P`: free, reserved for the waiters a release notified.
    Reserved,
    /// `Q`: reserved, and someone was turned away meanwhile.
    ReservedTurnedAway,
    /// `V`: freed by the last reader, reserved for the waiting writer.
    ReservedForWriter,
    /// `R`: held by readers.
    ReadHeld,
    /// `S`: held by readers, a writer waits.
    ReadHeldWriterWaits,
    /// `M`: a semaphore with holders.
    Permits,
    /// `N`: a semaphore that refused someone.
    PermitsRefused,
}

impl State {
    const ALL: [State; 11] = [
        State::Held,
        State::HeldQueued,
        State::HeldWaitedOn,
        State::Free,
        State::Reserved,
        State::ReservedTurnedAway,
        State::ReservedForWriter,
        State::ReadHeld,
        State::ReadHeldWriterWaits,
        State::Permits,
        State::PermitsRefused,
    ];

    /// The letter the value starts with.
    pub(crate) const fn letter(self) -> u8 {
        match self {
            State::Held => b'L',
            State::HeldQueued => b'H',
            State::HeldWaitedOn => b'W',
            State::Free => b'F',
            State::Reserved => b'P',
            State::ReservedTurnedAway => b'Q',
            State::ReservedForWriter => b'V',
            State::ReadHeld => b'R',
            State::ReadHeldWriterWaits => b'S',
            State::Permits => b'M',
            State::PermitsRefused => b'N',
        }
    }

    /// The state a value's first byte names; `None` for a value distlock did not write.
    pub(crate) fn of(letter: u8) -> Option<State> {
        State::ALL
            .into_iter()
            .find(|state| state.letter() == letter)
    }

    /// Held by one exclusive owner (`L`, `H`, `W`): the value names it.
    pub(crate) const fn is_exclusive(self) -> bool {
        matches!(self, State::Held | State::HeldQueued | State::HeldWaitedOn)
    }

    /// Held by readers or permit holders (`R`, `S`, `M`, `N`).
    pub(crate) const fn is_shared(self) -> bool {
        matches!(
            self,
            State::ReadHeld | State::ReadHeldWriterWaits | State::Permits | State::PermitsRefused
        )
    }

    /// A marker a release left (`F`, `P`, `Q`, `V`): the lock is free, and the next token must
    /// exceed the one it keeps.
    pub(crate) const fn is_free(self) -> bool {
        matches!(
            self,
            State::Free | State::Reserved | State::ReservedTurnedAway | State::ReservedForWriter
        )
    }

    /// Someone was told the lock is busy since it was taken (inspect's `waited_on`).
    pub(crate) const fn is_waited_on(self) -> bool {
        matches!(
            self,
            State::HeldQueued
                | State::HeldWaitedOn
                | State::ReadHeldWriterWaits
                | State::PermitsRefused
        )
    }
}

/// A lock value, read: its state, the token it keeps, and the fields its state has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockValue<'a> {
    pub(crate) state: State,
    pub(crate) token: u64,
    /// The holder's owner token (`L`, `H`, `W`).
    pub(crate) owner: Option<&'a str>,
    /// The holder's label (`L`, `H`, `W`), when one was written.
    pub(crate) label: Option<&'a str>,
    /// Until when, in server µs, a reservation or a writer's intent lasts (`P`, `Q`, `V`, `S`).
    pub(crate) until_us: Option<u64>,
}

impl<'a> LockValue<'a> {
    /// Reads `value`; `None` when distlock did not write it (an unknown letter, a missing
    /// field, a token that is not a number).
    pub(crate) fn parse(value: &'a str) -> Option<LockValue<'a>> {
        let state = State::of(*value.as_bytes().first()?)?;
        let rest = &value[1..];
        let (token, fields) = match rest.split_once(' ') {
            Some((token, fields)) => (token, Some(fields)),
            None => (rest, None),
        };
        let token = token.parse().ok()?;
        let mut parsed = LockValue {
            state,
            token,
            owner: None,
            label: None,
            until_us: None,
        };
        match state {
            State::Held | State::HeldQueued | State::HeldWaitedOn => {
                let fields = fields?;
                let (owner, label) = match fields.split_once(' ') {
                    Some((owner, label)) => (owner, Some(label)),
                    None => (fields, None),
                };
                parsed.owner = Some(owner).filter(|owner| !owner.is_empty());
                parsed.owner?;
                parsed.label = label;
            }
            State::Reserved
            | State::ReservedTurnedAway
            | State::ReservedForWriter
            | State::ReadHeldWriterWaits => parsed.until_us = Some(fields?.parse().ok()?),
            State::Free | State::ReadHeld | State::Permits | State::PermitsRefused => {
                if fields.is_some() {
                    return None;
                }
            }
        }
        Some(parsed)
    }

    /// The value of a lock `owner` holds in `state` with `token`, as the scripts write it.
    pub(crate) fn held(state: State, token: u64, owner: &str, label: &[u8]) -> Vec<u8> {
        debug_assert!(state.is_exclusive());
        let mut value = Vec::with_capacity(owner.len() + label.len() + 24);
        value.push(state.letter());
        value.extend_from_slice(token.to_string().as_bytes());
        value.push(b' ');
        value.extend_from_slice(owner.as_bytes());
        if !label.is_empty() {
            value.push(b' ');
            value.extend_from_slice(label);
        }
        value
    }

    /// The token marker a release leaves (`F<token>`).
    pub(crate) fn free(token: u64) -> String {
        format!("{}{token}", char::from(State::Free.letter()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_has_one_letter_and_back() {
        let letters: Vec<u8> = State::ALL.iter().map(|state| state.letter()).collect();
        assert_eq!(letters, b"LHWFPQVRSMN");
        for state in State::ALL {
            assert_eq!(State::of(state.letter()), Some(state));
        }
        assert_eq!(State::of(b'X'), None);
    }

    #[test]
    fn values_read_as_the_scripts_write_them() {
        let held = LockValue::parse("H1700000000000001 0a1b web-3:42 (canary)").unwrap();
        assert_eq!(held.state, State::HeldQueued);
        assert_eq!(held.token, 1_700_000_000_000_001);
        assert_eq!(held.owner, Some("0a1b"));
        assert_eq!(held.label, Some("web-3:42 (canary)"));
        let bare = LockValue::parse("L7 0a1b").unwrap();
        assert_eq!((bare.owner, bare.label), (Some("0a1b"), None));
        let reserved = LockValue::parse("P7 1700000000000123").unwrap();
        assert_eq!(reserved.until_us, Some(1_700_000_000_000_123));
        assert_eq!(LockValue::parse("F7").unwrap().state, State::Free);
        assert_eq!(LockValue::parse("N9").unwrap().state, State::PermitsRefused);
        assert_eq!(
            LockValue::held(State::Held, 7, "0a1b", b"web-3:42"),
            b"L7 0a1b web-3:42"
        );
        assert_eq!(LockValue::held(State::Held, 7, "0a1b", b""), b"L7 0a1b");
        assert_eq!(LockValue::free(7), "F7");
    }

    #[test]
    fn values_distlock_did_not_write_are_refused() {
        for value in [
            "", "hello", "L7", "Lx 0a1b", "P7", "P7 soon", "F7 extra", "X7 0a1b",
        ] {
            assert_eq!(LockValue::parse(value), None, "{value:?}");
        }
    }
}

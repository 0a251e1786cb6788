//! Holder labels: who holds a lock, in words an operator recognises (`hostname:pid` by default),
//! written with every lock and shown by [`Backend::inspect`](crate::Backend::inspect) and the
//! `distlock` CLI. A label is not a credential (the owner token is), and never contains one.

use crate::error::LockError;

/// Longest accepted label, in bytes: every held lock stores it.
pub(crate) const MAX_LABEL_LEN: usize = 128;

/// `hostname:pid` of this process (`unknown-host:pid` when the host name cannot be read).
pub(crate) fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    let label = format!("{host}:{}", std::process::id());
    // A host name is never this long or odd, but the default must always be valid.
    check_label(&label)
        .map(|()| label)
        .unwrap_or_else(|_| format!("pid:{}", std::process::id()))
}

/// A label must fit one line of an operator's terminal: at most [`MAX_LABEL_LEN`] bytes, no
/// control characters (an empty label writes none).
pub(crate) fn check_label(label: &str) -> Result<(), LockError> {
    if label.len() > MAX_LABEL_LEN {
        return Err(LockError::invalid_config(
            "holder_label",
            format!(
                "is {} bytes; at most {MAX_LABEL_LEN} (every held lock stores it)",
                label.len()
            ),
        ));
    }
    if let Some(bad) = label.chars().find(|c| c.is_control()) {
        return Err(LockError::invalid_config(
            "holder_label",
            format!(
                "`{}` contains the control character {bad:?}; a label is one line of plain text",
                label.escape_debug()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_names_host_and_process() {
        let label = default_label();
        assert!(
            label.ends_with(&format!(":{}", std::process::id())),
            "{label}"
        );
        assert!(check_label(&label).is_ok());
    }

    #[test]
    fn long_or_multiline_labels_are_refused_by_name() {
        let long = check_label(&"x".repeat(MAX_LABEL_LEN + 1)).unwrap_err();
        assert!(long.to_string().contains("holder_label"), "{long}");
        let newline = check_label("web-1\nrm -rf").unwrap_err();
        assert!(
            newline.to_string().contains("control character"),
            "{newline}"
        );
        assert!(check_label("").is_ok());
        assert!(check_label("web-1 (blue) pid 7").is_ok());
    }
}

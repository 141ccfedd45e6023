//! The shape of a Kubernetes bootstrap token (`[a-z0-9]{6}.[a-z0-9]{16}`, id then secret): one home for it, used by
//! the redactor (which hides tokens a provider quotes) and by the sim provider's echo mode (which quotes them).

/// The bootstrap tokens in a text: `[a-z0-9]{6}.[a-z0-9]{16}` not part of a longer such word.
pub fn bootstrap_tokens_in(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    (0..bytes.len().saturating_sub(22))
        .filter(|&i| {
            bytes[i + 6] == b'.'
                && bytes[i..i + 6].iter().all(|b| ok(*b))
                && bytes[i + 7..i + 23].iter().all(|b| ok(*b))
                && (i == 0 || !ok(bytes[i - 1]))
                && bytes.get(i + 23).is_none_or(|b| !ok(*b))
        })
        .map(|i| &text[i..i + 23])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::bootstrap_tokens_in;

    #[test]
    fn finds_whole_tokens_only() {
        let text =
            "join abcdef.0123456789abcdef now; not xabcdef.0123456789abcdefx nor ABCDEF.0123456789ABCDEF";
        assert_eq!(bootstrap_tokens_in(text), ["abcdef.0123456789abcdef"]);
        assert_eq!(
            bootstrap_tokens_in("abcdef.0123456789abcdef"),
            ["abcdef.0123456789abcdef"]
        );
        assert!(bootstrap_tokens_in("abcdef.0123").is_empty());
    }
}

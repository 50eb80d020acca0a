//! Enums named by keywords on the command line and in the control
//! protocol (`per-page`, `huge_idle`, ...): one way to parse them, with one
//! wording for an unknown keyword.

/// Implements `FromStr` for `$ty` from its keywords: each `"name" =>
/// Variant` pair, in the order the error message lists them. An unknown
/// keyword is refused as "unknown `$what` 'KEYWORD': expected a, b or c".
macro_rules! keywords {
    ($ty:ty, $what:literal, { $($name:literal => $variant:expr),+ $(,)? }) => {
        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                match s {
                    $($name => Ok($variant),)+
                    _ => Err($crate::keyword::unknown($what, s, &[$($name),+])),
                }
            }
        }
    };
}
pub(crate) use keywords;

/// "unknown WHAT 'GOT': expected a, b or c".
pub(crate) fn unknown(what: &str, got: &str, names: &[&str]) -> String {
    let expected = match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    format!("unknown {what} '{got}': expected {expected}")
}

#[cfg(test)]
mod tests {
    use super::unknown;

    #[test]
    fn lists_the_keywords_with_or_before_the_last() {
        assert_eq!(
            unknown("mode", "dense", &["per-page", "packed"]),
            "unknown mode 'dense': expected per-page or packed"
        );
        assert_eq!(
            unknown("type", "x", &["a", "b", "c"]),
            "unknown type 'x': expected a, b or c"
        );
    }
}

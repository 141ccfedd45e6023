//! Status strings read as enums that keep a value this build does not know.
//!
//! The reference's CRDs put no `enum` on status strings (`currentStatus.phase`, `lastOperation.state`/`type`,
//! condition `type`/`status`), so a newer reference, a mixed rollout or a rollback can store values we do not know.
//! A plain serde enum would refuse the whole object on such a value, and the controllers' watches would then not see
//! the object at all. These enums read an unknown value as `Other`, keep its text for writing it back unchanged, and
//! describe themselves to the CRD schema as a plain string, as the reference does.

use std::fmt;

use arrayvec::ArrayString;

/// Longest unknown value kept whole, in bytes; the reference's longest status string has 23.
pub const UNRECOGNIZED_CAPACITY: usize = 63;

/// A status value this build does not know, kept as read (cut at [`UNRECOGNIZED_CAPACITY`] bytes, on a character
/// boundary) so that writing it back changes nothing. `Copy`, like the enums that hold it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Unrecognized(ArrayString<UNRECOGNIZED_CAPACITY>);

impl Unrecognized {
    /// The value `text`, cut to the capacity on a character boundary.
    pub fn new(text: &str) -> Self {
        let mut end = text.len().min(UNRECOGNIZED_CAPACITY);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mut kept = ArrayString::new();
        kept.push_str(&text[..end]);
        Self(kept)
    }

    /// The value as read.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Debug for Unrecognized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Defines a status enum whose variant names are its wire strings, plus `Other(Unrecognized)` for any other value:
/// `ALL` (the known variants), `as_str`, `parse`, `is_recognized`, `Display`, serde as a string, and a JSON schema
/// of a plain string (no `enum`).
macro_rules! status_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$variant_meta])* $variant, )+
            /// A value this build does not know (from a newer version or another tool), kept as read.
            Other($crate::status_value::Unrecognized),
        }

        impl $name {
            /// Every value this build knows, in the reference's order.
            pub const ALL: [Self; [$(stringify!($variant)),+].len()] = [$(Self::$variant),+];

            /// The wire string.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => stringify!($variant), )+
                    Self::Other(value) => value.as_str(),
                }
            }

            /// The value of the wire string `text`; never fails: an unknown string is kept as `Other`.
            pub fn parse(text: &str) -> Self {
                match text {
                    $( stringify!($variant) => Self::$variant, )+
                    other => Self::Other($crate::status_value::Unrecognized::new(other)),
                }
            }

            /// Whether this build knows the value (it is not `Other`).
            pub fn is_recognized(&self) -> bool {
                !matches!(self, Self::Other(_))
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(deserializer)?;
                Ok(Self::parse(&text))
            }
        }

        impl ::schemars::JsonSchema for $name {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut ::schemars::SchemaGenerator) -> ::schemars::Schema {
                ::schemars::json_schema!({ "type": "string" })
            }
        }
    };
}

pub(crate) use status_enum;

#[cfg(test)]
mod tests {
    use super::*;

    status_enum! {
        /// A test enum.
        enum Colour {
            /// Red.
            Red,
            /// Green.
            Green,
        }
    }

    #[test]
    fn known_values_read_as_their_variant_and_unknown_ones_are_kept_as_read() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::Green]);
        let read: Vec<Colour> = serde_json::from_str(r#"["Green","Blue"]"#).expect("never refused");
        assert_eq!(read[0], Colour::Green);
        assert!(!read[1].is_recognized());
        assert_eq!(read[1].as_str(), "Blue");
        assert_eq!(
            serde_json::to_string(&read).expect("serializes"),
            r#"["Green","Blue"]"#
        );
    }

    #[test]
    fn an_overlong_unknown_value_is_cut_on_a_character_boundary() {
        let long = "é".repeat(40); // 80 bytes
        let kept = Unrecognized::new(&long);
        assert_eq!(kept.as_str().len(), 62);
        assert!(long.starts_with(kept.as_str()));
    }

    #[test]
    fn the_schema_is_a_plain_string_without_enum() {
        let schema = schemars::schema_for!(Colour);
        assert_eq!(schema.get("type"), Some(&serde_json::json!("string")));
        assert!(schema.get("enum").is_none());
    }
}

//! [`named_enum!`](crate::named_enum): the names of a fieldless enum, written once.
//!
//! Flags and files name enum values (`--placement vshape`, `"recompute": "full"`). Each such enum
//! needs the same four things: its values in order, the name of each, the value of a name, and a
//! `Display` that writes the name. The macro writes them from one table, so a name cannot be
//! spelled two ways; each enum keeps its own `FromStr`, whose error says what it accepts.

/// Implements `ALL`, `name`, `from_name` and `Display` for a fieldless enum from a table of
/// `Variant => "name"` (attributes such as `#[cfg(..)]` on a row apply to that variant).
///
/// ```
/// #[derive(Debug, Clone, Copy, PartialEq)]
/// enum Side { Left, Right }
/// pipefill_host::named_enum!(Side { Left => "left", Right => "right" });
/// assert_eq!(Side::ALL, &[Side::Left, Side::Right]);
/// assert_eq!(Side::from_name("right"), Some(Side::Right));
/// assert_eq!(Side::Left.to_string(), "left");
/// assert_eq!(Side::from_name("up"), None);
/// ```
#[macro_export]
macro_rules! named_enum {
    ($ty:ident { $( $(#[$attr:meta])* $variant:ident => $name:literal ),+ $(,)? }) => {
        impl $ty {
            /// Every value, in the order of its names.
            pub const ALL: &'static [$ty] = &[$( $(#[$attr])* $ty::$variant ),+];

            /// The name used in files and on the command line.
            pub fn name(self) -> &'static str {
                match self {
                    $( $(#[$attr])* $ty::$variant => $name ),+
                }
            }

            /// The value called `name` (exactly), if there is one.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

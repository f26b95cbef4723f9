//! [`named_enum!`](crate::named_enum): the names of a fieldless enum, written once.
//!
//! Flags and files name enum values (`--placement vshape`, `"recompute": "full"`). Each such enum
//! needs the same four things: its values in order, the name of each, the value of a name, and a
//! `Display` that writes the name. The macro writes them from one table, so a name cannot be
//! spelled two ways. Written `named_enum!(Ty as "what" { ... })`, it also writes `FromStr` with a
//! `String` error naming `what` and every accepted name; an enum whose parse error is a type of its
//! own keeps its own `FromStr`.

/// Implements `ALL`, `name`, `from_name` and `Display` (and, with `as "what"`, `FromStr`) for a
/// fieldless enum from a table of
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
///
/// // With `as "what"`, `FromStr` too, its error naming what was expected and every name.
/// #[derive(Debug, Clone, Copy, PartialEq)]
/// enum Turn { Cw, Ccw }
/// pipefill_host::named_enum!(Turn as "turn" { Cw => "cw", Ccw => "ccw" });
/// assert_eq!("ccw".parse::<Turn>(), Ok(Turn::Ccw));
/// assert_eq!("up".parse::<Turn>().unwrap_err(), "unknown turn `up`: use one of cw, ccw");
/// ```
#[macro_export]
macro_rules! named_enum {
    ($ty:ident as $what:literal { $( $(#[$attr:meta])* $variant:ident => $name:literal ),+ $(,)? }) => {
        $crate::named_enum!($ty { $( $(#[$attr])* $variant => $name ),+ });

        impl ::std::str::FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                Self::from_name(s).ok_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
                    format!(concat!("unknown ", $what, " `{}`: use one of {}"), s, names.join(", "))
                })
            }
        }
    };
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

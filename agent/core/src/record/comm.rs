//! A task's command name as kernel events carry it. The kernel's is at most 15 bytes
//! (`TASK_COMM_LEN` with its NUL), so it is kept inline: every event has one (a cgroup
//! attach two), and the agent keeps tens of thousands of events, where a `String` each
//! was as many small heap blocks, scattered among short-lived ones.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Bytes kept inline: the kernel's 15 even when an invalid byte or two became U+FFFD,
/// and still the size of a `String`.
const INLINE: usize = 22;

/// A command name; derefs to `str`.
#[derive(Clone)]
pub struct Comm(Repr);

#[derive(Clone)]
enum Repr {
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    /// Longer names (a trace edited or written elsewhere) are kept whole.
    Heap(Box<str>),
}

impl Comm {
    pub fn new(s: &str) -> Comm {
        if s.len() > INLINE {
            return Comm(Repr::Heap(s.into()));
        }
        let mut bytes = [0; INLINE];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Comm(Repr::Inline {
            len: s.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always valid: the bytes were copied from a `str`, up to its end.
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..*len as usize]).unwrap_or_default()
            }
            Repr::Heap(s) => s,
        }
    }
}

impl Deref for Comm {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Comm {
    fn from(s: &str) -> Comm {
        Comm::new(s)
    }
}

impl PartialEq for Comm {
    fn eq(&self, other: &Comm) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Comm {}

impl PartialEq<str> for Comm {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Comm {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Hash for Comm {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Display for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Comm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for Comm {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Comm {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Comm, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Comm;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a command name")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Comm, E> {
                Ok(Comm::new(s))
            }
        }
        d.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_the_size_of_a_string_and_keeps_any_name() {
        assert_eq!(size_of::<Comm>(), size_of::<String>());
        for name in [
            "",
            "runc",
            "runc:[2:INIT]",
            "containerd-shim",
            &"x".repeat(40),
        ] {
            let c = Comm::new(name);
            assert_eq!(c, name);
            assert_eq!(c.to_string(), name);
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, serde_json::to_string(name).unwrap());
            assert_eq!(serde_json::from_str::<Comm>(&json).unwrap(), c);
        }
        assert!(matches!(
            Comm::new("containerd-shim").0,
            Repr::Inline { .. }
        ));
    }
}

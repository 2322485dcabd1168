//! A CRI call read from a trace. Its `response` is read into the call's method's types,
//! so the method is wanted first: a trace writes `method` before `response`, and a JSON
//! value (the reader's general way) orders its keys so too. A `response` met before the
//! method (a hand-written trace) is read as strings and typed once the method is known.
//!
//! Otherwise it reads as a derived `Deserialize` would: `method`, `start_ns`, `end_ns`
//! and `code` required; the strings, `attempt` and `traced` defaulted; other keys (the
//! record's `type`) skipped; a key given twice refused.

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::cri_response::UnknownFields;
use super::cri_response_serde::{ResponseSeed, read_written};
use super::{CriCall, CriMethod, CriResponse, GrpcCode};

const FIELDS: &[&str] = &[
    "method",
    "pod_uid",
    "container",
    "attempt",
    "sandbox_id",
    "container_id",
    "image",
    "start_ns",
    "end_ns",
    "code",
    "message",
    "response",
    "traced",
];

enum Field {
    Method,
    PodUid,
    Container,
    Attempt,
    SandboxId,
    ContainerId,
    Image,
    StartNs,
    EndNs,
    Code,
    Message,
    Response,
    Traced,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Field, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("field identifier")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
                Ok(match v {
                    "method" => Field::Method,
                    "pod_uid" => Field::PodUid,
                    "container" => Field::Container,
                    "attempt" => Field::Attempt,
                    "sandbox_id" => Field::SandboxId,
                    "container_id" => Field::ContainerId,
                    "image" => Field::Image,
                    "start_ns" => Field::StartNs,
                    "end_ns" => Field::EndNs,
                    "code" => Field::Code,
                    "message" => Field::Message,
                    "response" => Field::Response,
                    "traced" => Field::Traced,
                    _ => Field::Other,
                })
            }

            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Field, E> {
                match std::str::from_utf8(v) {
                    Ok(s) => self.visit_str(s),
                    Err(_) => Ok(Field::Other),
                }
            }
        }
        d.deserialize_identifier(FieldVisitor)
    }
}

/// Reads the next value into `slot`, refusing a second one.
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
    name: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(name));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// The fields read so far.
#[derive(Default)]
struct Read {
    method: Option<CriMethod>,
    pod_uid: Option<String>,
    container: Option<String>,
    attempt: Option<u32>,
    sandbox_id: Option<String>,
    container_id: Option<String>,
    image: Option<String>,
    start_ns: Option<u64>,
    end_ns: Option<u64>,
    code: Option<GrpcCode>,
    message: Option<String>,
    response: Option<CriResponse>,
    /// A response met before the method.
    written: Option<UnknownFields>,
    traced: Option<bool>,
}

struct CallVisitor;

impl<'de> Visitor<'de> for CallVisitor {
    type Value = CriCall;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct CriCall")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CriCall, A::Error> {
        let mut r = Read::default();
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Method => once(&mut map, &mut r.method, "method")?,
                Field::PodUid => once(&mut map, &mut r.pod_uid, "pod_uid")?,
                Field::Container => once(&mut map, &mut r.container, "container")?,
                Field::Attempt => once(&mut map, &mut r.attempt, "attempt")?,
                Field::SandboxId => once(&mut map, &mut r.sandbox_id, "sandbox_id")?,
                Field::ContainerId => once(&mut map, &mut r.container_id, "container_id")?,
                Field::Image => once(&mut map, &mut r.image, "image")?,
                Field::StartNs => once(&mut map, &mut r.start_ns, "start_ns")?,
                Field::EndNs => once(&mut map, &mut r.end_ns, "end_ns")?,
                Field::Code => once(&mut map, &mut r.code, "code")?,
                Field::Message => once(&mut map, &mut r.message, "message")?,
                Field::Traced => once(&mut map, &mut r.traced, "traced")?,
                Field::Response => {
                    if r.response.is_some() || r.written.is_some() {
                        return Err(de::Error::duplicate_field("response"));
                    }
                    match r.method {
                        Some(method) => {
                            r.response = Some(map.next_value_seed(ResponseSeed(method))?)
                        }
                        None => r.written = Some(map.next_value()?),
                    }
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let method = r.method.ok_or_else(|| de::Error::missing_field("method"))?;
        let response = match (r.response, r.written) {
            (Some(response), _) => response,
            (None, Some(written)) => read_written(method, written),
            (None, None) => CriResponse::empty(),
        };
        Ok(CriCall {
            method,
            pod_uid: r.pod_uid.unwrap_or_default(),
            container: r.container.unwrap_or_default(),
            attempt: r.attempt.unwrap_or_default(),
            sandbox_id: r.sandbox_id.unwrap_or_default(),
            container_id: r.container_id.unwrap_or_default(),
            image: r.image.unwrap_or_default(),
            start_ns: r
                .start_ns
                .ok_or_else(|| de::Error::missing_field("start_ns"))?,
            end_ns: r.end_ns.ok_or_else(|| de::Error::missing_field("end_ns"))?,
            code: r.code.ok_or_else(|| de::Error::missing_field("code"))?,
            message: r.message.unwrap_or_default(),
            response,
            traced: r.traced.unwrap_or_default(),
        })
    }
}

impl<'de> Deserialize<'de> for CriCall {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CriCall, D::Error> {
        d.deserialize_struct("CriCall", FIELDS, CallVisitor)
    }
}

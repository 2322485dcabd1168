//! A call's response as a trace writes it: a map of field names to strings, in name
//! order (as the map of strings that held it once wrote it), e.g. `{"exit_code":"0",
//! "reason":"Completed","state":"2"}`; a Status's conditions as `<type>` ("true" or
//! "false") and a false one's `<type>_reason` and `<type>_message`. This is the only place
//! that knows those names and how each value is spelled; everything else reads the types.
//!
//! Reading takes a field into the method's type only when its value is spelled exactly as
//! the recorder spells it (`"0"`, not `"00"`; an IP as Rust and Go print it), so writing it
//! again gives the same text; anything else is kept as it was written, beside the typed
//! fields, and written back in its place.

use std::cmp::Ordering;
use std::fmt::{self, Display, Write as _};
use std::net::IpAddr;
use std::ops::Deref;
use std::str::FromStr;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Deserializer, Serialize};

use super::cri_response::{Recorded, UnknownFields};
use super::{
    ContainerReason, ContainerState, ContainerStatusFields, CriMethod, CriResponse, ListFields,
    PodSandboxNetwork, PodSandboxState, PodSandboxStatusFields, ResponseFields, RuntimeCondition,
    RuntimeConditionType, StatusFields,
};

const RUNTIME_NAME: &str = "runtime_name";
const RUNTIME_VERSION: &str = "runtime_version";
const STATE: &str = "state";
const IP: &str = "ip";
const COUNT: &str = "count";
const EXIT_CODE: &str = "exit_code";
const REASON: &str = "reason";
const PRESENT: &str = "present";
const AUTH: &str = "auth";
const IMAGE_REF: &str = "image_ref";
const TIMEOUT: &str = "timeout";
const CPU_QUOTA: &str = "cpu_quota";
const CPU_SHARES: &str = "cpu_shares";
const MEMORY_LIMIT_IN_BYTES: &str = "memory_limit_in_bytes";
/// After a condition's type: why it is false, and the runtime's words for it.
const CONDITION_REASON: &str = "_reason";
const CONDITION_MESSAGE: &str = "_message";

impl CriResponse {
    /// PodSandboxStatus as the runtime answered it: the state's CRI number, and the IP of
    /// its network status when it gave one. A state CRI does not define, or an IP that is
    /// not an address as the recorder spells one, is kept as the runtime's text.
    pub fn pod_sandbox_status(state: i32, ip: Option<&str>) -> CriResponse {
        let mut unknown = UnknownFields::new();
        let fields = PodSandboxStatusFields {
            state: PodSandboxState::from_number(state).or_else(|| {
                unknown.insert(STATE.into(), state.to_string());
                None
            }),
            network: ip.and_then(|text| {
                network(text).or_else(|| {
                    unknown.insert(IP.into(), text.into());
                    None
                })
            }),
        };
        CriResponse::with_unknown(ResponseFields::PodSandboxStatus(fields), unknown)
    }

    /// ContainerStatus as the runtime answered it: the state's CRI number, the exit code,
    /// and the reason when it gave one. A state CRI does not define is kept as its number.
    pub fn container_status(state: i32, exit_code: i32, reason: Option<&str>) -> CriResponse {
        let mut unknown = UnknownFields::new();
        let fields = ContainerStatusFields {
            state: ContainerState::from_number(state).or_else(|| {
                unknown.insert(STATE.into(), state.to_string());
                None
            }),
            exit_code: Some(exit_code),
            reason: reason.map(ContainerReason::new),
        };
        CriResponse::with_unknown(ResponseFields::ContainerStatus(fields), unknown)
    }

    /// ListPodSandbox or ListContainers (`method`) that listed `count`.
    pub fn listed(method: CriMethod, count: usize) -> CriResponse {
        // No runtime lists four billion objects.
        let fields = ListFields {
            count: Some(u32::try_from(count).unwrap_or(u32::MAX)),
        };
        match method {
            CriMethod::ListPodSandbox => ResponseFields::ListPodSandbox(fields).into(),
            _ => ResponseFields::ListContainers(fields).into(),
        }
    }
}

/// `text` as an integer, if it is one as Rust and Go print it: digits with no leading zero
/// and no `+`, a `-` before any but zero (so it writes back as exactly `text`). Checked on
/// the text rather than by printing the number again: a trace holds one or two per call.
fn number<T: FromStr>(text: &str) -> Option<T> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain = match digits.as_bytes() {
        [b'0'] => digits.len() == text.len(),
        [b'0', ..] | [] => false,
        d => d.iter().all(u8::is_ascii_digit),
    };
    if plain { text.parse().ok() } else { None }
}

/// `text` as a boolean: `true` or `false`, the only spellings Rust reads.
fn flag(text: &str) -> Option<bool> {
    text.parse().ok()
}

/// `text` as an IP address, if it writes back as exactly `text`: an IPv4 address always
/// does (Rust reads only the dotted quad, without leading zeros); an IPv6 one must be in
/// the form Rust and Go print (lower case, the longest run of zeros shortened).
fn address(text: &str) -> Option<IpAddr> {
    match text.parse().ok()? {
        IpAddr::V4(ip) => Some(IpAddr::V4(ip)),
        ip @ IpAddr::V6(_) => displays_as(&ip, text).then_some(ip),
    }
}

/// Whether `value` displays as `text`, compared as it is formatted (no allocation).
fn displays_as(value: &impl Display, text: &str) -> bool {
    struct Matches<'a>(Option<&'a str>);
    impl fmt::Write for Matches<'_> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 = self.0.and_then(|rest| rest.strip_prefix(s));
            Ok(())
        }
    }
    let mut m = Matches(Some(text));
    let _ = write!(m, "{value}");
    m.0 == Some("")
}

/// A sandbox network status's `ip`: empty on the host's network, else an address.
fn network(text: &str) -> Option<PodSandboxNetwork> {
    if text.is_empty() {
        return Some(PodSandboxNetwork { ip: None });
    }
    address(text).map(|ip| PodSandboxNetwork { ip: Some(ip) })
}

/// The method's fields, none set yet.
fn unset(method: CriMethod) -> ResponseFields {
    match method {
        CriMethod::Version => ResponseFields::Version(Default::default()),
        CriMethod::Status => ResponseFields::Status(Default::default()),
        CriMethod::PodSandboxStatus => ResponseFields::PodSandboxStatus(Default::default()),
        CriMethod::ListPodSandbox => ResponseFields::ListPodSandbox(Default::default()),
        CriMethod::ListContainers => ResponseFields::ListContainers(Default::default()),
        CriMethod::ContainerStatus => ResponseFields::ContainerStatus(Default::default()),
        CriMethod::ExecSync => ResponseFields::ExecSync(Default::default()),
        CriMethod::ImageStatus => ResponseFields::ImageStatus(Default::default()),
        CriMethod::PullImage => ResponseFields::PullImage(Default::default()),
        CriMethod::StopContainer => ResponseFields::StopContainer(Default::default()),
        CriMethod::UpdateContainerResources => {
            ResponseFields::UpdateContainerResources(Default::default())
        }
        CriMethod::RunPodSandbox
        | CriMethod::StopPodSandbox
        | CriMethod::RemovePodSandbox
        | CriMethod::CreateContainer
        | CriMethod::StartContainer
        | CriMethod::RemoveContainer => ResponseFields::None,
    }
}

/// Text as the deserializer gave it: borrowed from the input when it can be.
enum Text<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Text<'_> {
    fn into_owned(self) -> String {
        match self {
            Text::Borrowed(s) => s.to_string(),
            Text::Owned(s) => s,
        }
    }
}

impl Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Text::Borrowed(s) => s,
            Text::Owned(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Text<'de>, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text::Borrowed(v))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text::Owned(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text::Owned(v))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

/// Sets `slot` to `value` read by `parse`; gives `value` back when it does not read.
fn set<'de, T>(
    slot: &mut Option<T>,
    value: Text<'de>,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<(), Text<'de>> {
    *slot = parse(&value);
    if slot.is_some() { Ok(()) } else { Err(value) }
}

/// Reads the field `key` into `fields`; gives `value` back when `key` is not one of the
/// method's fields or `value` is not spelled as the recorder spells it (the field, if
/// `key` names one, is then unset: the later of two equal keys wins, as in a map).
fn read<'de>(fields: &mut ResponseFields, key: &str, value: Text<'de>) -> Result<(), Text<'de>> {
    use ResponseFields as F;
    match (fields, key) {
        (F::Version(f), RUNTIME_NAME) => f.runtime_name = Some(value.into_owned()),
        (F::Version(f), RUNTIME_VERSION) => f.runtime_version = Some(value.into_owned()),
        (F::Status(f), _) => return read_condition(f, key, value),
        (F::PodSandboxStatus(f), STATE) => {
            return set(&mut f.state, value, |v| {
                number(v).and_then(PodSandboxState::from_number)
            });
        }
        (F::PodSandboxStatus(f), IP) => return set(&mut f.network, value, network),
        (F::ListPodSandbox(f) | F::ListContainers(f), COUNT) => {
            return set(&mut f.count, value, number);
        }
        (F::ContainerStatus(f), STATE) => {
            return set(&mut f.state, value, |v| {
                number(v).and_then(ContainerState::from_number)
            });
        }
        (F::ContainerStatus(f), EXIT_CODE) => return set(&mut f.exit_code, value, number),
        (F::ContainerStatus(f), REASON) => f.reason = Some(ContainerReason::new(&value)),
        (F::ExecSync(f), EXIT_CODE) => return set(&mut f.exit_code, value, number),
        (F::ImageStatus(f), PRESENT) => return set(&mut f.present, value, flag),
        (F::PullImage(f), AUTH) => return set(&mut f.auth, value, flag),
        (F::PullImage(f), IMAGE_REF) => f.image_ref = Some(value.into_owned()),
        (F::StopContainer(f), TIMEOUT) => return set(&mut f.timeout, value, number),
        (F::UpdateContainerResources(f), CPU_QUOTA) => {
            return set(&mut f.cpu_quota, value, number);
        }
        (F::UpdateContainerResources(f), CPU_SHARES) => {
            return set(&mut f.cpu_shares, value, number);
        }
        (F::UpdateContainerResources(f), MEMORY_LIMIT_IN_BYTES) => {
            return set(&mut f.memory_limit_in_bytes, value, number);
        }
        _ => return Err(value),
    }
    Ok(())
}

/// A Status field: a condition's type with "true" or "false". A condition's reason and
/// message wait for [`finish`], as their condition may come later in the map.
fn read_condition<'de>(f: &mut StatusFields, key: &str, value: Text<'de>) -> Result<(), Text<'de>> {
    if key.ends_with(CONDITION_REASON) || key.ends_with(CONDITION_MESSAGE) {
        return Err(value);
    }
    let t = RuntimeConditionType::new(key);
    match flag(&value) {
        Some(status) => {
            f.set(RuntimeCondition::new(t, status));
            Ok(())
        }
        None => {
            f.conditions.retain(|c| c.r#type != t);
            Err(value)
        }
    }
}

/// Ends a read: a Status condition's reason and message join it.
fn finish(fields: &mut ResponseFields, unknown: &mut UnknownFields) {
    let ResponseFields::Status(f) = fields else {
        return;
    };
    if unknown.is_empty() {
        return;
    }
    for c in &mut f.conditions {
        let name = c.r#type.as_str();
        c.reason = unknown.remove(&format!("{name}{CONDITION_REASON}"));
        c.message = unknown.remove(&format!("{name}{CONDITION_MESSAGE}"));
    }
}

/// Puts `key` and `value` into `fields`, or keeps them as written.
fn take(fields: &mut ResponseFields, unknown: &mut UnknownFields, key: Text<'_>, value: Text<'_>) {
    match read(fields, &key, value) {
        Ok(()) => {
            if !unknown.is_empty() {
                unknown.remove(&*key);
            }
        }
        Err(value) => {
            unknown.insert(key.into_owned(), value.into_owned());
        }
    }
}

/// Reads a `response` map for `method`.
pub(super) struct ResponseSeed(pub CriMethod);

impl<'de> DeserializeSeed<'de> for ResponseSeed {
    type Value = CriResponse;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<CriResponse, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ResponseSeed {
    type Value = CriResponse;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<CriResponse, A::Error> {
        let mut fields = unset(self.0);
        let mut unknown = UnknownFields::new();
        while let Some(key) = map.next_key::<Text<'de>>()? {
            let value = map.next_value::<Text<'de>>()?;
            take(&mut fields, &mut unknown, key, value);
        }
        finish(&mut fields, &mut unknown);
        Ok(CriResponse::with_unknown(fields, unknown))
    }
}

/// A `response` map read before the call's method (a trace written by hand, its keys in
/// another order), read for `method` now.
pub(super) fn read_written(method: CriMethod, written: UnknownFields) -> CriResponse {
    let mut fields = unset(method);
    let mut unknown = UnknownFields::new();
    for (key, value) in written {
        take(
            &mut fields,
            &mut unknown,
            Text::Owned(key),
            Text::Owned(value),
        );
    }
    finish(&mut fields, &mut unknown);
    CriResponse::with_unknown(fields, unknown)
}

/// A field's name as written: a name, or a condition's type and what follows it.
#[derive(Clone, Copy)]
struct Key<'a> {
    head: &'a str,
    tail: &'static str,
}

impl<'a> Key<'a> {
    fn new(head: &'a str) -> Key<'a> {
        Key { head, tail: "" }
    }

    fn bytes(self) -> impl Iterator<Item = u8> + 'a {
        self.head.bytes().chain(self.tail.bytes())
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Key<'_> {}

impl PartialOrd for Key<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.bytes().cmp(other.bytes())
    }
}

impl Serialize for Key<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.tail.is_empty() {
            s.serialize_str(self.head)
        } else {
            s.collect_str(&format_args!("{}{}", self.head, self.tail))
        }
    }
}

/// A field's value as written: always a string.
#[derive(Clone, Copy)]
enum Value<'a> {
    Text(&'a str),
    Int(i64),
    Bool(bool),
    Network(PodSandboxNetwork),
}

impl Serialize for Value<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Text(t) => s.serialize_str(t),
            Value::Int(n) => s.collect_str(n),
            Value::Bool(b) => s.serialize_str(if *b { "true" } else { "false" }),
            Value::Network(PodSandboxNetwork { ip: None }) => s.serialize_str(""),
            Value::Network(PodSandboxNetwork { ip: Some(ip) }) => s.collect_str(ip),
        }
    }
}

/// Calls `f` with every field `r` writes, typed and kept, in no particular order.
fn each<'a>(r: &'a Recorded, mut f: impl FnMut(Key<'a>, Value<'a>)) {
    let mut put = |name: &'static str, value: Option<Value<'a>>| {
        if let Some(v) = value {
            f(Key::new(name), v);
        }
    };
    let int = |n: Option<i64>| n.map(Value::Int);
    let text = |t: &'a Option<String>| t.as_deref().map(Value::Text);
    match &r.fields {
        ResponseFields::None => {}
        ResponseFields::Version(v) => {
            put(RUNTIME_NAME, text(&v.runtime_name));
            put(RUNTIME_VERSION, text(&v.runtime_version));
        }
        ResponseFields::Status(s) => {
            for c in &s.conditions {
                let head = c.r#type.as_str();
                let key = |tail| Key { head, tail };
                f(key(""), Value::Bool(c.status));
                if let Some(reason) = &c.reason {
                    f(key(CONDITION_REASON), Value::Text(reason));
                }
                if let Some(message) = &c.message {
                    f(key(CONDITION_MESSAGE), Value::Text(message));
                }
            }
        }
        ResponseFields::PodSandboxStatus(s) => {
            put(STATE, int(s.state.map(|s| s.number().into())));
            put(IP, s.network.map(Value::Network));
        }
        ResponseFields::ListPodSandbox(l) | ResponseFields::ListContainers(l) => {
            put(COUNT, int(l.count.map(i64::from)));
        }
        ResponseFields::ContainerStatus(c) => {
            put(STATE, int(c.state.map(|s| s.number().into())));
            put(EXIT_CODE, int(c.exit_code.map(i64::from)));
            put(REASON, c.reason.as_ref().map(|r| Value::Text(r.as_str())));
        }
        ResponseFields::ExecSync(e) => put(EXIT_CODE, int(e.exit_code.map(i64::from))),
        ResponseFields::ImageStatus(i) => put(PRESENT, i.present.map(Value::Bool)),
        ResponseFields::PullImage(p) => {
            put(AUTH, p.auth.map(Value::Bool));
            put(IMAGE_REF, text(&p.image_ref));
        }
        ResponseFields::StopContainer(s) => put(TIMEOUT, int(s.timeout)),
        ResponseFields::UpdateContainerResources(u) => {
            put(CPU_QUOTA, int(u.cpu_quota));
            put(CPU_SHARES, int(u.cpu_shares));
            put(MEMORY_LIMIT_IN_BYTES, int(u.memory_limit_in_bytes));
        }
    }
    for (key, value) in r.unknown.iter() {
        f(Key::new(key), Value::Text(value));
    }
}

impl Serialize for CriResponse {
    /// The fields in name order, typed and kept alike: each pass over them writes the
    /// least name after the last written (a response has a handful).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Some(r) = self.recorded() else {
            return s.serialize_map(Some(0))?.end();
        };
        let mut len = 0;
        each(r, |_, _| len += 1);
        let mut map = s.serialize_map(Some(len))?;
        let mut last: Option<Key<'_>> = None;
        loop {
            let mut next: Option<(Key<'_>, Value<'_>)> = None;
            each(r, |k, v| {
                if last.is_none_or(|l| k > l) && next.is_none_or(|(n, _)| k < n) {
                    next = Some((k, v));
                }
            });
            let Some((k, v)) = next else {
                break;
            };
            map.serialize_entry(&k, &v)?;
            last = Some(k);
        }
        map.end()
    }
}

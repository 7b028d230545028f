//! AdmissionReview v1 on the wire: a strict decoder that turns every malformed input into a
//! clear client error (never a panic), and the response encoder.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

mod scan;

/// Why a request body is not an AdmissionReview v1 we can answer. Each is a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("body is not valid JSON: {0}")]
    Json(String),
    #[error("apiVersion must be admission.k8s.io/v1, got {0:?}")]
    ApiVersion(String),
    #[error("kind must be AdmissionReview, got {0:?}")]
    Kind(String),
    #[error("AdmissionReview has no request")]
    MissingRequest,
    #[error("request is malformed: {0}")]
    Request(String),
}

/// A string of a review, borrowed from its body where it has no escapes: a review is read
/// without copying its strings (allocating and copying a dozen per review was a tenth of the
/// decode, `make bench`, perf).
pub type Text<'a> = std::borrow::Cow<'a, str>;

/// Reads a `Text`, borrowed from the body where it has no escapes. serde borrows a `Cow` only
/// where a field spells out `Cow<'a, str>` (not through an alias, an `Option` or a list), and
/// copies it otherwise: every `Text` of a review says how it is read.
fn borrowed<'de: 'a, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Text<'a>, D::Error> {
    struct Borrowed;
    impl<'de> serde::de::Visitor<'de> for Borrowed {
        type Value = Text<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'de>, E> {
            Ok(Text::Borrowed(s))
        }
        fn visit_str<E>(self, s: &str) -> Result<Text<'de>, E> {
            Ok(Text::Owned(s.to_string()))
        }
        fn visit_string<E>(self, s: String) -> Result<Text<'de>, E> {
            Ok(Text::Owned(s))
        }
    }
    d.deserialize_str(Borrowed)
}

/// `borrowed`, where the field may be null.
fn borrowed_or_none<'de: 'a, 'a, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Text<'a>>, D::Error> {
    struct OrNone;
    impl<'de> serde::de::Visitor<'de> for OrNone {
        type Value = Option<Text<'de>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string or null")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            borrowed(d).map(Some)
        }
    }
    d.deserialize_option(OrNone)
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupVersionKind<'a> {
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub(crate) group: Text<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub(crate) version: Text<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub(crate) kind: Text<'a>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GroupVersionResource<'a> {
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub(crate) group: Text<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub(crate) version: Text<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub(crate) resource: Text<'a>,
}

/// A `Text` in a list (serde reads a list's items by their type alone).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Item<'a>(#[serde(borrow, deserialize_with = "borrowed")] pub Text<'a>);

impl AsRef<str> for Item<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Item<'_> {
    fn into_owned(self) -> Item<'static> {
        Item(own(self.0))
    }
}

/// A `Text` free of the body it was read from.
fn own(t: Text<'_>) -> Text<'static> {
    Text::Owned(t.into_owned())
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo<'a> {
    #[serde(default, borrow, deserialize_with = "borrowed")]
    pub username: Text<'a>,
    /// Borrowed as the strings are: a user has two or three groups, each a copy otherwise.
    #[serde(default, borrow)]
    pub groups: Vec<Item<'a>>,
    /// What the authenticator (or an `Impersonate-Extra-` header) added: the agent's canaries
    /// carry their nonce here (`guards::canary::NONCE_EXTRA`).
    #[serde(default)]
    pub(crate) extra: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    #[serde(borrow, deserialize_with = "borrowed")]
    pub uid: Text<'a>,
    #[serde(borrow)]
    pub(crate) kind: GroupVersionKind<'a>,
    #[serde(borrow)]
    pub(crate) resource: GroupVersionResource<'a>,
    #[serde(default, borrow, deserialize_with = "borrowed_or_none")]
    pub(crate) sub_resource: Option<Text<'a>>,
    #[serde(default, borrow, deserialize_with = "borrowed_or_none")]
    pub(crate) name: Option<Text<'a>>,
    #[serde(default, borrow, deserialize_with = "borrowed_or_none")]
    pub namespace: Option<Text<'a>>,
    #[serde(borrow, deserialize_with = "borrowed")]
    pub(crate) operation: Text<'a>,
    #[serde(default, borrow)]
    pub user_info: UserInfo<'a>,
    #[serde(default)]
    object: Option<Object<'a>>,
    #[serde(default)]
    old_object: Option<Object<'a>>,
    #[serde(default)]
    pub(crate) dry_run: Option<bool>,
}

/// An object of a review (`object`, `oldObject`) as it came: its JSON kept as text, its tree
/// built the first time a guard reads it. Most reviews are decided by who sent them or by the
/// name alone, and building the trees they never read was most of a review's decoding
/// (`make bench`, perf: `Value` trees and their strings, about a quarter of the service's own
/// CPU per review).
#[derive(Debug, Clone)]
struct Object<'a> {
    /// Borrowed from the body where the review was read by hand (`scan`).
    raw: Text<'a>,
    tree: std::sync::OnceLock<Result<Value, String>>,
    name: std::sync::OnceLock<Option<String>>,
}

/// serde_json's capture of the value's text, the object's own (the general way: `scan`
/// borrows it where it reads the review).
impl<'de, 'a> Deserialize<'de> for Object<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: Box<serde_json::value::RawValue> = Deserialize::deserialize(d)?;
        Ok(Object::new(Text::Owned(Box::<str>::from(raw).into())))
    }
}

impl<'a> Object<'a> {
    fn new(raw: Text<'a>) -> Self {
        Object {
            raw,
            tree: std::sync::OnceLock::new(),
            name: std::sync::OnceLock::new(),
        }
    }

    /// The tree, built once; `Err`: the text is JSON the tree cannot hold (nested deeper than
    /// serde_json's limit, a number out of range), which the whole request then answers as a
    /// malformed review (`Request::unreadable`).
    fn tree(&self) -> Result<&Value, &str> {
        self.tree
            .get_or_init(|| serde_json::from_str(&self.raw).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(String::as_str)
    }

    /// The string at `path`, read as the tree reads it (`o[path[0]][path[1]]….as_str()`) but,
    /// while no guard has built the tree, without building it (`Pick`). What the short way
    /// cannot read (a number out of range) goes the long way, which then fails too and says
    /// so (`Request::unreadable`).
    fn str_at(&self, path: &'static [&'static str]) -> Option<String> {
        let from_tree = |t: &Value| {
            path.iter()
                .fold(t, |v, k| &v[*k])
                .as_str()
                .map(str::to_string)
        };
        if let Some(Ok(tree)) = self.tree.get() {
            return from_tree(tree);
        }
        let mut d = serde_json::Deserializer::from_str(&self.raw);
        match serde::de::DeserializeSeed::deserialize(Pick(path), &mut d) {
            Ok(found) => found,
            Err(_) => self.tree().ok().and_then(from_tree),
        }
    }

    /// `metadata.name` (`str_at`), read once.
    fn name(&self) -> Option<&str> {
        self.name
            .get_or_init(|| self.str_at(&["metadata", "name"]))
            .as_deref()
    }

    fn into_owned(self) -> Object<'static> {
        Object {
            raw: own(self.raw),
            tree: self.tree,
            name: self.name,
        }
    }
}

/// Two objects are the same object when their trees are (an unreadable one by its text).
impl PartialEq for Object<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self.tree(), other.tree()) {
            (Ok(a), Ok(b)) => a == b,
            _ => self.raw == other.raw,
        }
    }
}

/// The string at a path of keys in a JSON value, as the tree reads it
/// (`v[path[0]][path[1]]….as_str()`: a later key replaces an earlier one, anything but an
/// object along the path or a string at its end is none), found in one pass that builds
/// nothing else.
struct Pick(&'static [&'static str]);

impl<'de> serde::de::DeserializeSeed<'de> for Pick {
    type Value = Option<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pick {
    type Value = Option<String>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_str<E>(self, s: &str) -> Result<Option<String>, E> {
        Ok(self.0.is_empty().then(|| s.to_string()))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<String>, E> {
        Ok(None)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Option<String>, A::Error> {
        while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Option<String>, A::Error> {
        let mut found = None;
        while let Some(Item(key)) = m.next_key::<Item<'de>>()? {
            match self.0.split_first() {
                Some((first, rest)) if key == *first => found = m.next_value_seed(Pick(rest))?,
                _ => {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

impl Request<'_> {
    /// The request with every string its own, free of the body it was read from.
    pub fn into_owned(self) -> Request<'static> {
        Request {
            uid: own(self.uid),
            kind: GroupVersionKind {
                group: own(self.kind.group),
                version: own(self.kind.version),
                kind: own(self.kind.kind),
            },
            resource: GroupVersionResource {
                group: own(self.resource.group),
                version: own(self.resource.version),
                resource: own(self.resource.resource),
            },
            sub_resource: self.sub_resource.map(own),
            name: self.name.map(own),
            namespace: self.namespace.map(own),
            operation: own(self.operation),
            user_info: UserInfo {
                username: own(self.user_info.username),
                groups: self
                    .user_info
                    .groups
                    .into_iter()
                    .map(Item::into_owned)
                    .collect(),
                extra: self.user_info.extra,
            },
            object: self.object.map(Object::into_owned),
            old_object: self.old_object.map(Object::into_owned),
            dry_run: self.dry_run,
        }
    }

    /// The object as it will be stored (CREATE, UPDATE; a CONNECT's options), its tree built
    /// at the first read; `None` where the review has none, or one the tree cannot hold
    /// (`unreadable`).
    pub fn object(&self) -> Option<&Value> {
        self.object.as_ref().and_then(|o| o.tree().ok())
    }

    /// The object as it was (UPDATE, DELETE), as `object` reads it.
    pub fn old_object(&self) -> Option<&Value> {
        self.old_object.as_ref().and_then(|o| o.tree().ok())
    }

    /// The string at `path` in the object as it will be stored, read without building its
    /// tree (`Object::str_at`): for a question every review is asked, as whether it is the
    /// agent's probe, which must not build the tree of every object a guard left unread.
    pub(crate) fn object_str_at(&self, path: &'static [&'static str]) -> Option<String> {
        self.object.as_ref().and_then(|o| o.str_at(path))
    }

    /// Why an object a guard read could not be read: the review is then malformed, and is
    /// answered so, whatever the guard decided without it. An object no guard read is not
    /// looked at.
    pub fn unreadable(&self) -> Option<&str> {
        [&self.object, &self.old_object]
            .into_iter()
            .flatten()
            .find_map(|o| o.tree.get().and_then(|t| t.as_ref().err()))
            .map(String::as_str)
    }

    /// Every name this request is about: the name the client asked for, the object's as it
    /// will be stored (CREATE and UPDATE, after every mutating admission, the tenant's own
    /// included) and the old object's (UPDATE and DELETE: each object of a collection delete,
    /// whose request names none). A guard that protects names judges all of them: the name
    /// asked for, before mutation, can only add a denial, never take one away. In the order
    /// they cost, each read only when the one before did not decide: the name asked for is
    /// already read, an object's is read from its text (a DELETE's name decides most of the
    /// reviews of the guards that protect names, and reading the old object's was a tenth of
    /// such a review's own CPU, `make bench`, perf).
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.name.as_deref())
            .chain(std::iter::once_with(|| {
                self.object.as_ref().and_then(Object::name)
            }))
            .chain(std::iter::once_with(|| {
                self.old_object.as_ref().and_then(Object::name)
            }))
            .flatten()
            .filter(|n| !n.is_empty())
    }

    /// Whether this is one of `operations` on the resource `group`/`resource` itself (no
    /// subresource): the requests a guard of one kind judges.
    pub(crate) fn is_one_of(&self, operations: &[&str], group: &str, resource: &str) -> bool {
        operations.contains(&&*self.operation)
            && self.resource.group == group
            && self.resource.resource == resource
            && self.sub_resource.as_deref().is_none_or(str::is_empty)
    }

    /// The name to show for this request: the stored object's (the new one, else the old
    /// one), else the name asked for.
    pub(crate) fn stored_name(&self) -> &str {
        [&self.object, &self.old_object]
            .into_iter()
            .flatten()
            .filter_map(Object::name)
            .chain(self.name.as_deref())
            .find(|n| !n.is_empty())
            .unwrap_or_default()
    }
}

/// The envelope of a review, decoded straight into types: no `Value` is built for the
/// envelope or the request (only for the objects the guards read).
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(
        rename = "apiVersion",
        default,
        borrow,
        deserialize_with = "borrowed_or_none"
    )]
    api_version: Option<Text<'a>>,
    #[serde(default, borrow, deserialize_with = "borrowed_or_none")]
    kind: Option<Text<'a>>,
    #[serde(default, borrow)]
    request: Option<Request<'a>>,
}

/// Decodes a request body. A review in the API server's shape is read by hand (`scan`), any
/// other well-formed one in one typed pass (`typed`); anything else is decoded again the slow
/// way, which checks the envelope first so the error names what is wrong (the same answer every
/// way: each shorter way only ever accepts what the slow one does, and reads it the same).
pub fn decode(body: &[u8]) -> Result<Request<'_>, ReviewError> {
    // Checked as UTF-8 once, whole, rather than string by string as `from_slice` does.
    if let Ok(text) = std::str::from_utf8(body)
        && let Some(req) = scan::request(text).or_else(|| typed(text))
    {
        return checked(req);
    }
    decode_checking_the_envelope(body)
}

/// The request of a review serde_json's typed pass reads whole, its envelope as it must be;
/// `None`: anything else, left to the slow way to say what is wrong. Out of line: it is the
/// path of the few reviews `scan` leaves, and inlined into `decode` it slowed the common one
/// (the loop over the bench's review, decode 639 to 677 ns against 609 to 655).
#[inline(never)]
fn typed(text: &str) -> Option<Request<'_>> {
    match serde_json::from_str::<Envelope>(text).ok()? {
        Envelope {
            api_version: Some(v),
            kind: Some(k),
            request: Some(req),
        } if v == "admission.k8s.io/v1" && k == "AdmissionReview" => Some(req),
        _ => None,
    }
}

fn decode_checking_the_envelope(body: &[u8]) -> Result<Request<'static>, ReviewError> {
    let mut v: Value =
        serde_json::from_slice(body).map_err(|e| ReviewError::Json(e.to_string()))?;
    let Some(env) = v.as_object_mut() else {
        return Err(ReviewError::Json("body is not a JSON object".into()));
    };
    let field = |env: &serde_json::Map<String, Value>, k: &str| {
        env.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let api_version = field(env, "apiVersion");
    if api_version != "admission.k8s.io/v1" {
        return Err(ReviewError::ApiVersion(api_version));
    }
    let kind = field(env, "kind");
    if kind != "AdmissionReview" {
        return Err(ReviewError::Kind(kind));
    }
    let req = env
        .remove("request")
        .filter(|r| !r.is_null())
        .ok_or(ReviewError::MissingRequest)?;
    let req = Request::deserialize(&req).map_err(|e| ReviewError::Request(e.to_string()))?;
    checked(req.into_owned())
}

fn checked(req: Request<'_>) -> Result<Request<'_>, ReviewError> {
    if req.uid.is_empty() {
        return Err(ReviewError::Request("uid is empty".into()));
    }
    if !["CREATE", "UPDATE", "DELETE", "CONNECT"].contains(&&*req.operation) {
        return Err(ReviewError::Request(format!(
            "unknown operation {:?}",
            req.operation
        )));
    }
    Ok(req)
}

/// What a webhook decided, before encoding.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    pub allowed: bool,
    /// Shown to the user on a denial.
    pub message: Option<String>,
    pub warnings: Vec<String>,
    pub audit_annotations: BTreeMap<String, String>,
    /// JSON Patch operations (mutating webhooks).
    pub patch: Vec<Value>,
}

impl Decision {
    pub fn allow() -> Self {
        Self {
            allowed: true,
            ..Self::default()
        }
    }

    pub(crate) fn deny(message: impl Into<String>) -> Self {
        Self {
            allowed: false,
            message: Some(message.into()),
            ..Self::default()
        }
    }
}

/// The AdmissionReview response for `uid`, written by hand: its fields in the order the
/// `json!` tree it once was wrote them (sorted), each string escaped as serde_json escapes it,
/// so the bytes are as they were (tests hold it to that tree). Through serde's serializer it
/// was a tenth of a denial's CPU in the service, most of it escaping the message a byte at a
/// time (`make bench`, perf).
pub fn encode(uid: &str, d: &Decision) -> Vec<u8> {
    let patch = (d.allowed && !d.patch.is_empty()).then(|| {
        let patch = serde_json::to_vec(&d.patch).unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(patch)
    });
    let message = d.message.as_deref().unwrap_or("denied");
    // Sized for the whole answer at once (the envelope is about 150 bytes): a denial's
    // answer outgrew the default buffer twice, each time copied (`make bench`, perf).
    let size = 192 + uid.len() + message.len() + patch.as_ref().map_or(0, String::len);
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"allowed":"#,
    );
    out.extend_from_slice(if d.allowed { b"true" } else { b"false" });
    if !d.audit_annotations.is_empty() {
        out.extend_from_slice(br#","auditAnnotations":"#);
        let pairs = d
            .audit_annotations
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()));
        json::object(&mut out, pairs);
    }
    if let Some(patch) = &patch {
        out.extend_from_slice(br#","patch":"#);
        json::string(&mut out, patch);
        out.extend_from_slice(br#","patchType":"JSONPatch""#);
    }
    if !d.allowed {
        out.extend_from_slice(br#","status":{"code":403,"message":"#);
        json::string(&mut out, message);
        out.extend_from_slice(br#","reason":"Forbidden"}"#);
    }
    out.extend_from_slice(br#","uid":"#);
    json::string(&mut out, uid);
    if !d.warnings.is_empty() {
        out.extend_from_slice(br#","warnings":"#);
        json::array(&mut out, d.warnings.iter().map(String::as_str));
    }
    out.extend_from_slice(b"}}");
    out
}

/// JSON written by hand for `encode`.
mod json {
    /// Eight copies of a byte's lowest bit.
    const ONES: u64 = u64::MAX / 255;

    /// The bytes of the eight in `c` (little-endian) that a JSON string escapes, below 0x20,
    /// `"` or `\`, each as its top bit (the test of "has a byte less than n", and of "has a
    /// zero byte" for the two others, from Anderson's bit twiddling hacks). Exact for whether
    /// one is there and for which is the first (`trailing_zeros() / 8`); a byte after the
    /// first may be marked when it is not one.
    fn escaped(c: u64) -> u64 {
        let control = c.wrapping_sub(ONES * 0x20) & !c;
        let q = c ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let b = c ^ (ONES * u64::from(b'\\'));
        let backslash = b.wrapping_sub(ONES) & !b;
        (control | quote | backslash) & (ONES << 7)
    }

    /// Where the first byte at or after `from` is that a JSON string escapes (below 0x20, `"`
    /// or `\`), else `bytes.len()`: eight bytes at a time, one at a time in the last eight.
    /// The answer's strings are written by it (`string`), the review's read by it (`scan`).
    pub(super) fn next_escaped(bytes: &[u8], mut from: usize) -> usize {
        while let Some(chunk) = bytes
            .get(from..from + 8)
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
        {
            let marked = escaped(u64::from_le_bytes(chunk));
            if marked != 0 {
                return from + (marked.trailing_zeros() / 8) as usize;
            }
            from += 8;
        }
        let rest = bytes.get(from..).unwrap_or_default();
        rest.iter()
            .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
            .map_or(bytes.len(), |at| from + at)
    }

    /// `s` as a JSON string, escaped as serde_json escapes it: `\"`, `\\`, the short forms
    /// of backspace, form feed, newline, carriage return and tab, every other control
    /// character as `\u00xx`; all else as it is.
    pub(super) fn string(out: &mut Vec<u8>, s: &str) {
        let bytes = s.as_bytes();
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        let mut run = 0;
        loop {
            let i = next_escaped(bytes, run);
            let Some(&b) = bytes.get(i) else { break };
            let short = match b {
                b'"' => b'"',
                b'\\' => b'\\',
                0x08 => b'b',
                0x0c => b'f',
                b'\n' => b'n',
                b'\r' => b'r',
                b'\t' => b't',
                // Every other byte `next_escaped` stops at is a control character.
                _ => b'u',
            };
            out.extend_from_slice(&bytes[run..i]);
            out.extend_from_slice(&[b'\\', short]);
            if short == b'u' {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(&[
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ]);
            }
            run = i + 1;
        }
        out.extend_from_slice(&bytes[run..]);
        out.push(b'"');
    }

    /// A JSON object of `pairs`, in their order.
    pub(super) fn object<'a>(out: &mut Vec<u8>, pairs: impl Iterator<Item = (&'a str, &'a str)>) {
        separated(out, (b'{', b'}'), pairs, |out, (k, v)| {
            string(out, k);
            out.push(b':');
            string(out, v);
        });
    }

    /// A JSON array of `items`, in their order.
    pub(super) fn array<'a>(out: &mut Vec<u8>, items: impl Iterator<Item = &'a str>) {
        separated(out, (b'[', b']'), items, string);
    }

    /// `items` written by `write` between `open` and `close`, a comma between two.
    fn separated<T>(
        out: &mut Vec<u8>,
        (open, close): (u8, u8),
        items: impl Iterator<Item = T>,
        write: impl Fn(&mut Vec<u8>, T),
    ) {
        out.push(open);
        for (i, item) in items.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write(out, item);
        }
        out.push(close);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn review(op: &str, object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Service"},
                "resource": {"group": "", "version": "v1", "resource": "services"},
                "namespace": "default",
                "operation": op,
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": object,
            }
        }))
        .expect("json")
    }

    #[test]
    fn decodes_a_real_shape() {
        let body = review("CREATE", json!({"metadata": {"name": "x"}}));
        let r = decode(&body).expect("ok");
        assert_eq!(r.uid, "u-1");
        assert_eq!(r.user_info.username, "alice");
        assert_eq!(r.resource.resource, "services");
    }

    #[test]
    fn strings_are_borrowed_from_the_body_unless_escaped_the_groups_too() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","userInfo":{"username":"al\u0069ce","groups":["system:authenticated","team-\u0061"]}}}"#;
        let r = decode(body).expect("a review");
        let borrowed = |t: &Text| matches!(t, Text::Borrowed(_));
        assert!(borrowed(&r.uid));
        assert_eq!(r.user_info.username, "alice");
        assert!(!borrowed(&r.user_info.username), "unescaped into a copy");
        let groups: Vec<&str> = r.user_info.groups.iter().map(AsRef::as_ref).collect();
        assert_eq!(groups, ["system:authenticated", "team-a"]);
        assert!(borrowed(&r.user_info.groups[0].0));
        assert!(!borrowed(&r.user_info.groups[1].0));
        let owned = r.clone().into_owned();
        assert_eq!(owned, r);
        assert!(!borrowed(&owned.user_info.groups[0].0));
    }

    #[test]
    fn malformed_inputs_have_clear_errors() {
        assert!(matches!(decode(b"{nope"), Err(ReviewError::Json(_))));
        assert!(matches!(decode(b"[]"), Err(ReviewError::Json(_))));
        let wrong =
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#;
        assert_eq!(
            decode(wrong),
            Err(ReviewError::ApiVersion("admission.k8s.io/v1beta1".into()))
        );
        let kind = br#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#;
        assert_eq!(decode(kind), Err(ReviewError::Kind("Pod".into())));
        let missing = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        assert_eq!(decode(missing), Err(ReviewError::MissingRequest));
        let partial = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x"}}"#;
        assert!(matches!(decode(partial), Err(ReviewError::Request(_))));
        let bad_op = review("DESTROY", json!({}));
        assert!(matches!(decode(&bad_op), Err(ReviewError::Request(m)) if m.contains("DESTROY")));
    }

    #[test]
    fn responses_carry_status_warnings_and_patches() {
        let mut d = Decision::deny("no");
        d.warnings.push("w".into());
        let v: Value = serde_json::from_slice(&encode("u", &d)).expect("json");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 403);
        assert_eq!(v["response"]["status"]["message"], "no");
        assert_eq!(v["response"]["warnings"][0], "w");
        let mut a = Decision::allow();
        a.patch
            .push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
        let v: Value = serde_json::from_slice(&encode("u", &a)).expect("json");
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v["response"]["patch"].as_str().expect("patch"))
            .expect("b64");
        let ops: Vec<Value> = serde_json::from_slice(&raw).expect("ops");
        assert_eq!(ops[0]["op"], "add");
    }

    /// The response as the `json!` tree `encode` once built (before it wrote the response
    /// itself): what its bytes are held to.
    fn tree(uid: &str, d: &Decision) -> Vec<u8> {
        let mut r = json!({ "uid": uid, "allowed": d.allowed });
        if !d.allowed {
            r["status"] = json!({"code": 403, "reason": "Forbidden",
                "message": d.message.clone().unwrap_or_else(|| "denied".into())});
        }
        if !d.warnings.is_empty() {
            r["warnings"] = json!(d.warnings);
        }
        if !d.audit_annotations.is_empty() {
            r["auditAnnotations"] = json!(d.audit_annotations);
        }
        if d.allowed && !d.patch.is_empty() {
            let patch = serde_json::to_vec(&d.patch).expect("patch");
            r["patchType"] = json!("JSONPatch");
            r["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview", "response": r}))
        .expect("tree")
    }

    #[test]
    fn the_response_is_written_byte_for_byte_as_its_json_tree_was() {
        let mut denied = Decision::deny("no \"quotes\" here");
        denied.warnings.push("w".into());
        denied
            .audit_annotations
            .insert("would-deny".into(), "x".into());
        let mut mutated = Decision::allow();
        mutated
            .patch
            .push(json!({"op": "add", "path": "/a", "value": 1}));
        mutated.warnings.push("warned".into());
        let mut no_message = Decision::deny("");
        no_message.message = None;
        for d in [Decision::allow(), denied, mutated, no_message] {
            assert_eq!(
                String::from_utf8_lossy(&encode("u-1", &d)),
                String::from_utf8_lossy(&tree("u-1", &d))
            );
        }
    }

    mod prop {
        use super::super::*;
        use proptest::prelude::*;

        fn json_value() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::from),
                any::<i64>().prop_map(serde_json::Value::from),
                ".{0,12}".prop_map(serde_json::Value::from),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                    prop::collection::btree_map(
                        prop_oneof![
                            Just("apiVersion".to_string()),
                            Just("kind".to_string()),
                            Just("request".to_string()),
                            Just("uid".to_string()),
                            Just("operation".to_string()),
                            Just("userInfo".to_string()),
                            "[a-z]{1,8}",
                        ],
                        inner,
                        0..6
                    )
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// Strings with what JSON escapes in them: quotes, backslashes, every control
        /// character, and text (multi-byte too) on either side, short and long.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                any::<String>(),
                prop::collection::vec(
                    prop_oneof![
                        (0u8..0x20).prop_map(char::from),
                        Just('"'),
                        Just('\\'),
                        Just('\u{7f}'),
                        Just('é'),
                        Just('/'),
                        prop::char::range('a', 'z'),
                    ],
                    0..40
                )
                .prop_map(|c| c.into_iter().collect()),
            ]
        }

        fn decision() -> impl Strategy<Value = Decision> {
            (
                any::<bool>(),
                prop::option::of(text()),
                prop::collection::vec(text(), 0..3),
                prop::collection::btree_map(text(), text(), 0..3),
                prop::collection::vec(json_value(), 0..2),
            )
                .prop_map(|(allowed, message, warnings, audit_annotations, patch)| {
                    Decision {
                        allowed,
                        message,
                        warnings,
                        audit_annotations,
                        patch,
                    }
                })
        }

        proptest! {
            /// Escaped exactly as serde_json escapes it.
            #[test]
            fn a_string_is_written_as_serde_json_writes_it(s in text()) {
                let mut out = Vec::new();
                super::super::json::string(&mut out, &s);
                prop_assert_eq!(
                    String::from_utf8(out).expect("utf-8"),
                    serde_json::to_string(&s).expect("json")
                );
            }

            /// Byte for byte the response the `json!` tree wrote, whatever the decision.
            #[test]
            fn any_decisions_response_is_written_as_its_json_tree_was(
                uid in text(),
                d in decision(),
            ) {
                prop_assert_eq!(
                    String::from_utf8(encode(&uid, &d)).expect("utf-8"),
                    String::from_utf8(super::tree(&uid, &d)).expect("utf-8")
                );
            }

            #[test]
            fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
                let _ = decode(&bytes);
            }

            #[test]
            fn arbitrary_json_never_panics_and_ok_means_valid(v in json_value()) {
                let bytes = serde_json::to_vec(&v).unwrap_or_default();
                if let Ok(r) = decode(&bytes) {
                    prop_assert!(!r.uid.is_empty());
                    prop_assert_eq!(&v["apiVersion"], "admission.k8s.io/v1");
                }
            }

            #[test]
            fn envelope_with_arbitrary_request_never_panics(req in json_value()) {
                let body = serde_json::to_vec(&serde_json::json!({
                    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req
                })).unwrap_or_default();
                let _ = decode(&body);
            }

            /// The typed pass and the envelope-first decoder give the same answer, on
            /// reviews whose request is arbitrary and on ones shaped like real requests.
            #[test]
            fn the_typed_pass_agrees_with_the_envelope_first_decoder(
                req in json_value(),
                uid in "[a-z0-9-]{0,8}",
                op in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "X"]),
                object in json_value(),
                api in prop::sample::select(vec!["admission.k8s.io/v1", "v1"]),
            ) {
                let shaped = serde_json::json!({
                    "uid": uid, "operation": op, "object": object,
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "userInfo": {"username": "u", "groups": ["g"]},
                });
                for request in [req, shaped] {
                    let body = serde_json::to_vec(&serde_json::json!({
                        "apiVersion": api, "kind": "AdmissionReview", "request": request
                    })).unwrap_or_default();
                    prop_assert_eq!(decode(&body), decode_checking_the_envelope(&body));
                }
            }

            /// An object's name read the short way (`Pick`) is the name its tree holds, for
            /// arbitrary objects and for ones whose metadata or name is anything at all.
            #[test]
            fn an_objects_name_is_the_one_its_tree_holds(
                any in json_value(),
                meta in json_value(),
                name in json_value(),
                rest in json_value(),
            ) {
                let shaped = serde_json::json!({"kind": "X", "metadata": meta, "spec": rest});
                let named = serde_json::json!({"metadata": {"labels": {}, "name": name}, "rest": any});
                for object in [any, shaped, named] {
                    let text = object.to_string();
                    let o: Object = serde_json::from_str(&text).expect("an object");
                    prop_assert_eq!(o.name(), object["metadata"]["name"].as_str(), "{}", text);
                }
            }
        }
    }

    /// What JSON's text can say and a tree cannot (keys twice, the last one kept), and the
    /// shapes a name's path can take: the short way reads each as the tree does. Where no
    /// tree can hold the object (a number out of range) the name is still read, as past the
    /// nesting limit (below).
    #[test]
    fn the_short_name_reads_duplicates_and_odd_shapes_as_the_tree_does() {
        for text in [
            r#"{"metadata": {"name": "a", "name": "b"}}"#,
            r#"{"metadata": {"name": "a"}, "metadata": {"labels": {}}}"#,
            r#"{"metadata": {"labels": {}}, "metadata": {"name": "c"}}"#,
            r#"{"metadata": {"name": "a", "name": 1}}"#,
            r#"{"metadata": ["name", "x"]}"#,
            r#"{"metadata": {"name": "\u0063luster-admin"}}"#,
            r#"{"metadata": {"name": null}}"#,
            r#"["metadata", {"name": "x"}]"#,
            r#""metadata""#,
        ] {
            let o: Object = serde_json::from_str(text).expect("an object");
            let tree: Value = serde_json::from_str(text).expect("a tree");
            assert_eq!(o.name(), tree["metadata"]["name"].as_str(), "{text}");
        }
        let o: Object =
            serde_json::from_str(r#"{"metadata": {"name": "x", "n": 1e400}}"#).expect("an object");
        assert_eq!(o.name(), Some("x"));
        assert!(o.tree().is_err(), "no tree holds 1e400");
    }

    /// Nothing is built of an object until a guard reads it; one its tree cannot hold (nested
    /// past serde_json's limit) makes the review malformed only once something reads it, and
    /// its name, which needs no tree, is still read.
    #[test]
    fn an_object_is_built_when_read_and_one_no_tree_holds_is_malformed_then() {
        let deep = format!(
            r#"{{"metadata": {{"name": "cluster-admin"}}, "spec": {}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let body = format!(
            r#"{{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {{"uid": "u", "operation": "DELETE", "kind": {{"group": "", "version": "v1", "kind": "X"}}, "resource": {{"group": "", "version": "v1", "resource": "xs"}}, "oldObject": {deep}, "object": {{"metadata": {{"name": "y"}}}}}}}}"#
        );
        let r = decode(body.as_bytes()).expect("decodes: nothing is built yet");
        let built = |o: &Option<Object>| o.as_ref().is_some_and(|o| o.tree.get().is_some());
        assert!(!built(&r.object) && !built(&r.old_object));
        assert_eq!(r.names().collect::<Vec<_>>(), ["y", "cluster-admin"]);
        assert!(
            !built(&r.object) && !built(&r.old_object),
            "names need no tree"
        );
        assert_eq!(r.unreadable(), None);
        assert_eq!(
            r.object().map(|o| &o["metadata"]["name"]),
            Some(&json!("y"))
        );
        assert_eq!(r.unreadable(), None);
        assert_eq!(r.old_object(), None, "a tree past the limit");
        assert!(
            r.unreadable()
                .is_some_and(|e| e.contains("recursion limit")),
            "{:?}",
            r.unreadable()
        );
    }
}

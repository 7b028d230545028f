//! A review read by hand, in one pass over its text: the shape the API server sends, each
//! string a guard reads borrowed from the body. serde_json's typed pass spent most of a
//! review's decoding token by token in its generic visitors: the fields no guard reads, the
//! objects captured as text (`make bench`, perf: 930 of the 1,165 ns a review took outside
//! the server).
//!
//! It reads only what it is sure of and answers `None` for anything else: a type other than
//! the one the API server writes, a field given twice, an escape in a string a guard reads
//! or in any key, nesting deeper than `MAX_DEPTH`. `review::decode` then reads the review as
//! it always did, so its answer and its errors are serde_json's (tests hold every review
//! this reads to serde_json's reading of it). What it skips it still checks as serde_json
//! checks what it skips (strings, escapes, numbers, literals), so it never takes what
//! serde_json would refuse.

use std::collections::BTreeMap;

use super::{GroupVersionKind, GroupVersionResource, Item, Object, Request, Text, UserInfo};

/// Nesting deeper than this is left to serde_json.
const MAX_DEPTH: usize = 64;

/// The request of an AdmissionReview v1, or `None`: read it the general way.
#[inline(always)]
pub(super) fn request(text: &str) -> Option<Request<'_>> {
    let mut c = Cursor {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    let (mut api_version, mut kind, mut request) = (None, None, None);
    c.members(|c, key| match key {
        "apiVersion" => once(&mut api_version, c.plain()?),
        "kind" => once(&mut kind, c.plain()?),
        "request" => once(&mut request, c.request()?),
        _ => c.skip(1),
    })?;
    c.ws();
    (c.at == c.bytes.len() && api_version? == "admission.k8s.io/v1" && kind? == "AdmissionReview")
        .then_some(request)?
}

/// Sets a field read for the first time; `None` for a second (serde refuses it).
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    slot.is_none().then(|| *slot = Some(value))
}

struct Cursor<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

// The token readers are inlined where they are used: left to the compiler, `plain` and the
// list readers were calls with a prologue each, per token, and the request was copied out of
// the reader (536 bytes) on its way to `decode`'s caller. Inlined, a loop over the bench's
// review outside the repository decodes it in 606 ns against 695 (six interleaved runs).
impl<'a> Cursor<'a> {
    #[inline(always)]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// The next byte that is not whitespace, not taken.
    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.bytes.get(self.at).copied()
    }

    #[inline(always)]
    fn eat(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.at += 1)
    }

    /// An object, each member's value read by `member` given its key (a key with an escape
    /// is left to serde, which would match it unescaped).
    #[inline(always)]
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.delimited((b'{', b'}'), |c| {
            let key = c.plain()?;
            c.eat(b':')?;
            member(c, key)
        })
    }

    /// An array, each element read by `element`.
    #[inline(always)]
    fn elements(&mut self, element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.delimited((b'[', b']'), element)
    }

    /// `open`, the items `item` reads with a comma between two, `close`.
    #[inline(always)]
    fn delimited(
        &mut self,
        (open, close): (u8, u8),
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                c if c == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes, borrowed.
    #[inline(always)]
    fn plain(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        self.string_end(false)?;
        self.text.get(start..self.at - 1)
    }

    /// A string or null (`borrowed_or_none`).
    fn plain_or_null(&mut self) -> Option<Option<Text<'a>>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        Some(Some(Text::Borrowed(self.plain()?)))
    }

    /// Past the string whose opening quote was taken; escapes checked as serde_json checks
    /// the strings it skips (`\u` and four hex digits, or one of `"\/bfnrt`) where `escapes`
    /// allows them. A control character is refused as serde_json refuses it.
    #[inline(always)]
    fn string_end(&mut self, escapes: bool) -> Option<()> {
        loop {
            self.at = super::json::next_escaped(self.bytes, self.at);
            match *self.bytes.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                b'\\' if escapes => {
                    self.at += 1;
                    match *self.bytes.get(self.at)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
                        b'u' => {
                            let hex = self.bytes.get(self.at + 1..self.at + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.at += 5;
                        }
                        _ => return None,
                    }
                }
                // An escape where none may be, or a control character.
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.peek()?;
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    fn bool_or_null(&mut self) -> Option<Option<bool>> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|()| Some(true)),
            b'f' => self.literal(b"false").map(|()| Some(false)),
            _ => self.literal(b"null").map(|()| None),
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.bytes.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        self.at - start
    }

    /// A number as JSON writes one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn number(&mut self) -> Option<()> {
        if self.bytes.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match *self.bytes.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.bytes.get(self.at) == Some(&b'.') {
            self.at += 1;
            (self.digits() > 0).then_some(())?;
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.at) {
                self.at += 1;
            }
            (self.digits() > 0).then_some(())?;
        }
        Some(())
    }

    /// Past any value, checked, at nesting `depth`.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.at += 1;
                self.string_end(true)
            }
            b'{' | b'[' if depth >= MAX_DEPTH => None,
            b'{' => self.delimited((b'{', b'}'), |c| {
                c.eat(b'"')?;
                c.string_end(true)?;
                c.eat(b':')?;
                c.skip(depth + 1)
            }),
            b'[' => self.elements(|c| c.skip(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An object of a review: its text (null: none).
    fn object(&mut self) -> Option<Option<Object<'a>>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        let start = self.at;
        self.skip(2)?;
        let raw = self.text.get(start..self.at)?;
        Some(Some(Object::new(Text::Borrowed(raw))))
    }

    /// Three strings by name, each at most once, each defaulting to empty.
    fn three(&mut self, names: [&str; 3]) -> Option<[Text<'a>; 3]> {
        let mut found: [Option<&'a str>; 3] = [None; 3];
        self.members(|c, key| match names.iter().position(|n| *n == key) {
            Some(i) => once(&mut found[i], c.plain()?),
            None => c.skip(3),
        })?;
        Some(found.map(|f| Text::Borrowed(f.unwrap_or_default())))
    }

    fn user_info(&mut self) -> Option<UserInfo<'a>> {
        let (mut username, mut groups, mut extra) = (None, None, None);
        self.members(|c, key| match key {
            "username" => once(&mut username, Text::Borrowed(c.plain()?)),
            "groups" => {
                let mut list = Vec::new();
                c.elements(|c| c.plain().map(|g| list.push(Item(Text::Borrowed(g)))))?;
                once(&mut groups, list)
            }
            "extra" => {
                let mut map = BTreeMap::new();
                c.members(|c, key| {
                    let mut values = Vec::new();
                    c.elements(|c| c.plain().map(|v| values.push(v.to_string())))?;
                    map.insert(key.to_string(), values);
                    Some(())
                })?;
                once(&mut extra, map)
            }
            _ => c.skip(3),
        })?;
        Some(UserInfo {
            username: username.unwrap_or_default(),
            groups: groups.unwrap_or_default(),
            extra: extra.unwrap_or_default(),
        })
    }

    #[inline(always)]
    fn request(&mut self) -> Option<Request<'a>> {
        #[derive(Default)]
        struct Fields<'a> {
            uid: Option<&'a str>,
            kind: Option<[Text<'a>; 3]>,
            resource: Option<[Text<'a>; 3]>,
            sub_resource: Option<Option<Text<'a>>>,
            name: Option<Option<Text<'a>>>,
            namespace: Option<Option<Text<'a>>>,
            operation: Option<&'a str>,
            user_info: Option<UserInfo<'a>>,
            object: Option<Option<Object<'a>>>,
            old_object: Option<Option<Object<'a>>>,
            dry_run: Option<Option<bool>>,
        }
        let mut f = Fields::default();
        self.members(|c, key| match key {
            "uid" => once(&mut f.uid, c.plain()?),
            "kind" => once(&mut f.kind, c.three(["group", "version", "kind"])?),
            "resource" => once(&mut f.resource, c.three(["group", "version", "resource"])?),
            "subResource" => once(&mut f.sub_resource, c.plain_or_null()?),
            "name" => once(&mut f.name, c.plain_or_null()?),
            "namespace" => once(&mut f.namespace, c.plain_or_null()?),
            "operation" => once(&mut f.operation, c.plain()?),
            "userInfo" => once(&mut f.user_info, c.user_info()?),
            "object" => once(&mut f.object, c.object()?),
            "oldObject" => once(&mut f.old_object, c.object()?),
            "dryRun" => once(&mut f.dry_run, c.bool_or_null()?),
            _ => c.skip(2),
        })?;
        let [group, version, kind] = f.kind?;
        let [r_group, r_version, resource] = f.resource?;
        Some(Request {
            uid: Text::Borrowed(f.uid?),
            kind: GroupVersionKind {
                group,
                version,
                kind,
            },
            resource: GroupVersionResource {
                group: r_group,
                version: r_version,
                resource,
            },
            sub_resource: f.sub_resource.flatten(),
            name: f.name.flatten(),
            namespace: f.namespace.flatten(),
            operation: Text::Borrowed(f.operation?),
            user_info: f.user_info.unwrap_or_default(),
            object: f.object.flatten(),
            old_object: f.old_object.flatten(),
            dry_run: f.dry_run.flatten(),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;

    use super::super::{Request, typed};

    /// The same request, the objects' texts as well as their trees.
    fn same(a: &Request<'_>, b: &Request<'_>) -> bool {
        let raw = |r: &Request<'_>| {
            [&r.object, &r.old_object].map(|o| o.as_ref().map(|o| o.raw.to_string()))
        };
        a == b && raw(a) == raw(b)
    }

    /// Whitespace as JSON allows it between tokens.
    fn ws() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just(""),
            Just(""),
            Just(" "),
            Just("\n  "),
            Just("\t"),
            Just("\r\n")
        ]
    }

    /// String literals: plain, escaped as serde_json writes them (any text), escapes
    /// serde_json reads, and ones it refuses (a bad escape, a control character, no end).
    fn string() -> impl Strategy<Value = String> {
        prop_oneof![
            200 => "[a-zA-Z0-9:./ -]{0,20}".prop_map(|s| format!("\"{s}\"")),
            20 => any::<String>().prop_map(|s| serde_json::Value::from(s).to_string()),
            1 => prop_oneof![
                Just(r#""a\/b""#), Just(r#""\u0041\u00e9""#), Just(r#""\ud800""#),
                Just(r#""tab\tend""#), Just(r#""\"""#), Just(r#""x\\""#),
                Just("\"a\\x\""), Just("\"\u{1}\""), Just("\"\\u12G4\""), Just("\"abc"),
                Just("\"\\u00\""), Just("\"\\"), Just("\"\u{1f}\"")
            ]
            .prop_map(str::to_string),
        ]
    }

    /// Number literals, well-formed and not.
    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            200 => "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
            1 => prop_oneof![
                Just("01"), Just("1."), Just("-"), Just("1e"), Just("+1"), Just(".5"),
                Just("1e+"), Just("-01"), Just("1.e3"), Just("0x1"), Just("1e400"), Just("-0")
            ]
            .prop_map(str::to_string),
        ]
    }

    fn literal() -> impl Strategy<Value = String> {
        prop_oneof![
            200 => prop_oneof![Just("true"), Just("false"), Just("null")],
            1 => prop_oneof![Just("tru"), Just("nul"), Just("True"), Just("nullx"), Just("")],
        ]
        .prop_map(str::to_string)
    }

    /// `{` members `}`, whitespace around every token.
    fn object_of(
        members: impl Strategy<Value = Vec<(String, String)>>,
    ) -> impl Strategy<Value = String> {
        (members, prop::collection::vec(ws(), 4)).prop_map(|(m, w)| {
            let body: Vec<String> = m
                .into_iter()
                .map(|(k, v)| format!("{}{k}{}:{}{v}", w[0], w[1], w[2]))
                .collect();
            format!("{{{}{}}}", body.join(","), w[3])
        })
    }

    /// A key: one of `names` (as is or, now and then, with an escape serde reads as it), or
    /// any string.
    fn key(names: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop_oneof![
            300 => prop::sample::select(names).prop_map(|n| format!("\"{n}\"")),
            1 => prop::sample::select(names).prop_map(|n| {
                let mut c = n.chars();
                let first = c.next().map_or(String::new(), |f| format!("\\u{:04x}", u32::from(f)));
                format!("\"{first}{}\"", c.as_str())
            }),
            1 => string(),
        ]
    }

    /// Any value, well-formed or not, nested; keys of the review's own among them.
    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![string(), number(), literal()];
        leaf.prop_recursive(5, 40, 5, |inner| {
            prop_oneof![
                (prop::collection::vec(inner.clone(), 0..5), ws())
                    .prop_map(|(items, w)| format!("[{w}{}]", items.join(&format!(",{w}")))),
                object_of(prop::collection::vec(
                    (key(&["metadata", "name", "uid", "kind", "group"]), inner),
                    0..5
                )),
            ]
        })
    }

    /// A string value most of the time, anything now and then.
    fn mostly(s: impl Strategy<Value = String>) -> impl Strategy<Value = String> {
        prop_oneof![300 => s, 1 => value(), 1 => Just("null".to_string())]
    }

    fn plain_string() -> impl Strategy<Value = String> {
        prop_oneof![
            300 => "[a-z0-9.:-]{0,16}".prop_map(|s| format!("\"{s}\"")),
            1 => string(),
        ]
    }

    fn gvk(last: &'static str) -> impl Strategy<Value = String> {
        let names: &'static [&'static str] = match last {
            "kind" => &["group", "version", "kind"],
            _ => &["group", "version", "resource"],
        };
        let each = names
            .iter()
            .map(|n| (key(std::slice::from_ref(n)), mostly(plain_string())).boxed())
            .collect();
        let others = prop_oneof![
            30 => (key(&["extra", "other"]), value()),
            1 => (key(names), mostly(plain_string())),
        ];
        mostly(object_of(shuffled(each, others.boxed())))
    }

    fn user_info() -> impl Strategy<Value = String> {
        let list = || {
            (prop::collection::vec(mostly(plain_string()), 0..4), ws())
                .prop_map(|(items, w)| format!("[{w}{}]", items.join(",")))
        };
        let extra = object_of(prop::collection::vec(
            (plain_string(), mostly(list())),
            0..3,
        ));
        let each = vec![
            (key(&["username"]), mostly(plain_string())).boxed(),
            (key(&["groups"]), mostly(list())).boxed(),
            (key(&["extra"]), mostly(extra)).boxed(),
        ];
        let others = prop_oneof![
            30 => (key(&["uid", "other"]), value()),
            1 => (key(&["username", "groups", "extra"]), value()),
        ];
        mostly(object_of(shuffled(each, others.boxed())))
    }

    fn an_object() -> impl Strategy<Value = String> {
        let meta = object_of(prop::collection::vec(
            (key(&["name", "labels"]), mostly(plain_string())),
            0..3,
        ));
        prop_oneof![
            object_of(prop::collection::vec(
                (key(&["metadata", "spec"]), mostly(meta)),
                0..3
            )),
            value(),
        ]
    }

    /// Members: each of `each` (most of the time), then some of `others`, in any order: a
    /// member missing, given twice or of another type now and then.
    fn shuffled(
        each: Vec<BoxedStrategy<(String, String)>>,
        others: BoxedStrategy<(String, String)>,
    ) -> impl Strategy<Value = Vec<(String, String)>> {
        let each: Vec<_> = each
            .into_iter()
            .map(|m| prop::option::weighted(0.995, m))
            .collect();
        (each, prop::collection::vec(others, 0..4))
            .prop_map(|(each, others)| each.into_iter().flatten().chain(others).collect::<Vec<_>>())
            .prop_shuffle()
    }

    fn request_members() -> impl Strategy<Value = Vec<(String, String)>> {
        let op = prop_oneof![
            Just("\"CREATE\""),
            Just("\"UPDATE\""),
            Just("\"DELETE\""),
            Just("\"CONNECT\""),
            Just("\"PATCH\"")
        ]
        .prop_map(str::to_string);
        let members = vec![
            (key(&["uid"]), mostly(plain_string())).boxed(),
            (key(&["kind"]), gvk("kind")).boxed(),
            (key(&["resource"]), gvk("resource")).boxed(),
            (key(&["operation"]), mostly(op)).boxed(),
            (key(&["userInfo"]), user_info()).boxed(),
            (
                key(&["subResource", "name", "namespace"]),
                mostly(plain_string()),
            )
                .boxed(),
            (
                key(&["object", "oldObject"]),
                prop_oneof![4 => an_object(), 1 => Just("null".to_string())],
            )
                .boxed(),
            (key(&["dryRun"]), prop_oneof![8 => literal(), 1 => value()]).boxed(),
        ];
        let others = prop_oneof![
            30 => (key(&["requestKind", "requestResource", "options", "requestSubResource"]), value()),
            1 => (key(&["subResource", "name", "namespace"]), mostly(plain_string())),
            1 => (key(&["object", "oldObject"]), an_object()),
            1 => (key(&["uid", "kind", "operation", "dryRun"]), value()),
        ];
        shuffled(members, others.boxed())
    }

    /// A whole body: the envelope's members (right most of the time) around a request.
    fn body() -> impl Strategy<Value = String> {
        let api = prop_oneof![
            16 => Just("\"admission.k8s.io/v1\"".to_string()),
            1 => Just(r#""admission.k8s.io\/v1""#.to_string()),
            1 => mostly(plain_string()),
        ];
        let kind = prop_oneof![
            16 => Just("\"AdmissionReview\"".to_string()),
            1 => mostly(plain_string()),
        ];
        let members = vec![
            (key(&["apiVersion"]), api).boxed(),
            (key(&["kind"]), kind).boxed(),
            (
                key(&["request"]),
                prop_oneof![16 => object_of(request_members()), 1 => value()],
            )
                .boxed(),
        ];
        let others = prop_oneof![
            30 => (key(&["response", "other"]), value()),
            1 => (key(&["request", "kind"]), value()),
        ];
        let tail = prop_oneof![16 => Just(""), 1 => Just(" \n"), 1 => Just(" x"), 1 => Just("{}")];
        (ws(), object_of(shuffled(members, others.boxed())), tail)
            .prop_map(|(w, o, t)| format!("{w}{o}{t}"))
    }

    /// A review as the API server writes it: every member once, each of its type, strings
    /// without escapes where a guard reads them, anything in the objects.
    fn apiservers() -> impl Strategy<Value = String> {
        let s = || "[a-z0-9.:-]{0,16}".prop_map(|s| format!("\"{s}\""));
        let gv = |last: &'static str| {
            (s(), s(), s())
                .prop_map(move |(g, v, k)| format!(r#"{{"group":{g},"version":{v},"{last}":{k}}}"#))
        };
        (
            (s(), gv("kind"), gv("resource"), prop::option::of(s()), s()),
            (
                prop::sample::select(&["CREATE", "UPDATE", "DELETE", "CONNECT"][..]),
                s(),
                prop::collection::vec(s(), 0..4),
                prop::option::of(value()),
                prop::option::of(value()),
            ),
            any::<bool>(),
        )
            .prop_filter_map(
                "objects serde_json would refuse",
                |((uid, kind, resource, name, ns), (op, user, groups, object, old), dry)| {
                    let valid = |o: &Option<String>| {
                        o.as_ref().is_none_or(|o| serde_json::from_str::<serde::de::IgnoredAny>(o).is_ok())
                    };
                    if !valid(&object) || !valid(&old) {
                        return None;
                    }
                    let mut m = vec![
                        format!(r#""uid":{uid}"#),
                        format!(r#""kind":{kind}"#),
                        format!(r#""resource":{resource}"#),
                        format!(r#""requestKind":{kind}"#),
                        format!(r#""requestResource":{resource}"#),
                    ];
                    m.extend(name.map(|n| format!(r#""name":{n}"#)));
                    m.push(format!(r#""namespace":{ns}"#));
                    m.push(format!(r#""operation":"{op}""#));
                    m.push(format!(
                        r#""userInfo":{{"username":{user},"uid":"1","groups":[{}],"extra":{{"authentication.kubernetes.io/pod-name":["p"]}}}}"#,
                        groups.join(",")
                    ));
                    m.extend(object.map(|o| format!(r#""object":{o}"#)));
                    m.extend(old.map(|o| format!(r#""oldObject":{o}"#)));
                    m.push(format!(r#""dryRun":{dry}"#));
                    m.push(r#""options":{"kind":"CreateOptions"}"#.to_string());
                    Some(format!(
                        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{{}}}}}"#,
                        m.join(",")
                    ))
                },
            )
    }

    /// The bodies the first property draws go both ways: a third or so the reader takes, and
    /// some it leaves that serde_json takes (an escape, a value of another type given as
    /// null); the rest neither takes. A property of bodies the reader never took would hold
    /// of any reader.
    #[test]
    fn the_bodies_drawn_go_both_ways() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut taken, mut left_to_serde) = (0, 0);
        for _ in 0..1000 {
            let Ok(tree) = body().new_tree(&mut runner) else {
                continue;
            };
            let text = tree.current();
            match (super::request(&text).is_some(), typed(&text).is_some()) {
                (true, _) => taken += 1,
                (false, true) => left_to_serde += 1,
                (false, false) => {}
            }
        }
        assert!(taken >= 200, "the reader took {taken} of 1000");
        assert!(
            left_to_serde >= 20,
            "serde_json alone took {left_to_serde} of 1000"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// Whatever the hand reader takes, serde_json's typed pass takes too, and reads the
        /// same: the reader is only ever a shorter way to serde_json's answer.
        #[test]
        fn what_the_reader_takes_serde_json_reads_the_same(text in body()) {
            if let Some(r) = super::request(&text) {
                let t = typed(&text);
                prop_assert!(t.as_ref().is_some_and(|t| same(&r, t)), "{text}\n{r:?}\n{t:?}");
            }
        }

        /// And it takes every review the API server writes: it is the way reviews are read.
        #[test]
        fn it_reads_every_review_the_api_server_writes(text in apiservers()) {
            let r = super::request(&text);
            let t = typed(&text);
            prop_assert!(r.is_some(), "{text}");
            prop_assert!(t.is_some());
            prop_assert!(r.as_ref().zip(t.as_ref()).is_some_and(|(r, t)| same(r, t)), "{text}");
        }
    }
}

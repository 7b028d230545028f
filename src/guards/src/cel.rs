//! CEL, as the hosted kube-apiserver evaluates it: literals, name patterns and the guards'
//! messages. Every guard's CEL form is written with these, and so are the exemptions
//! (`hosted::exemptions`), so both engines say the same thing.

use crate::catalogue::denial::Piece;

use crate::catalogue::denial::pieces;

/// A CEL string literal.
pub fn string(s: &str) -> String {
    let escaped = s
        .replace('\\', "\\\\")
        .replace('\'', "\\'")
        .replace('\n', "\\n")
        .replace('\r', "\\r");
    format!("'{escaped}'")
}

/// A CEL list of string literals.
pub fn list<S: AsRef<str>>(items: &[S]) -> String {
    let items: Vec<String> = items.iter().map(|s| string(s.as_ref())).collect();
    format!("[{}]", items.join(", "))
}

/// `value` matches one of `patterns` (exact names, or prefixes ending in '*'), in CEL; `None`
/// when there is no pattern (nothing matches).
pub fn matches_any(value: &str, patterns: &[String]) -> Option<String> {
    let exact: Vec<&String> = patterns.iter().filter(|p| !p.ends_with('*')).collect();
    let mut terms: Vec<String> = Vec::new();
    if !exact.is_empty() {
        terms.push(format!("{value} in {}", list(&exact)));
    }
    terms.extend(
        patterns
            .iter()
            .filter_map(|p| p.strip_suffix('*'))
            .map(|prefix| format!("{value}.startsWith({})", string(prefix))),
    );
    (!terms.is_empty()).then(|| terms.join(" || "))
}

/// `value` matches one of `patterns` and none of `except` (`matches_any` twice), in CEL;
/// `None` when there is no pattern.
pub fn matches_any_except(value: &str, patterns: &[String], except: &[String]) -> Option<String> {
    let m = matches_any(value, patterns)?;
    Some(match matches_any(value, except) {
        Some(e) => format!("(({m}) && !({e}))"),
        None => format!("({m})"),
    })
}

/// A denial template (`catalogue::denial`) as a CEL string expression, each placeholder
/// replaced by the CEL expression `values` gives for it. A placeholder without one stays
/// literal text, as `denial::fill` leaves it.
pub fn message(template: &str, values: &[(&str, &str)]) -> String {
    let parts: Vec<String> = pieces(template)
        .map(|p| match p {
            Piece::Text(t) => string(t),
            Piece::Value(k) => match values.iter().find(|(key, _)| *key == k) {
                Some((_, expr)) => format!("({expr})"),
                None => string(&format!("{{{k}}}")),
            },
        })
        .collect();
    if parts.is_empty() {
        string("")
    } else {
        parts.join(" + ")
    }
}

/// `Request::names` in CEL: the stored object's name, the old object's, the name asked for
/// (each where present and not empty), as a list. A request without a name (a collection
/// delete's, a create by `generateName`) has no `name` key at all in a real server's CEL
/// (`no such key: name`), so every read of it asks `has` first.
pub(crate) const NAMES: &str = "((object != null && has(object.metadata) && has(object.metadata.name) && object.metadata.name != '' ? [object.metadata.name] : []) + (oldObject != null && has(oldObject.metadata) && has(oldObject.metadata.name) && oldObject.metadata.name != '' ? [oldObject.metadata.name] : []) + (has(request.name) && request.name != '' ? [request.name] : []))";

/// `Request::stored_name` in CEL.
pub const STORED_NAME: &str = "(object != null && has(object.metadata) && has(object.metadata.name) && object.metadata.name != '' ? object.metadata.name : (oldObject != null && has(oldObject.metadata) && has(oldObject.metadata.name) && oldObject.metadata.name != '' ? oldObject.metadata.name : (has(request.name) ? request.name : '')))";

/// Some name of the request (`NAMES`) matches one of `patterns` (`matches_any`); `None` when
/// there is no pattern.
pub(crate) fn any_name_matches(patterns: &[String]) -> Option<String> {
    matches_any("n", patterns).map(|m| format!("{NAMES}.exists(n, {m})"))
}

pub(crate) fn group_is(g: &str) -> String {
    format!("request.resource.group == {}", string(g))
}
pub(crate) fn resource_is(r: &str) -> String {
    format!("request.resource.resource == {}", string(r))
}
/// `x.spec.<field>` is there, for objects that may lack `spec`.
pub(crate) fn has_spec(obj: &str, field: &str) -> String {
    format!("(has({obj}.spec) && has({obj}.spec.{field}))")
}
/// One word on DELETE, another otherwise.
pub(crate) fn verb(delete: &str, other: &str) -> String {
    format!(
        "request.operation == 'DELETE' ? {} : {}",
        string(delete),
        string(other)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_escaped() {
        assert_eq!(string("it's a \\ \n"), "'it\\'s a \\\\ \\n'");
        assert_eq!(list(&["a", "b"]), "['a', 'b']");
    }

    #[test]
    fn a_message_is_the_template_with_values_as_expressions() {
        assert_eq!(
            message("x {a} y {b}", &[("a", "request.name")]),
            "'x ' + (request.name) + ' y ' + '{b}'"
        );
        assert_eq!(message("plain", &[]), "'plain'");
    }
}

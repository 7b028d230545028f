//! How the agent decides that a live object already says what it rendered: every field it
//! renders is there with the same value, after the server's defaulting. A leaf module; both
//! the management-side objects and the hosted webhook configurations are compared this way.

use serde_json::Value;

/// Every field of `desired` is in `live` with the same value (recursively; arrays
/// element-wise and of the same length, so a removed or added list entry is a difference).
/// Fields only the server sets (defaults, status, metadata it keeps) are ignored.
pub fn subset(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d
            .iter()
            .all(|(k, dv)| l.get(k).is_some_and(|lv| subset(dv, lv))),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(x, y)| subset(x, y))
        }
        _ => desired == live,
    }
}

/// A fingerprint of a desired object, to tell "the same desired state as last time" from a
/// changed one. In memory only (the hash is not stable across builds).
pub fn fingerprint(desired: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    desired.to_string().hash(&mut h);
    h.finish()
}

/// A hash that is the same in every build and on every machine (FNV-1a, 64 bits, as 16 hex
/// digits), for what is written to the cluster and compared by a later agent.
pub fn stable_hash(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(std::iter::once(&0xff)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_defaults_are_not_differences() {
        let desired = json!({"spec": {"ports": [{"port": 443}]}});
        let live = json!({"spec": {"ports": [{"port": 443, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}, "status": {}});
        assert!(subset(&desired, &live));
    }

    #[test]
    fn a_changed_missing_or_extra_entry_is_a_difference() {
        let desired = json!({"data": {"a": "x"}, "list": [1, 2]});
        assert!(!subset(
            &desired,
            &json!({"data": {"a": "y"}, "list": [1, 2]})
        ));
        assert!(!subset(&desired, &json!({"data": {}, "list": [1, 2]})));
        assert!(!subset(&desired, &json!({"data": {"a": "x"}, "list": [1]})));
        assert!(!subset(
            &desired,
            &json!({"data": {"a": "x"}, "list": [1, 2, 3]})
        ));
        assert!(!subset(&desired, &Value::Null));
    }

    #[test]
    fn the_stable_hash_is_fnv1a_and_separates_parts() {
        // FNV-1a 64 of "a" followed by the separator byte, computed by hand.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in [b'a', 0xff] {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(stable_hash(&[b"a"]), format!("{h:016x}"));
        assert_ne!(stable_hash(&[b"ab", b"c"]), stable_hash(&[b"a", b"bc"]));
        assert_eq!(stable_hash(&[b"x"]).len(), 16);
    }

    #[test]
    fn fingerprints_tell_desired_states_apart() {
        let a = json!({"data": {"a": "x"}});
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&json!({"data": {"a": "y"}})));
    }
}

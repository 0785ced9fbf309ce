//! Keeping secrets (bearer tokens, passwords) out of `Debug` output and error messages.
//!
//! The rule, documented for users on [`LeaseConfig`](crate::LeaseConfig):
//!
//! * an object key *names a secret* when, lowercased and with every character that is not a
//!   letter or a digit removed, it contains one of [`SECRET_WORDS`] and does not end in `file`
//!   (`token-file`, `password_file` hold paths, which are shown);
//! * the value of such a key is replaced by [`REDACTED`] whatever its type (a string, a number, a
//!   table), at any depth;
//! * in every string, a user-info part (what precedes the last `@` of the authority, as in
//!   `http://user:password@host` or `user:password@host:port`) is replaced by [`REDACTED`] (an
//!   e-mail address loses its local part: harmless).
//!
//! Typed settings (`KubernetesSettings`, `EtcdConfig`) write `Debug` by hand instead, and read
//! their secret fields with [`deserialize_secret`], whose errors never contain the value.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{self, Deserializer, Visitor};

/// What a secret value is replaced with.
pub(crate) const REDACTED: &str = "<redacted>";

/// A key naming a secret contains one of these (after normalisation, see [`is_secret_key`]).
pub(crate) const SECRET_WORDS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "apikey",
    "privatekey",
];

/// Whether the configuration key `key` names a secret (see the module documentation).
pub(crate) fn is_secret_key(key: &str) -> bool {
    let normalized: String = key
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect();
    !normalized.ends_with("file") && SECRET_WORDS.iter().any(|w| normalized.contains(w))
}

/// The value of the configuration entry `key = value`, redacted.
pub(crate) fn redact_entry(key: &str, value: &serde_json::Value) -> serde_json::Value {
    if is_secret_key(key) {
        serde_json::Value::String(REDACTED.to_owned())
    } else {
        redact_json(value)
    }
}

/// `value` with the value of every key naming a secret replaced (at any depth), and the user-info
/// in every string replaced.
pub(crate) fn redact_json(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), redact_entry(k, v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact_json).collect()),
        Value::String(s) => Value::String(redact_url(s).into_owned()),
        other => other.clone(),
    }
}

/// The byte range of the user-info of `url` (`user:password` in `http://user:password@host`), if
/// it has one. A URL without `://` is read as an authority (`user:password@host:port`).
pub(crate) fn userinfo_range(url: &str) -> Option<Range<usize>> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let at = authority.rfind('@')?;
    Some(start..start + at)
}

/// `url` with its user-info replaced by [`REDACTED`].
pub(crate) fn redact_url(url: &str) -> Cow<'_, str> {
    match userinfo_range(url) {
        Some(range) => Cow::Owned(format!(
            "{}{REDACTED}{}",
            &url[..range.start],
            &url[range.end..]
        )),
        None => Cow::Borrowed(url),
    }
}

#[cfg_attr(not(any(feature = "kubernetes", feature = "etcd")), allow(dead_code))]
/// Reads the optional secret string `field`. serde's own "invalid type" errors print numbers and
/// booleans (`invalid type: integer `42``), so a value of another type is refused with an error
/// naming the field and the type only.
pub(crate) fn deserialize_secret<'de, D>(
    deserializer: D,
    field: &'static str,
) -> Result<Option<String>, D::Error>
where
    D: Deserializer<'de>,
{
    deserializer.deserialize_option(SecretVisitor { field })
}

#[cfg_attr(not(any(feature = "kubernetes", feature = "etcd")), allow(dead_code))]
struct SecretVisitor {
    field: &'static str,
}

#[cfg_attr(not(any(feature = "kubernetes", feature = "etcd")), allow(dead_code))]
impl SecretVisitor {
    fn refuse<E: de::Error>(&self, found: &str) -> E {
        E::custom(format_args!(
            "`{}` must be a string, not {found}",
            self.field
        ))
    }
}

#[cfg_attr(not(any(feature = "kubernetes", feature = "etcd")), allow(dead_code))]
impl<'de> Visitor<'de> for SecretVisitor {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` as a string", self.field)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        // `deserialize_any`, not `deserialize_string`: serde_json's `Value` answers the latter
        // with its own error, which prints the value.
        deserializer.deserialize_any(self)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Err(self.refuse("a boolean"))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Err(self.refuse("a number"))
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<Self::Value, E> {
        Err(self.refuse("a number"))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Err(self.refuse("a number"))
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<Self::Value, E> {
        Err(self.refuse("a number"))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Err(self.refuse("a number"))
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Self::Value, E> {
        Err(self.refuse("bytes"))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse("a list"))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse("a table"))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
        Err(self.refuse("an enum"))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secret_keys() {
        for key in [
            "token",
            "Token",
            "password",
            "PASSWORD",
            "passwd",
            "client-secret",
            "client_secret",
            "bearerToken",
            "etcd.password",
            "api-key",
            "api_key",
            "private-key",
            "credentials",
            "passphrase",
        ] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in [
            "token-file",
            "token_file",
            "tokenFile",
            "password-file",
            "secret-file",
            "namespace",
            "user",
            "endpoints",
            "api-url",
            "key",
            "prefix",
        ] {
            assert!(!is_secret_key(key), "{key}");
        }
    }

    #[test]
    fn json_is_redacted_at_any_depth_whatever_the_type() {
        let value = json!({
            "namespace": "ns",
            "token": "t0",
            "token-file": "/var/token",
            "nested": { "password": 42, "list": [{ "secret": { "a": "s1" } }, "plain"] },
            "url": "https://user:pw@host:1/path@x",
            "endpoint": "root:pw@h:1",
            "email": "me@example.com",
            "path": "/a@b",
        });
        assert_eq!(
            redact_json(&value),
            json!({
                "namespace": "ns",
                "token": REDACTED,
                "token-file": "/var/token",
                "nested": { "password": REDACTED, "list": [{ "secret": REDACTED }, "plain"] },
                "url": "https://<redacted>@host:1/path@x",
                "endpoint": "<redacted>@h:1",
                "email": "<redacted>@example.com",
                "path": "/a@b",
            })
        );
    }

    #[test]
    fn urls_lose_their_userinfo_only() {
        assert_eq!(redact_url("http://h:1"), "http://h:1");
        assert_eq!(redact_url("http://u:p@h:1"), "http://<redacted>@h:1");
        assert_eq!(redact_url("u:p@h:1"), "<redacted>@h:1");
        assert_eq!(redact_url("http://h:1/a@b"), "http://h:1/a@b");
        assert_eq!(redact_url("http://u:p@w@h:1?q"), "http://<redacted>@h:1?q");
        assert_eq!(userinfo_range("http://h:1"), None);
    }

    #[derive(Debug, serde::Deserialize)]
    struct S {
        #[serde(default, deserialize_with = "token")]
        token: Option<String>,
    }

    fn token<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        deserialize_secret(d, "token")
    }

    #[test]
    fn secret_fields_refuse_other_types_without_echoing_them() {
        let read = |v: serde_json::Value| serde_json::from_value::<S>(v);
        assert_eq!(
            read(json!({"token": "t"})).unwrap().token.as_deref(),
            Some("t")
        );
        assert_eq!(read(json!({"token": null})).unwrap().token, None);
        assert_eq!(read(json!({})).unwrap().token, None);
        for (value, kind) in [
            (json!(987654321), "a number"),
            (json!(-987654321), "a number"),
            (json!(9876.54321), "a number"),
            (json!(true), "a boolean"),
            (json!(["987654321"]), "a list"),
            (json!({"v": "987654321"}), "a table"),
        ] {
            let err = read(json!({ "token": value })).unwrap_err().to_string();
            assert!(!err.contains("987654321") && !err.contains("true"), "{err}");
            assert!(
                err.contains("`token` must be a string") && err.contains(kind),
                "{err}"
            );
        }
        // The same through a text format.
        let err = serde_json::from_str::<S>(r#"{"token": 987654321}"#).unwrap_err();
        assert!(!err.to_string().contains("987654321"), "{err}");
        let err = toml::from_str::<S>("token = 987654321.5\n").unwrap_err();
        assert!(
            err.to_string().contains("`token` must be a string"),
            "{err}"
        );
        assert_eq!(
            toml::from_str::<S>("token = \"t\"\n")
                .unwrap()
                .token
                .as_deref(),
            Some("t")
        );
    }
}

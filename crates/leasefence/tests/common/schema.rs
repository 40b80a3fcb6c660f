//! A small, strict JSON Schema checker for the subset `docs/openapi.json`
//! uses (hand-written rather than the `jsonschema` crate, to keep the test
//! build lean). A keyword outside the subset is an error, never ignored, so
//! the document cannot say more than the tests check.
//!
//! Supported: `$ref` (to `#/components/schemas/…`), `oneOf`, `type` (a name
//! or a list of names), `enum`, `properties`, `required`,
//! `additionalProperties: false`, `items`, `maxItems`, `minimum`, `maximum`,
//! `minLength`, `maxLength` (in bytes: names are limited in bytes), and
//! `description`.

use serde_json::Value;

const KEYWORDS: &[&str] = &[
    "$ref",
    "oneOf",
    "type",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "maxItems",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "description",
];

/// Checks `value` against `schema`; `doc` resolves `$ref`s. The error names
/// the JSON path and what was expected.
pub fn check(doc: &Value, schema: &Value, value: &Value) -> Result<(), String> {
    check_at(doc, schema, value, "$")
}

fn type_matches(name: &str, v: &Value) -> Result<bool, String> {
    Ok(match name {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        other => return Err(format!("unknown type {other:?} in the schema")),
    })
}

fn check_at(doc: &Value, schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    let s = schema
        .as_object()
        .ok_or_else(|| format!("{path}: schema is not an object: {schema}"))?;
    if let Some(k) = s.keys().find(|k| !KEYWORDS.contains(&k.as_str())) {
        return Err(format!("{path}: schema keyword {k:?} is not supported by this checker"));
    }
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let name = r
            .strip_prefix("#/components/schemas/")
            .ok_or_else(|| format!("{path}: unsupported $ref {r}"))?;
        let target = &doc["components"]["schemas"][name];
        if target.is_null() {
            return Err(format!("{path}: $ref to missing schema {name}"));
        }
        return check_at(doc, target, v, path);
    }
    if let Some(options) = s.get("oneOf").and_then(Value::as_array) {
        let passing = options.iter().filter(|o| check_at(doc, o, v, path).is_ok()).count();
        if passing != 1 {
            return Err(format!(
                "{path}: {v} matches {passing} of oneOf's {} schemas, not exactly 1",
                options.len()
            ));
        }
    }
    if let Some(t) = s.get("type") {
        let names: Vec<&str> = match t {
            Value::String(n) => vec![n.as_str()],
            Value::Array(ns) => ns.iter().filter_map(Value::as_str).collect(),
            _ => return Err(format!("{path}: bad type {t}")),
        };
        let mut ok = false;
        for n in &names {
            ok |= type_matches(n, v)?;
        }
        if !ok {
            return Err(format!("{path}: {v} is not of type {names:?}"));
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        return Err(format!("{path}: {v} is not one of {allowed:?}"));
    }
    bounds(s, v, path)?;
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for req in s.get("required").and_then(Value::as_array).into_iter().flatten() {
            let name = req.as_str().unwrap_or_default();
            if !obj.contains_key(name) {
                return Err(format!("{path}: required property {name:?} is missing from {v}"));
            }
        }
        for (k, child) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => check_at(doc, sub, child, &format!("{path}.{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{path}: property {k:?} is not in the schema"));
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            check_at(doc, items, item, &format!("{path}[{i}]"))?;
        }
    }
    Ok(())
}

fn bounds(s: &serde_json::Map<String, Value>, v: &Value, path: &str) -> Result<(), String> {
    let limit = |k: &str| s.get(k).and_then(Value::as_f64);
    if let Some(n) = v.as_f64().filter(|_| v.is_number())
        && (limit("minimum").is_some_and(|m| n < m) || limit("maximum").is_some_and(|m| n > m))
    {
        return Err(format!("{path}: {n} is out of the schema's bounds"));
    }
    if let Some(text) = v.as_str() {
        let len = text.len() as f64;
        if limit("minLength").is_some_and(|m| len < m) || limit("maxLength").is_some_and(|m| len > m) {
            return Err(format!(
                "{path}: a string of {len} bytes is out of the schema's length bounds"
            ));
        }
    }
    if let Some(arr) = v.as_array()
        && limit("maxItems").is_some_and(|m| arr.len() as f64 > m)
    {
        return Err(format!("{path}: {} items, over maxItems", arr.len()));
    }
    Ok(())
}

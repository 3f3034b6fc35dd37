//! JSON written the way Python's `json.dumps(..., ensure_ascii=False)` writes it, which is what
//! `tojson` produces in Hugging Face chat templates: `", "` and `": "` separators without an
//! indent, `","` and newlines with one, keys in insertion order, no HTML escaping.

use serde_json::Value;

/// Serialises `v` like `json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
pub fn dumps(v: &Value, indent: Option<usize>, sort_keys: bool) -> String {
    let mut out = String::new();
    write(&mut out, v, indent, sort_keys, 0);
    out
}

fn newline(out: &mut String, indent: Option<usize>, level: usize) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * level));
    }
}

fn write(out: &mut String, v: &Value, indent: Option<usize>, sort_keys: bool, level: usize) {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                // Python prints floats with at least one decimal (1.0), serde_json may not.
                if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
                    out.push_str(&format!("{f:.1}"));
                } else {
                    out.push_str(&n.to_string());
                }
            } else {
                out.push_str(&n.to_string());
            }
        }
        Value::String(s) => out.push_str(&serde_json::to_string(s).unwrap_or_default()),
        Value::Array(a) => {
            if a.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                write(out, x, indent, sort_keys, level + 1);
            }
            newline(out, indent, level);
            out.push(']');
        }
        Value::Object(o) => {
            if o.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = o.iter().collect();
            if sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, x)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, indent, level + 1);
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write(out, x, indent, sort_keys, level + 1);
            }
            newline(out, indent, level);
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_style() {
        let v: Value = serde_json::from_str(r#"{"b": 1, "a": [1.0, "x<y", {}], "c": null}"#).unwrap();
        assert_eq!(dumps(&v, None, false), r#"{"b": 1, "a": [1.0, "x<y", {}], "c": null}"#);
        assert_eq!(dumps(&v, Some(2), true), "{\n  \"a\": [\n    1.0,\n    \"x<y\",\n    {}\n  ],\n  \"b\": 1,\n  \"c\": null\n}");
    }
}

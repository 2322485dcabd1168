//! A JSON object's fields as Perfetto debug annotations: the arguments the UI shows
//! beside a slice or an instant.

use serde_json::Value;
use tracing_perfetto_sdk_schema::DebugAnnotation;
use tracing_perfetto_sdk_schema::debug_annotation::{NameField, Value as AnnotationValue};

/// One annotation per field of `args` (an object), by name; a nested value is kept
/// as its JSON text. Anything but an object gives none.
pub fn annotations(args: &Value) -> Vec<DebugAnnotation> {
    let Value::Object(fields) = args else {
        return Vec::new();
    };
    fields
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(name, v)| DebugAnnotation {
            name_field: Some(NameField::Name(name.clone())),
            value: Some(value(v)),
            ..Default::default()
        })
        .collect()
}

fn value(v: &Value) -> AnnotationValue {
    match v {
        Value::Bool(b) => AnnotationValue::BoolValue(*b),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                AnnotationValue::UintValue(u)
            } else if let Some(i) = n.as_i64() {
                AnnotationValue::IntValue(i)
            } else {
                AnnotationValue::DoubleValue(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => AnnotationValue::StringValue(s.clone()),
        other => AnnotationValue::LegacyJsonValue(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_field_keeps_its_type_and_nested_values_their_json() {
        let got = annotations(&json!({"ok": true, "pid": 42, "exit": -1, "detail": "x",
            "argv": ["a"], "gone": null}));
        let pairs: Vec<(String, AnnotationValue)> = got
            .into_iter()
            .map(|a| match (a.name_field, a.value) {
                (Some(NameField::Name(n)), Some(v)) => (n, v),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            pairs,
            vec![
                (
                    "argv".into(),
                    AnnotationValue::LegacyJsonValue("[\"a\"]".into())
                ),
                ("detail".into(), AnnotationValue::StringValue("x".into())),
                ("exit".into(), AnnotationValue::IntValue(-1)),
                ("ok".into(), AnnotationValue::BoolValue(true)),
                ("pid".into(), AnnotationValue::UintValue(42)),
            ]
        );
    }
}

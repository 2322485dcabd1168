//! go-yaml v2's behaviour on the forms real manifests use, as kubelet's decode sees it
//! (the JSON sigs.k8s.io/yaml makes of them).

use serde_json::{Value, json};

use super::*;

fn one(text: &str) -> Value {
    let (docs, err) = documents(text);
    assert_eq!(err, None, "{text}");
    docs.into_iter().next().unwrap()
}

#[test]
fn plain_scalars_resolve_as_go_yaml_resolves_them() {
    let cases: &[(&str, Value)] = &[
        ("01777", json!(1023)),
        ("0644", json!(420)),
        ("-017", json!(-15)),
        ("0o17", json!(15)),
        ("0x1F", json!(31)),
        ("0b101", json!(5)),
        ("1_000", json!(1000)),
        ("+12", json!(12)),
        ("0", json!(0)),
        // Not octal, so a float; written to JSON as the whole number it is.
        ("08", json!(8)),
        ("1e3", json!(1000)),
        ("1.5", json!(1.5)),
        (".5", json!(0.5)),
        ("yes", json!(true)),
        ("On", json!(true)),
        ("off", json!(false)),
        ("N", json!(false)),
        ("~", Value::Null),
        ("null", Value::Null),
        ("1.2.3", json!("1.2.3")),
        ("250m", json!("250m")),
        ("12:30", json!("12:30")),
        ("0x", json!("0x")),
    ];
    for (text, want) in cases {
        assert_eq!(resolve_plain(text), *want, "{text}");
        assert_eq!(
            one(&format!("v: {text}"))["v"],
            *want,
            "{text} in a mapping"
        );
    }
}

#[test]
fn quoted_and_tagged_scalars_stay_strings() {
    let v = one("a: '01777'\nb: \"0644\"\nc: !!str 0755\nd: 'yes'\n");
    assert_eq!(
        v,
        json!({"a": "01777", "b": "0644", "c": "0755", "d": "yes"})
    );
}

#[test]
fn a_quote_escaped_in_double_quotes_is_a_quote() {
    let v = one("msg: \"it\\'s \\\"here\\\"\"\nnext: \"a\\'b\\'c\"\n");
    assert_eq!(v, json!({"msg": "it's \"here\"", "next": "a'b'c"}));
    // Any other escape YAML does not know is still an error, with where it is.
    let (_, err) = documents("x: 1\nmsg: \"bad \\q\"\n");
    let err = err.expect("an unknown escape");
    assert!(err.info.contains("unknown escape"), "{err}");
    assert_eq!(err.line, 2);
}

#[test]
fn merge_keys_anchors_and_duplicates() {
    let v = one(
        "base: &b {cpu: 100m, memory: 64Mi}\nsized:\n  <<: *b\n  memory: 128Mi\nlist: [*b]\ndup: 1\ndup: 2\n'<<': literal\n",
    );
    assert_eq!(v["sized"], json!({"cpu": "100m", "memory": "128Mi"}));
    assert_eq!(v["list"], json!([{"cpu": "100m", "memory": "64Mi"}]));
    assert_eq!(v["dup"], json!(2), "a later duplicate wins");
    assert_eq!(v["<<"], json!("literal"), "a quoted << is an ordinary key");
}

#[test]
fn documents_and_syntax_errors() {
    let (docs, err) = documents("a: 1\n---\n---\nb: 2\n");
    assert_eq!(err, None);
    assert_eq!(docs, [json!({"a": 1}), Value::Null, json!({"b": 2})]);
    let (docs, err) = documents("a: 1\n---\nb: [unclosed\n");
    assert_eq!(docs, [json!({"a": 1})]);
    let err = err.expect("a syntax error");
    assert!(err.line >= 3, "{err}");
    // JSON is YAML.
    assert_eq!(one("{\"a\": [1, \"x\"]}"), json!({"a": [1, "x"]}));
}

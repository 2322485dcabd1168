//! The manifest reader on any bytes: YAML or JSON, any number of documents. It must not
//! panic; every pod it accepts passes validation and carries a UID; every error names
//! the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use podlapse::config::parse_manifest_text;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("/etc/podlapse/manifests/fuzz.yaml");
    let (pods, errors) = parse_manifest_text(file, text, "fuzz-node");
    for p in &pods {
        assert!(p.pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()));
        assert!(podlapse::config::validate(&p.pod).is_ok());
    }
    for e in &errors {
        let message = e.to_string();
        assert!(
            message.contains("fuzz.yaml"),
            "an error that names no file: {message}"
        );
    }
});

//! A stage's name as a type: its kind, and what it is about after `:` (the container in
//! `container_start:app`, the plugin in `cni_plugin:bridge`, the step, and maybe the
//! container, in `runtime:task_start:app`). It reads from and writes to exactly the
//! string a trace holds.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::stage_kind::StageKind;

/// `<kind>` or `<kind>:<name>`. Every string reads as one (a kind this podlapse does not
/// know as [`StageKind::Unknown`]) and prints back as it was written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StageName {
    kind: StageKind,
    /// Everything after the first `:`, itself possibly holding `:` (`task_start:app`).
    name: Option<String>,
}

impl StageName {
    /// A stage of the whole pod or sandbox, named by its kind alone (`pod_seen`).
    pub fn new(kind: StageKind) -> StageName {
        StageName { kind, name: None }
    }

    /// `<kind>:<name>`: a stage about one container, plugin or runtime step.
    pub fn of(kind: StageKind, name: impl Into<String>) -> StageName {
        StageName {
            kind,
            name: Some(name.into()),
        }
    }

    /// The name a trace or the API spells: the kind up to the first `:`, the rest after.
    pub fn parse(text: &str) -> StageName {
        match text.split_once(':') {
            Some((kind, name)) => StageName::of(StageKind::parse(kind), name),
            None => StageName::new(StageKind::parse(text)),
        }
    }

    pub fn kind(&self) -> &StageKind {
        &self.kind
    }

    /// What follows the kind after `:`, if anything does.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether this is the bare `kind`, with nothing after it.
    pub fn is(&self, kind: &StageKind) -> bool {
        self.kind == *kind && self.name.is_none()
    }

    /// The kind and the first `:`-part of the name (`runtime:task_start` for
    /// `runtime:task_start:app`, `image_pull:app` for itself); the kind alone when there
    /// is no name. Groups a runtime step's stages across containers.
    pub fn kind_and_step(&self) -> String {
        match &self.name {
            Some(name) => {
                let step = name.split_once(':').map_or(name.as_str(), |(s, _)| s);
                format!("{}:{step}", self.kind.as_str())
            }
            None => self.kind.as_str().to_string(),
        }
    }

    /// For a CNI plugin's run (`cni_plugin:<plugin>`), its plugin.
    pub fn cni_plugin(&self) -> Option<&str> {
        match self.kind {
            StageKind::CniPlugin => self.name(),
            _ => None,
        }
    }

    /// For a runtime stage (`runtime:<step>` or `runtime:<step>:<container>`), its step.
    pub fn runtime_step(&self) -> Option<&str> {
        match self.kind {
            StageKind::Runtime => self.name().map(|n| n.split_once(':').map_or(n, |(s, _)| s)),
            _ => None,
        }
    }
}

impl From<StageKind> for StageName {
    fn from(kind: StageKind) -> StageName {
        StageName::new(kind)
    }
}

impl From<&str> for StageName {
    /// As [`StageName::parse`].
    fn from(text: &str) -> StageName {
        StageName::parse(text)
    }
}

impl PartialEq<str> for StageName {
    /// Whether `text` spells this name, without building the name's string.
    fn eq(&self, text: &str) -> bool {
        match &self.name {
            None => self.kind.as_str() == text,
            Some(name) => text.split_once(':') == Some((self.kind.as_str(), name.as_str())),
        }
    }
}

impl PartialEq<&str> for StageName {
    fn eq(&self, text: &&str) -> bool {
        *self == **text
    }
}

impl fmt::Display for StageName {
    /// `<kind>` or `<kind>:<name>`; honours width and alignment, as a string would.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            None => f.pad(self.kind.as_str()),
            Some(name) => f.pad(&format!("{}:{name}", self.kind.as_str())),
        }
    }
}

impl Serialize for StageName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StageName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StageName, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = StageName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a stage name such as `pod_seen` or `container_start:app`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<StageName, E> {
                Ok(StageName::parse(v))
            }
        }
        d.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::Stage;

    #[test]
    fn every_name_reads_and_prints_back_as_written() {
        for text in [
            "pod_seen",
            "cni_plugin:bridge",
            "container_start:app",
            "runtime:task_start",
            "runtime:task_start:app",
            "hologram",
            "hologram:x:y",
            "pod_seen:",
            ":x",
            "",
        ] {
            let name = StageName::parse(text);
            assert_eq!(name.to_string(), text);
            assert_eq!(name, text);
            assert_ne!(name, format!("{text}x").as_str());
            let json = serde_json::to_string(&name).unwrap();
            assert_eq!(json, serde_json::to_string(text).unwrap());
            assert_eq!(serde_json::from_str::<StageName>(&json).unwrap(), name);
        }
    }

    #[test]
    fn the_kind_is_the_part_before_the_first_colon() {
        let n = StageName::parse("runtime:task_start:app");
        assert_eq!(n.kind(), &StageKind::Runtime);
        assert_eq!(n.name(), Some("task_start:app"));
        assert_eq!(n.runtime_step(), Some("task_start"));
        assert_eq!(
            StageName::parse("runtime:pull").runtime_step(),
            Some("pull")
        );
        assert_eq!(n.kind_and_step(), "runtime:task_start");
        for same in ["runtime:pull", "image_pull:app", "running", "pod_seen:"] {
            assert_eq!(StageName::parse(same).kind_and_step(), same);
        }
        assert_eq!(StageName::parse("cni_plugin:bridge").runtime_step(), None);
        assert_eq!(
            StageName::parse("cni_plugin:bridge").cni_plugin(),
            Some("bridge")
        );
        assert_eq!(StageName::parse("cni_add").cni_plugin(), None);
        assert!(StageName::parse("running").is(&StageKind::Running));
        assert!(!StageName::parse("running:x").is(&StageKind::Running));
        assert_eq!(
            StageName::parse("hologram:x").kind(),
            &StageKind::Unknown("hologram".into())
        );
    }

    #[test]
    fn padding_applies_to_the_whole_name() {
        let n = StageName::of(StageKind::ImagePull, "app");
        assert_eq!(format!("[{n:<16}]"), "[image_pull:app  ]");
        assert_eq!(format!("[{n:>16}]"), "[  image_pull:app]");
    }

    /// Every stage a recorded fixture holds reads into a [`Stage`] of a known kind, and
    /// that stage writes back as the same record.
    #[test]
    fn every_fixture_stage_reads_as_a_known_kind_and_writes_back_the_same() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
        let mut stages = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "jsonl") {
                continue;
            }
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
                if v["type"] != "stage" {
                    continue;
                }
                v.as_object_mut().unwrap().remove("type");
                let s: Stage = serde_json::from_value(v.clone()).unwrap();
                assert!(s.kind().rank() < StageKind::PIPELINE.len(), "{}", s.stage);
                assert_eq!(serde_json::to_value(&s).unwrap(), v, "{}", path.display());
                stages += 1;
            }
        }
        assert!(stages > 100, "{stages} stages");
    }

    #[test]
    fn an_escaped_name_in_json_reads_as_its_text() {
        let n: StageName = serde_json::from_str(r#""container_start:\u0061pp""#).unwrap();
        assert_eq!(n, StageName::of(StageKind::ContainerStart, "app"));
    }
}

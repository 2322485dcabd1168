//! The runtime's CNI configuration directory, read as libcni reads it: the files named
//! `*.conf`, `*.conflist` and `*.json`, in the order of their names. containerd (go-cni)
//! loads them in that order until it has its `max_conf_num` networks (1 by default), and
//! a file on the way that does not load fails the whole load: the runtime then reports
//! NetworkReady=false, "cni plugin not initialized". So the first file decides the pod
//! network, and this module says what each file is and which one the runtime uses.
//!
//! Each file is JSON and nothing more: read, never executed or expanded.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The extensions libcni loads, as `libcni.ConfFiles` is asked for them by go-cni.
const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];
/// Larger than any real network configuration; a bigger file is not read.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One configuration file, as far as it loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfFile {
    pub path: PathBuf,
    /// The network's `name`; empty when the file does not load.
    pub network: String,
    /// The chain's plugin types, in order.
    pub plugins: Vec<String>,
    /// The file's configuration, when it loads.
    pub conf: Option<Value>,
    /// Why the runtime cannot load it; None when it loads.
    pub problem: Option<String>,
}

impl ConfFile {
    pub fn loads(&self) -> bool {
        self.problem.is_none()
    }

    /// The file's name, for people.
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| self.path.display().to_string())
    }
}

/// The directory's configuration files in libcni's order, or why it cannot be read.
pub fn read(dir: &Path) -> Result<Vec<ConfFile>, std::io::Error> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e))
        })
        .collect();
    paths.sort();
    Ok(paths.into_iter().map(|p| read_file(&p)).collect())
}

fn read_file(path: &Path) -> ConfFile {
    let mut file = ConfFile {
        path: path.to_path_buf(),
        network: String::new(),
        plugins: Vec::new(),
        conf: None,
        problem: None,
    };
    let text = match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE_BYTES => Err(format!(
            "{} bytes, larger than any network configuration ({MAX_FILE_BYTES} read at most)",
            m.len()
        )),
        _ => std::fs::read(path).map_err(|e| format!("cannot be read: {e}")),
    };
    let parsed = text.and_then(|bytes| parse(path, &bytes));
    match parsed {
        Ok((network, plugins, conf)) => {
            file.network = network;
            file.plugins = plugins;
            file.conf = Some(conf);
        }
        Err(problem) => file.problem = Some(problem),
    }
    file
}

/// A file's network name, plugin types and configuration, checked as libcni checks them
/// when it loads a list (`ConfListFromBytes`) or a single plugin's file
/// (`ConfFromBytes`, which go-cni then requires to name a `type`).
fn parse(path: &Path, bytes: &[u8]) -> Result<(String, Vec<String>, Value), String> {
    let conf: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("is not valid JSON: {e}"))?;
    if !conf.is_object() {
        return Err("is not a JSON object".into());
    }
    let list = path.extension().is_some_and(|e| e == "conflist");
    let name = conf.get("name");
    let network = match name {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        Some(Value::String(_)) | None if list => {
            return Err("has no network name (\"name\")".into());
        }
        Some(Value::String(_)) | None => String::new(),
        Some(_) => return Err("has a \"name\" that is not a string".into()),
    };
    let plugins: Vec<&Value> = if list {
        match conf.get("plugins") {
            Some(Value::Array(p)) if !p.is_empty() => p.iter().collect(),
            Some(Value::Array(_)) => return Err("has an empty \"plugins\" list".into()),
            Some(_) => return Err("has a \"plugins\" that is not a list".into()),
            None => return Err("has no \"plugins\" key".into()),
        }
    } else {
        vec![&conf]
    };
    let mut types = Vec::with_capacity(plugins.len());
    for (i, p) in plugins.iter().enumerate() {
        match p.get("type").and_then(Value::as_str) {
            Some(t) if !t.is_empty() => types.push(t.to_string()),
            _ if list => return Err(format!("plugin {} of its list has no \"type\"", i + 1)),
            _ => return Err("names no plugin \"type\"".into()),
        }
    }
    Ok((network, types, conf))
}

/// The file the runtime uses: the first in libcni's order, if it loads. None when there
/// is no file, or the first does not load (and so the runtime loads nothing).
pub fn used(files: &[ConfFile]) -> Option<&ConfFile> {
    files.first().filter(|f| f.loads())
}

/// The plugin types of `file`'s chain (and their IPAM plugins) that have no executable
/// file in any of `bin_dirs`, as libcni looks for them (`FindInPath`): the runtime fails
/// the ADD with `failed to find plugin "<type>" in path [<dirs>]` before it runs any.
pub fn missing_plugins(file: &ConfFile, bin_dirs: &[String]) -> Vec<String> {
    let mut wanted: Vec<&str> = file.plugins.iter().map(String::as_str).collect();
    wanted.extend(ipam_types(file));
    let mut missing: Vec<String> = Vec::new();
    for t in wanted {
        let found = bin_dirs
            .iter()
            .any(|d| is_regular_file(&Path::new(d).join(t)));
        if !found && !missing.iter().any(|m| m == t) {
            missing.push(t.to_string());
        }
    }
    missing
}

/// The IPAM plugins the chain delegates to.
fn ipam_types(file: &ConfFile) -> Vec<&str> {
    let Some(conf) = &file.conf else {
        return Vec::new();
    };
    let plugins: Vec<&Value> = match conf.get("plugins").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![conf],
    };
    plugins
        .into_iter()
        .filter_map(|p| p.get("ipam")?.get("type")?.as_str())
        .filter(|t| !t.is_empty())
        .collect()
}

/// libcni's test: a regular file of the plugin's name (whether it may be executed is the
/// exec's to find out).
fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn files_are_read_in_name_order_and_only_libcnis_extensions() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "20-b.conflist",
            r#"{"name":"b","cniVersion":"1.0.0","plugins":[{"type":"bridge","ipam":{"type":"host-local"}},{"type":"portmap"}]}"#,
        );
        write(d.path(), "10-a.conf", r#"{"name":"a","type":"ptp"}"#);
        write(d.path(), "05-notes.txt", "not a configuration");
        write(d.path(), "99-c.json", r#"{"name":"c","type":"macvlan"}"#);
        let files = read(d.path()).unwrap();
        let names: Vec<String> = files.iter().map(ConfFile::name).collect();
        assert_eq!(names, ["10-a.conf", "20-b.conflist", "99-c.json"]);
        assert_eq!(files[1].network, "b");
        assert_eq!(files[1].plugins, ["bridge", "portmap"]);
        assert_eq!(
            used(&files).map(ConfFile::name).as_deref(),
            Some("10-a.conf")
        );
    }

    #[test]
    fn each_broken_file_says_why_and_a_broken_first_file_means_none_is_used() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "10-broken.conflist",
            r#"{"name": "x", "plugins": [ {"type": "bridge"} "#,
        );
        write(
            d.path(),
            "20-noname.conflist",
            r#"{"plugins":[{"type":"bridge"}]}"#,
        );
        write(
            d.path(),
            "30-notype.conflist",
            r#"{"name":"n","plugins":[{"type":"bridge"},{}]}"#,
        );
        write(
            d.path(),
            "40-empty.conflist",
            r#"{"name":"n","plugins":[]}"#,
        );
        write(d.path(), "50-conf.conf", r#"{"name":"n"}"#);
        write(d.path(), "60-array.json", "[1, 2]");
        let files = read(d.path()).unwrap();
        let problems: Vec<String> = files.iter().map(|f| f.problem.clone().unwrap()).collect();
        assert!(
            problems[0].starts_with("is not valid JSON: EOF while parsing"),
            "{problems:?}"
        );
        assert_eq!(problems[1], "has no network name (\"name\")");
        assert_eq!(problems[2], "plugin 2 of its list has no \"type\"");
        assert_eq!(problems[3], "has an empty \"plugins\" list");
        assert_eq!(problems[4], "names no plugin \"type\"");
        assert_eq!(problems[5], "is not a JSON object");
        assert!(used(&files).is_none());
        assert!(used(&[]).is_none());
    }

    #[test]
    fn a_plugin_without_an_executable_in_any_bin_dir_is_missing() {
        use std::os::unix::fs::PermissionsExt;
        let bins = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        for (dir, name, mode) in [
            (bins.path(), "bridge", 0o755),
            (other.path(), "host-local", 0o755),
            (bins.path(), "portmap", 0o644),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "10.conflist",
            r#"{"name":"n","plugins":[{"type":"bridge","ipam":{"type":"host-local"}},{"type":"portmap"},{"type":"flannel","ipam":{"type":"whereabouts"}}]}"#,
        );
        let files = read(d.path()).unwrap();
        let dirs = vec![
            bins.path().display().to_string(),
            other.path().display().to_string(),
        ];
        // portmap is there, if not executable: libcni finds it (and its exec fails).
        assert_eq!(
            missing_plugins(&files[0], &dirs),
            ["flannel", "whereabouts"]
        );
    }
}

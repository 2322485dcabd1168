//! The node's CNI configuration changed for one test and put back after it, passed or
//! not: the directory is the runtime's own (its CRI status names it), so the same test
//! breaks the host lab's network and the modern node's. containerd watches the directory
//! and reloads on change; every change here waits for the runtime to say it loaded it
//! (its status info names the network, or NetworkReady turns false), never on a guess of
//! how long a reload takes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use podlapse::cri::{CriClient, Endpoint, EndpointSource, NodeShape, RuntimeService, Timeouts};
use serde_json::Value;

use crate::eventually;

/// How long containerd may take to reload its CNI configuration: it does so on a file
/// event, in well under a second here; the bound is for a broken runtime only, long
/// enough for the emulated guest.
const RELOAD: Duration = Duration::from_secs(120);

/// What the runtime says of its network: NetworkReady, and its status info's `cniconfig`
/// (the networks it loaded, as JSON text).
pub struct RuntimeNetwork {
    pub ready: bool,
    pub message: String,
    pub cniconfig: String,
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<String>,
}

/// One CRI Status (verbose) of the lab's runtime.
pub fn runtime_network() -> RuntimeNetwork {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sock = crate::lab().cri_socket();
        let ep = Endpoint {
            given: sock.display().to_string(),
            path: sock,
            source: EndpointSource::Flag,
        };
        let cri = CriClient::connect(ep, Timeouts::default())
            .await
            .expect("the runtime's CRI socket");
        let shape = NodeShape::detect(&cri, None, false)
            .await
            .expect("the runtime says its node's shape");
        let status = cri.status(true).await.expect("CRI Status");
        let ready = status
            .status
            .iter()
            .flat_map(|s| &s.conditions)
            .find(|c| c.r#type == "NetworkReady")
            .expect("a NetworkReady condition");
        RuntimeNetwork {
            ready: ready.status,
            message: ready.message.clone(),
            cniconfig: status.info.get("cniconfig").cloned().unwrap_or_default(),
            conf_dir: PathBuf::from(
                shape
                    .cni_conf_dir
                    .expect("the runtime names its CNI configuration directory"),
            ),
            bin_dirs: shape.cni_bin_dirs,
        }
    })
}

/// The runtime's CNI configuration directory as it was, put back on drop.
pub struct ConfSwap {
    dir: PathBuf,
    /// Every file the directory held, by name.
    saved: BTreeMap<String, Vec<u8>>,
    /// The network the runtime used, waited for again on restore.
    network: String,
    /// host-local stores of the test's networks, removed on restore.
    stores: Vec<PathBuf>,
}

impl ConfSwap {
    /// Saves the runtime's configuration directory. The used network must load (the
    /// lab's and the modern node's do).
    pub fn save() -> ConfSwap {
        let rt = runtime_network();
        assert!(
            rt.ready,
            "the node's network is not ready before the test: {}",
            rt.message
        );
        let mut saved = BTreeMap::new();
        for e in std::fs::read_dir(&rt.conf_dir).expect("the CNI configuration directory") {
            let e = e.unwrap();
            if e.file_type().unwrap().is_file() {
                saved.insert(
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                );
            }
        }
        let network = ConfSwap::used_conf(&saved)
            .and_then(|(_, c)| c["name"].as_str().map(str::to_string))
            .expect("the runtime's network has a name");
        ConfSwap {
            dir: rt.conf_dir,
            saved,
            network,
            stores: Vec::new(),
        }
    }

    /// The first configuration in libcni's order, parsed.
    fn used_conf(saved: &BTreeMap<String, Vec<u8>>) -> Option<(String, Value)> {
        saved
            .iter()
            .find(|(n, _)| n.ends_with(".conflist"))
            .and_then(|(n, b)| Some((n.clone(), serde_json::from_slice(b).ok()?)))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The used network's configuration as saved.
    pub fn original(&self) -> Value {
        ConfSwap::used_conf(&self.saved).unwrap().1
    }

    /// Replaces the used network with `conf` (its `name` must be new, so the runtime's
    /// reload can be told), then waits until the runtime has loaded it.
    pub fn use_network(&mut self, conf: &Value) {
        let (file, _) = ConfSwap::used_conf(&self.saved).unwrap();
        let name = conf["name"].as_str().expect("a network name").to_string();
        assert_ne!(
            name, self.network,
            "a test's network needs a name of its own"
        );
        if let Some(ipam) = conf["plugins"]
            .as_array()
            .and_then(|p| p.iter().find_map(|p| p.get("ipam")))
        {
            let data = ipam["dataDir"].as_str().unwrap_or("/var/lib/cni/networks");
            self.stores.push(Path::new(data).join(&name));
        }
        std::fs::write(
            self.dir.join(file),
            serde_json::to_vec_pretty(conf).unwrap(),
        )
        .unwrap();
        wait_loaded(&name);
    }

    /// Empties the directory and waits for the runtime to report its network not ready.
    pub fn remove_all(&mut self) {
        for name in self.saved.keys() {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
        wait_not_ready();
    }

    /// Adds `name` with `text` (sorted before the runtime's own file, it is the one the
    /// runtime loads first), and waits for the runtime to report not ready.
    pub fn add_broken(&mut self, name: &str, text: &str) {
        std::fs::write(self.dir.join(name), text).unwrap();
        wait_not_ready();
    }

    /// host-local's store of network `name` under the used network's `dataDir`.
    pub fn store_of(&self, name: &str) -> PathBuf {
        let data = self.original()["plugins"][0]["ipam"]["dataDir"]
            .as_str()
            .unwrap_or("/var/lib/cni/networks")
            .to_string();
        Path::new(&data).join(name)
    }

    fn restore(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !self.saved.contains_key(&name) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        for (name, bytes) in &self.saved {
            let _ = std::fs::write(self.dir.join(name), bytes);
        }
        for store in self.stores.drain(..) {
            let _ = std::fs::remove_dir_all(store);
        }
    }
}

impl Drop for ConfSwap {
    fn drop(&mut self) {
        self.restore();
        if !std::thread::panicking() {
            wait_loaded(&self.network);
        }
    }
}

/// Waits until the runtime reports NetworkReady with network `name` loaded.
fn wait_loaded(name: &str) {
    let quoted = format!("\"{name}\"");
    eventually(
        &format!("the runtime to load CNI network {name}"),
        RELOAD,
        Duration::from_millis(100),
        || {
            let rt = runtime_network();
            if rt.ready && rt.cniconfig.contains(&quoted) {
                Ok(())
            } else {
                Err(format!("ready={} {}", rt.ready, rt.message))
            }
        },
    );
}

/// Waits until the runtime reports NetworkReady=false.
fn wait_not_ready() {
    eventually(
        "the runtime to report its network not ready",
        RELOAD,
        Duration::from_millis(100),
        || {
            let rt = runtime_network();
            if rt.ready {
                Err("still ready".to_string())
            } else {
                Ok(())
            }
        },
    );
}

/// The used network, renamed `name`, with `edit` applied to its first plugin.
pub fn network(swap: &ConfSwap, name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut conf = swap.original();
    conf["name"] = name.into();
    edit(&mut conf["plugins"][0]);
    conf
}

/// A pool of the addresses `.first` to `.last` of the lab's pod subnet.
pub fn pool(first: u8, last: u8) -> impl FnOnce(&mut Value) {
    move |bridge: &mut Value| {
        let range = &mut bridge["ipam"]["ranges"][0][0];
        let subnet = range["subnet"].as_str().unwrap().to_string();
        let base = subnet.rsplit_once('.').unwrap().0.to_string();
        range["rangeStart"] = format!("{base}.{first}").into();
        range["rangeEnd"] = format!("{base}.{last}").into();
    }
}

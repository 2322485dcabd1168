//! Tying kernel events to pods by the identities the kernel itself reports, never by
//! time windows: a cgroup path naming a pod, sandbox or container; the sandbox ID and pod
//! UID in a CNI plugin's environment; the v2 cgroup a task runs in, once that cgroup's
//! creation was attributed; the parent of a process, once the parent was attributed; and
//! a network namespace's inode, once a task of the pod entered it. An event none of these
//! reach stays a node-level event.
//!
//! Events are walked in time order because most identities are learned from an earlier
//! event (a cgroup's mkdir before the execs inside it, a plugin's execve before its
//! children). The netns creation is the exception: the unshare comes before any sign of
//! whose namespace it is, so it is resolved after the walk, by inode.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::ids::{cgroup_ids, is_runtime_id};
use super::index::Index;
use super::runtime_args;
use crate::ebpf::event::cni_args_value;
use crate::ebpf::{KernelEvent, NetnsCall};

/// Which identity tied an event to its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The cgroup path names the pod (`pod<uid>`) or a sandbox or container CRI created.
    CgroupPath,
    /// A CNI plugin's `CNI_CONTAINERID` is a sandbox CRI created for the pod.
    CniContainerId,
    /// A CNI plugin's `CNI_ARGS` names the pod's UID (a sandbox whose creation failed
    /// is known to CRI by no ID).
    CniPodUid,
    /// The task runs in a cgroup whose creation was attributed.
    CgroupId,
    /// The process is a CNI plugin of the pod, or a descendant of one.
    Ancestry,
    /// A runtime program's arguments name a sandbox or container CRI created for the
    /// pod (the shim's `-id`, runc's container ID).
    RuntimeArgs,
    /// The network namespace is the one the pod's tasks entered.
    Netns,
}

/// Whose an event is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub pod_uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    pub rule: Rule,
}

impl Owner {
    fn pod(uid: &str, rule: Rule) -> Owner {
        Owner {
            // The systemd cgroup driver spells the UID with `_`.
            pod_uid: uid.replace('_', "-"),
            sandbox_id: None,
            container_id: None,
            rule,
        }
    }

    fn sandbox(uid: &str, sandbox: &str, rule: Rule) -> Owner {
        Owner {
            sandbox_id: Some(sandbox.to_string()),
            ..Owner::pod(uid, rule)
        }
    }

    fn by(&self, rule: Rule) -> Owner {
        Owner {
            rule,
            ..self.clone()
        }
    }
}

/// The owner of each kernel event that has one, by the event's index in the records.
/// Each distinct owner is kept once: a pod's hundreds of events have a handful of
/// owners, and an owner's IDs are a few hundred bytes.
#[derive(Debug, Clone, Default)]
pub struct Attribution {
    distinct: Vec<Owner>,
    /// Event index to its owner's position in `distinct`.
    owners: BTreeMap<usize, u32>,
}

impl Attribution {
    /// The owner of the record at `index`, if it is a kernel event with one.
    pub fn owner(&self, index: usize) -> Option<&Owner> {
        self.owners.get(&index).map(|&o| &self.distinct[o as usize])
    }

    /// How many events have an owner.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &Owner)> {
        self.owners
            .iter()
            .map(|(i, &o)| (*i, &self.distinct[o as usize]))
    }
}

/// Equal when every event has the same owner, however the owners were numbered.
impl PartialEq for Attribution {
    fn eq(&self, other: &Attribution) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Attribution {}

/// An [`Attribution`] being built. The walk's own maps hold owners by their position in
/// `distinct` too, so no owner is copied per event.
#[derive(Default)]
struct Owners {
    attribution: Attribution,
    positions: HashMap<Owner, u32>,
}

impl Owners {
    /// The position of `owner`, added if it is new.
    fn intern(&mut self, owner: Owner) -> u32 {
        let distinct = &mut self.attribution.distinct;
        *self.positions.entry(owner).or_insert_with_key(|owner| {
            distinct.push(owner.clone());
            (distinct.len() - 1) as u32
        })
    }

    fn get(&self, position: u32) -> &Owner {
        &self.attribution.distinct[position as usize]
    }

    /// The owner at `position`, tied by `rule` instead.
    fn by(&mut self, position: u32, rule: Rule) -> u32 {
        let owner = self.get(position).by(rule);
        self.intern(owner)
    }

    fn set(&mut self, index: usize, position: u32) {
        self.attribution.owners.insert(index, position);
    }

    /// Gives `index` the owner at `position` unless it has an owner already.
    fn set_if_none(&mut self, index: usize, position: u32) {
        self.attribution.owners.entry(index).or_insert(position);
    }
}

/// A network namespace seen being created (unshare or clone with CLONE_NEWNET).
struct Created {
    inum: u32,
    at: u64,
    index: usize,
}

pub(super) fn attribute(index: &Index<'_>) -> Attribution {
    let mut owners = Owners::default();
    // v2 cgroup ID of an attributed cgroup, to its owner.
    let mut cgroups: HashMap<u64, u32> = HashMap::new();
    // Live CNI plugins and their descendants, by process ID.
    let mut procs: HashMap<u32, u32> = HashMap::new();
    // Plugins whose own exec has not been seen yet: only that one exec is theirs by PID,
    // so a reused PID cannot inherit an owner.
    let mut awaiting_exec: HashSet<u32> = HashSet::new();
    // Sandbox IDs CNI plugins were given, for cgroup paths CRI never named (a sandbox
    // whose RunPodSandbox failed after its network was set up).
    let mut cni_sandboxes: HashMap<String, String> = HashMap::new();
    let mut created: Vec<Created> = Vec::new();
    let mut entered: Vec<(u32, u64, u32)> = Vec::new();
    // Every successful setns: (index, inode, time).
    let mut setns: Vec<(usize, u32, u64)> = Vec::new();

    for &(i, e) in &index.kernel {
        let meta = e.meta();
        let owner = match e {
            KernelEvent::CniExec(c) => {
                let (container_id, args) = (&c.container_id, &c.args);
                cni_owner(index, container_id, args).map(|o| {
                    if !container_id.is_empty() {
                        cni_sandboxes.insert(container_id.clone(), o.pod_uid.clone());
                    }
                    let o = owners.intern(o);
                    procs.insert(meta.tgid, owners.by(o, Rule::Ancestry));
                    awaiting_exec.insert(meta.tgid);
                    o
                })
            }
            KernelEvent::RuntimeExec(r) => {
                // By the ID in its arguments; `runc init`, which names none, by its
                // parent (its own first exec was already tied by ancestry).
                let named = runtime_args::parse(&r.argv, r.head_cut)
                    .and_then(|run| run.id)
                    .and_then(|id| runtime_owner(index, id, Rule::RuntimeArgs))
                    .map(|o| owners.intern(o));
                let owner = named.or_else(|| procs.get(&meta.tgid).copied());
                if let Some(o) = owner {
                    procs.insert(meta.tgid, owners.by(o, Rule::Ancestry));
                    awaiting_exec.insert(meta.tgid);
                }
                owner
            }
            KernelEvent::CgroupMkdir { cgroup, .. }
            | KernelEvent::CgroupRmdir { cgroup, .. }
            | KernelEvent::CgroupAttach { cgroup, .. } => {
                let owner =
                    cgroup_owner(index, &cni_sandboxes, &cgroup.path).map(|o| owners.intern(o));
                if let (KernelEvent::CgroupMkdir { .. }, Some(o)) = (e, owner)
                    && cgroup.hierarchy == 0
                {
                    cgroups.insert(cgroup.cgroup_id, owners.by(o, Rule::CgroupId));
                }
                owner
            }
            KernelEvent::Exec { ppid, .. } => {
                if let Some(&o) = cgroups.get(&meta.cgroup_id) {
                    Some(o)
                } else if awaiting_exec.remove(&meta.tgid) {
                    procs.get(&meta.tgid).copied()
                } else if let Some(&o) = ppid.and_then(|p| procs.get(&p)) {
                    procs.insert(meta.tgid, o);
                    Some(o)
                } else {
                    None
                }
            }
            KernelEvent::Exit { .. } => {
                awaiting_exec.remove(&meta.tgid);
                let proc_owner = procs.remove(&meta.tgid);
                cgroups.get(&meta.cgroup_id).copied().or(proc_owner)
            }
            KernelEvent::Netns {
                syscall,
                ret,
                netns_inum,
                ..
            } => {
                let owner = cgroups
                    .get(&meta.cgroup_id)
                    .or_else(|| procs.get(&meta.tgid))
                    .copied();
                if let (0, Some(inum)) = (*ret, *netns_inum) {
                    match syscall {
                        NetnsCall::Unshare | NetnsCall::Clone | NetnsCall::Clone3 => {
                            created.push(Created {
                                inum,
                                at: meta.ktime_ns,
                                index: i,
                            });
                        }
                        NetnsCall::Setns => {
                            setns.push((i, inum, meta.ktime_ns));
                            if let Some(o) = owner {
                                entered.push((inum, meta.ktime_ns, o));
                            }
                        }
                    }
                }
                owner
            }
            // A plugin's output is its run's: the same process, between its exec and
            // its exit (the total at exit comes just before the exit).
            KernelEvent::CniOutput(_) => procs.get(&meta.tgid).copied(),
            // The agent's own record of its write hook: the node's.
            KernelEvent::CniWriteHook(_) => None,
        };
        if let Some(o) = owner {
            owners.set(i, o);
        }
    }

    attribute_netns(&created, &entered, &setns, &mut owners);
    owners.attribution
}

/// A namespace belongs to the pod whose task entered it; the creation it came from is
/// the latest one of that inode before the entry (inodes are reused once a namespace is
/// freed). Other entries into it, until the inode is created anew, are the pod's too.
fn attribute_netns(
    created: &[Created],
    entered: &[(u32, u64, u32)],
    setns: &[(usize, u32, u64)],
    owners: &mut Owners,
) {
    // Creation (by position in `created`) to owner: the first entry decides.
    let mut namespaces: BTreeMap<usize, u32> = BTreeMap::new();
    for &(inum, at, owner) in entered {
        let Some(pos) = created.iter().rposition(|c| c.inum == inum && c.at <= at) else {
            continue;
        };
        if let std::collections::btree_map::Entry::Vacant(v) = namespaces.entry(pos) {
            v.insert(owners.by(owner, Rule::Netns));
        }
    }
    for (&pos, &owner) in &namespaces {
        let c = &created[pos];
        owners.set_if_none(c.index, owner);
        let until = created[pos + 1..]
            .iter()
            .find(|n| n.inum == c.inum)
            .map_or(u64::MAX, |n| n.at);
        for &(i, inum, at) in setns {
            if inum == c.inum && at >= c.at && at < until {
                owners.set_if_none(i, owner);
            }
        }
    }
}

/// A CNI plugin run: its sandbox if CRI created it, else the pod UID in `CNI_ARGS`.
fn cni_owner(index: &Index<'_>, container_id: &str, args: &str) -> Option<Owner> {
    if let Some(uid) = index.sandboxes.get(container_id) {
        return Some(Owner::sandbox(uid, container_id, Rule::CniContainerId));
    }
    let uid = cni_args_value(args, "K8S_POD_UID")?;
    Some(if container_id.is_empty() {
        Owner::pod(&uid, Rule::CniPodUid)
    } else {
        Owner::sandbox(&uid, container_id, Rule::CniPodUid)
    })
}

/// A sandbox or container CRI created, by its ID, tied by `rule`.
fn runtime_owner(index: &Index<'_>, id: &str, rule: Rule) -> Option<Owner> {
    if let Some(c) = index.containers.get(id) {
        return Some(Owner {
            pod_uid: c.pod_uid.to_string(),
            sandbox_id: (!c.sandbox_id.is_empty()).then(|| c.sandbox_id.to_string()),
            container_id: Some(id.to_string()),
            rule,
        });
    }
    let uid = index.sandboxes.get(id)?;
    Some(Owner::sandbox(uid, id, rule))
}

/// A cgroup: the container or sandbox its last component names, else the pod its
/// `pod<uid>` component names.
fn cgroup_owner(
    index: &Index<'_>,
    cni_sandboxes: &HashMap<String, String>,
    path: &str,
) -> Option<Owner> {
    let ids = cgroup_ids(path);
    if let Some(id) = ids.runtime_id.filter(|id| is_runtime_id(id)) {
        if let Some(o) = runtime_owner(index, id, Rule::CgroupPath) {
            return Some(o);
        }
        if let Some(uid) = cni_sandboxes.get(id) {
            return Some(Owner::sandbox(uid, id, Rule::CgroupPath));
        }
    }
    // The systemd driver writes the UID's `-` as `_` in the slice name.
    ids.pod_uid
        .map(|uid| Owner::pod(&uid.replace('_', "-"), Rule::CgroupPath))
}

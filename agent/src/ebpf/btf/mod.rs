//! Offsets into kernel structs, resolved from the running kernel's BTF at load time.
//!
//! The probes read `task_struct->nsproxy->net_ns->ns.inum` (the netns inode),
//! `task_struct->exit_code`, `task_struct->real_parent->tgid`, `task_struct->start_time`
//! (when a process was forked) and, for a CNI plugin's
//! environment, `task_struct->mm->start_stack`. Those offsets change with every kernel
//! build and config
//! (randomised layouts, added fields), so the probes take them as globals and this
//! module finds them in `/sys/kernel/btf/vmlinux`. Without kprobes or CO-RE relocations
//! in the probes' toolchain, this is how a tracepoint program reads a kernel struct
//! safely.

use std::path::{Path, PathBuf};

use super::error::EbpfError;

mod format;
#[cfg(test)]
mod test_blob;

pub use format::BtfFormatError;
use format::{Btf, Kind};

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The struct offsets the probes need, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KernelOffsets {
    /// `task_struct.nsproxy`.
    pub task_nsproxy: u32,
    /// `nsproxy.net_ns`.
    pub nsproxy_net_ns: u32,
    /// `net.ns.inum`: `ns_common` embedded in `struct net`, then its inode number.
    pub net_inum: u32,
    /// `ns_common.inum`: a namespace's inode from its `ns_common` (what `netns_install`
    /// is handed). 0 when missing (a setns the kernel-function hook reports then has no
    /// inode).
    pub ns_common_inum: u32,
    /// `task_struct.exit_code`.
    pub task_exit_code: u32,
    /// `task_struct.real_parent`.
    pub task_real_parent: u32,
    /// `task_struct.tgid`.
    pub task_tgid: u32,
    /// `task_struct.mm`.
    pub task_mm: u32,
    /// `mm_struct.start_stack`.
    pub mm_start_stack: u32,
    /// `mm_struct.arg_start`: where a program's argument strings begin.
    pub mm_arg_start: u32,
    /// `mm_struct.arg_end`: one past their end.
    pub mm_arg_end: u32,
    /// `task_struct.start_time`: when the task was forked. 0 when the kernel has no such
    /// member (the probes then report no fork times).
    pub task_start_time: u32,
    /// `task_struct.comm`: the probes read it directly, which costs every exec on the
    /// node less than the `bpf_get_current_comm` helper. 0 when missing (they then use
    /// the helper).
    pub task_comm: u32,
}

impl KernelOffsets {
    /// Resolves the offsets from the BTF file at `path` (normally [`VMLINUX_BTF`]).
    pub fn from_btf_file(path: &Path) -> Result<KernelOffsets, EbpfError> {
        if !path.exists() {
            return Err(EbpfError::BtfMissing {
                path: path.to_path_buf(),
            });
        }
        let unreadable = |source| EbpfError::BtfUnreadable {
            path: path.to_path_buf(),
            source,
        };
        let data = std::fs::read(path).map_err(|e| unreadable(BtfFormatError::Io(e)))?;
        let btf = Btf::parse(data).map_err(unreadable)?;
        let r = Resolver {
            btf: &btf,
            path: path.to_path_buf(),
        };
        Ok(KernelOffsets {
            task_nsproxy: r.offset("task_struct", &["nsproxy"])?,
            nsproxy_net_ns: r.offset("nsproxy", &["net_ns"])?,
            net_inum: r.offset("net", &["ns", "inum"])?,
            ns_common_inum: match r.offset("ns_common", &["inum"]) {
                Err(EbpfError::BtfMemberMissing { .. }) => 0,
                other => other?,
            },
            task_exit_code: r.offset("task_struct", &["exit_code"])?,
            task_real_parent: r.offset("task_struct", &["real_parent"])?,
            task_tgid: r.offset("task_struct", &["tgid"])?,
            task_mm: r.offset("task_struct", &["mm"])?,
            mm_start_stack: r.offset("mm_struct", &["start_stack"])?,
            mm_arg_start: r.offset("mm_struct", &["arg_start"])?,
            mm_arg_end: r.offset("mm_struct", &["arg_end"])?,
            task_start_time: match r.offset("task_struct", &["start_time"]) {
                Err(EbpfError::BtfMemberMissing { .. }) => 0,
                other => other?,
            },
            task_comm: match r.offset("task_struct", &["comm"]) {
                Err(EbpfError::BtfMemberMissing { .. }) => 0,
                other => other?,
            },
        })
    }
}

struct Resolver<'a> {
    btf: &'a Btf,
    path: PathBuf,
}

impl Resolver<'_> {
    /// Byte offset of `members` (a path through embedded structs) from the start of
    /// `struct strukt`.
    fn offset(&self, strukt: &'static str, members: &[&str]) -> Result<u32, EbpfError> {
        let missing = |member: &str| EbpfError::BtfMemberMissing {
            path: self.path.clone(),
            strukt,
            member: member.to_string(),
        };
        let mut ty = self
            .btf
            .struct_named(strukt)
            .map_err(|e| self.unreadable(e))?
            .ok_or_else(|| missing(members.first().copied().unwrap_or_default()))?;
        let mut bits = 0u32;
        for (i, name) in members.iter().enumerate() {
            let (member_bits, member_ty) = self
                .find_member(ty, name, 0)?
                .ok_or_else(|| missing(&members[..=i].join(".")))?;
            bits += member_bits;
            ty = member_ty;
        }
        if !bits.is_multiple_of(8) {
            return Err(missing(&format!("{} (a bitfield)", members.join("."))));
        }
        Ok(bits / 8)
    }

    /// The bit offset and type of member `name` of struct or union `ty`, looking through
    /// anonymous structs and unions (the kernel uses them for randomised layouts and
    /// unions of alternatives). `depth` bounds the nesting a malformed file could loop.
    fn find_member(
        &self,
        ty: u32,
        name: &str,
        depth: u32,
    ) -> Result<Option<(u32, u32)>, EbpfError> {
        let ty = self.strip(ty)?;
        if depth > 32
            || !matches!(
                self.btf.kind(ty).map_err(|e| self.unreadable(e))?,
                Kind::Struct | Kind::Union
            )
        {
            return Ok(None);
        }
        for m in self.btf.members(ty).map_err(|e| self.unreadable(e))? {
            let member_name = self
                .btf
                .string(m.name_off)
                .map_err(|e| self.unreadable(e))?;
            if member_name == name {
                return Ok(Some((m.bit_offset, m.type_id)));
            }
            if member_name.is_empty()
                && let Some((inner, t)) = self.find_member(m.type_id, name, depth + 1)?
            {
                return Ok(Some((m.bit_offset + inner, t)));
            }
        }
        Ok(None)
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn strip(&self, mut ty: u32) -> Result<u32, EbpfError> {
        // Bounded: a BTF chain of qualifiers longer than this is malformed.
        for _ in 0..32 {
            if ty == 0 || self.btf.kind(ty).map_err(|e| self.unreadable(e))? != Kind::Alias {
                return Ok(ty);
            }
            ty = self.btf.aliased(ty).map_err(|e| self.unreadable(e))?;
        }
        Ok(ty)
    }

    fn unreadable(&self, source: BtfFormatError) -> EbpfError {
        EbpfError::BtfUnreadable {
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_resolve_against_the_running_kernel() {
        let path = Path::new(VMLINUX_BTF);
        // The probes need the kernel's BTF on every node podlapse supports (setup
        // checks for it), so its absence is a failure here, not a skip.
        assert!(path.exists(), "{VMLINUX_BTF} is absent on this kernel");
        let off = KernelOffsets::from_btf_file(path).expect("offsets");
        assert_plausible(&off, VMLINUX_BTF);
    }

    /// Plausibility, not exact values: they differ between kernel builds. The fields sit
    /// well inside their structs, aligned as their types are.
    fn assert_plausible(off: &KernelOffsets, of: &str) {
        let off = *off;
        assert!(
            off.task_nsproxy > 0 && off.task_nsproxy < 16384,
            "{of}: {off:?}"
        );
        assert!(
            off.task_exit_code > 0 && off.task_exit_code < 16384,
            "{of}: {off:?}"
        );
        assert!(off.net_inum > 0 && off.net_inum < 16384, "{of}: {off:?}");
        assert!(off.nsproxy_net_ns < 128, "{of}: {off:?}");
        assert_eq!(off.task_nsproxy % 8, 0, "{of}: a pointer is 8-byte aligned");
        assert_eq!(
            off.nsproxy_net_ns % 8,
            0,
            "{of}: a pointer is 8-byte aligned"
        );
        assert_eq!(
            off.net_inum % 4,
            0,
            "{of}: an unsigned int is 4-byte aligned"
        );
        assert_eq!(
            off.task_real_parent % 8,
            0,
            "{of}: a pointer is 8-byte aligned"
        );
        assert_eq!(off.task_mm % 8, 0, "{of}: a pointer is 8-byte aligned");
        assert!(off.task_mm > 0 && off.task_mm < 16384, "{of}: {off:?}");
        assert_eq!(
            off.mm_start_stack % 8,
            0,
            "{of}: an unsigned long is 8-byte aligned"
        );
        assert!(off.mm_start_stack > 0, "{of}: {off:?}");
        assert_eq!(
            off.mm_arg_start % 8,
            0,
            "{of}: an unsigned long is 8-byte aligned"
        );
        assert_eq!(off.mm_arg_end, off.mm_arg_start + 8, "{of}: {off:?}");
        assert!(off.task_tgid > 0 && off.task_tgid < 16384, "{of}: {off:?}");
        assert!(
            off.task_start_time > 0 && off.task_start_time < 16384,
            "{of}: {off:?}"
        );
        assert_eq!(off.task_start_time % 8, 0, "{of}: a u64 is 8-byte aligned");
        assert!(
            off.task_comm > 0 && off.task_comm < 16384,
            "{of}: task_struct.comm at {}",
            off.task_comm
        );
    }

    /// The BTF of every kernel of the matrix the modern node boots (5.10, 6.1, 6.12, 7.2),
    /// as Debian built them: `cargo xtask test` extracts each kernel's `.BTF` from its
    /// cached package and names the files in `PODLAPSE_KERNEL_BTF` (`name=path,...`).
    /// Each parses, and every offset the probes need resolves.
    #[test]
    #[ignore = "needs the matrix's kernel BTF, which `cargo xtask test` extracts and runs this with"]
    fn the_btf_of_every_kernel_of_the_matrix_resolves_every_offset() {
        let list = std::env::var("PODLAPSE_KERNEL_BTF")
            .expect("PODLAPSE_KERNEL_BTF names the kernels' BTF files (name=path,...)");
        let kernels: Vec<(&str, &str)> = list
            .split(',')
            .map(|kv| kv.split_once('=').expect("name=path"))
            .collect();
        assert!(!kernels.is_empty(), "no kernel in {list}");
        for (name, path) in kernels {
            let data = std::fs::read(path).unwrap_or_else(|e| panic!("kernel {name}: {path}: {e}"));
            let hdr_len = u32::from_le_bytes(data[4..8].try_into().unwrap());
            let btf = Btf::parse(data).unwrap_or_else(|e| panic!("kernel {name}: {e}"));
            let off = KernelOffsets::from_btf_file(Path::new(path))
                .unwrap_or_else(|e| panic!("kernel {name}: {e}"));
            assert_plausible(&off, &format!("kernel {name}"));
            assert!(
                btf.struct_named("task_struct").unwrap().is_some(),
                "kernel {name}"
            );
            eprintln!("kernel {name}: {hdr_len}-byte header, offsets {off:?}");
        }
    }

    #[test]
    fn a_missing_member_is_named() {
        let path = Path::new(VMLINUX_BTF);
        // The probes need the kernel's BTF on every node podlapse supports (setup
        // checks for it), so its absence is a failure here, not a skip.
        assert!(path.exists(), "{VMLINUX_BTF} is absent on this kernel");
        let btf = Btf::parse(std::fs::read(path).unwrap()).unwrap();
        let r = Resolver {
            btf: &btf,
            path: path.to_path_buf(),
        };
        let e = r
            .offset("task_struct", &["no_such_member"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no_such_member") && e.contains("task_struct"),
            "{e}"
        );
        let e = r.offset("net", &["ns", "nope"]).unwrap_err().to_string();
        assert!(e.contains("ns.nope"), "{e}");
    }

    /// A struct reached through an anonymous union, a const typedef and a pointer, as
    /// the kernel's own layouts do.
    fn nested() -> Vec<u8> {
        let mut b = test_blob::Blob::new();
        let int = b.int("int");
        let inner = b.composite("inner", false, false, &[("a", int, 0), ("b", int, 32)]);
        let alias = b.typedef("inner_t", inner);
        let konst = b.konst(alias);
        let anon = b.composite("", true, false, &[("x", int, 0), ("y", inner, 0)]);
        let ptr = b.ptr(inner);
        b.composite(
            "outer",
            false,
            false,
            &[
                ("first", int, 0),
                ("", anon, 64),
                ("q", konst, 128),
                ("p", ptr, 192),
            ],
        );
        b.composite("odd", false, true, &[("f", int, 3)]);
        b.bytes(false)
    }

    fn resolver_test(data: Vec<u8>, f: impl FnOnce(&Resolver)) {
        let btf = Btf::parse(data).unwrap();
        f(&Resolver {
            btf: &btf,
            path: PathBuf::from("nested.btf"),
        });
    }

    #[test]
    fn offsets_go_through_anonymous_unions_typedefs_and_qualifiers() {
        resolver_test(nested(), |r| {
            assert_eq!(r.offset("outer", &["first"]).unwrap(), 0);
            assert_eq!(r.offset("outer", &["y", "b"]).unwrap(), 12);
            assert_eq!(r.offset("outer", &["q", "b"]).unwrap(), 20);
            assert_eq!(r.offset("outer", &["p"]).unwrap(), 24);
            // A pointer is not an embedded struct: nothing to go into.
            let e = r.offset("outer", &["p", "a"]).unwrap_err().to_string();
            assert!(e.contains("p.a") && e.contains("nested.btf"), "{e}");
            let e = r.offset("odd", &["f"]).unwrap_err().to_string();
            assert!(e.contains("a bitfield"), "{e}");
            let e = r.offset("absent", &["f"]).unwrap_err().to_string();
            assert!(e.contains("struct absent"), "{e}");
        });
    }

    #[test]
    fn a_truncated_btf_file_is_named_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vmlinux");
        let data = nested();
        std::fs::write(&path, &data[..data.len() - 40]).unwrap();
        let e = KernelOffsets::from_btf_file(&path).unwrap_err().to_string();
        assert!(
            e.contains(path.to_str().unwrap()) && e.contains("string section"),
            "{e}"
        );
    }

    #[test]
    fn no_btf_file_is_reported_as_unavailable() {
        let e = KernelOffsets::from_btf_file(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(e.is_unavailable(), "{e}");
    }
}

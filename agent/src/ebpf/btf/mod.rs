//! Offsets into kernel structs, resolved from the running kernel's BTF at load time.
//!
//! The probes read `task_struct->nsproxy->net_ns->ns.inum` (the netns inode),
//! `task_struct->exit_code`, `task_struct->real_parent->tgid` and, for a CNI plugin's
//! environment, `task_struct->mm->start_stack`. Those offsets change with every kernel
//! build and config
//! (randomised layouts, added fields), so the probes take them as globals and this
//! module finds them in `/sys/kernel/btf/vmlinux`. Without kprobes or CO-RE relocations
//! in the probes' toolchain, this is how a tracepoint program reads a kernel struct
//! safely.

use std::path::{Path, PathBuf};

use btf_rs::{Btf, BtfType, Type};

use super::error::EbpfError;

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
}

impl KernelOffsets {
    /// Resolves the offsets from the BTF file at `path` (normally [`VMLINUX_BTF`]).
    pub fn from_btf_file(path: &Path) -> Result<KernelOffsets, EbpfError> {
        if !path.exists() {
            return Err(EbpfError::BtfMissing {
                path: path.to_path_buf(),
            });
        }
        let btf = Btf::from_file(path).map_err(|source| EbpfError::BtfUnreadable {
            path: path.to_path_buf(),
            source: Box::new(source),
        })?;
        let r = Resolver {
            btf: &btf,
            path: path.to_path_buf(),
        };
        Ok(KernelOffsets {
            task_nsproxy: r.offset("task_struct", &["nsproxy"])?,
            nsproxy_net_ns: r.offset("nsproxy", &["net_ns"])?,
            net_inum: r.offset("net", &["ns", "inum"])?,
            task_exit_code: r.offset("task_struct", &["exit_code"])?,
            task_real_parent: r.offset("task_struct", &["real_parent"])?,
            task_tgid: r.offset("task_struct", &["tgid"])?,
            task_mm: r.offset("task_struct", &["mm"])?,
            mm_start_stack: r.offset("mm_struct", &["start_stack"])?,
            mm_arg_start: r.offset("mm_struct", &["arg_start"])?,
            mm_arg_end: r.offset("mm_struct", &["arg_end"])?,
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
        let unreadable = |source| EbpfError::BtfUnreadable {
            path: self.path.clone(),
            source: Box::new(source),
        };
        let mut ty = self
            .btf
            .resolve_types_by_name(strukt)
            .map_err(unreadable)?
            .into_iter()
            .find(|t| matches!(t, Type::Struct(_)))
            .ok_or_else(|| missing(members.first().copied().unwrap_or_default()))?;
        let mut bits = 0u32;
        for (i, name) in members.iter().enumerate() {
            let (member_bits, member_ty) = self
                .find_member(&ty, name)?
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
    /// unions of alternatives).
    fn find_member(&self, ty: &Type, name: &str) -> Result<Option<(u32, Type)>, EbpfError> {
        let unreadable = |source| EbpfError::BtfUnreadable {
            path: self.path.clone(),
            source: Box::new(source),
        };
        let s = match self.strip(ty.clone())? {
            Type::Struct(s) | Type::Union(s) => s,
            _ => return Ok(None),
        };
        for m in &s.members {
            let member_name = self.btf.resolve_name(m).unwrap_or_default();
            let member_ty = self.btf.resolve_chained_type(m).map_err(unreadable)?;
            if member_name == name {
                return Ok(Some((m.bit_offset(), member_ty)));
            }
            if member_name.is_empty()
                && let Some((inner, t)) = self.find_member(&member_ty, name)?
            {
                return Ok(Some((m.bit_offset() + inner, t)));
            }
        }
        Ok(None)
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn strip(&self, mut ty: Type) -> Result<Type, EbpfError> {
        // Bounded: a BTF chain of qualifiers longer than this is malformed.
        for _ in 0..32 {
            ty = match &ty {
                Type::Typedef(t) => self.chained(t)?,
                Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => self.chained(t)?,
                Type::TypeTag(t) => self.chained(t)?,
                _ => return Ok(ty),
            };
        }
        Ok(ty)
    }

    fn chained<T: BtfType + ?Sized>(&self, t: &T) -> Result<Type, EbpfError> {
        self.btf
            .resolve_chained_type(t)
            .map_err(|source| EbpfError::BtfUnreadable {
                path: self.path.clone(),
                source: Box::new(source),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_resolve_against_the_running_kernel() {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            eprintln!("skipped: {VMLINUX_BTF} is absent on this kernel");
            return;
        }
        let off = KernelOffsets::from_btf_file(path).expect("offsets");
        // Plausibility, not exact values: they differ between kernel builds. Both
        // fields sit well inside task_struct, and ns_common is not at offset 0 of net.
        assert!(off.task_nsproxy > 0 && off.task_nsproxy < 16384, "{off:?}");
        assert!(
            off.task_exit_code > 0 && off.task_exit_code < 16384,
            "{off:?}"
        );
        assert!(off.net_inum > 0 && off.net_inum < 16384, "{off:?}");
        assert!(off.nsproxy_net_ns < 128, "{off:?}");
        assert_eq!(off.task_nsproxy % 8, 0, "a pointer is 8-byte aligned");
        assert_eq!(off.nsproxy_net_ns % 8, 0, "a pointer is 8-byte aligned");
        assert_eq!(off.net_inum % 4, 0, "an unsigned int is 4-byte aligned");
        assert_eq!(off.task_real_parent % 8, 0, "a pointer is 8-byte aligned");
        assert_eq!(off.task_mm % 8, 0, "a pointer is 8-byte aligned");
        assert!(off.task_mm > 0 && off.task_mm < 16384, "{off:?}");
        assert_eq!(
            off.mm_start_stack % 8,
            0,
            "an unsigned long is 8-byte aligned"
        );
        assert!(off.mm_start_stack > 0, "{off:?}");
        assert_eq!(
            off.mm_arg_start % 8,
            0,
            "an unsigned long is 8-byte aligned"
        );
        assert_eq!(off.mm_arg_end, off.mm_arg_start + 8, "{off:?}");
        assert!(off.task_tgid > 0 && off.task_tgid < 16384, "{off:?}");
    }

    #[test]
    fn a_missing_member_is_named() {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            eprintln!("skipped: {VMLINUX_BTF} is absent on this kernel");
            return;
        }
        let btf = Btf::from_file(path).unwrap();
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

    #[test]
    fn no_btf_file_is_reported_as_unavailable() {
        let e = KernelOffsets::from_btf_file(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(e.is_unavailable(), "{e}");
    }
}

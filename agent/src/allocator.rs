//! The process's allocator, chosen once per process from its command line.
//!
//! The agent (and every other command) allocates with glibc malloc, which
//! [`crate::agent::malloc`] tunes for a low, flat RSS. A batch command (the replay) builds
//! and frees millions of small objects and then exits: there, how fast it allocates is what
//! counts, and it allocates with mimalloc. On the 10,000-pod trace of benchmark 5, glibc's
//! malloc and free were about a sixth of the whole process's instructions.
//!
//! The choice is made on the first allocation, before `main`, from `/proc/self/cmdline`, and
//! never changes: every block is freed by the allocator that gave it. Memory that C code
//! allocates with `malloc` itself stays glibc's either way.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU8, Ordering};

use libmimalloc_sys as mi;

/// The subcommands whose process allocates with mimalloc.
pub const BATCH_COMMANDS: &[&str] = &["replay"];

const UNDECIDED: u8 = 0;
const SYSTEM: u8 = 1;
const MIMALLOC: u8 = 2;

static CHOSEN: AtomicU8 = AtomicU8::new(UNDECIDED);

/// The alignment mimalloc's plain `mi_malloc` gives every block of at least this size, as
/// glibc's `malloc` does: its `MI_MAX_ALIGN_SIZE` (small sizes are rounded up to two words,
/// so there is no 24-byte block). Smaller blocks are aligned to their size rounded up to a
/// word; anything stricter goes through its aligned calls.
const MI_MALLOC_ALIGN: usize = 16;

/// glibc malloc, or mimalloc for a [batch command](BATCH_COMMANDS).
pub struct PerCommand;

/// Whether a command line, as `/proc/self/cmdline` has it (each argument followed by a NUL),
/// runs a batch command. podlapse takes no option before its subcommand, so the
/// subcommand is the first argument after the program's name.
pub fn is_batch(cmdline: &[u8]) -> bool {
    let mut args = cmdline.split(|&b| b == 0);
    let _program = args.next();
    args.next()
        .is_some_and(|sub| BATCH_COMMANDS.iter().any(|c| c.as_bytes() == sub))
}

/// Reads the process's command line without allocating. A line longer than the buffer
/// (a program path of over 4 KiB) is cut, and then reads as no batch command.
fn own_command_is_batch() -> bool {
    let mut buf = [0u8; 4352];
    // SAFETY: a NUL-terminated path; the descriptor is closed below, and `read` writes only
    // within `buf` from `filled` on.
    unsafe {
        let fd = libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let mut filled = 0;
        while filled < buf.len() {
            let n = libc::read(fd, buf[filled..].as_mut_ptr().cast(), buf.len() - filled);
            if n <= 0 {
                break;
            }
            filled += n as usize;
        }
        libc::close(fd);
        is_batch(&buf[..filled])
    }
}

#[cold]
#[inline(never)]
fn decide() -> bool {
    // Threads that race here read the same command line and store the same choice.
    let batch = own_command_is_batch();
    CHOSEN.store(if batch { MIMALLOC } else { SYSTEM }, Ordering::Relaxed);
    batch
}

/// Whether this process allocates with mimalloc: one load on every call but the first.
#[inline(always)]
fn mimalloc() -> bool {
    match CHOSEN.load(Ordering::Relaxed) {
        MIMALLOC => true,
        SYSTEM => false,
        _ => decide(),
    }
}

/// Whether plain `mi_malloc` gives a block of `size` bytes the alignment `align`.
#[inline(always)]
fn plain(align: usize, size: usize) -> bool {
    align <= MI_MALLOC_ALIGN && align <= size
}

/// mimalloc, through its plain calls where they give the alignment asked for.
struct Mi;

// SAFETY: `mi_malloc` and `mi_realloc` give the alignments [`plain`] lets through; stricter
// ones take mimalloc's aligned calls; `mi_free` frees either kind.
unsafe impl GlobalAlloc for Mi {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: a non-zero size (the caller's contract) and a power-of-two alignment.
        unsafe {
            if plain(align, size) {
                mi::mi_malloc(size).cast()
            } else {
                mi::mi_malloc_aligned(size, align).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: as in `alloc`.
        unsafe {
            if plain(align, size) {
                mi::mi_zalloc(size).cast()
            } else {
                mi::mi_zalloc_aligned(size, align).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        // SAFETY: `ptr` came from this allocator with `layout`; a non-zero new size.
        unsafe {
            if plain(align, new_size) {
                mi::mi_realloc(ptr.cast(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast(), new_size, align).cast()
            }
        }
    }
}

// SAFETY: every call goes to one allocator, the same for the life of the process (see
// `decide`), so each block is resized and freed by the allocator that gave it; both meet
// `GlobalAlloc`'s contract themselves.
unsafe impl GlobalAlloc for PerCommand {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if mimalloc() {
                Mi.alloc(layout)
            } else {
                System.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            if mimalloc() {
                Mi.alloc_zeroed(layout)
            } else {
                System.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on, to the allocator that gave `ptr`.
        unsafe {
            if mimalloc() {
                Mi.dealloc(ptr, layout)
            } else {
                System.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on, to the allocator that gave `ptr`.
        unsafe {
            if mimalloc() {
                Mi.realloc(ptr, layout, new_size)
            } else {
                System.realloc(ptr, layout, new_size)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_batch_subcommand_allocates_with_mimalloc() {
        assert!(is_batch(b"podlapse\0replay\0trace.jsonl\0-o\0json\0"));
        assert!(is_batch(b"/usr/local/bin/podlapse\0replay\0"));
        for line in [
            &b"podlapse\0run\0--manifests\0/etc/podlapse\0"[..],
            b"podlapse\0observe\0",
            b"podlapse\0report\0replay\0",
            b"podlapse\0replays\0",
            b"podlapse\0",
            b"replay\0",
            b"",
        ] {
            assert!(!is_batch(line), "{}", String::from_utf8_lossy(line));
        }
    }

    /// Every size and alignment a program asks for comes back aligned, zeroed when asked,
    /// and keeps its bytes through growing and shrinking, on the plain calls and the
    /// aligned ones alike.
    #[test]
    fn mimalloc_blocks_have_the_alignment_asked_for_and_keep_their_bytes() {
        let aligns = [1, 2, 4, 8, 16, 32, 64, 128, 4096];
        let sizes = [
            1, 3, 7, 8, 12, 16, 24, 40, 48, 100, 1000, 5000, 70_000, 300_000,
        ];
        for align in aligns {
            for size in sizes {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; each block is used within its size and freed once,
                // by the allocator that gave it, with its current layout.
                unsafe {
                    let z = Mi.alloc_zeroed(layout);
                    assert!(
                        !z.is_null() && (z as usize).is_multiple_of(align),
                        "{size}/{align}"
                    );
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    Mi.dealloc(z, layout);
                    // Blocks live side by side, so a size class whose blocks step past an
                    // alignment shows it.
                    let live: Vec<*mut u8> = (0..6).map(|_| Mi.alloc(layout)).collect();
                    for &b in &live {
                        assert!(
                            !b.is_null() && (b as usize).is_multiple_of(align),
                            "{size}/{align}"
                        );
                    }
                    for b in live {
                        Mi.dealloc(b, layout);
                    }
                    for new_size in [size * 3, size.div_ceil(2)] {
                        let p = Mi.alloc(layout);
                        assert!(
                            !p.is_null() && (p as usize).is_multiple_of(align),
                            "{size}/{align}"
                        );
                        for i in 0..size {
                            *p.add(i) = i as u8;
                        }
                        let q = Mi.realloc(p, layout, new_size);
                        let at = format!("{size}->{new_size}/{align}");
                        assert!(!q.is_null() && (q as usize).is_multiple_of(align), "{at}");
                        for i in 0..size.min(new_size) {
                            assert_eq!(*q.add(i), i as u8, "{at} byte {i}");
                        }
                        Mi.dealloc(q, Layout::from_size_align(new_size, align).unwrap());
                    }
                }
            }
        }
    }

    /// A batch command is a real subcommand, and one that gives up glibc's tuning for a
    /// low RSS: a renamed command cannot silently lose its allocator, and the agent never
    /// gains one that was not measured for its memory.
    #[test]
    fn batch_commands_are_subcommands_that_do_not_keep_memory_low() {
        use clap::{CommandFactory, Parser};
        let cli = crate::cli::Cli::command();
        for name in BATCH_COMMANDS {
            assert!(
                cli.find_subcommand(name).is_some(),
                "{name} is not a subcommand"
            );
            let parsed = crate::cli::Cli::try_parse_from(["podlapse", name, "t.jsonl"])
                .unwrap_or_else(|e| panic!("podlapse {name} t.jsonl: {e}"));
            assert!(!parsed.keeps_memory_low() && !parsed.is_long_running());
        }
        let run = crate::cli::Cli::try_parse_from(["podlapse", "run", "--manifests", "d"])
            .expect("podlapse run parses");
        assert!(run.keeps_memory_low() && !is_batch(b"podlapse\0run\0"));
    }
}

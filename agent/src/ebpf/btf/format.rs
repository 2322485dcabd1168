//! A reader of the BTF format (`Documentation/bpf/btf.rst`), reading just what the
//! offsets need: struct and union members, their names, types and bit offsets, through
//! typedefs and qualifiers.
//!
//! It reads the format as kernels up to 7.x write it: the header's own length decides
//! where the sections start (7.1 added `layout_off`/`layout_len`, a 32-byte header); a
//! type's kind has 7 bits and its vlen 24 (widened from 5 and 16 in 7.x, the bits unused
//! before); and a kind this reader does not know is skipped by the size the layout
//! section gives it, when the file has one.
//!
//! The file's bytes are kept as they are and indexed by one `u32` per type (where its
//! record starts), so the kernel's ~6 MB of BTF costs about 6.5 MB while it is read
//! and nothing after; no type is decoded until asked for.

use thiserror::Error;

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
/// The header with the layout section's offset and length (kernel 7.1 on).
const LAYOUT_HEADER_LEN: usize = 32;
/// The size of `struct btf_layout`: info_sz (u8), elem_sz (u8), flags (u16).
const LAYOUT_LEN: usize = 4;
/// The size of `struct btf_type`: name_off, info, size/type.
const TYPE_LEN: usize = 12;

/// What is wrong with a BTF blob, with the byte offset or type ID where it shows.
#[derive(Debug, Error)]
pub enum BtfFormatError {
    #[error("reading it: {0}")]
    Io(#[source] std::io::Error),
    #[error("not BTF: the file is {len} bytes, shorter than BTF's 24-byte header")]
    TooShort { len: usize },
    #[error("not BTF: magic {found:#06x} where 0xeb9f belongs")]
    BadMagic { found: u16 },
    #[error("BTF version {0} (this reader knows version 1)")]
    Version(u8),
    #[error(
        "the BTF header says its {section} section is at {start}..{end}, past the end of the {len}-byte file"
    )]
    SectionOutOfFile {
        section: &'static str,
        start: usize,
        end: usize,
        len: usize,
    },
    #[error(
        "BTF type {id} at byte {at}: kind {kind} is not a BTF kind this reader knows, and the file has no layout section that sizes it"
    )]
    UnknownKind { id: u32, at: usize, kind: u32 },
    #[error("BTF type {id} at byte {at} runs past the end of the type section")]
    TypeTruncated { id: u32, at: usize },
    #[error("BTF refers to type {id}, but the file has types 1 to {count}")]
    NoSuchType { id: u32, count: usize },
    #[error("BTF names a string at {offset}, past the {len}-byte string section")]
    NoSuchString { offset: u32, len: usize },
}

/// The kinds this reader tells apart; the rest only need skipping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Struct,
    Union,
    /// typedef, volatile, const, restrict, type tag: stand for the type they name.
    Alias,
    Other,
}

/// One member of a struct or union.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub name_off: u32,
    pub type_id: u32,
    /// From the start of the enclosing struct or union.
    pub bit_offset: u32,
}

/// A parsed BTF blob: the bytes and where each type's record starts.
pub struct Btf {
    data: Vec<u8>,
    big_endian: bool,
    /// `types[id - 1]` is the byte offset of type `id`'s record in `data`.
    types: Vec<u32>,
    strings: std::ops::Range<usize>,
    /// The layout section (empty when the file has none): a `struct btf_layout` per kind.
    layout: std::ops::Range<usize>,
}

/// A type's kind: 7 bits of its info word.
fn kind_of(info: u32) -> u32 {
    (info >> 24) & 0x7f
}

/// A type's vlen (members, entries, parameters): the low 24 bits of its info word.
fn vlen_of(info: u32) -> usize {
    (info & 0xff_ffff) as usize
}

impl Btf {
    pub fn parse(data: Vec<u8>) -> Result<Btf, BtfFormatError> {
        if data.len() < HEADER_LEN {
            return Err(BtfFormatError::TooShort { len: data.len() });
        }
        let big_endian = match u16::from_le_bytes([data[0], data[1]]) {
            MAGIC => false,
            m if m.swap_bytes() == MAGIC => true,
            found => return Err(BtfFormatError::BadMagic { found }),
        };
        if data[2] != 1 {
            return Err(BtfFormatError::Version(data[2]));
        }
        let mut btf = Btf {
            data,
            big_endian,
            types: Vec::new(),
            strings: 0..0,
            layout: 0..0,
        };
        let hdr_len = btf.u32_at(4) as usize;
        let section = |name, off: u32, len: u32| {
            let start = hdr_len.saturating_add(off as usize);
            let end = start.saturating_add(len as usize);
            if hdr_len < HEADER_LEN || end > btf.data.len() {
                return Err(BtfFormatError::SectionOutOfFile {
                    section: name,
                    start,
                    end,
                    len: btf.data.len(),
                });
            }
            Ok(start..end)
        };
        let types = section("type", btf.u32_at(8), btf.u32_at(12))?;
        let strings = section("string", btf.u32_at(16), btf.u32_at(20))?;
        if hdr_len >= LAYOUT_HEADER_LEN && btf.data.len() >= LAYOUT_HEADER_LEN {
            btf.layout = section("layout", btf.u32_at(24), btf.u32_at(28))?;
        }
        btf.strings = strings;
        btf.types = btf.index(types)?;
        Ok(btf)
    }

    /// Walks the type section once, noting where each record starts.
    fn index(&self, section: std::ops::Range<usize>) -> Result<Vec<u32>, BtfFormatError> {
        let mut starts = Vec::with_capacity(section.len() / 32);
        let mut at = section.start;
        while at < section.end {
            let id = starts.len() as u32 + 1;
            if at + TYPE_LEN > section.end {
                return Err(BtfFormatError::TypeTruncated { id, at });
            }
            let info = self.u32_at(at + 4);
            let vlen = vlen_of(info);
            let kind = kind_of(info);
            let extra = match kind {
                // ptr, fwd, typedef, volatile, const, restrict, func, float, type tag
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                // int, var, decl tag: one u32
                1 | 14 | 17 => 4,
                // array: type, index type, count
                3 => 12,
                // struct, union, datasec, enum64: 12 bytes an entry
                4 | 5 | 15 | 19 => 12 * vlen,
                // enum, func proto: 8 bytes an entry
                6 | 13 => 8 * vlen,
                kind => match self.layout_of(kind) {
                    Some((info_sz, elem_sz)) => info_sz + elem_sz * vlen,
                    None => return Err(BtfFormatError::UnknownKind { id, at, kind }),
                },
            };
            let next = at + TYPE_LEN + extra;
            if next > section.end {
                return Err(BtfFormatError::TypeTruncated { id, at });
            }
            starts.push(at as u32);
            at = next;
        }
        Ok(starts)
    }

    /// What the layout section says a record of `kind` carries after its `btf_type`:
    /// (bytes once, bytes per vlen entry).
    fn layout_of(&self, kind: u32) -> Option<(usize, usize)> {
        let at = self.layout.start + kind as usize * LAYOUT_LEN;
        (at + LAYOUT_LEN <= self.layout.end)
            .then(|| (usize::from(self.data[at]), usize::from(self.data[at + 1])))
    }

    fn u32_at(&self, at: usize) -> u32 {
        let b = [
            self.data[at],
            self.data[at + 1],
            self.data[at + 2],
            self.data[at + 3],
        ];
        if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }

    fn record(&self, id: u32) -> Result<usize, BtfFormatError> {
        id.checked_sub(1)
            .and_then(|i| self.types.get(i as usize))
            .map(|&at| at as usize)
            .ok_or(BtfFormatError::NoSuchType {
                id,
                count: self.types.len(),
            })
    }

    pub fn kind(&self, id: u32) -> Result<Kind, BtfFormatError> {
        let at = self.record(id)?;
        Ok(match kind_of(self.u32_at(at + 4)) {
            4 => Kind::Struct,
            5 => Kind::Union,
            8 | 9 | 10 | 11 | 18 => Kind::Alias,
            _ => Kind::Other,
        })
    }

    /// The type an alias (typedef, qualifier, type tag) stands for.
    pub fn aliased(&self, id: u32) -> Result<u32, BtfFormatError> {
        let at = self.record(id)?;
        Ok(self.u32_at(at + 8))
    }

    /// The name of type `id` ("" when anonymous).
    pub fn type_name(&self, id: u32) -> Result<&str, BtfFormatError> {
        let at = self.record(id)?;
        self.string(self.u32_at(at))
    }

    /// The string at `offset` in the string section.
    pub fn string(&self, offset: u32) -> Result<&str, BtfFormatError> {
        let strings = &self.data[self.strings.clone()];
        let rest = strings
            .get(offset as usize..)
            .ok_or(BtfFormatError::NoSuchString {
                offset,
                len: strings.len(),
            })?;
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        // Kernel BTF names are C identifiers; anything else reads as no name.
        Ok(std::str::from_utf8(&rest[..end]).unwrap_or_default())
    }

    /// The members of struct or union `id`, in order (empty for other kinds).
    pub fn members(&self, id: u32) -> Result<Vec<Member>, BtfFormatError> {
        let at = self.record(id)?;
        let info = self.u32_at(at + 4);
        if !matches!(kind_of(info), 4 | 5) {
            return Ok(Vec::new());
        }
        // With kind_flag set, a member's offset holds the bitfield size in its top
        // byte and the bit offset below it.
        let bitfields = info >> 31 == 1;
        Ok((0..vlen_of(info))
            .map(|i| {
                let m = at + TYPE_LEN + 12 * i;
                let offset = self.u32_at(m + 8);
                Member {
                    name_off: self.u32_at(m),
                    type_id: self.u32_at(m + 4),
                    bit_offset: if bitfields {
                        offset & 0xff_ffff
                    } else {
                        offset
                    },
                }
            })
            .collect())
    }

    /// The ID of the first struct named `name`, if any.
    pub fn struct_named(&self, name: &str) -> Result<Option<u32>, BtfFormatError> {
        for id in 1..=self.types.len() as u32 {
            if self.kind(id)? == Kind::Struct && self.type_name(id)? == name {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_blob::Blob;
    use super::*;

    fn sample() -> Blob {
        let mut b = Blob::new();
        let int = b.int("int");
        b.enumeration("e");
        b.composite("pair", false, false, &[("a", int, 0), ("b", int, 32)]);
        b
    }

    #[test]
    fn members_names_and_kinds_read_back_in_both_byte_orders() {
        for big_endian in [false, true] {
            let btf = Btf::parse(sample().bytes(big_endian)).unwrap();
            assert_eq!(btf.struct_named("pair").unwrap(), Some(3));
            assert_eq!(btf.type_name(1).unwrap(), "int");
            assert_eq!(btf.kind(2).unwrap(), Kind::Other);
            let m = btf.members(3).unwrap();
            let names: Vec<&str> = m.iter().map(|m| btf.string(m.name_off).unwrap()).collect();
            assert_eq!(names, ["a", "b"]);
            assert_eq!((m[1].type_id, m[1].bit_offset), (1, 32));
        }
    }

    #[test]
    fn a_bitfield_members_offset_leaves_out_its_size() {
        let mut b = Blob::new();
        let int = b.int("int");
        b.composite("flags", false, true, &[("x", int, 0), ("y", int, 3)]);
        let btf = Btf::parse(b.bytes(false)).unwrap();
        assert_eq!(btf.members(2).unwrap()[1].bit_offset, 3);
    }

    #[test]
    fn broken_blobs_say_what_is_wrong_and_where() {
        let good = sample().bytes(false);
        let err = |data: Vec<u8>| Btf::parse(data).err().expect("an error").to_string();
        assert!(err(good[..10].to_vec()).contains("10 bytes"));
        let mut magic = good.clone();
        magic[0] = 0;
        assert!(err(magic).contains("magic 0xeb00"), "{}", err(good.clone()));
        let mut version = good.clone();
        version[2] = 7;
        assert!(err(version).contains("version 7"));
        // The string section said to be longer than the file.
        let mut long = good.clone();
        long[20..24].copy_from_slice(&1000u32.to_le_bytes());
        assert!(err(long).contains("string section"));
        // A kind no BTF has, at type 2, and no layout section to size it.
        let mut b = Blob::new();
        b.int("int");
        b.raw(31);
        let e = err(b.bytes(false));
        assert!(
            e.contains("type 2") && e.contains("kind 31") && e.contains("no layout section"),
            "{e}"
        );
        // A struct that says it has members the section does not hold.
        let mut cut = good.clone();
        let type_len = u32::from_le_bytes(good[12..16].try_into().unwrap()) - 4;
        cut[12..16].copy_from_slice(&type_len.to_le_bytes());
        let e = err(cut);
        assert!(e.contains("type 3") && e.contains("past the end"), "{e}");
    }

    /// Kernel 7.1's header (32 bytes, with the layout section's offset and length), a
    /// kind past the five bits older kernels used, which only the layout section sizes,
    /// and a struct with more members than 16 bits of vlen hold.
    #[test]
    fn the_7x_header_its_layout_section_and_wider_kinds_and_vlens_read() {
        for big_endian in [false, true] {
            let mut b = Blob::new();
            let int = b.int("int");
            // Kind 40 with 3 entries of 8 bytes after 4 bytes of its own.
            b.unknown(40, 3, 4, 8);
            let many: Vec<(String, u32, u32)> = (0..70_000u32)
                .map(|i| (format!("m{i}"), int, 32 * i))
                .collect();
            let many: Vec<(&str, u32, u32)> =
                many.iter().map(|(n, t, o)| (n.as_str(), *t, *o)).collect();
            b.composite("wide", false, false, &many);
            b.composite("pair", false, false, &[("a", int, 0), ("b", int, 32)]);
            let mut layout = vec![(0u8, 0u8); 41];
            layout[40] = (4, 8);
            let btf = Btf::parse(b.bytes_with_layout(big_endian, &layout)).unwrap();
            assert_eq!(btf.struct_named("pair").unwrap(), Some(4));
            assert_eq!(btf.kind(2).unwrap(), Kind::Other);
            let wide = btf.members(3).unwrap();
            assert_eq!(wide.len(), 70_000);
            assert_eq!(btf.string(wide[69_999].name_off).unwrap(), "m69999");
            // The same blob without a layout section cannot be read past kind 40.
            let e = Btf::parse(b.bytes(big_endian)).err().unwrap().to_string();
            assert!(e.contains("type 2") && e.contains("kind 40"), "{e}");
        }
    }

    #[test]
    fn a_layout_section_past_the_end_of_the_file_is_named() {
        let mut b = Blob::new();
        b.int("int");
        let mut data = b.bytes_with_layout(false, &[(0, 0); 20]);
        data[28..32].copy_from_slice(&10_000u32.to_le_bytes());
        let e = Btf::parse(data).err().unwrap().to_string();
        assert!(e.contains("layout section"), "{e}");
    }

    #[test]
    fn a_reference_to_a_type_or_string_that_is_not_there_is_an_error() {
        let btf = Btf::parse(sample().bytes(false)).unwrap();
        assert!(matches!(
            btf.kind(0),
            Err(BtfFormatError::NoSuchType { id: 0, .. })
        ));
        assert!(matches!(
            btf.kind(4),
            Err(BtfFormatError::NoSuchType { id: 4, count: 3 })
        ));
        assert!(matches!(
            btf.string(10_000),
            Err(BtfFormatError::NoSuchString { .. })
        ));
    }
}

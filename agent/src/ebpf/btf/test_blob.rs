//! Builds small BTF blobs for the reader's tests, in either byte order.

/// A BTF blob under construction: types are numbered from 1 in the order added.
#[derive(Default)]
pub struct Blob {
    types: Vec<u32>,
    strings: Vec<u8>,
    count: u32,
}

impl Blob {
    pub fn new() -> Blob {
        Blob {
            strings: vec![0],
            ..Blob::default()
        }
    }

    fn name(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        off
    }

    fn head(
        &mut self,
        name: &str,
        kind: u32,
        vlen: u32,
        kind_flag: bool,
        size_or_type: u32,
    ) -> u32 {
        let name = self.name(name);
        self.types.extend([
            name,
            (u32::from(kind_flag) << 31) | (kind << 24) | vlen,
            size_or_type,
        ]);
        self.count += 1;
        self.count
    }

    /// A 4-byte int.
    pub fn int(&mut self, name: &str) -> u32 {
        let id = self.head(name, 1, 0, false, 4);
        self.types.push(32);
        id
    }

    pub fn typedef(&mut self, name: &str, to: u32) -> u32 {
        self.head(name, 8, 0, false, to)
    }

    pub fn konst(&mut self, to: u32) -> u32 {
        self.head("", 10, 0, false, to)
    }

    pub fn ptr(&mut self, to: u32) -> u32 {
        self.head("", 2, 0, false, to)
    }

    /// A struct (or with `union`, a union) of `(name, type, bit offset)` members; with
    /// `bitfields`, offsets carry a bitfield size of 3 in their top byte.
    pub fn composite(
        &mut self,
        name: &str,
        union: bool,
        bitfields: bool,
        members: &[(&str, u32, u32)],
    ) -> u32 {
        let kind = if union { 5 } else { 4 };
        let id = self.head(name, kind, members.len() as u32, bitfields, 64);
        for &(m, ty, bits) in members {
            let n = self.name(m);
            let off = if bitfields { (3 << 24) | bits } else { bits };
            self.types.extend([n, ty, off]);
        }
        id
    }

    /// An enum of two values: one more kind to skip over.
    pub fn enumeration(&mut self, name: &str) -> u32 {
        let id = self.head(name, 6, 2, false, 4);
        let (a, b) = (self.name("A"), self.name("B"));
        self.types.extend([a, 0, b, 1]);
        id
    }

    /// A record of a kind this reader does not know: `info_sz` bytes after its
    /// `btf_type`, then `vlen` entries of `elem_sz` bytes (all zero).
    pub fn unknown(&mut self, kind: u32, vlen: u32, info_sz: usize, elem_sz: usize) -> u32 {
        let id = self.head("", kind, vlen, false, 0);
        let words = (info_sz + elem_sz * vlen as usize) / 4;
        self.types.extend(std::iter::repeat_n(0, words));
        id
    }

    /// An uninterpreted raw record: `kind` with no trailing data.
    pub fn raw(&mut self, kind: u32) -> u32 {
        self.head("", kind, 0, false, 0)
    }

    /// The blob as kernel 7.1 on writes it: a 32-byte header, and after the strings a
    /// layout section of `(info_sz, elem_sz)` per kind, from kind 0.
    pub fn bytes_with_layout(&self, big_endian: bool, layout: &[(u8, u8)]) -> Vec<u8> {
        let classic = self.bytes(big_endian);
        let word = |v: u32| {
            if big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let body = &classic[24..];
        let mut out = classic[..4].to_vec();
        out.extend(word(32));
        out.extend(&classic[8..24]);
        out.extend(word(body.len() as u32));
        out.extend(word(layout.len() as u32 * 4));
        out.extend(body);
        for &(info_sz, elem_sz) in layout {
            out.extend([info_sz, elem_sz, 0, 0]);
        }
        out
    }

    pub fn bytes(&self, big_endian: bool) -> Vec<u8> {
        let word = |v: u32| {
            if big_endian {
                v.to_be_bytes()
            } else {
                v.to_le_bytes()
            }
        };
        let type_len = self.types.len() as u32 * 4;
        let mut out = Vec::new();
        let magic: u16 = 0xeb9f;
        out.extend(if big_endian {
            magic.to_be_bytes()
        } else {
            magic.to_le_bytes()
        });
        out.extend([1, 0]);
        for v in [24, 0, type_len, type_len, self.strings.len() as u32] {
            out.extend(word(v));
        }
        for &v in &self.types {
            out.extend(word(v));
        }
        out.extend(&self.strings);
        out
    }
}

//! Byte mutations of real inputs: bits flipped, bytes and words
//! overwritten, ranges inserted, removed, copied or cut, mostly in the
//! interesting ranges (ELF headers, symbol tables, notes, DWARF).
use std::{fmt::Debug, ops::Range};

use proptest::{collection::vec, prelude::*};

/// Where a mutation applies: anywhere in the input, or in one of its
/// interesting ranges (ELF headers, symbol tables, notes, DWARF).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spot {
    hot: bool,
    at: u64,
}

#[derive(Clone, Debug)]
pub(crate) enum Mutation {
    Flip {
        at: Spot,
        bit: u8,
    },
    Byte {
        at: Spot,
        value: u8,
    },
    /// A little-endian word of `width` bytes: a boundary value, usually.
    Word {
        at: Spot,
        value: u64,
        width: u8,
    },
    Insert {
        at: Spot,
        bytes: Vec<u8>,
    },
    Remove {
        at: Spot,
        len: u16,
    },
    Truncate {
        at: Spot,
    },
    /// Copies `len` bytes from one place over another.
    Copy {
        from: Spot,
        to: Spot,
        len: u16,
    },
}

pub(crate) fn place(spot: Spot, len: usize, hot: &[Range<usize>]) -> usize {
    if len == 0 {
        return 0;
    }
    if spot.hot && !hot.is_empty() {
        let range = &hot[(spot.at % hot.len() as u64) as usize];
        let within = (spot.at / hot.len() as u64) % range.len().max(1) as u64;
        return (range.start + within as usize).min(len - 1);
    }
    (spot.at % len as u64) as usize
}

pub(crate) fn mutate(bytes: &mut Vec<u8>, mutations: &[Mutation], hot: &[Range<usize>]) {
    for mutation in mutations {
        let len = bytes.len();
        match mutation {
            Mutation::Flip { at, bit } => {
                if len > 0 {
                    bytes[place(*at, len, hot)] ^= 1 << (bit % 8);
                }
            }
            Mutation::Byte { at, value } => {
                if len > 0 {
                    bytes[place(*at, len, hot)] = *value;
                }
            }
            Mutation::Word { at, value, width } => {
                let start = place(*at, len, hot);
                for (i, byte) in value.to_le_bytes().iter().take(*width as usize).enumerate() {
                    if let Some(slot) = bytes.get_mut(start + i) {
                        *slot = *byte;
                    }
                }
            }
            Mutation::Insert { at, bytes: new } => {
                let start = place(*at, len, hot);
                bytes.splice(start..start, new.iter().copied());
            }
            Mutation::Remove { at, len: count } => {
                let start = place(*at, len, hot);
                let end = (start + *count as usize).min(len);
                bytes.drain(start..end);
            }
            Mutation::Truncate { at } => bytes.truncate(place(*at, len, hot)),
            Mutation::Copy {
                from,
                to,
                len: count,
            } => {
                let (from, to) = (place(*from, len, hot), place(*to, len, hot));
                let count = (*count as usize).min(len - from.max(to));
                bytes.copy_within(from..from + count, to);
            }
        }
    }
}

pub(crate) fn spot() -> impl Strategy<Value = Spot> {
    (any::<bool>(), any::<u64>()).prop_map(|(hot, at)| Spot { hot, at })
}

/// Values that sit on boundaries: sizes, counts, offsets and flags.
pub(crate) fn boundary() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(0x7f),
        Just(0x80),
        Just(0xff),
        Just(0x100),
        Just(0xfff),
        Just(0x1000),
        Just(0x7fff),
        Just(0xffff),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        Just(0xffff_fffe),
        Just(0xffff_ffff),
        Just(i64::MAX as u64),
        Just(i64::MIN as u64),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        0u64..0x10000,
        any::<u64>(),
    ]
}

pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (spot(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        3 => (spot(), any::<u8>()).prop_map(|(at, value)| Mutation::Byte { at, value }),
        4 => (spot(), boundary(), prop_oneof![Just(1u8), Just(2), Just(4), Just(8)])
            .prop_map(|(at, value, width)| Mutation::Word { at, value, width }),
        1 => (spot(), vec(any::<u8>(), 1..32))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (spot(), 1u16..512).prop_map(|(at, len)| Mutation::Remove { at, len }),
        1 => spot().prop_map(|at| Mutation::Truncate { at }),
        1 => (spot(), spot(), 1u16..128).prop_map(|(from, to, len)| Mutation::Copy { from, to, len }),
    ]
}

/// A real input, and where in it mutations are most likely to matter.
pub(crate) struct Seed {
    pub(crate) name: String,
    pub(crate) bytes: Vec<u8>,
    pub(crate) hot: Vec<Range<usize>>,
}

/// One fuzzed input: a seed mutated, or bytes out of nothing (behind an
/// ELF header's magic, for the ELF readers, half of the time).
#[derive(Clone, Debug)]
pub(crate) enum Input {
    Mutated {
        seed: usize,
        mutations: Vec<Mutation>,
    },
    Random {
        magic: bool,
        bytes: Vec<u8>,
    },
}

impl Input {
    pub(crate) fn bytes(&self, seeds: &[Seed]) -> Vec<u8> {
        match self {
            Input::Mutated { seed, mutations } => {
                let seed = &seeds[*seed];
                let mut bytes = seed.bytes.clone();
                mutate(&mut bytes, mutations, &seed.hot);
                bytes
            }
            Input::Random { magic, bytes } => {
                let mut out = Vec::new();
                if *magic {
                    // 64-bit, little-endian, current version, System V.
                    out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
                }
                out.extend_from_slice(bytes);
                out
            }
        }
    }
}

pub(crate) fn input(seeds: usize) -> impl Strategy<Value = Input> {
    prop_oneof![
        12 => (0..seeds, vec(mutation(), 1..6))
            .prop_map(|(seed, mutations)| Input::Mutated { seed, mutations }),
        1 => (any::<bool>(), vec(any::<u8>(), 0..1024))
            .prop_map(|(magic, bytes)| Input::Random { magic, bytes }),
    ]
}

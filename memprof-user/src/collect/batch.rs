//! Whole BPF maps read a few thousand entries a call
//! (`BPF_MAP_LOOKUP_BATCH`). aya reads a hash map two calls an entry (next
//! key, then its value): a host's hundred thousand sites took seconds to
//! read, on the thread that must answer SIGTERM within two.
use std::{
    io,
    mem::size_of,
    os::fd::{AsFd as _, AsRawFd as _},
};

use aya::{maps::MapData, Pod};

use crate::probes::bpf_call::{bpf, BatchAttr};

/// `BPF_MAP_LOOKUP_BATCH` (uapi `enum bpf_cmd`).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries asked for per call; more when one bucket holds more.
const CHUNK: usize = 4096;
const MAX_CHUNK: usize = 1 << 20;

/// Calls `each` with every entry of a hash map whose values are `V`,
/// in the kernel's order. Entries added or deleted meanwhile may be
/// missed, as in any read of a live map.
pub fn for_each<K: Pod, V: Pod>(map: &MapData, mut each: impl FnMut(K, V)) -> io::Result<()> {
    read(map, size_of::<K>(), size_of::<V>(), |key, value| {
        each(read_at(key, 0), read_at(value, 0))
    })
}

/// As [`for_each`] for a per-CPU map: the values of each of `cpus` CPUs.
pub fn for_each_per_cpu<K: Pod, V: Pod>(
    map: &MapData,
    cpus: usize,
    mut each: impl FnMut(K, &[V]),
) -> io::Result<()> {
    // The kernel copies each CPU's value 8-byte aligned.
    let stride = size_of::<V>().next_multiple_of(8);
    let mut per_cpu = Vec::with_capacity(cpus);
    read(map, size_of::<K>(), stride * cpus, |key, values| {
        per_cpu.clear();
        per_cpu.extend((0..cpus).map(|cpu| read_at::<V>(values, cpu * stride)));
        each(read_at(key, 0), &per_cpu)
    })
}

/// The batch calls: `each` gets every entry's key and value bytes.
fn read(
    map: &MapData,
    key_len: usize,
    value_len: usize,
    mut each: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    let mut chunk = CHUNK;
    let mut keys: Vec<u8> = vec![0; chunk * key_len];
    let mut values: Vec<u8> = vec![0; chunk * value_len];
    // Where the kernel left off between calls (a bucket index for hash
    // maps; room for a key, as libbpf gives).
    let mut token_in = vec![0u8; key_len.max(8)];
    let mut token_out = vec![0u8; key_len.max(8)];
    let mut started = false;
    loop {
        let mut attr = BatchAttr {
            in_batch: if started { token_in.as_ptr() as u64 } else { 0 },
            out_batch: token_out.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        let done = match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
            Ok(_) => false,
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => true,
            // One bucket holds more entries than were asked for.
            Err(err) if err.raw_os_error() == Some(libc::ENOSPC) && chunk < MAX_CHUNK => {
                chunk *= 4;
                keys.resize(chunk * key_len, 0);
                values.resize(chunk * value_len, 0);
                continue;
            }
            Err(err) => return Err(err),
        };
        for index in 0..(attr.count as usize).min(chunk) {
            each(
                &keys[index * key_len..(index + 1) * key_len],
                &values[index * value_len..(index + 1) * value_len],
            );
        }
        if done {
            return Ok(());
        }
        std::mem::swap(&mut token_in, &mut token_out);
        started = true;
    }
}

/// The `T` at byte `at` of `bytes`.
fn read_at<T: Pod>(bytes: &[u8], at: usize) -> T {
    assert!(at + size_of::<T>() <= bytes.len());
    // SAFETY: in bounds (checked); any bits are a valid T (Pod).
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().add(at).cast::<T>()) }
}

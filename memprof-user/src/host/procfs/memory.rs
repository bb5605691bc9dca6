//! Reading a process's memory through `/proc/PID/mem`: what its runtime
//! keeps there (Python's code objects). A read never stops the process;
//! one that fails (an address not mapped, the process gone) is an error.
use std::{fs::File, io, os::unix::fs::FileExt};

/// One process's memory, open for reading.
pub struct ProcessMemory {
    file: File,
}

impl ProcessMemory {
    pub fn open(pid: u32) -> io::Result<ProcessMemory> {
        Ok(ProcessMemory {
            file: File::open(format!("/proc/{pid}/mem"))?,
        })
    }

    /// Fills `buf` from `address` on.
    pub fn read(&self, address: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, address)
    }

    pub fn u64_at(&self, address: u64) -> io::Result<u64> {
        let mut word = [0; 8];
        self.read(address, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    pub fn i32_at(&self, address: u64) -> io::Result<i32> {
        let mut word = [0; 4];
        self.read(address, &mut word)?;
        Ok(i32::from_le_bytes(word))
    }

    /// `len` bytes from `address` on.
    pub fn bytes_at(&self, address: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0; len];
        self.read(address, &mut bytes)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_memory() {
        let value: u64 = 0x1234_5678_9abc_def0;
        let memory = ProcessMemory::open(std::process::id()).unwrap();
        let address = std::ptr::addr_of!(value) as u64;
        assert_eq!(memory.u64_at(address).unwrap(), value);
        assert!(memory.u64_at(0).is_err());
    }
}

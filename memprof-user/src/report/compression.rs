//! Compressed saved reports: written compressed when the output's name
//! ends in `.gz` or `.zst`, read back by their magic bytes whatever their
//! name.
use std::{
    io::{self, Read as _},
    path::Path,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// What a file named `path` is written as.
    pub fn of_name(path: &Path) -> Compression {
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz") => Compression::Gzip,
            Some("zst") => Compression::Zstd,
            _ => Compression::None,
        }
    }

    /// What `bytes` (a file's start) were written as.
    pub fn of_bytes(bytes: &[u8]) -> Compression {
        if bytes.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if bytes.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Runs `write` with a writer that compresses into `out` as `compression`
/// says, and ends the stream.
pub fn write_compressed(
    compression: Compression,
    out: &mut dyn io::Write,
    write: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<()> {
    // The encoders take serde's many small writes in large pieces.
    fn buffered<W: io::Write>(
        encoder: W,
        write: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    ) -> io::Result<W> {
        let mut buffered = io::BufWriter::with_capacity(1 << 16, encoder);
        write(&mut buffered)?;
        buffered.into_inner().map_err(|err| err.into_error())
    }
    match compression {
        Compression::None => write(out),
        Compression::Gzip => {
            let encoder = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            buffered(encoder, write)?.finish().map(drop)
        }
        Compression::Zstd => {
            // Level 3, zstd's default.
            let encoder = zstd::stream::write::Encoder::new(out, 3)?;
            buffered(encoder, write)?.finish().map(drop)
        }
    }
}

/// `bytes` decompressed if they are compressed, else as they are. More
/// than `max_bytes` once decompressed is an error (a small file may
/// expand without bound).
pub fn decompressed(bytes: Vec<u8>, max_bytes: u64) -> io::Result<Vec<u8>> {
    let mut text = Vec::new();
    let reader: Box<dyn io::Read + '_> = match Compression::of_bytes(&bytes) {
        Compression::None => return Ok(bytes),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&bytes[..])),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(&bytes[..])?),
    };
    reader
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut text)?;
    if text.len() as u64 > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("more than {max_bytes} bytes once decompressed"),
        ));
    }
    Ok(text)
}

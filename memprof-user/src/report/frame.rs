//! One frame of a stack, and how a stack's frames are saved: whole in
//! each stack (JSON version 1), or as indices into the report's table of
//! frames, each written once (version 2, `json::tables`). serde passes no
//! context, so the table in use is the thread's while a report is
//! written ([`with_indices`]) or read ([`with_table`]).
use std::{cell::RefCell, collections::HashMap, fmt, sync::Arc};

use serde::{
    de::{self, MapAccess, SeqAccess, Visitor},
    ser::SerializeSeq as _,
    Deserialize, Deserializer, Serialize, Serializer,
};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameReport {
    /// Return address, "0x…".
    pub address: String,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub module: Option<String>,
    /// Inlined into the frame that follows it.
    pub inlined: bool,
    /// The address's offset in `module`'s file, "0x…": the same in every
    /// run (the address is not), so an unnamed frame reads
    /// `module+0xOFFSET` and can be symbolized later.
    #[serde(default)]
    pub module_offset: Option<String>,
    /// `module`'s GNU build id, hex.
    #[serde(default)]
    pub build_id: Option<String>,
}

impl FrameReport {
    /// A short name for the frame: its function, else its module, else
    /// its address.
    pub fn label(&self) -> String {
        match (&self.function, &self.module) {
            (Some(function), _) => function.clone(),
            (None, Some(module)) => format!("[{}]", module.rsplit('/').next().unwrap_or(module)),
            (None, None) => format!("[{}]", self.address),
        }
    }
}

/// Each frame written, by where it lies, with its index in the table.
pub type FrameIndices = HashMap<*const FrameReport, u32>;

thread_local! {
    static WRITING: RefCell<Option<FrameIndices>> = const { RefCell::new(None) };
    static READING: RefCell<Option<Vec<Arc<FrameReport>>>> = const { RefCell::new(None) };
}

/// Runs `write` with stacks' frames serialized as the indices `indices`
/// gives them.
pub fn with_indices<R>(indices: FrameIndices, write: impl FnOnce() -> R) -> R {
    WRITING.with(|w| *w.borrow_mut() = Some(indices));
    let written = write();
    WRITING.with(|w| *w.borrow_mut() = None);
    written
}

/// Runs `read` with frame indices read as the frames of `table`.
pub fn with_table<R>(table: Vec<Arc<FrameReport>>, read: impl FnOnce() -> R) -> R {
    READING.with(|r| *r.borrow_mut() = Some(table));
    let read = read();
    READING.with(|r| *r.borrow_mut() = None);
    read
}

/// Whether frames are written as indices now (for serde's
/// `skip_serializing_if`).
pub fn writing_indices<T>(_: &T) -> bool {
    WRITING.with(|w| w.borrow().is_some())
}

pub fn serialize<S: Serializer>(frames: &[Arc<FrameReport>], to: S) -> Result<S::Ok, S::Error> {
    WRITING.with(|w| {
        let indices = w.borrow();
        let mut seq = to.serialize_seq(Some(frames.len()))?;
        for frame in frames {
            match indices.as_ref() {
                Some(indices) => {
                    let index = indices.get(&Arc::as_ptr(frame)).ok_or_else(|| {
                        serde::ser::Error::custom("a frame missing from the frame table")
                    })?;
                    seq.serialize_element(index)?
                }
                None => seq.serialize_element(&**frame)?,
            }
        }
        seq.end()
    })
}

pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<Vec<Arc<FrameReport>>, D::Error> {
    from.deserialize_seq(FramesVisitor)
}

struct FramesVisitor;

impl<'de> Visitor<'de> for FramesVisitor {
    type Value = Vec<Arc<FrameReport>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of frames, or of indices into the frame table")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut frames = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(SavedFrame(frame)) = seq.next_element()? {
            frames.push(frame);
        }
        Ok(frames)
    }
}

/// A frame as saved: whole, or an index into the table being read.
struct SavedFrame(Arc<FrameReport>);

impl<'de> Deserialize<'de> for SavedFrame {
    fn deserialize<D: Deserializer<'de>>(from: D) -> Result<Self, D::Error> {
        from.deserialize_any(SavedFrameVisitor)
    }
}

struct SavedFrameVisitor;

impl<'de> Visitor<'de> for SavedFrameVisitor {
    type Value = SavedFrame;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a frame, or an index into the frame table")
    }

    fn visit_u64<E: de::Error>(self, index: u64) -> Result<SavedFrame, E> {
        READING.with(|r| {
            let table = r.borrow();
            let frame = table
                .as_ref()
                .and_then(|table| table.get(usize::try_from(index).ok()?))
                .ok_or_else(|| E::custom(format!("frame {index} is not in the frame table")))?;
            Ok(SavedFrame(Arc::clone(frame)))
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SavedFrame, A::Error> {
        let frame = FrameReport::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(SavedFrame(Arc::new(frame)))
    }
}

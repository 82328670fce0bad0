//! What one position of the log holds: an applied event with its decision, or an
//! operation on the guard state that replay must repeat at the same point (a policy
//! change, a retention prune, forgotten ledger keys).
//!
//! Positions are stored in frames: one `events` value holds consecutive positions, keyed
//! by the first one (big-endian), so a batch costs a few sled inserts instead of several
//! per event. A frame is `count: u32 LE` then the LZ4 block (size-prepended) of, per
//! position, its kind, its record and its decision (empty for an operation), each as
//! `len: u32 LE` + bytes. Events are in their positional stored form (`stored.rs`),
//! decisions and operations in MessagePack with named fields (self-describing, so the
//! core types may skip `None` fields). LZ4 because field names and values repeat
//! across records: it cuts the bytes sled writes, rereads on open and keeps on disk by
//! more than half for well under a microsecond an event. Each event and decision is
//! serialised exactly once, when its batch is staged.

use std::ops::Range;

use fusebox_core::{Decision, Event, LedgerEntry, PolicySet};
use serde::{Deserialize, Serialize};

use crate::error::LogError;
use crate::stored;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum LogOp {
    /// From here on, new runs get these policies (runs already started keep theirs).
    SetPolicies { policies: PolicySet },
    /// Retention: these closed runs are forgotten (their ledger entries stay).
    Prune { runs: Vec<RunRef> },
    /// Ledger retention: these keys are forgotten; their operations may run again.
    ForgetOperations { operations: Vec<OpRef> },
    /// Cluster: what the shared (JetStream KV) ledger said about these keys just before
    /// the batch that follows was decided, so a replay judges its calls the same way.
    AdoptOperations { operations: Vec<AdoptedOp> },
}

/// One key as the cluster's shared ledger had it: an entry, or `None` when free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdoptedOp {
    pub tenant: String,
    pub op_key: String,
    pub entry: Option<LedgerEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunRef {
    pub tenant: String,
    pub run: String,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpRef {
    pub tenant: String,
    pub op_key: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Event(Box<Event>),
    Op(LogOp),
}

/// Kind byte of a frame entry.
const EVENT: u8 = 0;
const OP: u8 = 1;

/// Frames are cut at about this size before compression: sled keeps up to 16 values
/// per leaf and writes a node above 128 KiB as a separate blob file, so compressed
/// frames must stay well below 8 KiB.
pub const FRAME_BYTES: usize = 16 * 1024;
/// A new frame's buffer: it is cut once it holds `FRAME_BYTES`, so it ends with one entry
/// more than that. Grown from empty by doubling, a full frame was copied about thirteen
/// times over on the applier thread (~5 % of its time with 64 requests in flight).
const FRAME_CAPACITY: usize = FRAME_BYTES + 4 * 1024;

/// MessagePack with field names (self-describing: `skip_serializing_if` safe).
pub fn encode<T: Serialize + ?Sized>(value: &T, what: &'static str) -> Result<Vec<u8>, LogError> {
    let mut out = Vec::with_capacity(128);
    encode_into(&mut out, value, what)?;
    Ok(out)
}

pub fn encode_into<T: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    value: &T,
    what: &'static str,
) -> Result<(), LogError> {
    rmp_serde::encode::write_named(out, value).map_err(|source| LogError::Encode { what, source })
}

pub fn decode_value<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
}

/// One position in a frame, borrowed from the stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEntry<'a> {
    pub is_op: bool,
    pub record: &'a [u8],
    /// The decision's bytes (empty for an operation).
    pub decision: &'a [u8],
}

impl FrameEntry<'_> {
    /// Decodes the record; the error is a sentence for a corruption report.
    pub fn decode(&self) -> Result<Record, String> {
        if self.is_op {
            decode_value(self.record)
                .map(Record::Op)
                .map_err(|e| format!("operation record does not decode: {e}"))
        } else {
            stored::decode_event(self.record)
                .map(|event| Record::Event(Box::new(event)))
                .map_err(|e| format!("event record does not decode: {e}"))
        }
    }

    pub fn decode_decision(&self) -> Result<Decision, String> {
        decode_value(self.decision).map_err(|e| format!("decision does not decode: {e}"))
    }
}

/// Number of positions a frame holds, from its header alone.
pub fn frame_len(bytes: &[u8]) -> Result<u64, String> {
    let header: [u8; 4] = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or("frame shorter than its header")?;
    match u32::from_le_bytes(header) {
        0 => Err("empty frame".to_owned()),
        n => Ok(u64::from(n)),
    }
}

/// A decompressed frame whose entries have all been length-checked. One `Frame` can be
/// decoded into again and again ([`Frame::decode`]): a replay reads a million frames,
/// and a fresh zero-filled buffer for each was ~5% of its reading thread's instructions.
#[derive(Debug, Default)]
pub struct Frame {
    /// The decompressed bytes, at the start; it only grows, so a reused frame
    /// zero-fills nothing.
    data: Vec<u8>,
    /// Per entry: whether it is an operation, and where its record and decision are.
    entries: Vec<(bool, Range<usize>, Range<usize>)>,
}

/// LZ4 encodes at most 255 bytes of output per byte of input (a match length grows by
/// 255 per extra byte; a few bytes more for a tiny block); a frame that claims more is
/// damaged, and is refused before a buffer of the claimed size is allocated.
const LZ4_MAX_RATIO: usize = 255;

/// The fewest bytes an entry takes: three length prefixes and its one-byte kind. A
/// frame that claims more entries than its bytes can hold is damaged, and is refused
/// before room for them is reserved (a flipped header byte asked for 600 MB; fuzz).
const MIN_ENTRY_BYTES: usize = 3 * 4 + 1;

impl Frame {
    /// Decompresses a stored frame into this one and checks every length against the
    /// bytes there are. On an error the frame holds no entries.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<(), String> {
        // Taken first, so that every error below leaves the frame without entries.
        let mut entries = std::mem::take(&mut self.entries);
        entries.clear();
        let count = frame_len(bytes)? as usize;
        let (size, compressed) = lz4_flex::block::uncompressed_size(&bytes[4..])
            .map_err(|e| format!("frame does not decompress: {e}"))?;
        if size > compressed.len().saturating_mul(LZ4_MAX_RATIO) + 16 {
            return Err(format!(
                "frame claims {size} bytes from {} compressed bytes",
                compressed.len()
            ));
        }
        if self.data.len() < size {
            self.data.resize(size, 0);
        }
        let written = lz4_flex::block::decompress_into(compressed, &mut self.data[..size])
            .map_err(|e| format!("frame does not decompress: {e}"))?;
        if written != size {
            return Err(format!("frame decompresses to {written} bytes, not {size}"));
        }
        if count > size / MIN_ENTRY_BYTES {
            return Err(format!("frame claims {count} entries in {size} bytes"));
        }
        let data = &self.data[..size];
        let mut rest = Parts { data, at: 0 };
        entries.reserve(count);
        for _ in 0..count {
            let kind = rest.take("kind")?;
            let is_op = match &data[kind] {
                [EVENT] => false,
                [OP] => true,
                other => return Err(format!("bad entry kind {other:?}")),
            };
            let record = rest.take("record")?;
            let decision = rest.take("decision")?;
            entries.push((is_op, record, decision));
        }
        if rest.at != size {
            return Err(format!("{} bytes after the last entry", size - rest.at));
        }
        self.entries = entries;
        Ok(())
    }

    pub fn entries(&self) -> impl Iterator<Item = FrameEntry<'_>> {
        self.entries
            .iter()
            .map(|(is_op, record, decision)| FrameEntry {
                is_op: *is_op,
                record: &self.data[record.clone()],
                decision: &self.data[decision.clone()],
            })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Decompresses a stored frame and checks every length against the bytes there are.
pub fn decode_frame(bytes: &[u8]) -> Result<Frame, String> {
    let mut frame = Frame::default();
    frame.decode(bytes)?;
    Ok(frame)
}

/// The unread rest of a frame: length-prefixed parts (the kind is one too, so every
/// part of an entry is checked the same way).
struct Parts<'a> {
    data: &'a [u8],
    at: usize,
}

impl Parts<'_> {
    fn take(&mut self, what: &str) -> Result<Range<usize>, String> {
        let len = self
            .data
            .get(self.at..self.at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| format!("frame cut short before a {what} length"))?;
        let start = self.at + 4;
        if self.data.len() - start < len {
            return Err(format!("frame cut short inside a {what}"));
        }
        self.at = start + len;
        Ok(start..start + len)
    }
}

/// Builds frames for consecutive positions, cutting a new one every [`FRAME_BYTES`].
#[derive(Debug, Default)]
pub struct FrameWriter {
    /// (first position, bytes), in order.
    frames: Vec<(u64, Vec<u8>)>,
    next: u64,
}

impl FrameWriter {
    pub fn push_event(
        &mut self,
        pos: u64,
        event: &Event,
        decision: &Decision,
    ) -> Result<(), LogError> {
        let frame = self.entry(pos, EVENT);
        put(frame, |out| stored::encode_event(out, event))?;
        put(frame, |out| encode_into(out, decision, "a decision"))
    }

    pub fn push_op(&mut self, pos: u64, op: &LogOp) -> Result<(), LogError> {
        let frame = self.entry(pos, OP);
        put(frame, |out| encode_into(out, op, "a log operation"))?;
        put(frame, |_| Ok(()))
    }

    /// Adds an already encoded entry (a frame being rewritten).
    pub fn push_raw(&mut self, pos: u64, entry: &FrameEntry<'_>) {
        let frame = self.entry(pos, if entry.is_op { OP } else { EVENT });
        for part in [entry.record, entry.decision] {
            frame.extend_from_slice(&(part.len() as u32).to_le_bytes());
            frame.extend_from_slice(part);
        }
    }

    /// Starts the entry of `pos` (which must follow the previous one) and writes its kind.
    fn entry(&mut self, pos: u64, kind: u8) -> &mut Vec<u8> {
        let cut = match self.frames.last() {
            None => true,
            Some((_, bytes)) => {
                assert_eq!(pos, self.next, "frame positions must be consecutive");
                bytes.len() >= FRAME_BYTES
            }
        };
        if cut {
            let mut frame = Vec::with_capacity(FRAME_CAPACITY);
            frame.extend_from_slice(&[0; 4]);
            self.frames.push((pos, frame));
        }
        self.next = pos + 1;
        let frame = &mut self.frames.last_mut().expect("pushed above").1;
        let count = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) + 1;
        frame[..4].copy_from_slice(&count.to_le_bytes());
        frame.extend_from_slice(&1u32.to_le_bytes());
        frame.push(kind);
        frame
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The frames as stored: count, then the compressed entries.
    pub fn into_frames(self) -> Vec<(u64, Vec<u8>)> {
        self.frames
            .into_iter()
            .map(|(first, frame)| {
                let mut stored = frame[..4].to_vec();
                stored.extend_from_slice(&lz4_flex::compress_prepend_size(&frame[4..]));
                (first, stored)
            })
            .collect()
    }
}

/// Writes a length-prefixed part whose length is known only once it is written.
fn put(
    frame: &mut Vec<u8>,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), LogError>,
) -> Result<(), LogError> {
    let at = frame.len();
    frame.extend_from_slice(&[0; 4]);
    write(frame)?;
    let len = (frame.len() - at - 4) as u32;
    frame[at..at + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use fusebox_core::parse_event;

    use super::*;
    use crate::state::LogState;

    #[test]
    fn frames_round_trip_events_decisions_and_operations() {
        let op = LogOp::Prune {
            runs: vec![RunRef {
                tenant: "acme".into(),
                run: "r1".into(),
            }],
        };
        let event = parse_event(
            br#"{"v":1,"id":"e1","tenant":"acme","run":"r1","ts_ms":5,"type":"tool_call","call_id":"c","tool":"send","args":{"n":-1.5,"big":18446744073709551615,"neg":-3,"f":1.0,"s":"\u00e9"},"op_key":"k"}"#,
        )
        .unwrap();
        let decision = LogState::new(4).apply_event(&event);
        let mut writer = FrameWriter::default();
        writer.push_op(1, &op).unwrap();
        writer.push_event(2, &event, &decision).unwrap();
        let frames = writer.into_frames();
        assert_eq!(frames.len(), 1);
        let frame = decode_frame(&frames[0].1).unwrap();
        let entries: Vec<_> = frame.entries().collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].decode(), Ok(Record::Op(op)));
        assert!(entries[0].decision.is_empty());
        assert_eq!(
            entries[1].decode(),
            Ok(Record::Event(Box::new(event.clone())))
        );
        assert_eq!(entries[1].decode_decision(), Ok(decision));
        // The export writes the decoded event as JSON: it must be the wire form again.
        let Ok(Record::Event(back)) = entries[1].decode() else {
            unreachable!("checked above")
        };
        assert_eq!(
            serde_json::to_vec(&back).unwrap(),
            serde_json::to_vec(&event).unwrap()
        );

        let mut bytes = frames[0].1.clone();
        bytes.truncate(bytes.len() - 1);
        assert!(decode_frame(&bytes).is_err());
        assert!(decode_frame(&[1, 0, 0, 0, 9]).is_err());
        assert!(decode_frame(&[0, 0, 0, 0]).is_err());
        // A count that promises more entries than the frame holds.
        let mut more = frames[0].1.clone();
        more[0] = 3;
        assert!(decode_frame(&more).is_err());
        let garbage = FrameEntry {
            is_op: false,
            record: b"garbage",
            decision: b"",
        };
        assert!(garbage.decode().is_err());
    }

    #[test]
    fn frames_are_cut_by_size_and_keep_positions_consecutive() {
        let mut writer = FrameWriter::default();
        let op = LogOp::SetPolicies {
            policies: PolicySet::default(),
        };
        for pos in 10..400 {
            writer.push_op(pos, &op).unwrap();
        }
        let frames = writer.into_frames();
        assert!(frames.len() > 1);
        let mut next = 10;
        for (first, bytes) in &frames {
            assert_eq!(*first, next);
            assert!(bytes.len() < 8 * 1024);
            next += frame_len(bytes).unwrap();
        }
        assert_eq!(next, 400);
    }

    #[test]
    fn a_reused_frame_holds_only_the_last_frame_decoded_into_it() {
        let op = |run: &str| LogOp::Prune {
            runs: vec![RunRef {
                tenant: "acme".into(),
                run: run.into(),
            }],
        };
        let mut big = FrameWriter::default();
        for pos in 1..=50 {
            big.push_op(pos, &op(&"long-run-name-".repeat(20))).unwrap();
        }
        let mut small = FrameWriter::default();
        small.push_op(51, &op("r")).unwrap();
        let (big, small) = (big.into_frames(), small.into_frames());

        let mut frame = Frame::default();
        frame.decode(&big[0].1).unwrap();
        assert_eq!(frame.len(), 50);
        // Smaller than the buffer it reuses: no entry and no byte of the first is seen.
        frame.decode(&small[0].1).unwrap();
        let records: Vec<_> = frame.entries().map(|e| e.decode()).collect();
        assert_eq!(records, vec![Ok(Record::Op(op("r")))]);
        // A damaged frame leaves no entries behind, not the previous frame's.
        assert!(frame.decode(&small[0].1[..small[0].1.len() - 1]).is_err());
        assert!(frame.is_empty());
    }

    #[test]
    fn a_frame_claiming_more_than_lz4_can_expand_to_is_refused_unread() {
        let mut claims_4_gib = vec![1, 0, 0, 0];
        claims_4_gib.extend_from_slice(&u32::MAX.to_le_bytes());
        claims_4_gib.extend_from_slice(&[0x10, 0]);
        let err = decode_frame(&claims_4_gib).unwrap_err();
        assert!(err.contains("claims 4294967295 bytes"), "{err}");
    }

    /// fuzz/ (log_frame): a frame header claiming 40 million entries reserved room for
    /// all of them before reading one.
    #[test]
    fn a_frame_claiming_more_entries_than_its_bytes_hold_is_refused_unread() {
        let prune = LogOp::Prune {
            runs: vec![RunRef {
                tenant: "acme".into(),
                run: "r".into(),
            }],
        };
        let mut writer = FrameWriter::default();
        writer.push_op(1, &prune).unwrap();
        let mut frame = writer.into_frames().remove(0).1;
        frame[..4].copy_from_slice(&40_000_000u32.to_le_bytes());
        let err = decode_frame(&frame).unwrap_err();
        assert!(err.contains("claims 40000000 entries"), "{err}");
    }
}

//! The commit file: what makes a batch of frames durable in one `fdatasync`.
//!
//! sled 0.34's own flush costs two disk round trips (its buffer written and waited on
//! with `sync_file_range`, then the `fdatasync` that `sled_log::flush` adds) and hands the
//! write to sled's I/O pool, whose condition variable wakes all seven of its threads for
//! every flush. So a commit that holds only new frames is written here instead: one
//! record appended in place to a file allocated up front (an `fdatasync` then writes data
//! only, never the file's size or its block map), while sled takes the same frames
//! in memory and writes them out in its own time. When the file is full, and on close,
//! sled is flushed in full (a checkpoint) and the file starts over; on open, whatever the
//! file holds is applied to sled again. Frames are inserted at positions nobody else
//! writes, so applying one a second time changes nothing.
//!
//! Layout: two header slots (generation, CRC) at offsets 0 and [`SLOT_BYTES`]; the
//! valid one with the higher generation is current. Records from [`RECORDS_AT`] on:
//! `len: u32 LE`, `crc: u32 LE` (CRC-32 of the generation then the payload), payload.
//! The generation in the CRC is what ends a replay at the last record written since the
//! file started over: the older records after it fail their check.
//!
//! Records are written with direct, synchronous I/O where the file system allows it
//! (`O_DIRECT | O_DSYNC`, see [`Direct`]): a commit is then one write that returns once
//! the disk has it, instead of a copy into the page cache, its writeback and an
//! `fdatasync`. Direct writes are whole blocks, so the last, partly filled block is
//! written again with each record (the same bytes where records already are, zeroes
//! after the new one: nothing a replay reads changes but the record appended).

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The commit file's name in the log's directory. A copy of a live directory takes it
/// before sled's files: whatever a checkpoint empties out of it while the copy is made,
/// sled's files, copied after, already hold.
pub const FILE: &str = "commits";
const MAGIC: &[u8; 8] = b"FBXCOMMT";
const SLOT_BYTES: u64 = 512;
/// Records start on their own page, apart from the headers rewritten at each start-over.
const RECORDS_AT: u64 = 4096;
const RECORD_HEADER: usize = 8;
/// What a direct write's offset, length and memory are aligned to: the largest logical
/// block size of the disks this runs on (512 or 4096 bytes).
const BLOCK: usize = 4096;
/// The file's size: a checkpoint per ~100 k events of the usual size.
pub(crate) const CAPACITY: u64 = 32 << 20;

/// One frame: its key and bytes, as they go into the events tree.
pub(crate) type Frame = (Vec<u8>, Vec<u8>);

pub(crate) struct CommitFile {
    file: File,
    capacity: u64,
    generation: u64,
    /// Where the next record goes.
    end: u64,
    /// `None`: records go through the page cache and an `fdatasync`, where the file system
    /// refuses direct I/O (tmpfs).
    direct: Option<Direct>,
}

/// The commit file opened a second time for direct, synchronous writes: one syscall per
/// commit, with no copy into the page cache and no writeback to wait on, on the applier
/// thread whose time per batch bounds the gate (figures in docs/benchmarks.md, "Direct
/// writes to the commit file").
struct Direct {
    file: File,
    /// The bytes of the block the file's end falls in, up to the end: written again in
    /// front of the next record, which starts mid-block.
    tail: Vec<u8>,
    /// Room for one write, over-allocated by a block so an aligned run can be cut out of
    /// it (`aligned`).
    staging: Vec<u8>,
}

/// What an open found in the file: the frames of each record of the current
/// generation, in the order they were committed.
pub(crate) type Replay = Vec<Vec<Frame>>;

impl CommitFile {
    /// Opens the file in `dir`, creating it with `capacity` bytes when missing.
    pub(crate) fn open(dir: &Path, capacity: u64) -> io::Result<(CommitFile, Replay)> {
        Self::open_with(dir, capacity, true)
    }

    /// [`CommitFile::open`] writing through the page cache whatever the file system.
    #[cfg(test)]
    fn open_buffered(dir: &Path, capacity: u64) -> io::Result<(CommitFile, Replay)> {
        Self::open_with(dir, capacity, false)
    }

    fn open_with(dir: &Path, capacity: u64, direct: bool) -> io::Result<(CommitFile, Replay)> {
        let path = dir.join(FILE);
        let (mut commits, replay) = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => Self::read(file)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                (Self::create(dir, &path, capacity)?, Vec::new())
            }
            Err(e) => return Err(e),
        };
        if direct && commits.capacity % BLOCK as u64 == 0 {
            commits.direct = Direct::open(&path, &commits.file, commits.end)?;
        }
        Ok((commits, replay))
    }

    fn create(dir: &Path, path: &Path, capacity: u64) -> io::Result<CommitFile> {
        // Written under another name and renamed once allocated and durable, so a crash
        // here never leaves a half-made file that an open would take for a damaged one.
        let partial = dir.join(format!("{FILE}.new"));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&partial)?;
        // Real zeroes, not `set_len`'s holes: a write into a hole allocates blocks, and
        // the `fdatasync` after it would have to write the file's block map too.
        let zeroes = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < capacity {
            let n = zeroes.len().min((capacity - at) as usize);
            file.write_all_at(&zeroes[..n], at)?;
            at += n as u64;
        }
        let mut commits = CommitFile {
            file,
            capacity,
            generation: 0,
            end: RECORDS_AT,
            direct: None,
        };
        commits.start_over()?;
        std::fs::rename(&partial, path)?;
        File::open(dir)?.sync_all()?;
        Ok(commits)
    }

    /// Reads the headers, then the records of the current generation in order, up to
    /// the first that is not whole: only what was written, not the file's zeroed rest.
    fn read(file: File) -> io::Result<(CommitFile, Replay)> {
        let capacity = file.metadata()?.len();
        if capacity < RECORDS_AT {
            return Err(damaged("shorter than its headers"));
        }
        let mut slots = [0u8; 2 * SLOT_BYTES as usize];
        file.read_exact_at(&mut slots, 0)?;
        let generation = slots
            .chunks(SLOT_BYTES as usize)
            .filter_map(read_slot)
            .max()
            .ok_or_else(|| damaged("neither header slot is valid"))?;
        let mut reader = BufReader::new(&file);
        reader.seek(SeekFrom::Start(RECORDS_AT))?;
        let mut replay = Vec::new();
        let mut end = RECORDS_AT;
        while let Some(payload) = next_record(&mut reader, end, capacity, generation)? {
            end += (RECORD_HEADER + payload.len()) as u64;
            replay.push(decode(&payload).ok_or_else(|| damaged("a record's frames"))?);
        }
        drop(reader);
        let commits = CommitFile {
            file,
            capacity,
            generation,
            end,
            direct: None,
        };
        Ok((commits, replay))
    }

    /// Appends one record and makes it durable; `false` (nothing written) when it does
    /// not fit in what is left of the file.
    pub(crate) fn append(&mut self, record: &mut Record) -> io::Result<bool> {
        let bytes = record.seal(self.generation);
        if self.end + bytes.len() as u64 > self.capacity {
            return Ok(false);
        }
        let written = match &mut self.direct {
            Some(direct) => match direct.append(bytes, self.end) {
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                    // The disk wants a larger alignment than `BLOCK`: this record and
                    // every later one go through the page cache.
                    tracing::warn!(err = %e, "direct writes to the commit file refused; writing through the page cache");
                    self.direct = None;
                    false
                }
                appended => appended.map(|()| true)?,
            },
            None => false,
        };
        if !written {
            self.file.write_all_at(bytes, self.end)?;
            self.file.sync_data()?;
        }
        self.end += bytes.len() as u64;
        Ok(true)
    }

    /// Empties the file: called once everything its records hold is durable elsewhere.
    /// The next generation goes in the slot the current one is not in, so a torn header
    /// write leaves the current one readable (and its records, already durable in sled,
    /// are applied once more at worst).
    pub(crate) fn start_over(&mut self) -> io::Result<()> {
        self.generation += 1;
        let mut slot = [0u8; 20];
        slot[..8].copy_from_slice(MAGIC);
        slot[8..16].copy_from_slice(&self.generation.to_le_bytes());
        let crc = crc32fast::hash(&slot[..16]);
        slot[16..].copy_from_slice(&crc.to_le_bytes());
        self.file
            .write_all_at(&slot, (self.generation % 2) * SLOT_BYTES)?;
        self.file.sync_data()?;
        self.end = RECORDS_AT;
        if let Some(direct) = &mut self.direct {
            direct.tail.clear();
        }
        Ok(())
    }

    /// Whether nothing was appended since the file last started over.
    pub(crate) fn is_empty(&self) -> bool {
        self.end == RECORDS_AT
    }
}

impl Direct {
    /// Opens `path` for direct writes, and reads the block `end` falls in; `None` where
    /// the file system refuses direct I/O.
    fn open(path: &Path, buffered: &File, end: u64) -> io::Result<Option<Direct>> {
        let Some(file) = open_direct(path)? else {
            return Ok(None);
        };
        let block_start = end - end % BLOCK as u64;
        let mut tail = vec![0; (end - block_start) as usize];
        buffered.read_exact_at(&mut tail, block_start)?;
        Ok(Some(Direct {
            file,
            tail,
            staging: Vec::new(),
        }))
    }

    /// Writes `record` at `end` (durable on return): the blocks from the one `end` falls
    /// in, holding the bytes before `end` in that block, the record, then zeroes.
    fn append(&mut self, record: &[u8], end: u64) -> io::Result<()> {
        let used = self.tail.len() + record.len();
        let len = used.div_ceil(BLOCK) * BLOCK;
        let blocks = aligned(&mut self.staging, len);
        blocks[..self.tail.len()].copy_from_slice(&self.tail);
        blocks[self.tail.len()..used].copy_from_slice(record);
        blocks[used..].fill(0);
        self.file
            .write_all_at(blocks, end - self.tail.len() as u64)?;
        let last_block = used / BLOCK * BLOCK;
        self.tail.clear();
        self.tail.extend_from_slice(&blocks[last_block..used]);
        Ok(())
    }
}

/// `len` bytes of `buffer` starting on a [`BLOCK`] boundary in memory, growing it as
/// needed.
fn aligned(buffer: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if buffer.len() < len + BLOCK {
        buffer.resize(len + BLOCK, 0);
    }
    let offset = buffer.as_ptr().align_offset(BLOCK);
    &mut buffer[offset..offset + len]
}

/// `path` opened with `O_DIRECT | O_DSYNC`; `None` where the file system refuses it.
#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(path)
    {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> io::Result<Option<File>> {
    Ok(None)
}

/// The frames of one commit, encoded as they are staged.
pub(crate) struct Record {
    bytes: Vec<u8>,
}

impl Default for Record {
    fn default() -> Self {
        Record {
            bytes: vec![0; RECORD_HEADER],
        }
    }
}

impl Record {
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) {
        for part in [key, value] {
            self.bytes
                .extend_from_slice(&(part.len() as u32).to_le_bytes());
            self.bytes.extend_from_slice(part);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.bytes.len() == RECORD_HEADER
    }

    /// Bytes staged.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len() - RECORD_HEADER
    }

    pub(crate) fn clear(&mut self) {
        self.bytes.truncate(RECORD_HEADER);
    }

    /// The record with its header for `generation`.
    fn seal(&mut self, generation: u64) -> &[u8] {
        let payload_len = (self.bytes.len() - RECORD_HEADER) as u32;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&generation.to_le_bytes());
        crc.update(&self.bytes[RECORD_HEADER..]);
        self.bytes[..4].copy_from_slice(&payload_len.to_le_bytes());
        self.bytes[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
        &self.bytes
    }
}

fn read_slot(slot: &[u8]) -> Option<u64> {
    let crc = u32::from_le_bytes(slot[16..20].try_into().ok()?);
    (slot[..8] == MAGIC[..] && crc32fast::hash(&slot[..16]) == crc)
        .then(|| u64::from_le_bytes(slot[8..16].try_into().expect("8 bytes")))
}

/// The payload of the record at `at` (where `reader` stands), when a whole record of
/// `generation` is there.
fn next_record(
    reader: &mut impl Read,
    at: u64,
    capacity: u64,
    generation: u64,
) -> io::Result<Option<Vec<u8>>> {
    if at + RECORD_HEADER as u64 > capacity {
        return Ok(None);
    }
    let mut header = [0u8; RECORD_HEADER];
    reader.read_exact(&mut header)?;
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    if len == 0 || at + (RECORD_HEADER as u64) + u64::from(len) > capacity {
        return Ok(None);
    }
    let mut payload = vec![0; len as usize];
    reader.read_exact(&mut payload)?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&generation.to_le_bytes());
    hasher.update(&payload);
    Ok((hasher.finalize() == crc).then_some(payload))
}

fn decode(mut payload: &[u8]) -> Option<Vec<Frame>> {
    let mut take = || -> Option<Vec<u8>> {
        let len = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
        let part = payload.get(4..4 + len)?.to_vec();
        payload = &payload[4 + len..];
        Some(part)
    };
    let mut frames = Vec::new();
    while let Some(key) = take() {
        frames.push((key, take()?));
    }
    payload.is_empty().then_some(frames)
}

fn damaged(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the commit file ({FILE}) is damaged: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for two blocks of records: whole blocks, so direct writes are used where the
    /// file system takes them.
    const SMALL: u64 = RECORDS_AT + 2 * BLOCK as u64;

    /// How a test opens the file: direct where the file system allows, or buffered.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Io {
        Direct,
        Buffered,
    }
    const BOTH: [Io; 2] = [Io::Direct, Io::Buffered];

    fn open(dir: &Path, capacity: u64, io: Io) -> io::Result<(CommitFile, Replay)> {
        match io {
            Io::Direct => CommitFile::open(dir, capacity),
            Io::Buffered => CommitFile::open_buffered(dir, capacity),
        }
    }

    fn record(frames: &[(&[u8], &[u8])]) -> Record {
        let mut record = Record::default();
        for (key, value) in frames {
            record.push(key, value);
        }
        record
    }

    fn frames(replay: &Replay) -> Vec<Vec<(&[u8], &[u8])>> {
        replay
            .iter()
            .map(|r| r.iter().map(|(k, v)| (&k[..], &v[..])).collect())
            .collect()
    }

    #[test]
    fn what_was_appended_is_read_back_in_order_until_the_file_starts_over() {
        for io in BOTH {
            let dir = tempfile::tempdir().unwrap();
            let (mut commits, replay) = open(dir.path(), SMALL, io).unwrap();
            assert!(replay.is_empty() && commits.is_empty());
            assert!(commits
                .append(&mut record(&[(b"k1", b"one"), (b"k2", b"")]))
                .unwrap());
            assert!(commits.append(&mut record(&[(b"k3", b"three")])).unwrap());
            drop(commits);
            let (mut commits, replay) = open(dir.path(), SMALL, io).unwrap();
            assert_eq!(
                frames(&replay),
                [
                    vec![(&b"k1"[..], &b"one"[..]), (b"k2", b"")],
                    vec![(b"k3", b"three")]
                ],
                "{io:?}"
            );
            commits.start_over().unwrap();
            // A shorter record over the old ones: they follow it, and must not be replayed.
            assert!(commits.append(&mut record(&[(b"k4", b"4")])).unwrap());
            drop(commits);
            let (_, replay) = open(dir.path(), SMALL, io).unwrap();
            assert_eq!(frames(&replay), [vec![(&b"k4"[..], &b"4"[..])]], "{io:?}");
        }
    }

    /// Records across block boundaries, appended before and after a reopen (which must
    /// pick up the partly filled last block): read back whole, and the file holds the
    /// same bytes whichever way they were written.
    #[test]
    fn records_across_blocks_read_back_the_same_written_either_way() {
        let sizes = [10, 4000, 1, 4087, 4088, 300, 9000, 4096, 17];
        let values: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| vec![i as u8 + 1; n])
            .collect();
        let capacity = RECORDS_AT + 16 * BLOCK as u64;
        let mut files = Vec::new();
        for io in BOTH {
            let dir = tempfile::tempdir().unwrap();
            let (before, after) = values.split_at(4);
            for part in [before, after] {
                let (mut commits, _) = open(dir.path(), capacity, io).unwrap();
                for value in part {
                    assert!(commits.append(&mut record(&[(b"k", value)])).unwrap());
                }
                // Still direct: a misaligned write would have fallen back to buffered.
                let direct = io == Io::Direct && takes_direct(dir.path());
                assert_eq!(commits.direct.is_some(), direct, "{io:?}");
            }
            let (_, replay) = open(dir.path(), capacity, io).unwrap();
            let read: Vec<&[u8]> = replay.iter().map(|r| &r[0].1[..]).collect();
            let expected: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
            assert_eq!(read, expected, "{io:?}");
            files.push(std::fs::read(dir.path().join(FILE)).unwrap());
        }
        assert!(files[0] == files[1], "direct and buffered files differ");
    }

    /// Whether the file system under `dir` takes direct I/O.
    fn takes_direct(dir: &Path) -> bool {
        let probe = dir.join("probe");
        std::fs::write(&probe, [0; BLOCK]).unwrap();
        let takes = open_direct(&probe).unwrap().is_some();
        std::fs::remove_file(probe).unwrap();
        takes
    }

    #[test]
    fn direct_writes_are_used_where_the_file_system_takes_them() {
        let dir = tempfile::tempdir().unwrap();
        let (commits, _) = open(dir.path(), SMALL, Io::Direct).unwrap();
        assert_eq!(commits.direct.is_some(), takes_direct(dir.path()));
        let (commits, _) = open(dir.path(), SMALL, Io::Buffered).unwrap();
        assert!(commits.direct.is_none());
    }

    #[test]
    fn a_record_that_does_not_fit_is_refused_and_nothing_is_written() {
        for io in BOTH {
            let dir = tempfile::tempdir().unwrap();
            let (mut commits, _) = open(dir.path(), SMALL, io).unwrap();
            assert!(commits.append(&mut record(&[(b"k", &[1; 5000])])).unwrap());
            assert!(!commits.append(&mut record(&[(b"k", &[2; 5000])])).unwrap());
            drop(commits);
            let (_, replay) = open(dir.path(), SMALL, io).unwrap();
            assert_eq!(replay.len(), 1, "{io:?}");
        }
    }

    #[test]
    fn a_torn_record_ends_the_replay_before_it() {
        for io in BOTH {
            let dir = tempfile::tempdir().unwrap();
            let (mut commits, _) = open(dir.path(), SMALL, io).unwrap();
            commits.append(&mut record(&[(b"a", b"1")])).unwrap();
            let second = commits.end;
            commits.append(&mut record(&[(b"b", b"2")])).unwrap();
            commits.append(&mut record(&[(b"c", b"3")])).unwrap();
            drop(commits);
            // The second record's last byte never reached the disk.
            let file = OpenOptions::new()
                .write(true)
                .open(dir.path().join(FILE))
                .unwrap();
            file.write_all_at(&[0xff], second + RECORD_HEADER as u64 + 9)
                .unwrap();
            let (commits, replay) = open(dir.path(), SMALL, io).unwrap();
            assert_eq!(frames(&replay), [vec![(&b"a"[..], &b"1"[..])]], "{io:?}");
            assert_eq!(
                commits.end, second,
                "the next record goes where the torn one was"
            );
        }
    }

    #[test]
    fn a_torn_header_leaves_the_other_slot_current() {
        for io in BOTH {
            let dir = tempfile::tempdir().unwrap();
            let (mut commits, _) = open(dir.path(), SMALL, io).unwrap();
            commits.start_over().unwrap(); // generation 2, in slot 0
            commits.append(&mut record(&[(b"a", b"1")])).unwrap();
            let torn_slot = ((commits.generation + 1) % 2) * SLOT_BYTES;
            drop(commits);
            let file = OpenOptions::new()
                .write(true)
                .open(dir.path().join(FILE))
                .unwrap();
            file.write_all_at(b"FBXCOMMT\x03\0\0\0\0\0\0\0garb", torn_slot)
                .unwrap();
            let (_, replay) = open(dir.path(), SMALL, io).unwrap();
            assert_eq!(frames(&replay), [vec![(&b"a"[..], &b"1"[..])]], "{io:?}");
            // Both slots gone is damage, said as such rather than an empty log.
            file.write_all_at(&[0; 16], 0).unwrap();
            file.write_all_at(&[0; 16], SLOT_BYTES).unwrap();
            let err = open(dir.path(), SMALL, io).err().expect("damaged");
            assert!(err.to_string().contains("neither header slot"), "{err}");
        }
    }
}

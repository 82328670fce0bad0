//! The log's frames and records: any bytes either refuse, or decode to entries that
//! re-encode to the same decompressed frame bytes; every record and decision that
//! decodes re-encodes and decodes to the same value.
#![no_main]

use fusebox_log::record::{decode_frame, decode_value, encode, FrameWriter, Record};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = decode_frame(data) else {
        return;
    };
    let entries: Vec<_> = frame.entries().collect();
    let mut writer = FrameWriter::default();
    for (pos, entry) in entries.iter().enumerate() {
        writer.push_raw(pos as u64 + 1, entry);
    }
    // Re-encoded, the same entries come back, frame by frame, and the bytes inside
    // the compression are the original's.
    let original = lz4_flex::decompress_size_prepended(&data[4..]).expect("decoded above");
    let mut inner = Vec::new();
    let mut back = Vec::new();
    let frames = writer.into_frames();
    for (_, bytes) in &frames {
        let decoded = decode_frame(bytes).expect("a re-encoded frame decodes");
        back.extend(
            decoded
                .entries()
                .map(|e| (e.is_op, e.record.to_vec(), e.decision.to_vec())),
        );
        inner.extend(lz4_flex::decompress_size_prepended(&bytes[4..]).unwrap());
    }
    let want: Vec<_> = entries
        .iter()
        .map(|e| (e.is_op, e.record.to_vec(), e.decision.to_vec()))
        .collect();
    assert_eq!(back, want);
    if frames.len() == 1 {
        assert_eq!(inner, original);
    }

    for entry in &entries {
        match entry.decode() {
            Ok(Record::Event(event)) => {
                let decision = entry.decode_decision();
                let mut writer = FrameWriter::default();
                let decision =
                    decision.unwrap_or_else(|_| fusebox_log::LogState::new(1).apply_event(&event));
                writer
                    .push_event(1, &event, &decision)
                    .expect("a decoded event encodes");
                let frames = writer.into_frames();
                let again = decode_frame(&frames[0].1).expect("re-encoded frame decodes");
                let again = again.entries().next().expect("one entry");
                assert_eq!(again.decode(), Ok(Record::Event(event)));
                assert_eq!(again.decode_decision(), Ok(decision));
            }
            Ok(Record::Op(op)) => {
                let bytes = encode(&op, "op").expect("a decoded operation encodes");
                assert_eq!(decode_value(&bytes), Ok(op));
            }
            Err(_) => {}
        }
    }
});

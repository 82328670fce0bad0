//! Snapshot decoding, past the checksum (a fuzzer cannot forge SHA-256, so the target
//! feeds the payload): any bytes either refuse, or give a state that encodes into a
//! snapshot decoding to the same state.
#![no_main]

use fusebox_log::snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(state) = snapshot::decode_payload(data) else {
        return;
    };
    let bytes = snapshot::encode(&state).expect("a decoded state encodes");
    let again = snapshot::decode(&bytes).expect("a re-encoded snapshot decodes");
    assert_eq!(again, state);
});

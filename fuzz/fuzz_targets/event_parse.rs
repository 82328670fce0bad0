//! The event parser, as the gate and ingest call it (`parse_event`): any bytes either
//! refuse with an error or give an event that serialises back to the wire form and
//! parses to the same event (the log's `export` and `fusebox replay` rely on it).
#![no_main]

use fusebox_core::parse_event;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(event) = parse_event(data) else {
        return;
    };
    let wire = serde_json::to_vec(&event).expect("a parsed event serialises");
    let again = parse_event(&wire).unwrap_or_else(|err| {
        panic!(
            "re-serialised event refused: {err}\n{}",
            String::from_utf8_lossy(&wire)
        )
    });
    assert_eq!(again, event, "{}", String::from_utf8_lossy(&wire));
    // The wire form is a fixpoint: serialising the re-parsed event writes the same bytes.
    assert_eq!(serde_json::to_vec(&again).unwrap(), wire);
});

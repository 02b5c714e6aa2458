//! `OpMsg::parse` on arbitrary flags + sections behind a header whose length matches, then a
//! walk of the body, the sequences and their documents, recursively through nested documents
//! and arrays.
//!
//! When the input sets checksumPresent, it is parsed a second time with a correct CRC-32C
//! trailer, so that the fuzzer reaches the section parser with the flag set (it would
//! otherwise almost never guess a matching CRC).

#![no_main]

use libfuzzer_sys::fuzz_target;
use mongoguard::wire::{
    Header, Message, MsgFlags, OpCode, OpMsg, DEFAULT_MAX_MESSAGE_SIZE, HEADER_LEN,
};
use mongoguard_fuzz::walk_message;

fn framed(payload: &[u8]) -> Option<Vec<u8>> {
    let length = i32::try_from(HEADER_LEN + payload.len()).ok()?;
    let header = Header {
        length,
        request_id: 1,
        response_to: 0,
        op_code: OpCode::Msg as i32,
    };
    let mut message = header.to_bytes().to_vec();
    message.extend_from_slice(payload);
    Some(message)
}

fn check(message: &[u8]) {
    let Ok(msg) = OpMsg::parse(message) else {
        return;
    };
    // The Message view of the same bytes must agree.
    let Ok(Message::Msg(same)) = Message::parse(message, DEFAULT_MAX_MESSAGE_SIZE) else {
        panic!("OpMsg::parse accepted what Message::parse rejects");
    };
    assert_eq!(same.body().as_bytes(), msg.body().as_bytes());
    walk_message(message, &Message::Msg(msg), DEFAULT_MAX_MESSAGE_SIZE, 0);
}

fuzz_target!(|data: &[u8]| {
    let Some(mut message) = framed(data) else {
        return;
    };
    check(&message);
    let flags = data
        .get(..4)
        .map(|f| u32::from_le_bytes([f[0], f[1], f[2], f[3]]));
    if flags.is_some_and(|f| f & MsgFlags::CHECKSUM_PRESENT != 0) && data.len() >= 8 {
        let covered = message.len() - 4;
        let crc = crc32c::crc32c(&message[..covered]);
        message[covered..].copy_from_slice(&crc.to_le_bytes());
        check(&message);
    }
});

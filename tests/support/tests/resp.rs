//! The RESP codec on inputs the proxy meets in practice: frames split at
//! every byte, nesting, nils, binary payloads and RESP3 types.

use distlock_test_support::{encode_command, frame_len, parse_reply, try_frame_len, Reply};

/// Every strict prefix of `frame` is incomplete and the whole is one frame,
/// also with the next frame already behind it.
fn assert_frame(frame: &[u8]) {
    for cut in 0..frame.len() {
        assert_eq!(
            try_frame_len(&frame[..cut]),
            Ok(None),
            "prefix {:?} of {:?}",
            String::from_utf8_lossy(&frame[..cut]),
            String::from_utf8_lossy(frame)
        );
    }
    assert_eq!(frame_len(frame), Some(frame.len()));
    let mut two = frame.to_vec();
    two.extend_from_slice(b"+NEXT\r\n");
    assert_eq!(frame_len(&two), Some(frame.len()));
}

#[test]
fn resp2_frames_split_anywhere() {
    for frame in [
        &b"+OK\r\n"[..],
        b"-ERR wrong type\r\n",
        b":-42\r\n",
        b"$5\r\nhello\r\n",
        b"$0\r\n\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"*0\r\n",
        b"$6\r\na\r\nb\r\n\r\n", // CRLF inside a bulk payload
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$4\r\ndata\r\n",
        b"*2\r\n*2\r\n:1\r\n*1\r\n$-1\r\n*-1\r\n", // nested, with nils
    ] {
        assert_frame(frame);
    }
}

#[test]
fn resp3_frames_split_anywhere() {
    for frame in [
        &b"_\r\n"[..],
        b"#t\r\n",
        b",3.14\r\n",
        b"(3492890328409238509324850943850943825024385\r\n",
        b"!21\r\nSYNTAX invalid syntax\r\n",
        b"=15\r\ntxt:Some string\r\n",
        b"%2\r\n+first\r\n:1\r\n+second\r\n*1\r\n:2\r\n",
        b"~2\r\n+a\r\n+b\r\n",
        b">3\r\n+message\r\n+ch\r\n$2\r\nhi\r\n",
        b"|1\r\n+ttl\r\n:3600\r\n$1\r\nv\r\n", // attribute and the value it annotates
    ] {
        assert_frame(frame);
    }
}

#[test]
fn malformed_input_is_reported_not_awaited() {
    for garbage in [
        &b"?what\r\n"[..],
        b":12\rx",
        b"$3\r\nabcXY",
        b"*x\r\n",
        b"$-2\r\n",
    ] {
        assert!(
            try_frame_len(garbage).is_err(),
            "{:?}",
            String::from_utf8_lossy(garbage)
        );
        assert_eq!(frame_len(garbage), None);
    }
}

#[test]
fn replies_parse_into_resp2_shapes() {
    let parse = |bytes: &[u8]| parse_reply(bytes).unwrap().unwrap();
    assert_eq!(parse(b"+OK\r\n"), (Reply::Simple("OK".into()), 5));
    assert_eq!(parse(b"-ERR no\r\n").0.as_error(), Some("ERR no"));
    assert_eq!(parse(b":7\r\n").0.as_int(), Some(7));
    assert_eq!(parse(b"$2\r\n12\r\n").0.as_int(), Some(12));
    assert!(parse(b"$-1\r\n").0.is_nil());
    assert!(parse(b"*-1\r\n").0.is_nil());
    assert!(parse(b"_\r\n").0.is_nil());
    assert_eq!(parse(b"#f\r\n").0, Reply::Int(0));
    assert_eq!(
        parse(b"=9\r\ntxt:hello\r\n").0.as_str().as_deref(),
        Some("hello")
    );
    assert_eq!(
        parse(b"%1\r\n+k\r\n*1\r\n$1\r\nv\r\n").0,
        Reply::Array(Some(vec![
            Reply::Simple("k".into()),
            Reply::Array(Some(vec![Reply::Bulk(Some(b"v".to_vec()))])),
        ]))
    );
    assert_eq!(parse(b"|1\r\n+a\r\n+b\r\n:5\r\n").0, Reply::Int(5));
    assert_eq!(parse_reply(b"*2\r\n:1\r\n"), Ok(None));
}

#[test]
fn commands_encode_as_arrays_of_bulk_strings() {
    let encoded = encode_command(&[b"SET", b"k", b"a\r\nb"]);
    assert_eq!(encoded, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n");
    assert_frame(&encoded);
}

//! Seed inputs of every target, built from real messages: the bytes our encoders (and torch's
//! client) put on the wire, the header and hello layouts the transport writes, a dump as
//! colltrace serializes it. `scripts/fuzz.sh` writes them into `fuzz/corpus/<target>/` before
//! fuzzing; the regression tests run them directly.

use colltrace::schema::{
    CommDump, CommState, Dump, Record, RecordKind, SeqCounters, State, SCHEMA_NAME, SCHEMA_VERSION,
};
use colltrace::Trigger;

/// `(target, seed name, bytes)` for every target.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut add = |t: &'static str, name: &str, b: Vec<u8>| out.push((t, name.to_string(), b));

    add(
        "tcpstore_server",
        "session",
        torchcomms_core::bootstrap::tcp_store::fuzz::sample_session(),
    );
    // Captured from torch's client: the connect handshake and `store.set("k", "v")`.
    add(
        "tcpstore_server",
        "torch-set",
        hex("00cef7853c0102000000000000002f6b010000000000000076"),
    );

    let mut replies = vec![0];
    replies.extend(0x1234_5678u32.to_le_bytes());
    replies.push(1);
    replies.extend(5i64.to_le_bytes());
    replies.push(2);
    replies.extend(string(b"value"));
    replies.extend([3, 0]);
    replies.push(4);
    replies.extend(2i64.to_le_bytes());
    replies.extend(string(b"/a"));
    replies.extend(string(b"/b"));
    replies.push(5);
    replies.extend(1i64.to_le_bytes());
    replies.extend(string(b"item"));
    replies.extend([6, 1]);
    replies.push(7 + 9 * 2);
    replies.extend(string(b"x"));
    replies.extend(string(b""));
    replies.extend([8, 0]);
    add("tcpstore_client", "replies", replies);

    // Frame headers as `conn.rs` writes them: magic, flags (1 abort, 2 bye), length.
    // Frame headers as `socket/frame.rs` writes them: magic, flags, length, tag word, sequence.
    let frame = |flags: u32, len: u64, word: u64, seq: u64| {
        let mut b = 0x7C7C_0D47u32.to_le_bytes().to_vec();
        b.extend(flags.to_le_bytes());
        b.extend(len.to_le_bytes());
        b.extend(word.to_le_bytes());
        b.extend(seq.to_le_bytes());
        b
    };
    add(
        "socket_frame",
        "data",
        frame(0, 5, 0x00FF_FFFF_FF00_0002, 3),
    );
    add(
        "socket_frame",
        "confirmed",
        frame(8, 64, 0x0000_0000_0100_0004, 9),
    );
    add("socket_frame", "abort", frame(1, 12, 0, 0));
    add("socket_frame", "bye", frame(2, 0, 0, 0));
    add(
        "socket_frame",
        "probe",
        frame(4, 0, 0x00FF_FFFF_FF00_0006, 11),
    );
    add(
        "socket_frame",
        "ack",
        frame(16, 0, 0x0000_0000_0100_0003, 10),
    );

    // A hello as `handshake.rs` writes it: rank 0 greets rank 1 of 2.
    let mut hello = b"TCRSHEL3".to_vec();
    hello.extend(3u32.to_le_bytes());
    hello.extend(0u32.to_le_bytes());
    hello.extend(1u32.to_le_bytes());
    hello.resize(64, 0);
    hello.extend([1, 2, 1]);
    add("socket_hello", "rank0-to-1", hello);

    // A 100-byte message through 64-byte slots of a 4-slot FIFO.
    let mut shm = 100u16.to_le_bytes().to_vec();
    shm.extend([63, 3]);
    for (head, chunk) in [(1u64, 64u64), (2, 36)] {
        shm.extend(head.to_le_bytes());
        shm.extend(100u64.to_le_bytes());
        shm.extend(chunk.to_le_bytes());
    }
    add("shm_slot", "two-chunks", shm);

    add("init_records", "secret", [&[0u8][..], &[9; 16]].concat());
    add(
        "init_records",
        "addr-v4",
        [&[1u8][..], b"10.0.0.1:29500"].concat(),
    );
    add(
        "init_records",
        "addr-v6",
        [&[1u8][..], b"[fe80::1]:40000"].concat(),
    );
    // Host id, a CPU mask of 1024 bits with CPUs 0-3, no quota.
    let mut host = vec![2u8];
    host.extend(0xABCDu64.to_le_bytes());
    let mut mask = [0u8; 128];
    mask[0] = 0x0f;
    host.extend(mask);
    host.extend(0u64.to_le_bytes());
    add("init_records", "host", host.clone());
    // A split record: color, index, list hash, secret, IPv4-mapped address, port, host, CPUs.
    let mut rec = vec![3u8];
    rec.extend(0i64.to_le_bytes());
    rec.extend(1u64.to_le_bytes());
    rec.extend(0x1234u64.to_le_bytes());
    rec.extend([5; 16]);
    rec.extend([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2]);
    rec.extend(29500u16.to_le_bytes());
    rec.extend([0; 6]);
    rec.extend(&host[1..]);
    add("init_records", "split", rec);
    for (t, name, bytes) in ctran::fuzzing::rdma_and_ib_seeds() {
        add(t, &name, bytes);
    }

    let dumps = vec![
        dump(
            0,
            vec![rec_of(1, State::Completed), rec_of(2, State::Started)],
        ),
        dump(1, vec![rec_of(1, State::Completed)]),
    ];
    let one = serde_json::to_vec(&dumps[0]).expect("a dump serializes");
    let all = serde_json::to_vec(&dumps).expect("dumps serialize");
    add("colltrace_dump", "file", [&[0u8][..], &one].concat());
    let mut http = b"\x01HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n".to_vec();
    http.extend(&all);
    add("colltrace_dump", "endpoint", http);

    // Environment lines: selector byte, value (the selector picks a variable by index).
    let env: Vec<u8> = [
        "\u{0}1",
        "\u{1}64K",
        "\u{2}20ms",
        "\u{3}ring",
        "\u{4}0,1",
        "\u{5}yes",
    ]
    .join("\n")
    .into_bytes();
    add("cvars_env", "values", env);
    add(
        "cvars_file",
        "toml",
        b"\x00TORCHCOMMS_TRACE = true\nctran_chunk_bytes = \"1M\"\nlist = [1, 2]\n".to_vec(),
    );
    add(
        "cvars_file",
        "yaml",
        b"\x01TORCHCOMMS_TRACE: true\nctran_timeout: 30s\n".to_vec(),
    );
    out
}

fn string(s: &[u8]) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s);
    b
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digits"))
        .collect()
}

fn rec_of(seq: u64, state: State) -> Record {
    Record {
        id: seq,
        kind: RecordKind::Collective,
        seq,
        op: "all_reduce".into(),
        dtype: Some("f32".into()),
        count: Some(1024),
        in_bytes: 4096,
        out_bytes: 4096,
        root: None,
        peer: None,
        peers: None,
        reduce_op: Some("sum".into()),
        async_op: None,
        algorithm: Some("ring".into()),
        transport: None,
        timeout_ms: 1000,
        state,
        enqueued_ns: seq * 100,
        started_ns: seq * 100 + 1,
        ended_ns: if state.is_final() { seq * 100 + 50 } else { 0 },
        error: None,
        detail: None,
    }
}

fn dump(rank: usize, records: Vec<Record>) -> Dump {
    Dump {
        schema: SCHEMA_NAME.into(),
        version: SCHEMA_VERSION,
        rank,
        pid: 100 + rank as u32,
        host: "node0".into(),
        trigger: Trigger::Timeout,
        reason: Some("timed out".into()),
        dumped_at_ns: 10_000_000_000,
        endpoint: None,
        comms: vec![CommDump {
            name: "world".into(),
            instance: 1,
            rank,
            size: 2,
            global_ranks: vec![0, 1],
            transport: Some("socket".into()),
            state: CommState::Active,
            error: None,
            buffer_size: 16,
            dropped: 0,
            created_ns: 0,
            collective: SeqCounters {
                enqueued: 2,
                started: 2,
                completed: 1,
            },
            p2p: SeqCounters::default(),
            records,
        }],
    }
}

//! Writes the seed corpora of the fuzz targets into `fuzz/corpus/<target>/` (the committed
//! seeds): `cargo run -p rmm-checks --example write_seeds`. Every seed passes its checker
//! (`cargo test -p rmm-checks committed_corpora_pass`); one that does not is written all the
//! same, and the example then fails naming it.

use std::path::PathBuf;

use rmm_checks::ops::{encode_ops, BinResource, Kind, Op, Stream, WrongFree};

const MIB: usize = 1 << 20;

fn alloc(bytes: usize, stream: Stream) -> Op {
    Op::Allocate {
        bytes,
        alignment: 256,
        stream,
    }
}

fn free(pick: u16, stream: Stream) -> Op {
    Op::Free { pick, stream }
}

fn wrong(kind: WrongFree, stream: Stream) -> Op {
    Op::WrongFree { kind, stream }
}

/// The operation sequences every sub-allocator gets, by name.
fn sequences() -> Vec<(&'static str, Vec<Op>)> {
    use Stream::{Legacy as L, PerThread as P};
    let basics = vec![
        alloc(100, L),
        alloc(3000, L),
        alloc(256, L),
        alloc(70_000, L),
        wrong(WrongFree::WrongSize { pick: 1, how: 0 }, L),
        wrong(WrongFree::WrongSize { pick: 3, how: 4 }, L),
        wrong(WrongFree::UnknownPointer { pick: 1, how: 0 }, L),
        wrong(WrongFree::UnknownPointer { pick: 0, how: 1 }, L),
        wrong(WrongFree::UnknownPointer { pick: 3, how: 2 }, L),
        wrong(WrongFree::UnknownPointer { pick: 2, how: 3 }, L),
        free(1, L),
        wrong(WrongFree::DoubleFree { pick: 0 }, L),
        Op::FreeNull { stream: L },
        Op::Maintain,
        free(0, L),
        alloc(3000, L),
        free(0, L),
    ];
    let mut streams = Vec::new();
    for i in 0..12u16 {
        let s = if i % 2 == 0 { L } else { P };
        let t = if i % 3 == 0 { L } else { P };
        streams.push(alloc(256 << (i % 9), s));
        streams.push(alloc(1000 + 512 * usize::from(i), t));
        if i % 2 == 1 {
            streams.push(free(i, if i % 4 == 1 { L } else { P }));
        }
    }
    streams.push(wrong(WrongFree::DoubleFree { pick: 2 }, P));
    streams.push(Op::Maintain);
    let mut exhaust = Vec::new();
    for i in 0..12 {
        exhaust.push(alloc(
            (1 + i % 3) * MIB + 100,
            if i % 2 == 0 { L } else { P },
        ));
    }
    for i in 0..6 {
        exhaust.push(free(i, L));
    }
    exhaust.extend([alloc(900 * 1024, L), alloc(3 * MIB, P), Op::Maintain]);
    let faults = vec![
        Op::FailUpstream { count: 1 },
        alloc(5000, L),
        Op::FailUpstream { count: 8 },
        alloc(2 * MIB, L),
        alloc(100, L),
        alloc(0, P),
        alloc(usize::MAX, L),
        alloc(usize::MAX - 255, P),
        alloc(rmm_checks::ops::ABSURD_BYTES, L),
        Op::Maintain,
        free(0, P),
    ];
    vec![
        ("basics", basics),
        ("streams", streams),
        ("exhaust", exhaust),
        ("faults", faults),
    ]
}

/// A binning resource with bins of 256 B to 1 KiB (setup bytes `[8, 0]`) that gets bins while
/// blocks are live: the 600-byte block of issue 27 (from the 1 KiB bin, then a 768-byte bin
/// that is the upstream itself), a block of the upstream under a new fixed-size bin, wrong
/// frees across the moved routes, and 70 more bins between allocations and frees, past the 64
/// the lock-free routes hold.
fn late_bins() -> (&'static str, [u8; 2], Vec<Op>) {
    use Stream::{Legacy as L, PerThread as P};
    let add = |size, resource| Op::AddBin { size, resource };
    let mut ops = vec![
        alloc(600, L),
        alloc(100, P),
        alloc(5000, L),
        add(768, BinResource::Upstream),
        add(6000, BinResource::Fixed),
        wrong(WrongFree::WrongSize { pick: 0, how: 0 }, L),
        wrong(WrongFree::WrongSize { pick: 2, how: 3 }, L),
        wrong(WrongFree::UnknownPointer { pick: 0, how: 0 }, L),
        free(0, L),
        wrong(WrongFree::DoubleFree { pick: 0 }, L),
    ];
    let kinds = [
        BinResource::Fixed,
        BinResource::FixedSize,
        BinResource::Upstream,
    ];
    for k in 0..70usize {
        ops.push(add(256 * (k + 4) + 7, kinds[k % 3]));
        ops.push(alloc(300 + 200 * k, if k % 2 == 0 { L } else { P }));
        if k % 5 == 4 {
            ops.push(free(k as u16, L));
            ops.push(wrong(WrongFree::DoubleFree { pick: k as u16 }, L));
        }
    }
    ops.push(free(0, P));
    ("late-bins", [8, 0], ops)
}

/// The two setup bytes of each sequence's seed, by kind (see `rmm_checks::ops::Setup::decode`).
fn setups(kind: Kind) -> [[u8; 2]; 4] {
    match kind {
        // 1 MiB initial and 4 MiB more at most; unbounded; 4 MiB at most; 256 KiB, unbounded.
        Kind::Pool => [[16, 0x21], [0, 0], [0, 0x21], [4, 0]],
        // 8 MiB; 4 MiB + 300 bytes with size classes; 4 MiB; 2 MiB with size classes.
        Kind::Arena => [[7, 0], [0x83, 3], [3, 0], [0x81, 0]],
        // 4 KiB blocks, 4 per chunk; 1 MiB, 2 per chunk; 3 MiB, 3 per chunk; 300 B, 1 per chunk.
        Kind::FixedSize => [[4, 3], [6, 1], [7, 2], [2, 0]],
        // Bins 256 B .. 4 KiB and 3000 B; 1 KiB .. 32 KiB and 1 MiB; 2 KiB .. 64 KiB and
        // 200,000 B; 256 B .. 512 B.
        Kind::Binning => [[16, 1], [0x16, 3], [0x17, 2], [4, 0]],
    }
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let failed = std::cell::RefCell::new(Vec::new());
    let write = |target: &str, name: &str, data: &[u8]| {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), data).unwrap();
        if let Err(e) = rmm_checks::check_target(target, data) {
            failed
                .borrow_mut()
                .push(format!("{target}/seed-{name}: {e}"));
        }
    };
    for kind in Kind::ALL {
        for (i, (name, ops)) in sequences().into_iter().enumerate() {
            let mut data = setups(kind)[i].to_vec();
            data.extend(encode_ops(&ops).unwrap());
            write(kind.target(), name, &data);
            let stats = rmm_checks::ops::check(kind, &data).unwrap_or_default();
            println!("{}/seed-{name}: {stats}", kind.target());
        }
    }
    let (name, setup, ops) = late_bins();
    let mut data = setup.to_vec();
    data.extend(encode_ops(&ops).unwrap());
    write(Kind::Binning.target(), name, &data);
    if let Ok(stats) = rmm_checks::ops::check(Kind::Binning, &data) {
        println!("{}/seed-{name}: {stats}", Kind::Binning.target());
    }
    let logs: [(&str, &[u8]); 7] = [
        (
            "rmm-log",
            b"Thread,Time,Action,Pointer,Size,Stream\n\
              140210031454016,14:03:27.512345,allocate,0x7f3a1c000000,100,0\n\
              140210031454016,14:03:27.512400,allocate failure,(nil),1099511627776,0\n\
              140210031454017,14:03:27.513001,free,0x7f3a1c000000,100,0x2\n",
        ),
        (
            "crlf-bom-reordered",
            "\u{feff}Stream, Size ,Pointer,Action,Time,Thread,Extra\r\n\
             0x55d0c0a8e2f0,4096,0X7F3A1C000100,allocate,00:00:00:000001,1,x\r\n\
             \r\n\
             0,4096,7f3a1c000100,free,23:59:60.999999,18446744073709551615,\r\n"
                .as_bytes(),
        ),
        ("header-only", b"Thread,Time,Action,Pointer,Size,Stream"),
        (
            "bad-action",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,Free,0x1,1,0\n",
        ),
        (
            "bad-field-count",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,free,0x1,1\n",
        ),
        (
            "missing-column",
            b"Thread,Time,Action,Pointer,Size\n1,00:00:00.000000,free,0x1,1\n",
        ),
        (
            "invalid-utf8",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,free,0x\xff,1,0\n",
        ),
    ];
    for (name, log) in logs {
        write("csv_parser", name, log);
    }
    let sizes: [(&str, &str); 9] = [
        ("gib", "1GiB"),
        ("spaced-fraction", " 1.5 gib "),
        ("leading-dot", ".5KiB"),
        ("decimal-units", "512MB"),
        ("largest", "16777215.999999999999999999999TiB"),
        (
            "long-fraction",
            "0.0000000000009094947017729282379150390625TiB",
        ),
        ("overflow", "99999999999999999999 GiB"),
        ("not-a-unit", "12 parsecs"),
        ("exponent", "1e9"),
    ];
    for (name, text) in sizes {
        write("byte_size", name, text.as_bytes());
    }
    println!("seeds written under {}", root.display());
    let failed = failed.into_inner();
    assert!(
        failed.is_empty(),
        "seeds that fail their checker:\n{}",
        failed.join("\n")
    );
}

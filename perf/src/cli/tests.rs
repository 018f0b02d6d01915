use super::*;

#[test]
fn byte_suffixes() {
    assert_eq!(parse_bytes("8").unwrap(), 8);
    assert_eq!(parse_bytes("64K").unwrap(), 64 << 10);
    assert_eq!(parse_bytes("64m").unwrap(), 64 << 20);
    assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
    assert_eq!(parse_bytes("2MB").unwrap(), 2 << 20);
    assert_eq!(parse_bytes("16B").unwrap(), 16);
    assert!(parse_bytes("").is_err());
    assert!(parse_bytes("12X").is_err());
    assert!(parse_bytes("-1").is_err());
    assert!(parse_bytes("99999999999999999G").is_err());
}

#[test]
fn sizes_step_by_factor() {
    let a = Args::try_parse_from(["p", "-b", "8", "-e", "100", "-f", "3"]).unwrap();
    let s = Settings::from_args(a).unwrap();
    assert_eq!(s.sizes(), vec![8, 24, 72]);
    let a = Args::try_parse_from(["p", "-b", "1K", "-e", "1K"]).unwrap();
    assert_eq!(Settings::from_args(a).unwrap().sizes(), vec![1024]);
    let a = Args::try_parse_from(["p", "-b", "0", "-e", "4"]).unwrap();
    assert_eq!(Settings::from_args(a).unwrap().sizes(), vec![0, 1, 2, 4]);
}

#[test]
fn lists_and_all() {
    let a = Args::try_parse_from([
        "p",
        "--op",
        "all_reduce,gather",
        "-d",
        "all",
        "-o",
        "sum,max",
    ])
    .unwrap();
    let s = Settings::from_args(a).unwrap();
    assert_eq!(s.ops, vec![CollOp::AllReduce, CollOp::Gather]);
    assert_eq!(s.dtypes.len(), DataType::ALL.len());
    assert_eq!(s.redops, vec![ReduceOp::Sum, ReduceOp::Max]);
    let s = Settings::from_args(Args::try_parse_from(["p"]).unwrap()).unwrap();
    assert_eq!(s.ops.len(), CollOp::ALL.len());
    assert_eq!(s.dtypes, vec![DataType::F32]);
}

#[test]
fn algo_all_lists_every_algorithm_then_auto() {
    let a = Args::try_parse_from(["p", "--op", "broadcast,send_recv", "--algo", "all"]).unwrap();
    let s = Settings::from_args(a).unwrap();
    let names = |v: Vec<Option<String>>| -> Vec<String> {
        v.into_iter()
            .map(|x| x.unwrap_or_else(|| "-".into()))
            .collect()
    };
    assert_eq!(
        names(s.algos_for(CollOp::Broadcast).unwrap()),
        ["tree", "chain", "direct", "auto"]
    );
    assert_eq!(names(s.algos_for(CollOp::SendRecv).unwrap()), ["-"]);
    // One name: the ops that have it run with it, the others are skipped with the reason.
    let a = Args::try_parse_from(["p", "--algo", "Ring"]).unwrap();
    let s = Settings::from_args(a).unwrap();
    assert_eq!(names(s.algos_for(CollOp::AllGather).unwrap()), ["ring"]);
    let why = s.algos_for(CollOp::Broadcast).unwrap_err();
    assert!(why.contains("auto, tree, chain, direct"), "{why}");
    // A name no op has is an error that lists them.
    let a = Args::try_parse_from(["p", "--op", "broadcast", "--algo", "ring"]).unwrap();
    let e = Settings::from_args(a).unwrap_err().to_string();
    assert!(
        e.contains("--algo") && e.contains("broadcast: tree, chain, direct"),
        "{e}"
    );
    let a = Args::try_parse_from(["p", "--algo", "all", "--backend", "nccl"]).unwrap();
    assert!(Settings::from_args(a).is_err());
}

#[test]
fn iterations_shrink_for_large_sizes() {
    let a = Args::try_parse_from(["p", "-w", "3", "-i", "20", "--max-iter-bytes", "64M"]).unwrap();
    let s = Settings::from_args(a).unwrap();
    assert_eq!(s.iterations(0), (3, 20));
    assert_eq!(s.iterations(1 << 20), (3, 20));
    assert_eq!(s.iterations(16 << 20), (3, 4));
    assert_eq!(s.iterations(64 << 20), (1, 1));
    assert_eq!(s.iterations(1 << 30), (1, 1));
    let a = Args::try_parse_from(["p", "-w", "0", "-i", "5"]).unwrap();
    assert_eq!(Settings::from_args(a).unwrap().iterations(1 << 30), (0, 5));
}

#[test]
fn iterations_grow_to_the_floor_and_stay_under_the_cap() {
    let argv = [
        "p",
        "-w",
        "1",
        "-i",
        "8",
        "--min-iter-bytes",
        "64M",
        "--max-iter-bytes",
        "128M",
    ];
    let s = Settings::from_args(Args::try_parse_from(argv).unwrap()).unwrap();
    assert_eq!(s.iterations(0), (1, 8));
    assert_eq!(s.iterations(1 << 20), (1, 64));
    assert_eq!(s.iterations(4 << 20), (1, 16));
    assert_eq!(s.iterations(16 << 20), (1, 8));
    assert_eq!(s.iterations(32 << 20), (1, 4));
    assert_eq!(s.iterations(64 << 20), (1, 2));
    let a = Args::try_parse_from(["p", "-i", "5", "--min-iter-bytes", "1G"]).unwrap();
    assert_eq!(
        Settings::from_args(a).unwrap().iterations(1 << 20),
        (5, 1024)
    );
}

#[test]
fn trace_ab_times_one_combination_in_groups_of_four_blocks() {
    let parse = |argv: &[&str]| {
        let base = ["p", "--op", "all_reduce", "-b", "8", "--trace-ab"];
        let args: Vec<&str> = base.iter().chain(argv).copied().collect();
        Settings::from_args(Args::try_parse_from(args).unwrap())
    };
    let s = parse(&["-e", "8", "--ab-block", "100", "-i", "800"]).unwrap();
    assert_eq!((s.trace_ab, s.iters), (Some(100), 800));
    for (argv, name) in [
        (
            &["-e", "8", "--ab-block", "100", "-i", "900"][..],
            "--iters",
        ),
        (
            &["-e", "8", "--ab-block", "100", "-i", "400"][..],
            "--iters",
        ),
        (&["-e", "16", "-i", "8000"][..], "sizes"),
        (&["-e", "8", "-i", "8000", "--rounds", "3"][..], "--rounds"),
        (
            &["-e", "8", "-i", "8000", "--min-iter-bytes", "64M"][..],
            "--min-iter-bytes",
        ),
        (
            &["-e", "8", "-i", "8000", "--op", "broadcast"][..],
            "operations",
        ),
        (
            &["-e", "8", "-i", "8000", "-d", "f32,f64"][..],
            "element types",
        ),
        (
            &["-e", "8", "-i", "8000", "-o", "sum,max"][..],
            "reductions",
        ),
        (
            &["-e", "8", "-i", "8000", "--backend", "nccl"][..],
            "--backend",
        ),
    ] {
        let e = parse(argv).unwrap_err().to_string();
        assert!(e.contains(name), "{argv:?}: {e}");
    }
    let s = Settings::from_args(Args::try_parse_from(["p"]).unwrap()).unwrap();
    assert_eq!(s.trace_ab, None);
    // The A/A control is a setting of --trace-ab only.
    let s = parse(&["-e", "8", "--ab-block", "100", "-i", "800", "--ab-control"]).unwrap();
    assert!(s.ab_control);
    let e = Args::try_parse_from(["p", "--ab-control"]).unwrap_err();
    assert!(e.to_string().contains("--trace-ab"), "{e}");
}

#[test]
fn bad_values_name_the_argument() {
    for (argv, name) in [
        (["p", "--dtype", "f7"], "--dtype"),
        (["p", "-o", "mean"], "--redop"),
        (["p", "-e", "12X"], "--maxbytes"),
        (["p", "-f", "1"], "--stepfactor"),
        (["p", "-i", "0"], "--iters"),
        (["p", "-n", "0"], "--nranks"),
        (["p", "--op", "bogus"], "--op"),
        (["p", "--device", "tpu"], "--device"),
        (["p", "-c", "2"], "--check"),
        (["p", "--timeout", "0"], "--timeout"),
        (["p", "--rounds", "0"], "--rounds"),
        (["p", "--max-iter-bytes", "x"], "--max-iter-bytes"),
        (["p", "--min-iter-bytes", "x"], "--min-iter-bytes"),
    ] {
        let e = Args::try_parse_from(argv).unwrap_err().to_string();
        assert!(e.contains(name), "{argv:?}: {e}");
    }
    let a = Args::try_parse_from(["p", "-b", "1M", "-e", "1K"]).unwrap();
    let e = Settings::from_args(a).unwrap_err().to_string();
    assert!(e.contains("--minbytes"), "{e}");
}

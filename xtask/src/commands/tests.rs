use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};

use super::Cli;
use crate::run::Run;

fn parse(args: &[&str]) -> Result<Cli, String> {
    Cli::try_parse_from(args).map_err(|e| e.to_string())
}

fn refused(args: &[&str]) -> String {
    parse(args).err().unwrap_or_else(|| panic!("{args:?} parsed"))
}

#[test]
fn every_flag_and_command_is_described_and_usage_says_cargo_xtask() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in cmd.get_arguments().filter(|a| !["help", "version"].contains(&a.get_id().as_str())) {
            if a.get_help().is_none() {
                missing.push(format!("{path} --{}", a.get_id()));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            if sub.get_about().is_none() {
                missing.push(format!("{path} {}", sub.get_name()));
            }
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "cargo xtask", &mut missing);
    assert!(missing.is_empty(), "undescribed: {missing:?}");
    assert!(Cli::command().render_usage().to_string().contains("cargo xtask"));
    Cli::command().debug_assert();
}

#[test]
fn out_dir_and_kernels_are_the_kernel_set_of_every_stage() {
    for cmd in ["test", "check", "sanitize", "bench", "tune", "build"] {
        let cli = parse(&["xtask", cmd, "--out-dir", "/tmp/ks", "--device", "1"]).unwrap();
        assert_eq!(cli.command.kernel_dir(), Some(Path::new("/tmp/ks")), "{cmd}");
        let cx = Run::new(cli.device.clone(), cli.command.kernel_dir()).unwrap();
        assert_eq!((cx.kernels, cx.device.as_deref()), (PathBuf::from("/tmp/ks"), Some("1")), "{cmd}");
    }
    for cmd in ["test", "bench", "sanitize"] {
        let cli = parse(&["xtask", cmd, "--kernels", "/tmp/pre"]).unwrap();
        assert_eq!(cli.command.kernel_dir(), Some(Path::new("/tmp/pre")), "{cmd}");
    }
    // Only the commands that can load a prebuilt set have --kernels; clap says so.
    for cmd in ["check", "build", "iterate x", "tune"] {
        let mut args = vec!["xtask"];
        args.extend(cmd.split(' '));
        args.extend(["--kernels", "/tmp/pre"]);
        assert!(refused(&args).contains("--kernels"), "{cmd}");
    }
    assert!(parse(&["xtask", "test", "--kernels", "a", "--out-dir", "b"]).is_err());
    // The default is the `kernels` folder of the target dir, whatever sets it.
    let cx = Run::new(None, parse(&["xtask", "test"]).unwrap().command.kernel_dir()).unwrap();
    assert_eq!(cx.kernels, cx.target.join("kernels"));
}

#[test]
fn values_are_checked_while_parsing_by_the_launch_api_rules() {
    let err = |args: &[&str]| parse(args).err().unwrap_or_default();
    let e = err(&["xtask", "bench", "--shape", "1,2,3"]);
    assert!(e.contains("B,H,S,D"), "{e}");
    let e = err(&["xtask", "bench", "--shape", "1,1,128,80"]);
    assert!(e.contains("head dim is 80") && e.contains("[64, 96, 128, 192, 256]"), "{e}");
    let e = err(&["xtask", "profile", "--shape", "1,0,128,64"]);
    assert!(e.contains("at least 1"), "{e}");
    assert!(err(&["xtask", "test", "--gpus", "0"]).contains("(0,)"));
    assert!(err(&["xtask", "sanitize", "--gpus", ","]).contains("names no GPU"));
    assert!(err(&["xtask", "bench", "--dtype", "f32"]).contains("use f16, bf16 or e4m3"));
    assert!(err(&["xtask", "test", "--shard", "3/2"]).contains("I/N"));
    assert!(err(&["xtask", "build", "--define", "1X=2"]).contains("C identifier"));
    assert!(err(&["xtask", "build", "--jobs", "0"]).contains("--jobs"));
    assert!(err(&["xtask", "bench", "--gate-secs", "nan"]).contains("seconds"));
    assert!(err(&["xtask", "test", "--device", "first"]).contains("UUID"));
    let ok = parse(&["xtask", "bench", "--shape", "2,16,8192,128,causal", "--dtype", "f16,bf16"]).unwrap();
    let super::Command::Bench(b) = ok.command else { panic!("bench") };
    let opts = b.gate.options(&b.dtype.dtypes);
    assert_eq!((opts.shapes, opts.dtypes.as_str()), (vec!["2,16,8192,128,causal".to_string()], "f16,bf16"));
}

#[test]
fn the_gate_seed_is_decided_where_the_flag_is_parsed() {
    let seeded = parse(&["xtask", "bench", "--seed", "7"]).unwrap();
    let super::Command::Bench(b) = seeded.command else { panic!("bench") };
    assert_eq!(b.gate.options(&b.dtype.dtypes).gate().seed, 7);
}

#[test]
fn flags_that_cannot_work_are_refused_while_parsing() {
    let err = |args: &[&str]| parse(args).err().unwrap_or_default();
    let ci = err(&["xtask", "ci", "--gpu"]);
    assert!(ci.contains("--against") && ci.contains("Usage: cargo xtask ci"), "{ci}");
    assert!(err(&["xtask", "ci", "--gpu", "--against", "main"]).is_empty());
    assert!(err(&["xtask", "bench", "--self-test", "2"]).contains("0.005 to 0.5"));
    assert!(err(&["xtask", "bench", "--self-test", "nan"]).contains("0.005 to 0.5"));
    assert!(err(&["xtask", "bench", "--self-test"]).is_empty());
}

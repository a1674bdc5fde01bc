//! `cargo xtask ort-check [MODEL.onnx...]`: cuplan against onnxruntime on real models, from the repository
//! alone. Sets up its own virtualenv (`target/ort-venv`, the pinned `xtask/python/requirements.txt`; rebuilt
//! when that file changes), builds the `cuplan` binary in release, and runs `xtask/python/ort_check.py` per
//! model: seeded weights and inputs, onnxruntime's outputs against `cuplan run`'s, one line per output.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The usage text.
pub const USAGE: &str = "usage: cargo xtask ort-check [MODEL.onnx...] [--seed N] [--rtol R] [--dim NAME=VALUE]...
                              [--precision fp16|bf16] [--extra \"ARGS for cuplan run\"] [--python PYTHON3]
  default models: the four in models/; default --extra: \"--streams 4 --schedule random --seed 5\"
  --precision: plan cuplan in that precision and compare with onnxruntime's float16 run of the model
               (onnxconverter-common's conversion); default --rtol 1e-2 (fp16) or 5e-2 (bf16)";

/// The four models of `models/`, in report order.
const MODELS: [&str; 4] = ["resnet50", "mobilenet_v2", "googlenet", "bert_base"];

#[derive(Debug)]
struct Args {
    models: Vec<PathBuf>,
    seed: u64,
    rtol: f64,
    dims: Vec<String>,
    /// `fp16` or `bf16`: cuplan plans in it and onnxruntime runs the float16 conversion.
    precision: Option<String>,
    extra: String,
    python: String,
}

fn parse(args: &[String], root: &Path) -> Result<Option<Args>> {
    let mut a = Args {
        models: Vec::new(),
        seed: 0,
        rtol: 1e-4,
        dims: Vec::new(),
        precision: None,
        extra: "--streams 4 --schedule random --seed 5".into(),
        python: "python3".into(),
    };
    let mut rtol = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value\n{USAGE}")).cloned();
        match arg.as_str() {
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--seed" => a.seed = value("--seed")?.parse().context("--seed: not an integer")?,
            "--rtol" => rtol = Some(value("--rtol")?.parse().context("--rtol: not a number")?),
            "--precision" => match value("--precision")?.as_str() {
                p @ ("fp16" | "bf16") => a.precision = Some(p.to_string()),
                other => bail!("--precision: {other:?} is not fp16 or bf16\n{USAGE}"),
            },
            "--dim" => a.dims.push(value("--dim")?),
            "--extra" => a.extra = value("--extra")?,
            "--python" => a.python = value("--python")?,
            other if other.starts_with('-') => bail!("ort-check: unknown option {other:?}\n{USAGE}"),
            model => a.models.push(PathBuf::from(model)),
        }
    }
    // The issue's accuracy targets for half precision, unless the caller chose a tolerance.
    a.rtol = rtol.unwrap_or(match a.precision.as_deref() {
        Some("fp16") => 1e-2,
        Some(_) => 5e-2,
        None => a.rtol,
    });
    if let Some(p) = &a.precision {
        a.extra = format!("{} --precision {p}", a.extra);
    }
    if a.models.is_empty() {
        a.models = MODELS.iter().map(|m| root.join("models").join(format!("{m}.onnx"))).collect();
    }
    Ok(Some(a))
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("{what}: cannot start"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// The virtualenv's python, created or refreshed when the pinned requirements changed.
fn venv(root: &Path, python: &str) -> Result<PathBuf> {
    let dir = root.join("target").join("ort-venv");
    let py = dir.join("bin").join("python");
    let req = root.join("xtask").join("python").join("requirements.txt");
    let want = std::fs::read_to_string(&req).with_context(|| format!("reading {}", req.display()))?;
    let stamp = dir.join("requirements.installed");
    if py.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(py);
    }
    eprintln!("ort-check: setting up {} (pip install -r {})", dir.display(), req.display());
    run(Command::new(python).args(["-m", "venv", "--clear"]).arg(&dir), "python3 -m venv")?;
    run(
        Command::new(&py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"]).arg(&req),
        "pip install",
    )?;
    std::fs::write(&stamp, want).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(py)
}

/// Run the task.
pub fn main(args: &[String], root: &Path) -> Result<()> {
    let Some(a) = parse(args, root)? else { return Ok(()) };
    let py = venv(root, &a.python)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("ort-check: cargo build --release -p cuplan");
    run(Command::new(cargo).current_dir(root).args(["build", "--release", "--quiet", "-p", "cuplan"]), "cargo build")?;
    let cuplan = root.join("target").join("release").join("cuplan");
    let script = root.join("xtask").join("python").join("ort_check.py");
    let (mut passed, mut failed) = (0usize, Vec::new());
    for m in &a.models {
        println!("== {} ({})", m.display(), a.extra);
        let t0 = Instant::now();
        let mut c = Command::new(&py);
        c.arg(&script).arg(m).arg("--cuplan").arg(&cuplan);
        c.args(["--seed", &a.seed.to_string(), "--rtol", &a.rtol.to_string(), "--extra", &a.extra]);
        for d in &a.dims {
            c.args(["--dim", d]);
        }
        if a.precision.is_some() {
            c.arg("--ort-fp16");
        }
        let status = c.status().context("running ort_check.py")?;
        println!("   {:.1} s", t0.elapsed().as_secs_f64());
        if status.success() {
            passed += 1;
        } else {
            failed.push(m.display().to_string());
        }
    }
    println!(
        "models: {passed} agree, {} disagree{}",
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(" ({})", failed.join(", ")) }
    );
    if !failed.is_empty() {
        bail!("onnxruntime disagrees on {} model(s)", failed.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_four_models_and_options_parse() {
        let root = Path::new("/r");
        let a = parse(&[], root).unwrap().unwrap();
        assert_eq!(a.models.len(), 4);
        assert_eq!(a.models[0], Path::new("/r/models/resnet50.onnx"));
        let args: Vec<String> = ["m.onnx", "--seed", "3", "--dim", "batch=2", "--extra", "--streams 2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let a = parse(&args, root).unwrap().unwrap();
        assert_eq!(
            (a.models.len(), a.seed, a.dims.as_slice(), a.extra.as_str()),
            (1, 3, &["batch=2".to_string()][..], "--streams 2")
        );
        assert!(parse(&["--nope".to_string()], root).is_err());
        assert!(parse(&["--seed".to_string()], root).is_err());
    }

    #[test]
    fn precision_sets_the_tolerance_and_the_cuplan_flag() {
        let root = Path::new("/r");
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = parse(&args(&["--precision", "fp16"]), root).unwrap().unwrap();
        assert_eq!((a.rtol, a.extra.as_str()), (1e-2, "--streams 4 --schedule random --seed 5 --precision fp16"));
        let a = parse(&args(&["--precision", "bf16", "--extra", "--streams 1"]), root).unwrap().unwrap();
        assert_eq!((a.rtol, a.extra.as_str()), (5e-2, "--streams 1 --precision bf16"));
        let a = parse(&args(&["--rtol", "3e-3", "--precision", "fp16"]), root).unwrap().unwrap();
        assert_eq!(a.rtol, 3e-3);
        let a = parse(&[], root).unwrap().unwrap();
        assert_eq!((a.rtol, a.precision), (1e-4, None));
        let err = parse(&args(&["--precision", "fp8"]), root).unwrap_err();
        assert!(format!("{err}").contains("\"fp8\" is not fp16 or bf16"), "{err}");
    }
}

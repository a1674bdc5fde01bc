//! Loading a GRAPH argument: a `.json` file in our format, an `.onnx` model, or `-` for JSON on standard input.

use anyhow::{bail, Context, Result};
use graph_ir::ComputeGraph;
use graph_plan::{HostTensor, TensorMap};
use std::io::Read;
use std::path::Path;

/// Largest graph file read (hostile inputs fail with an error instead of exhausting memory).
pub const MAX_FILE_BYTES: u64 = 2 << 30;

/// Arguments shared by every command that reads a graph.
#[derive(clap::Args, Debug, Clone)]
pub struct GraphArgs {
    /// Graph file: `.json` (cuplan format), `.onnx`, or `-` for JSON on standard input.
    pub graph: String,
    /// Bind a symbolic dimension (an ONNX dim_param or a JSON named extent): NAME=VALUE (repeatable).
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    pub dims: Vec<String>,
}

fn read_limited(mut r: impl Read, what: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    r.by_ref().take(MAX_FILE_BYTES + 1).read_to_end(&mut buf).with_context(|| format!("reading {what}"))?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        bail!("{what} is larger than the limit of {MAX_FILE_BYTES} bytes");
    }
    Ok(buf)
}

/// Parse `NAME=VALUE` bindings.
pub fn parse_dims(dims: &[String]) -> Result<Vec<(String, usize)>> {
    dims.iter()
        .map(|d| {
            let (n, v) = d.split_once('=').with_context(|| format!("--dim {d:?}: expected NAME=VALUE"))?;
            let v: usize =
                v.trim().parse().with_context(|| format!("--dim {d:?}: VALUE must be a non-negative integer"))?;
            if n.trim().is_empty() {
                bail!("--dim {d:?}: NAME is empty");
            }
            Ok((n.trim().to_string(), v))
        })
        .collect()
}

/// A loaded graph with the weight values its file carried (ONNX initializers with data).
pub struct Loaded {
    /// The graph.
    pub graph: ComputeGraph,
    /// Weight values from the file, by tensor name.
    pub weights: TensorMap,
    /// A line about the source format (opset, producer), for `validate`.
    pub origin: Option<String>,
}

/// Load the graph named by `args`.
pub fn load_graph(args: &GraphArgs) -> Result<ComputeGraph> {
    Ok(load(args)?.graph)
}

/// Load the graph named by `args` with the weights its file carries.
pub fn load(args: &GraphArgs) -> Result<Loaded> {
    let dims = parse_dims(&args.dims)?;
    if args.graph == "-" {
        let bytes = read_limited(std::io::stdin().lock(), "standard input")?;
        let text = String::from_utf8(bytes).context("standard input is not UTF-8")?;
        let graph = json_graph(&text, &dims).context("standard input")?;
        return Ok(Loaded { graph, weights: TensorMap::new(), origin: None });
    }
    let path = Path::new(&args.graph);
    let file = std::fs::File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
    // The size first, so that an oversized file fails before 2 GiB of it are read into memory.
    if let Ok(meta) = file.metadata() {
        if meta.len() > MAX_FILE_BYTES {
            bail!("'{}' is larger than the limit of {MAX_FILE_BYTES} bytes ({} bytes)", path.display(), meta.len());
        }
    }
    let bytes = read_limited(file, &format!("'{}'", path.display()))?;
    let is_onnx = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
    let what = format!("'{}'", path.display());
    from_bytes(bytes, if is_onnx { Format::Onnx } else { Format::Json }, dims, &what, path.parent())
}

/// What a graph's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An ONNX `ModelProto`.
    Onnx,
    /// cuplan's JSON format.
    Json,
}

impl Format {
    /// The format of bytes whose source has no name: JSON when the first non-blank byte opens an object, else
    /// ONNX (a protobuf message never starts with `{`: that byte is field 15, wire type 3, which ONNX lacks).
    pub fn sniff(bytes: &[u8]) -> Format {
        match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            Some(b'{') => Format::Json,
            _ => Format::Onnx,
        }
    }
}

/// Load a graph from its bytes; `what` names the source in errors (`'model.onnx'`), `dir` is the folder ONNX
/// external data is read from (`None`: the model must carry all its data inline).
pub fn from_bytes(
    bytes: Vec<u8>,
    format: Format,
    dims: Vec<(String, usize)>,
    what: &str,
    dir: Option<&Path>,
) -> Result<Loaded> {
    if format == Format::Onnx {
        let mut opts = graph_onnx::ImportOptions::with_dims(dims);
        opts.external_data_dir = dir.map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d }.to_path_buf());
        let model = graph_onnx::import(&bytes, &opts).with_context(|| what.to_string())?;
        drop(bytes);
        return Ok(onnx_loaded(model));
    }
    let text = String::from_utf8(bytes).with_context(|| format!("{what} is not UTF-8 text"))?;
    let graph = json_graph(&text, &dims).with_context(|| what.to_string())?;
    Ok(Loaded { graph, weights: TensorMap::new(), origin: None })
}

/// An imported ONNX model as a [`Loaded`] graph with its weights and origin line.
fn onnx_loaded(model: graph_onnx::OnnxModel) -> Loaded {
    let mut weights = TensorMap::new();
    for w in &model.weights {
        weights.insert(w.name.clone(), HostTensor { dtype: w.dtype, shape: w.shape.clone(), data: w.bytes.to_vec() });
    }
    let s = &model.stats;
    let origin = format!(
        "onnx opset {} (ir {}, producer {:?}): {} nodes, {} folded at import, {} weights with data",
        model.opset,
        model.ir_version,
        model.producer,
        s.onnx_nodes,
        s.folded_nodes,
        model.weights.len()
    );
    Loaded { graph: model.graph, weights, origin: Some(origin) }
}

/// A JSON graph with its symbolic extents bound by `--dim`.
fn json_graph(text: &str, dims: &[(String, usize)]) -> graph_ir::GraphResult<ComputeGraph> {
    let dims = dims.iter().cloned().collect();
    graph_ir::json::from_json_with_dims(text, graph_ir::Limits::default(), &dims)
}

/// A model file read once, loaded again at any values of its symbolic dimensions: what a plan set loads its
/// members from (`--buckets`).
pub struct Source {
    bytes: Vec<u8>,
    format: Format,
    what: String,
    dir: Option<std::path::PathBuf>,
    /// An ONNX model decoded once (the members share the protobuf and initializer decoding).
    decoded: Option<graph_onnx::DecodedModel>,
}

impl Source {
    /// Read the file named by `args` (its `--dim` values are the caller's to pass to [`load_at`](Self::load_at)).
    pub fn read(args: &GraphArgs) -> Result<Source> {
        if args.graph == "-" {
            let bytes = read_limited(std::io::stdin().lock(), "standard input")?;
            return Ok(Source { bytes, format: Format::Json, what: "standard input".into(), dir: None, decoded: None });
        }
        let path = Path::new(&args.graph);
        let file = std::fs::File::open(path).with_context(|| format!("cannot open '{}'", path.display()))?;
        if let Ok(meta) = file.metadata() {
            if meta.len() > MAX_FILE_BYTES {
                bail!("'{}' is larger than the limit of {MAX_FILE_BYTES} bytes ({} bytes)", path.display(), meta.len());
            }
        }
        let what = format!("'{}'", path.display());
        let bytes = read_limited(file, &what)?;
        let is_onnx = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
        let dir = path.parent().map(|d| if d.as_os_str().is_empty() { Path::new(".") } else { d }.to_path_buf());
        let decoded = if is_onnx {
            let opts = graph_onnx::ImportOptions { external_data_dir: dir.clone(), ..Default::default() };
            Some(graph_onnx::DecodedModel::decode(&bytes, &opts).with_context(|| what.clone())?)
        } else {
            None
        };
        let format = if is_onnx { Format::Onnx } else { Format::Json };
        Ok(Source { bytes: if is_onnx { Vec::new() } else { bytes }, format, what, dir, decoded })
    }

    /// The graph alone with its symbols bound to `dims` (no copy of the weights' values: a set loads every
    /// member this way and the weights once).
    pub fn graph_at(&self, dims: &graph_plan::Dims) -> Result<ComputeGraph> {
        match &self.decoded {
            Some(d) => {
                let mut opts =
                    graph_onnx::ImportOptions::with_dims(dims.iter().map(|(k, v)| (k.clone(), *v)).collect::<Vec<_>>());
                opts.external_data_dir = self.dir.clone();
                opts.inline_folded = true;
                Ok(d.import(&opts).with_context(|| self.what.clone())?.graph)
            }
            None => Ok(self.load_at(dims)?.graph),
        }
    }

    /// The model with its symbols bound to `dims`. Folded constants stay constants whatever their size
    /// (`ImportOptions::inline_folded`): a set's members differ in them.
    pub fn load_at(&self, dims: &graph_plan::Dims) -> Result<Loaded> {
        let dims: Vec<(String, usize)> = dims.iter().map(|(k, v)| (k.clone(), *v)).collect();
        match &self.decoded {
            Some(d) => {
                let mut opts = graph_onnx::ImportOptions::with_dims(dims);
                opts.external_data_dir = self.dir.clone();
                opts.inline_folded = true;
                let model = d.import(&opts).with_context(|| self.what.clone())?;
                Ok(onnx_loaded(model))
            }
            None => from_bytes(self.bytes.clone(), self.format, dims, &self.what, self.dir.as_deref()),
        }
    }
}

//! Bucket specifications (`batch=1,2,4,8`, a grid over two symbols) and the typed errors of plan sets.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::PlanError;

/// Values of the symbolic dimensions, by name: one member of a set, or one request.
pub type Dims = BTreeMap<String, usize>;

/// Most symbols a set ranges over (one list, or a grid over two such as batch x seq).
pub const MAX_SYMBOLS: usize = 2;
/// Most members of one set (each is a whole plan, and exec-cuda captures one CUDA graph per member).
pub const MAX_MEMBERS: usize = 64;

/// The bucket values of one symbol, strictly ascending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolBuckets {
    /// The symbol (an ONNX dim_param or a JSON named extent).
    pub name: String,
    /// Its bucket values, strictly ascending, each at least 1.
    pub values: Vec<usize>,
}

/// What a set is planned for: one symbol's values, or the grid over two symbols' values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketSpec {
    /// The symbols, in the order they were given (the grid is row-major over them).
    pub symbols: Vec<SymbolBuckets>,
}

impl BucketSpec {
    /// Parse `NAME=V1,V2,...` arguments (one per symbol), then [`validate`](Self::validate).
    pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<BucketSpec, SetError> {
        let mut symbols = Vec::new();
        for a in args {
            let a = a.as_ref();
            let Some((name, list)) = a.split_once('=') else {
                return Err(SetError::InvalidBuckets {
                    symbol: a.to_string(),
                    detail: "expected NAME=V1,V2,... (e.g. batch=1,2,4,8)".into(),
                });
            };
            let name = name.trim().to_string();
            let mut values = Vec::new();
            for v in list.split(',') {
                let v = v.trim();
                if v.is_empty() {
                    return Err(SetError::InvalidBuckets { symbol: name, detail: format!("empty value in {list:?}") });
                }
                values.push(v.parse::<usize>().map_err(|_| SetError::InvalidBuckets {
                    symbol: name.clone(),
                    detail: format!("{v:?} is not a non-negative integer"),
                })?);
            }
            symbols.push(SymbolBuckets { name, values });
        }
        let spec = BucketSpec { symbols };
        spec.validate()?;
        Ok(spec)
    }

    /// Check the spec: 1 or 2 distinct non-empty symbol names, each with a non-empty, strictly ascending list of
    /// values >= 1, and at most [`MAX_MEMBERS`] members. Nothing is sorted or dropped silently.
    pub fn validate(&self) -> Result<(), SetError> {
        let err = |symbol: &str, detail: String| SetError::InvalidBuckets { symbol: symbol.to_string(), detail };
        if self.symbols.is_empty() {
            return Err(err("", "no bucket list given".into()));
        }
        if self.symbols.len() > MAX_SYMBOLS {
            return Err(err(
                &self.symbols[MAX_SYMBOLS].name,
                format!("a set ranges over at most {MAX_SYMBOLS} symbols (a list or a grid over two)"),
            ));
        }
        for (i, s) in self.symbols.iter().enumerate() {
            if s.name.is_empty() {
                return Err(err(&s.name, "the symbol name is empty".into()));
            }
            if self.symbols[..i].iter().any(|o| o.name == s.name) {
                return Err(err(&s.name, "the symbol is given twice".into()));
            }
            if s.values.is_empty() {
                return Err(err(&s.name, "the bucket list is empty".into()));
            }
            if s.values.contains(&0) {
                return Err(err(&s.name, "a bucket of 0 holds no request".into()));
            }
            for w in s.values.windows(2) {
                if w[0] == w[1] {
                    return Err(err(&s.name, format!("bucket {} is listed twice", w[0])));
                }
                if w[0] > w[1] {
                    return Err(err(&s.name, format!("buckets must ascend: {} comes before {}", w[0], w[1])));
                }
            }
        }
        let members = self.symbols.iter().try_fold(1usize, |n, s| n.checked_mul(s.values.len()));
        if members.is_none_or(|n| n > MAX_MEMBERS) {
            return Err(err(&self.symbols[0].name, format!("the grid has more than {MAX_MEMBERS} members")));
        }
        Ok(())
    }

    /// The members' dims, row-major over the symbols (the last symbol varies fastest), each merged over `fixed`.
    pub fn members(&self, fixed: &Dims) -> Vec<Dims> {
        let mut out = vec![fixed.clone()];
        for s in &self.symbols {
            out = out
                .into_iter()
                .flat_map(|d| {
                    s.values.iter().map(move |&v| {
                        let mut d = d.clone();
                        d.insert(s.name.clone(), v);
                        d
                    })
                })
                .collect();
        }
        out
    }

    /// The names of the symbols.
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.symbols.iter().map(|s| s.name.as_str())
    }
}

/// `batch=8,seq=128`, the way errors and reports name a member or request.
pub fn dims_label(d: &Dims) -> String {
    d.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Why a plan set could not be built, checked or run.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// A malformed bucket list (`--buckets`).
    #[error("--buckets {symbol}: {detail}")]
    InvalidBuckets {
        /// The symbol, or the argument when it has no `=`.
        symbol: String,
        /// What was wrong.
        detail: String,
    },
    /// A symbol the model does not have (no tensor's shape changes with it), or one given both as a bucket and
    /// as a fixed `--dim`.
    #[error("symbol '{symbol}': {detail}")]
    UnknownSymbol {
        /// The symbol.
        symbol: String,
        /// What was wrong.
        detail: String,
    },
    /// Loading the model at a member's dims failed.
    #[error("loading the model at {dims}: {source}")]
    Load {
        /// The member's dims.
        dims: String,
        /// The loader's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A weight whose shape changes with the symbols: one value by name cannot serve every member (a loader
    /// should keep such values constants of each member's graph).
    #[error("weight '{name}' changes with the buckets ({detail}, at {dims}): one value cannot serve every member")]
    VaryingWeight {
        /// The weight.
        name: String,
        /// The member where it differs.
        dims: String,
        /// How it differs.
        detail: String,
    },
    /// Planning a member failed.
    #[error("planning the bucket {dims}: {source}")]
    Member {
        /// The member's dims.
        dims: String,
        /// The planner's error.
        #[source]
        source: PlanError,
    },
    /// A request above the largest bucket (without chunking, or for a symbol that cannot be chunked).
    #[error("request {symbol}={value} is above the largest bucket {symbol}={largest}{hint}")]
    AboveLargest {
        /// The symbol.
        symbol: String,
        /// The request's value.
        value: usize,
        /// The largest bucket's value.
        largest: usize,
        /// How to serve it anyway, when there is a way.
        hint: String,
    },
    /// A request that does not fit the set: a missing or unknown symbol, a value of 0, a wrong tensor.
    #[error("request: {detail}")]
    Request {
        /// What was wrong.
        detail: String,
    },
    /// Padding a symbol could change the valid rows: `node` mixes values across its axis.
    #[error(
        "padding '{symbol}' is not safe: node '{node}' ({op}) {detail}; a request must then match a bucket \
         exactly, or the caller marks '{symbol}' safe to pad"
    )]
    NotPaddable {
        /// The symbol.
        symbol: String,
        /// The node that mixes across the symbol's axis.
        node: String,
        /// Its op.
        op: String,
        /// How it mixes.
        detail: String,
    },
    /// The set needs more memory than the budget allows.
    #[error("memory budget of {budget} bytes is too small for the largest bucket {dims}, which needs {needed} bytes")]
    Budget {
        /// The budget.
        budget: u64,
        /// What the largest bucket needs (pool, weights, io and host regions).
        needed: u64,
        /// The largest bucket.
        dims: String,
    },
    /// The backend failed running a member.
    #[error(transparent)]
    Exec(#[from] crate::ExecError),
    /// A malformed request-size histogram.
    #[error("histogram: {0}")]
    Histogram(String),
}

//! Running one launch: evaluate the kernel's program over values, reading its `Read` params from their buffers
//! and writing its `Write` params to theirs. Temporaries live in kernel-local scratch; views reinterpret.
//! The program is the only description used: no graph node is looked up.

use graph_plan::{Access, BufferRef, DType, ExecError, GroupKind, HostTensor, Kernel, Op, Region, Shape};
use std::collections::HashMap;
use std::sync::Arc;

use crate::attention;
use crate::ops::{self, Spec};
use crate::value::{Data, Val};

/// A CPU implementation of a custom kernel: its inputs in program order, returning its outputs.
pub type CustomFn = Arc<dyn Fn(&[HostTensor]) -> Result<Vec<HostTensor>, String> + Send + Sync>;

/// The byte regions of a prepared plan.
#[derive(Clone, Debug, Default)]
pub(crate) struct Memory {
    pub regions: [Vec<u8>; 4],
}

pub(crate) fn backend(message: String) -> ExecError {
    ExecError::Backend { backend: "sim", message }
}

impl Memory {
    pub fn bytes(&self, b: &BufferRef) -> Result<&[u8], String> {
        let r = &self.regions[b.region.index()];
        let (lo, hi) = (b.offset as usize, b.end() as usize);
        r.get(lo..hi).ok_or_else(|| format!("{b} lies outside region {} of {} bytes", b.region.name(), r.len()))
    }

    pub fn bytes_mut(&mut self, b: &BufferRef) -> Result<&mut [u8], String> {
        let r = &mut self.regions[b.region.index()];
        let len = r.len();
        let (lo, hi) = (b.offset as usize, b.end() as usize);
        r.get_mut(lo..hi).ok_or_else(|| format!("{b} lies outside region {} of {len} bytes", b.region.name()))
    }

    /// Copy `bytes` from `src` to `dst` (ranges may share a region).
    pub fn copy(&mut self, src: &BufferRef, dst: &BufferRef, bytes: u64) -> Result<(), String> {
        let n = bytes.min(src.bytes).min(dst.bytes);
        let s = BufferRef { bytes: n, ..*src };
        let d = BufferRef { bytes: n, ..*dst };
        self.bytes(&s)?;
        self.bytes(&d)?;
        if s.region == d.region {
            let r = &mut self.regions[s.region.index()];
            r.copy_within(s.offset as usize..s.end() as usize, d.offset as usize);
        } else {
            let tmp = self.bytes(&s)?.to_vec();
            self.bytes_mut(&d)?.copy_from_slice(&tmp);
        }
        Ok(())
    }
}

fn kerr(k: &Kernel, node: &str, op: &Op, msg: impl std::fmt::Display) -> ExecError {
    backend(format!("kernel {} node '{node}' ({}): {msg}", k.name, op.name()))
}

/// The unsupported-custom error for `kernel` (used at prepare and run).
pub(crate) fn missing_custom(k: &Kernel, node: &str, entry: &str) -> ExecError {
    ExecError::Unsupported {
        kernel: k.name.clone(),
        what: format!(
            "custom kernel '{entry}' (node '{node}') has no CPU implementation; register one with \
             SimExecutor::register_custom(\"{entry}\", ...)"
        ),
    }
}

/// Execute kernel `k` against `mem`.
pub(crate) fn run(k: &Kernel, mem: &mut Memory, customs: &HashMap<String, CustomFn>) -> Result<(), ExecError> {
    let mut env: Vec<Option<Val>> = vec![None; k.values.len()];
    for p in k.params.iter().filter(|p| p.access == Access::Read) {
        let v = k
            .values
            .get(p.value.index())
            .ok_or_else(|| backend(format!("kernel {}: param names unknown value {}", k.name, p.value)))?;
        let bytes =
            mem.bytes(&p.buffer).map_err(|e| backend(format!("kernel {} reading '{}': {e}", k.name, v.name)))?;
        let val = Val::load(v.dtype, v.shape.0.to_vec(), bytes)
            .map_err(|e| backend(format!("kernel {} reading '{}' from {}: {e}", k.name, v.name, p.buffer)))?;
        env[p.value.index()] = Some(val);
    }
    // A fused attention kernel never forms its scores: its chain runs as one online-softmax pass.
    let attn = if k.kind == GroupKind::Attention {
        Some(attention::chain(k).map_err(|e| backend(format!("kernel {}: {e}", k.name)))?)
    } else {
        None
    };
    for (idx, ins) in k.body.iter().enumerate() {
        if attn.is_some_and(|c| c.skipped(idx)) {
            continue;
        }
        let fused = attn.is_some_and(|c| c.m2 == idx);
        let mut args: Vec<&Val> = Vec::with_capacity(ins.inputs.len());
        for &i in ins.inputs.iter().filter(|_| !fused) {
            let v = env.get(i.index()).and_then(Option::as_ref).ok_or_else(|| {
                kerr(k, &ins.node, &ins.op, format!("input value {i} is neither a read param nor computed earlier"))
            })?;
            args.push(v);
        }
        let specs: Vec<Spec<'_>> = ins
            .outputs
            .iter()
            .map(|&o| {
                k.values
                    .get(o.index())
                    .map(|v| Spec { dtype: v.dtype, shape: &v.shape.0 })
                    .ok_or_else(|| kerr(k, &ins.node, &ins.op, format!("unknown output value {o}")))
            })
            .collect::<Result<_, _>>()?;
        let outs = match &ins.op {
            _ if fused => {
                let c = attn.as_ref().ok_or_else(|| kerr(k, &ins.node, &ins.op, "no chain"))?;
                vec![attention::run(k, c, &env).map_err(|e| kerr(k, &ins.node, &ins.op, e))?]
            }
            Op::Custom(c) => {
                let f = customs.get(&c.entry).ok_or_else(|| missing_custom(k, &ins.node, &c.entry))?;
                let host: Vec<HostTensor> = args
                    .iter()
                    .map(|v| to_host(v))
                    .collect::<Result<_, _>>()
                    .map_err(|e| kerr(k, &ins.node, &ins.op, e))?;
                let res = f(&host)
                    .map_err(|e| kerr(k, &ins.node, &ins.op, format!("custom kernel '{}' failed: {e}", c.entry)))?;
                if res.len() != specs.len() {
                    return Err(kerr(
                        k,
                        &ins.node,
                        &ins.op,
                        format!("custom kernel '{}' returned {} outputs, declared {}", c.entry, res.len(), specs.len()),
                    ));
                }
                res.iter()
                    .map(|t| Val::load(t.dtype, t.shape.0.to_vec(), &t.data))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| kerr(k, &ins.node, &ins.op, e))?
            }
            op if mixed(op, &args, &specs) => eval_mixed(op, &args, &specs).map_err(|e| kerr(k, &ins.node, op, e))?,
            op => ops::eval(op, &args, &specs).map_err(|e| kerr(k, &ins.node, op, e))?,
        };
        if outs.len() != ins.outputs.len() {
            return Err(kerr(
                k,
                &ins.node,
                &ins.op,
                format!("made {} outputs, program declares {}", outs.len(), ins.outputs.len()),
            ));
        }
        for ((v, spec), &o) in outs.into_iter().zip(&specs).zip(&ins.outputs) {
            if v.dtype != spec.dtype || v.shape != spec.shape {
                return Err(kerr(
                    k,
                    &ins.node,
                    &ins.op,
                    format!("computed {} {:?}, program declares {} {:?}", v.dtype, v.shape, spec.dtype, spec.shape),
                ));
            }
            env[o.index()] = Some(v);
        }
    }
    for p in k.params.iter().filter(|p| p.access == Access::Write) {
        let name = k.values.get(p.value.index()).map_or("?", |v| v.name.as_ref());
        let v = env
            .get(p.value.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| backend(format!("kernel {}: written value '{name}' is never computed", k.name)))?;
        let out = mem.bytes_mut(&p.buffer).map_err(|e| backend(format!("kernel {} writing '{name}': {e}", k.name)))?;
        v.store(out).map_err(|e| backend(format!("kernel {} writing '{name}' to {}: {e}", k.name, p.buffer)))?;
    }
    Ok(())
}

fn to_host(v: &Val) -> Result<HostTensor, String> {
    let mut data = vec![0u8; v.len() * v.dtype.size_bytes()];
    v.store(&mut data)?;
    Ok(HostTensor { dtype: v.dtype, shape: Shape::from(v.shape.clone()), data })
}

/// Every buffer a kernel touches, as the race detector sees it.
pub(crate) fn accesses(k: &Kernel) -> Vec<(BufferRef, Access)> {
    k.params.iter().map(|p| (p.buffer, p.access)).collect()
}

/// Regions that hold run-time results (poisoned before each run so stale bytes cannot pass for results).
pub(crate) const SCRATCH_REGIONS: [Region; 2] = [Region::Pool, Region::Host];

/// Whether an instruction is a mixed-precision node (graph-ir's `Node::store`): an op that may store mixed
/// dtypes whose float operands and outputs do not share one dtype.
fn mixed(op: &Op, args: &[&Val], specs: &[Spec<'_>]) -> bool {
    if !op.stores_mixed() {
        return false;
    }
    let mut floats = args.iter().map(|a| a.dtype).chain(specs.iter().map(|s| s.dtype)).filter(|d| d.is_float());
    let first = floats.next();
    floats.any(|d| Some(d) != first)
}

/// The numeric rule for a mixed node: its float operands widened exactly to f32, the op computed in f32, each
/// float output rounded once to its own dtype.
fn eval_mixed(op: &Op, args: &[&Val], specs: &[Spec<'_>]) -> Result<Vec<Val>, String> {
    let widen = |v: &Val| if v.dtype.is_float() { Val { dtype: DType::F32, ..v.clone() } } else { v.clone() };
    let wide: Vec<Val> = args.iter().map(|v| widen(v)).collect();
    let refs: Vec<&Val> = wide.iter().collect();
    let f32_specs: Vec<Spec<'_>> = specs
        .iter()
        .map(|s| Spec { dtype: if s.dtype.is_float() { DType::F32 } else { s.dtype }, shape: s.shape })
        .collect();
    let outs = ops::eval(op, &refs, &f32_specs)?;
    outs.into_iter()
        .zip(specs)
        .map(|(v, s)| match (&v.data, s.dtype.is_float()) {
            // An f32 output is the f32 result as it is; a half one is rounded once.
            (Data::F(x), true) if s.dtype != DType::F32 => Ok(Val::from_f(s.dtype, v.shape.clone(), x.to_vec())),
            _ => Ok(v),
        })
        .collect()
}

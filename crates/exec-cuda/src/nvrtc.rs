//! The NVRTC compile layer: CUDA C source -> PTX, with options fixed for exactness and a per-plan cache.
//!
//! NVRTC is a CPU library: this layer works on machines without a GPU (CI installs the library with
//! `.ci/install-nvrtc.sh`), which is how CI proves that every generated kernel compiles.
//!
//! The cache keys on the exact (source, options) pair through a `HashMap`, which hashes the pair and compares it
//! in full on a hash match, so two different kernels can never share an entry; identical kernels (the same fused
//! pattern at the same shapes, repeated through a model) compile once.
//!
//! A cache may also keep its entries in a directory (`CompileCache::with_dir`, or `CUPLAN_PTX_CACHE` through
//! `CompileCache::from_env`): `<hash>.cu` holds the options and the source, `<hash>.ptx` the result, and an entry
//! is used only when its `.cu` matches exactly. PTX compiled on a CPU-only machine can so be carried to a GPU
//! machine that has a driver but no NVRTC.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::CompileError;

use crate::error::{check_identifier, CudaError, CudaResult};

/// NVRTC options. The defaults target sm_90 and keep IEEE single precision: no FMA contraction, precise division
/// and square root, denormals kept, so that the GPU's numbers stay close to the simulator's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Virtual or real architecture, e.g. `sm_90` (PTX is emitted for it).
    pub arch: String,
    /// Allow multiply-add contraction (`--fmad`); off by default for exactness.
    pub fmad: bool,
    /// C++ dialect, e.g. `c++17`.
    pub std: String,
    /// Emit line information for profilers (`-lineinfo`).
    pub line_info: bool,
    /// Further raw options, appended last.
    pub extra: Vec<String>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self { arch: "sm_90".to_owned(), fmad: false, std: "c++17".to_owned(), line_info: false, extra: Vec::new() }
    }
}

impl CompileOptions {
    /// The defaults for another architecture, e.g. `CompileOptions::for_arch("sm_80")`.
    #[must_use]
    pub fn for_arch(arch: &str) -> Self {
        Self { arch: arch.to_owned(), ..Self::default() }
    }

    /// The command-line options handed to NVRTC, in order.
    #[must_use]
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--gpu-architecture={}", self.arch),
            format!("--std={}", self.std),
            // Functions without an execution-space qualifier are device functions: generated helpers need none.
            "--device-as-default-execution-space".to_owned(),
            format!("--fmad={}", self.fmad),
            "--prec-div=true".to_owned(),
            "--prec-sqrt=true".to_owned(),
            "--ftz=false".to_owned(),
        ];
        if self.line_info {
            args.push("--generate-line-info".to_owned());
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// A compiled kernel: PTX text and the program name it was compiled under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ptx {
    kernel: String,
    text: Arc<str>,
}

impl Ptx {
    /// The program (kernel) name given to [`compile`].
    #[must_use]
    pub fn kernel(&self) -> &str {
        &self.kernel
    }

    /// The PTX assembly.
    #[must_use]
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The `.target` line's architecture, e.g. `sm_90`.
    #[must_use]
    pub fn target(&self) -> Option<&str> {
        self.text.lines().find_map(|l| {
            l.trim().strip_prefix(".target").map(|rest| rest.trim().split(',').next().unwrap_or("").trim())
        })
    }

    /// The names of the `.entry` points (the `extern "C" __global__` functions).
    #[must_use]
    pub fn entries(&self) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l.strip_prefix(".visible .entry ").or_else(|| l.strip_prefix(".entry "))?;
                Some(rest.split(|c: char| c == '(' || c.is_whitespace()).next().unwrap_or(rest))
            })
            .collect()
    }
}

impl fmt::Display for Ptx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Compiles `source` to PTX under the program name `kernel` (NVRTC's log lines start with it), uncached.
///
/// # Errors
/// [`CudaError::InvalidName`] when `kernel` is not a C identifier; [`CudaError::NvrtcUnavailable`] when NVRTC
/// cannot be loaded; [`CudaError::Compile`] with NVRTC's log when the source does not compile.
pub fn compile(kernel: &str, source: &str, options: &CompileOptions) -> CudaResult<Ptx> {
    check_identifier("kernel", kernel)?;
    crate::probe::nvrtc_availability()?;
    compile_uncached(kernel, source, options)
}

/// The compile itself, once `probe` has found NVRTC working; it checks what would make cudarc panic.
fn compile_uncached(kernel: &str, source: &str, options: &CompileOptions) -> CudaResult<Ptx> {
    check_identifier("kernel", kernel)?;
    if !crate::ffi::nvrtc_lib_present() {
        return Err(CudaError::NvrtcUnavailable { reason: "libnvrtc cannot be loaded".to_owned() });
    }
    // cudarc panics on an interior NUL (CString); report it as what it is, a broken source.
    if let Some(pos) = source.find('\0') {
        return Err(CudaError::Compile {
            kernel: kernel.to_owned(),
            log: format!("the source contains a NUL byte at offset {pos}"),
        });
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: options.to_args(),
        name: Some(format!("{kernel}.cu")),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let result = crate::probe::guard("NVRTC", || cudarc::nvrtc::compile_ptx_with_opts(source, opts))
        .map_err(|reason| CudaError::NvrtcUnavailable { reason })?;
    tracing::debug!(kernel, elapsed_ms = started.elapsed().as_secs_f64() * 1e3, "nvrtc compile");
    let ptx = result.map_err(|e| compile_error(kernel, e))?;
    Ok(Ptx { kernel: kernel.to_owned(), text: Arc::from(ptx.to_src()) })
}

fn compile_error(kernel: &str, e: CompileError) -> CudaError {
    match e {
        CompileError::CompileError { log, .. } => {
            CudaError::Compile { kernel: kernel.to_owned(), log: log.to_string_lossy().trim_end().to_owned() }
        }
        other => CudaError::Compile {
            kernel: kernel.to_owned(),
            log: format!("NVRTC failed outside compilation: {other:?}"),
        },
    }
}

/// Hit and miss counts of a [`CompileCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered from memory.
    pub hits: u64,
    /// Lookups answered from the cache directory.
    pub disk_hits: u64,
    /// Lookups that ran NVRTC.
    pub misses: u64,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<(String, CompileOptions), Arc<str>>,
    stats: CacheStats,
}

/// Compiles each distinct (source, options) pair once. Shareable between threads.
#[derive(Default)]
pub struct CompileCache {
    inner: Mutex<CacheInner>,
    dir: Option<PathBuf>,
}

/// FNV-1a over the options and the source: a stable file name for a cache entry (its `.cu` confirms the match).
fn stable_hash(source: &str, options: &CompileOptions) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in options.to_args().join("\n").bytes().chain([0xff]).chain(source.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn entry_text(source: &str, options: &CompileOptions) -> String {
    format!("// nvrtc options: {}\n{source}", options.to_args().join(" "))
}

impl fmt::Debug for CompileCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompileCache").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl CompileCache {
    /// An empty cache.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache that also reads and writes its entries under `dir` (created when first written).
    #[must_use]
    pub fn with_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: Some(dir.into()), ..Self::default() }
    }

    /// [`CompileCache::with_dir`] on `$CUPLAN_PTX_CACHE` when it is set, else [`CompileCache::new`].
    #[must_use]
    pub fn from_env() -> Self {
        match std::env::var_os("CUPLAN_PTX_CACHE") {
            Some(d) if !d.is_empty() => Self::with_dir(d),
            _ => Self::new(),
        }
    }

    fn disk_lookup(dir: &Path, source: &str, options: &CompileOptions) -> Option<Arc<str>> {
        let stem = format!("{:016x}", stable_hash(source, options));
        let cu = std::fs::read_to_string(dir.join(format!("{stem}.cu"))).ok()?;
        if cu != entry_text(source, options) {
            return None;
        }
        std::fs::read_to_string(dir.join(format!("{stem}.ptx"))).ok().map(Arc::from)
    }

    fn disk_store(dir: &Path, source: &str, options: &CompileOptions, ptx: &str) {
        let stem = format!("{:016x}", stable_hash(source, options));
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(dir)?;
            // PTX first: a reader that finds the .cu finds the PTX too.
            std::fs::write(dir.join(format!("{stem}.ptx")), ptx)?;
            std::fs::write(dir.join(format!("{stem}.cu")), entry_text(source, options))
        };
        if let Err(e) = write() {
            tracing::warn!(dir = %dir.display(), error = %e, "could not write a PTX cache entry");
        }
    }

    /// [`compile`], answered from the cache when the same source was compiled with the same options before. The
    /// returned [`Ptx`] carries `kernel` as its name either way. Failures are not cached.
    ///
    /// # Errors
    /// As [`compile`].
    pub fn compile(&self, kernel: &str, source: &str, options: &CompileOptions) -> CudaResult<Ptx> {
        check_identifier("kernel", kernel)?;
        let key = (source.to_owned(), options.clone());
        {
            let mut inner = self.lock();
            if let Some(text) = inner.entries.get(&key).cloned() {
                inner.stats.hits += 1;
                return Ok(Ptx { kernel: kernel.to_owned(), text });
            }
        }
        if let Some(text) = self.dir.as_deref().and_then(|d| Self::disk_lookup(d, source, options)) {
            let mut inner = self.lock();
            inner.stats.disk_hits += 1;
            inner.entries.insert(key, text.clone());
            return Ok(Ptx { kernel: kernel.to_owned(), text });
        }
        // Compile outside the lock: NVRTC takes tens of milliseconds and other threads may compile other kernels.
        let ptx = compile(kernel, source, options)?;
        if let Some(d) = self.dir.as_deref() {
            Self::disk_store(d, source, options, ptx.text());
        }
        let mut inner = self.lock();
        inner.stats.misses += 1;
        inner.entries.insert(key, ptx.text.clone());
        Ok(ptx)
    }

    /// Whether `source` compiled with `options` is already in memory or in the cache directory, so that
    /// [`CompileCache::compile`] would answer it without NVRTC.
    #[must_use]
    pub fn contains(&self, source: &str, options: &CompileOptions) -> bool {
        self.lock().entries.contains_key(&(source.to_owned(), options.clone()))
            || self.dir.as_deref().is_some_and(|d| Self::disk_lookup(d, source, options).is_some())
    }

    /// The counts so far.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// Number of distinct compiled (source, options) pairs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// True when nothing has been compiled.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        // A panic while holding the lock leaves only counters and complete entries behind: keep using them.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_args_are_exact_and_target_sm90() {
        let args = CompileOptions::default().to_args();
        assert_eq!(
            args,
            [
                "--gpu-architecture=sm_90",
                "--std=c++17",
                "--device-as-default-execution-space",
                "--fmad=false",
                "--prec-div=true",
                "--prec-sqrt=true",
                "--ftz=false"
            ]
        );
        let mut o = CompileOptions::for_arch("sm_80");
        o.line_info = true;
        o.extra.push("-DX=1".into());
        let args = o.to_args();
        assert_eq!(args[0], "--gpu-architecture=sm_80");
        assert_eq!(&args[args.len() - 2..], ["--generate-line-info", "-DX=1"]);
    }

    #[test]
    fn ptx_parsing() {
        let ptx = Ptx {
            kernel: "k".into(),
            text: Arc::from(
                "//\n.version 8.7\n.target sm_90\n.address_size 64\n\n\t// .globl\tadd\n.visible .entry add(\n\t.param .u64 add_param_0\n)\n{\n}\n.entry other()\n{}\n",
            ),
        };
        assert_eq!(ptx.target(), Some("sm_90"));
        assert_eq!(ptx.entries(), ["add", "other"]);
        assert_eq!(ptx.kernel(), "k");
    }

    #[test]
    fn disk_entries_are_used_only_when_their_source_matches() {
        let dir = std::env::temp_dir().join(format!("cuplan-ptx-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = CompileOptions::default();
        let src = "extern \"C\" __global__ void k() {}";
        // A pre-made entry (as carried from another machine): answered without NVRTC.
        CompileCache::disk_store(&dir, src, &opts, ".version 8.7\n.target sm_90\n.visible .entry k()\n{}\n");
        let cache = CompileCache::with_dir(&dir);
        let ptx = cache.compile("k", src, &opts).unwrap();
        assert_eq!(ptx.entries(), ["k"]);
        assert_eq!(cache.stats(), CacheStats { disk_hits: 1, ..CacheStats::default() });
        // Other options are another entry; a tampered .cu is not trusted.
        assert!(CompileCache::disk_lookup(&dir, src, &CompileOptions::for_arch("sm_80")).is_none());
        let stem = format!("{:016x}", stable_hash(src, &opts));
        std::fs::write(dir.join(format!("{stem}.cu")), "something else").unwrap();
        assert!(CompileCache::disk_lookup(&dir, src, &opts).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_names_are_rejected_before_nvrtc() {
        let cache = CompileCache::new();
        let err = cache.compile("bad name", "", &CompileOptions::default());
        assert!(matches!(err, Err(CudaError::InvalidName { what: "kernel", .. })));
        assert_eq!(cache.stats(), CacheStats::default());
    }
}

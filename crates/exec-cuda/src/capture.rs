//! CUDA graph capture over several streams, and replay of the instantiated graph.
//!
//! The recipe (CUDA's "cross-stream dependencies" rule for capture):
//! 1. begin capture on the main stream (thread-local mode, so that other threads' unrelated CUDA calls are not
//!    refused while this one captures);
//! 2. record a fork event on the main stream and make every side stream wait on it: that wait pulls the side
//!    stream into the same capture;
//! 3. enqueue the work (the plan's launches, copies, records and waits) on any of the streams;
//! 4. record a join event on each side stream and make the main stream wait on it, since a capture whose side
//!    streams are not joined back ends with `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`;
//! 5. end capture on the main stream and instantiate.
//!
//! If step 3 fails, the capture is still joined and ended (and the partial graph dropped), so the streams are left
//! usable, and the step's own error is returned.

use std::fmt;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

use crate::device::{Device, Event, Stream};
use crate::error::{driver, CudaError, CudaResult};

/// An instantiated CUDA graph, replayed on the main stream it was captured on.
pub struct Graph {
    inner: CudaGraph,
    main: Stream,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").field("main", &self.main).finish_non_exhaustive()
    }
}

impl Graph {
    /// Enqueues one replay on the main stream.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn launch(&self) -> CudaResult<()> {
        self.inner.launch().map_err(driver("cuGraphLaunch"))
    }

    /// Uploads the graph's resources so that the first replay costs no more than later ones.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn upload(&self) -> CudaResult<()> {
        self.inner.upload().map_err(driver("cuGraphUpload"))
    }

    /// The stream replays run on.
    #[must_use]
    pub fn stream(&self) -> &Stream {
        &self.main
    }
}

/// Captures everything `record` enqueues on `main` and `side` into one graph.
///
/// `record` receives the streams as one slice, `main` first, so that plan stream `i` is `streams[i]`.
///
/// # Errors
/// The error of `record`, if any; otherwise [`CudaError::Driver`] for a capture call that fails, or when the
/// capture turns out empty.
pub fn capture<F>(device: &Device, main: &Stream, side: &[Stream], record: F) -> CudaResult<Graph>
where
    F: FnOnce(&[Stream]) -> CudaResult<()>,
{
    // Events first: nothing but the captured work should be created inside the capture.
    let fork = device.event()?;
    let joins = side.iter().map(|_| device.event()).collect::<CudaResult<Vec<Event>>>()?;
    let mut streams = Vec::with_capacity(side.len() + 1);
    streams.push(main.clone());
    streams.extend(side.iter().cloned());

    main.cuda()
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(driver("cuStreamBeginCapture"))?;
    let forked = fork_sides(main, side, &fork);
    let recorded = forked.and_then(|()| record(&streams));
    // Join even after a failure: ending a capture with unjoined streams fails and leaves them in capture mode.
    let joined = join_sides(main, side, &joins);
    let ended =
        main.cuda().end_capture(CUgraphInstantiate_flags(0)).map_err(driver("cuStreamEndCapture/cuGraphInstantiate"));
    recorded?;
    joined?;
    let graph = ended?.ok_or_else(|| CudaError::Driver {
        call: "cuStreamEndCapture",
        detail: "the capture recorded no work".to_owned(),
    })?;
    tracing::debug!(streams = streams.len(), "captured CUDA graph");
    Ok(Graph { inner: graph, main: main.clone() })
}

/// Records `fork` on `main` and makes every side stream wait for it.
pub(crate) fn fork_sides(main: &Stream, side: &[Stream], fork: &Event) -> CudaResult<()> {
    main.record(fork)?;
    side.iter().try_for_each(|s| s.wait(fork))
}

/// Records one of `joins` on each side stream and makes `main` wait for it; keeps going after an error and returns
/// the first.
pub(crate) fn join_sides(main: &Stream, side: &[Stream], joins: &[Event]) -> CudaResult<()> {
    let mut first_err = None;
    for (s, ev) in side.iter().zip(joins) {
        // Keep joining after an error, so that as many streams as possible leave capture mode.
        if let Err(e) = s.record(ev).and_then(|()| main.wait(ev)) {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

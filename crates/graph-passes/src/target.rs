//! The target a plan is made for: the stream limit and the device profile. The pipeline driver derives it
//! once from its options and passes it to every pass that needs it (fusion's score and concurrency check, the
//! memory pass's ordered-reuse preference, the stream pass's cost model), so no pass re-derives either.

use serde::{Deserialize, Serialize};

use crate::device::DeviceProfile;

/// What the plan will run on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// Most streams the plan may use (>= 1); with 1, fusion cannot lose concurrency and every reuse is ordered.
    pub streams: usize,
    /// The device whose cost model the passes use.
    pub device: DeviceProfile,
}

impl Target {
    /// `streams` streams on `device`.
    pub fn new(streams: usize, device: DeviceProfile) -> Target {
        Target { streams, device }
    }
}

impl Default for Target {
    fn default() -> Self {
        Target { streams: 1, device: DeviceProfile::default() }
    }
}

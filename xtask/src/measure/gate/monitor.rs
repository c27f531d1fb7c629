//! NVML readings of the GPU being timed, looked up by the UUID CUDA reports
//! for it (nvidia-smi's and NVML's indices ignore `CUDA_VISIBLE_DEVICES`).
//! NVML is loaded at run time, so a machine without a driver builds and tests
//! xtask; there the readings are simply absent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::Clock;

pub struct Monitor {
    nvml: Nvml,
    uuid: String,
}

/// Clock-event reasons that mean the hardware slowed itself (not the software
/// power cap, which is the normal state under load): quads under them may be set aside.
pub const HARDWARE: &[&str] = &["hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"];

impl Monitor {
    /// `None` where NVML cannot be loaded or does not know the UUID.
    pub fn open(uuid: Option<&str>) -> Option<Monitor> {
        let uuid = uuid?.to_string();
        let nvml = Nvml::init().ok()?;
        nvml.device_by_uuid(uuid.as_str()).ok()?;
        Some(Monitor { nvml, uuid })
    }

    /// The clock-event (throttle) reasons active now, by name; empty when none
    /// or when the reading fails.
    pub fn reasons(&self) -> Vec<&'static str> {
        let bits = self.nvml.device_by_uuid(self.uuid.as_str()).and_then(|d| d.current_throttle_reasons());
        bits.map(|b| reason_names(b.bits())).unwrap_or_default()
    }
}

/// The SM clock of every GPU NVML sees, by UUID, every 250 ms on one thread
/// with one NVML handle, while a bench process runs; the process's report then
/// names which GPU it used.
pub struct ClockSampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<BTreeMap<String, Vec<f64>>>,
}

impl ClockSampler {
    pub fn start() -> ClockSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            let Ok(nvml) = Nvml::init() else { return samples };
            let count = nvml.device_count().unwrap_or(0);
            while !flag.load(Ordering::Relaxed) {
                for i in 0..count {
                    let Ok(dev) = nvml.device_by_index(i) else { continue };
                    if let (Ok(uuid), Ok(mhz)) = (dev.uuid(), dev.clock_info(Clock::SM)) {
                        samples.entry(uuid).or_default().push(f64::from(mhz));
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            samples
        });
        ClockSampler { stop, handle }
    }

    /// SM clock samples (MHz) by GPU UUID; empty without NVML.
    pub fn stop(self) -> BTreeMap<String, Vec<f64>> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// Names of the reasons set in an NVML clock-event bitmask.
pub fn reason_names(bits: u64) -> Vec<&'static str> {
    let table = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, "applications_clocks"),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display_clock"),
    ];
    table.iter().filter(|(r, _)| bits & r.bits() != 0).map(|(_, name)| *name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_bits_by_name() {
        // nvml.h: SwPowerCap 0x4, HwSlowdown 0x8, SwThermalSlowdown 0x20.
        assert_eq!(reason_names(0x4), ["sw_power_cap"]);
        assert_eq!(reason_names(0x4 | 0x8 | 0x20), ["sw_power_cap", "hw_slowdown", "sw_thermal"]);
        assert!(reason_names(0).is_empty());
        assert!(HARDWARE.iter().all(|h| reason_names(u64::MAX).contains(h)));
    }
}

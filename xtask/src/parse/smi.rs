//! Parser for `nvidia-smi -q -x`. Pure. The DOCTYPE line names a DTD that is
//! never fetched or resolved (quick-xml does not load external entities). Output
//! that is empty, cut short or not an `<nvidia_smi_log>` is an error.

use std::collections::BTreeMap;

use anyhow::Result;
use serde::{Deserialize, Serialize};

#[derive(Debug, Deserialize)]
struct RawLog {
    driver_version: Option<String>,
    cuda_version: Option<String>,
    #[serde(rename = "gpu", default)]
    gpus: Vec<RawGpu>,
}

#[derive(Debug, Deserialize)]
struct RawGpu {
    #[serde(rename = "@id")]
    id: Option<String>,
    uuid: Option<String>,
    product_name: Option<String>,
    product_architecture: Option<String>,
    persistence_mode: Option<String>,
    clocks: Option<RawClocks>,
    max_clocks: Option<RawClocks>,
    /// Current name; drivers before 535 call it `clocks_throttle_reasons`.
    clocks_event_reasons: Option<BTreeMap<String, String>>,
    clocks_throttle_reasons: Option<BTreeMap<String, String>>,
    temperature: Option<RawTemperature>,
    processes: Option<RawProcesses>,
}

#[derive(Debug, Deserialize)]
struct RawClocks {
    sm_clock: Option<String>,
    mem_clock: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawTemperature {
    gpu_temp: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RawProcesses {
    #[serde(rename = "process_info", default)]
    list: Vec<RawProcess>,
}

#[derive(Debug, Deserialize)]
struct RawProcess {
    pid: Option<String>,
    process_name: Option<String>,
    used_memory: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Smi {
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub bus_id: String,
    /// `GPU-…`, as CUDA's device UUID reads in kernel-ffi's DeviceInfo.
    pub uuid: Option<String>,
    pub name: String,
    pub architecture: Option<String>,
    pub persistence_mode: Option<bool>,
    pub sm_clock_mhz: Option<f64>,
    pub sm_clock_max_mhz: Option<f64>,
    pub mem_clock_mhz: Option<f64>,
    pub mem_clock_max_mhz: Option<f64>,
    pub temperature_c: Option<f64>,
    /// Clock-event reasons reported `Active`, without the `clocks_*_reason_` prefix.
    pub active_clock_reasons: Vec<String>,
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: Option<u32>,
    pub name: String,
    pub used_memory_mib: Option<f64>,
}

/// `"495 MHz"` → 495; `"N/A"`, empty or garbage → None.
pub fn value(text: Option<&str>) -> Option<f64> {
    text?.split_whitespace().next()?.parse().ok()
}

pub fn parse(xml: &str) -> Result<Smi> {
    let raw: RawLog = crate::parse::xml::from_str(xml, "nvidia_smi_log", "nvidia-smi -q -x output")?;
    let gpus = raw
        .gpus
        .into_iter()
        .map(|g| {
            let reasons = g.clocks_event_reasons.or(g.clocks_throttle_reasons).unwrap_or_default();
            let active_clock_reasons = reasons
                .into_iter()
                .filter(|(_, v)| v.trim() == "Active")
                .map(|(k, _)| {
                    let k = k.strip_prefix("clocks_event_reason_").unwrap_or(&k);
                    k.strip_prefix("clocks_throttle_reason_").unwrap_or(k).to_string()
                })
                .collect();
            Gpu {
                bus_id: g.id.unwrap_or_default(),
                uuid: g.uuid.map(|u| u.trim().to_ascii_lowercase().replacen("gpu-", "GPU-", 1)),
                name: g.product_name.unwrap_or_default(),
                architecture: g.product_architecture,
                persistence_mode: g.persistence_mode.map(|m| m.trim() == "Enabled"),
                sm_clock_mhz: value(g.clocks.as_ref().and_then(|c| c.sm_clock.as_deref())),
                sm_clock_max_mhz: value(g.max_clocks.as_ref().and_then(|c| c.sm_clock.as_deref())),
                mem_clock_mhz: value(g.clocks.as_ref().and_then(|c| c.mem_clock.as_deref())),
                mem_clock_max_mhz: value(g.max_clocks.as_ref().and_then(|c| c.mem_clock.as_deref())),
                temperature_c: value(g.temperature.as_ref().and_then(|t| t.gpu_temp.as_deref())),
                active_clock_reasons,
                processes: g
                    .processes
                    .map(|p| p.list)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|p| Process {
                        pid: p.pid.and_then(|s| s.trim().parse().ok()),
                        name: p.process_name.unwrap_or_default(),
                        used_memory_mib: value(p.used_memory.as_deref()),
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Smi { driver_version: raw.driver_version, cuda_version: raw.cuda_version, gpus })
}

impl Smi {
    /// Only the GPU with `uuid`: the one CUDA opened, whatever order nvidia-smi
    /// lists GPUs in (it ignores `CUDA_VISIBLE_DEVICES`).
    pub fn only(mut self, uuid: &str) -> Result<Smi> {
        let listed: Vec<String> =
            self.gpus.iter().map(|g| g.uuid.clone().unwrap_or_else(|| g.bus_id.clone())).collect();
        self.gpus.retain(|g| g.uuid.as_deref() == Some(uuid));
        if self.gpus.is_empty() {
            anyhow::bail!("nvidia-smi does not list the GPU CUDA opened ({uuid}); it lists [{}]", listed.join(", "));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: &str = include_str!("../../tests/data/h200/nvidia-smi-q-x.xml");

    #[test]
    fn parses_the_h200_capture() {
        let smi = parse(H200).unwrap();
        assert_eq!(smi.driver_version.as_deref(), Some("580.159.04"));
        assert_eq!(smi.cuda_version.as_deref(), Some("13.0"));
        let g = &smi.gpus[0];
        assert_eq!(g.name, "NVIDIA H200");
        assert_eq!(g.architecture.as_deref(), Some("Hopper"));
        assert_eq!(g.persistence_mode, Some(true));
        assert_eq!((g.sm_clock_mhz, g.sm_clock_max_mhz), (Some(495.0), Some(1980.0)));
        assert_eq!(g.mem_clock_max_mhz, Some(3201.0));
        assert_eq!(g.temperature_c, Some(41.0));
        assert_eq!(g.active_clock_reasons, vec!["gpu_idle"]);
        assert!(g.processes.is_empty());
    }

    #[test]
    fn older_throttle_names_processes_and_na() {
        let xml = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "http://example.invalid/never-fetched.dtd">
<nvidia_smi_log><driver_version>535.1</driver_version><cuda_version>12.2</cuda_version>
<gpu id="0"><product_name>NVIDIA L4</product_name><persistence_mode>Disabled</persistence_mode>
<clocks><sm_clock>N/A</sm_clock></clocks>
<clocks_throttle_reasons><clocks_throttle_reason_sw_thermal_slowdown>Active</clocks_throttle_reason_sw_thermal_slowdown>
<clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle></clocks_throttle_reasons>
<processes><process_info><pid>4242</pid><process_name>python3</process_name><used_memory>1024 MiB</used_memory></process_info></processes>
<future_field><x>1</x></future_field></gpu></nvidia_smi_log>"#;
        let g = &parse(xml).unwrap().gpus[0];
        assert_eq!(g.persistence_mode, Some(false));
        assert_eq!(g.sm_clock_mhz, None);
        assert_eq!(g.active_clock_reasons, vec!["sw_thermal_slowdown"]);
        assert_eq!(
            g.processes,
            vec![Process { pid: Some(4242), name: "python3".into(), used_memory_mib: Some(1024.0) }]
        );
    }

    #[test]
    fn only_keeps_the_gpu_cuda_opened() {
        let two = H200.replacen(
            "<gpu id=",
            "<gpu id=\"00000000:1B:00.0\"><uuid>GPU-11111111-2222-3333-4444-555555555555</uuid></gpu>\n<gpu id=",
            1,
        );
        let smi = parse(&two).unwrap();
        assert_eq!(smi.gpus.len(), 2);
        let cuda = "GPU-00000000-0000-0000-0000-000000000000";
        let only = smi.clone().only(cuda).unwrap();
        assert_eq!((only.gpus.len(), only.gpus[0].name.as_str()), (1, "NVIDIA H200"));
        let err = smi.only("GPU-99999999-0000-0000-0000-000000000000").unwrap_err().to_string();
        assert!(err.contains("GPU-11111111-2222-3333-4444-555555555555") && err.contains(cuda), "{err}");
    }

    #[test]
    fn doctype_inside_text_is_read_not_a_panic() {
        // quick-xml 0.38 reached `unreachable!` here, and preflight exited 101.
        let xml = H200.replacen("<driver_version>580", "<driver_version>5<!DOCTYPE x>80", 1);
        assert_eq!(parse(&xml).unwrap().driver_version.as_deref(), Some("580.159.04"));
    }

    #[test]
    fn absent_cut_short_or_foreign_output_is_an_error() {
        for (xml, says) in [
            ("", "no <nvidia_smi_log>"),
            ("No devices were found\n", "no <nvidia_smi_log>"),
            ("<?xml version=\"1.0\" ?>\n<ComputeSanitizerOutput/>", "root <ComputeSanitizerOutput>"),
            ("<nvidia_smi_log><gpu id=\"0\"><uuid>GPU-1</uuid>", "cut short"),
        ] {
            let err = format!("{:#}", parse(xml).unwrap_err());
            assert!(err.contains("nvidia-smi -q -x output") && err.contains(says), "{xml:?}: {err}");
        }
        let end = H200.find("</nvidia_smi_log>").unwrap();
        for (cut, _) in H200[..end].match_indices('\n') {
            assert!(parse(&H200[..cut]).is_err(), "cut at byte {cut} parsed");
        }
    }

    #[test]
    fn values_with_units() {
        assert_eq!(value(Some("1,980 MHz")), None, "thousands separators are not nvidia-smi's");
        assert_eq!(value(Some("79.97 W")), Some(79.97));
        assert_eq!(value(Some("N/A")), None);
        assert_eq!(value(None), None);
    }
}

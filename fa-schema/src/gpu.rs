//! Which GPU to open, as a flag or `FA_DEVICE` names it: a CUDA ordinal among
//! the visible devices (after `CUDA_VISIBLE_DEVICES`) or a device UUID as
//! `nvidia-smi -L` prints it. Pure, so that xtask refuses a bad `--device` by
//! the rule kernel-ffi opens devices with.

use std::fmt;
use std::str::FromStr;

/// A GPU to open: a CUDA ordinal or a device UUID. Parses from either form
/// (the default is ordinal 0) and is checked against the visible devices only
/// when opened.
///
/// ```
/// use fa_schema::gpu::Gpu;
///
/// assert_eq!("1".parse::<Gpu>(), Ok(Gpu::Ordinal(1)));
/// let uuid: Gpu = "GPU-62B9475D-0A1B-2C3D-4E5F-0123456789AB".parse().unwrap();
/// assert_eq!(uuid.to_string(), "GPU-62b9475d-0a1b-2c3d-4e5f-0123456789ab");
/// assert!("MIG-1".parse::<Gpu>().unwrap_err().contains("nvidia-smi -L"));
/// assert_eq!(Gpu::default(), Gpu::Ordinal(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpu {
    /// A CUDA ordinal among the visible devices (after `CUDA_VISIBLE_DEVICES`).
    Ordinal(usize),
    /// `GPU-` and 8-4-4-4-12 hex digits, lower case.
    Uuid(String),
}

impl Default for Gpu {
    fn default() -> Gpu {
        Gpu::Ordinal(0)
    }
}

impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gpu::Ordinal(n) => write!(f, "{n}"),
            Gpu::Uuid(u) => f.write_str(u),
        }
    }
}

impl FromStr for Gpu {
    type Err = String;

    fn from_str(s: &str) -> Result<Gpu, String> {
        let s = s.trim();
        if let Ok(n) = s.parse::<usize>() {
            return Ok(Gpu::Ordinal(n));
        }
        let lower = s.to_ascii_lowercase();
        let groups: Vec<&str> = lower.strip_prefix("gpu-").map(|r| r.split('-').collect()).unwrap_or_default();
        let sizes_ok = groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
        if sizes_ok && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit())) {
            return Ok(Gpu::Uuid(format!("GPU-{}", groups.join("-"))));
        }
        Err(format!(
            "device `{s}`: expected a CUDA ordinal (0, 1, …) or a UUID as `nvidia-smi -L` prints it \
             (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::Gpu;

    #[test]
    fn ordinals_and_uuids_parse_and_anything_else_says_what_is_expected() {
        assert_eq!("1".parse::<Gpu>(), Ok(Gpu::Ordinal(1)));
        let u = "GPU-62B9475D-0A1B-2C3D-4E5F-0123456789ab".parse::<Gpu>().unwrap();
        assert_eq!(u, Gpu::Uuid("GPU-62b9475d-0a1b-2c3d-4e5f-0123456789ab".into()));
        assert_eq!(u.to_string(), "GPU-62b9475d-0a1b-2c3d-4e5f-0123456789ab");
        for bad in ["", "-1", "GPU-62b9475d", "MIG-1234", "GPU-zzzzzzzz-0a1b-2c3d-4e5f-0123456789ab"] {
            let err = bad.parse::<Gpu>().unwrap_err();
            assert!(err.contains("CUDA ordinal") && err.contains("nvidia-smi -L"), "{bad}: {err}");
        }
    }
}

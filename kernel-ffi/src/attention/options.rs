//! What a forward call asks for (`Options`: mask, scale, splits, `KernelChoice`)
//! and the kernel families a `Variant` resolves to.

use crate::scores::{Scores, Window};
use crate::tensor::Dtype;

/// What a forward call asks for beyond its tensors. The default is
/// non-causal attention at scale 1/sqrt(head_dim), with the planner choosing
/// the splits and the entry.
///
/// ```
/// use kernel_ffi::{Options, Splits, Variant};
///
/// let mut opts = Options { causal: true, ..Options::default() };
/// opts.choice.variant = Variant::Portable;
/// assert_eq!((opts.scale, opts.splits), (None, Splits::Auto));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Apply the causal mask, bottom-right aligned: query row i sees keys
    /// j ≤ i + seqlen_k − seqlen_q (PyTorch's `causal_lower_right`).
    pub causal: bool,
    /// A sliding window around that diagonal (FlashAttention's `window_size`);
    /// the default is unbounded. With `causal` its right side is 0.
    pub window: Window,
    /// Logit softcapping: scores become c · tanh(score · scale / c) (Gemma 2).
    pub softcap: Option<f32>,
    /// The softmax scale; `None` is 1/sqrt(head_dim). Must be finite and positive.
    pub scale: Option<f32>,
    /// How many parts the keys are split into (a second, combine launch merges
    /// them): more CTAs for problems too small to fill the GPU.
    pub splits: Splits,
    /// Which compiled entry runs the call; the default leaves it to the planner.
    pub choice: KernelChoice,
}

impl Options {
    /// The mask and score modifier these options give `sq` query rows on `sk` keys.
    pub fn scores(&self, sq: usize, sk: usize) -> crate::Result<Scores> {
        Scores::resolve(self.causal, self.window, self.softcap, sq, sk)
    }
}

/// How many parts a forward call splits the keys into. Parses from `auto` or
/// a count ≥ 1, and displays the same way.
///
/// ```
/// use kernel_ffi::Splits;
///
/// assert_eq!("auto".parse::<Splits>(), Ok(Splits::Auto));
/// assert_eq!("4".parse::<Splits>(), Ok(Splits::Fixed(4)));
/// assert!("0".parse::<Splits>().unwrap_err().contains("use auto or a number ≥ 1"));
/// assert_eq!(Splits::Fixed(4).to_string(), "4");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Splits {
    /// Let the planner choose from SM count, shape and occupancy.
    #[default]
    Auto,
    /// Exactly this many (clamped so no split is empty).
    Fixed(u32),
}

impl std::str::FromStr for Splits {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Splits, String> {
        match s {
            "auto" => Ok(Splits::Auto),
            n => match n.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(Splits::Fixed(n)),
                _ => Err(format!("`{s}` is not a split count; use auto or a number ≥ 1")),
            },
        }
    }
}

/// `auto` or the count, as `FromStr` reads it.
impl std::fmt::Display for Splits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Splits::Auto => f.write_str("auto"),
            Splits::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// Which compiled entry runs a call; `Variant::Auto` and every `None` leave that
/// choice to the planner. The binaries take these fields as flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct KernelChoice {
    /// Kernel: auto (Hopper where loaded), portable or hopper.
    #[arg(long, default_value = "auto")]
    pub variant: Variant,
    /// Query rows per CTA (32, 64, 128 or 192) where the kernel has several; default: the planner's choice.
    ///
    /// An `_m64` entry beside the 128-row one (the planner's rule is `planner::prefer_m64`) or,
    /// Hopper non-causal D=64 and e4m3 D=128, the 192-row one (`planner::prefer_m192`), and
    /// the portable D=64 `_kg2` entry's 32 rows.
    #[arg(long)]
    pub block_m: Option<u32>,
    /// Key groups per CTA (1, or 2 where a `_kg2` entry is loaded); default: the planner's choice.
    ///
    /// The planner's rules are `planner::prefer_key_groups` (D=128) and
    /// `planner::prefer_narrow_key_groups` (D=64, 32 rows); a forced 2 without
    /// `--block-m` takes the `_kg2` entry's rows.
    #[arg(long)]
    pub key_groups: Option<u32>,
    /// Persistent CTAs (true/false) where the entry has a persistent twin; default: the planner's choice.
    ///
    /// Some entries are persistent only; one (Hopper non-causal D=64) has a persistent
    /// twin (`…_persistent`), chosen by `planner::prefer_persistent`.
    #[arg(long)]
    pub persistent: Option<bool>,
}

/// Which kernel family a call asks for (`--variant`); `Attention::resolve`
/// turns it into the `Family` that runs.
///
/// ```
/// use kernel_ffi::{Family, Variant};
///
/// let v: Variant = "hopper".parse().unwrap();
/// assert_eq!(v.family(), Some(Family::Hopper));
/// assert_eq!(Variant::Auto.family(), None); // decided per device and problem
/// assert!("wgmma".parse::<Variant>().unwrap_err().contains("auto, portable or hopper"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// The Hopper kernel where it is loaded (sm_90a), else the portable one.
    #[default]
    Auto,
    /// The sm_80+ mma.sync kernel.
    Portable,
    /// The sm_90a wgmma/TMA kernel; an error on other devices.
    Hopper,
}

impl Variant {
    /// Every variant, in the order `--help` lists them.
    pub const ALL: [Variant; 3] = [Variant::Auto, Variant::Portable, Variant::Hopper];

    /// `auto`, `portable` or `hopper`: what `FromStr` reads and `--variant` takes.
    pub fn name(self) -> &'static str {
        self.family().map_or("auto", Family::name)
    }

    /// The family this variant names; `None` for `Auto`.
    pub fn family(self) -> Option<Family> {
        match self {
            Variant::Auto => None,
            Variant::Portable => Some(Family::Portable),
            Variant::Hopper => Some(Family::Hopper),
        }
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Variant, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| format!("unknown kernel variant `{s}`: expected auto, portable or hopper"))
    }
}

/// A forward kernel family: what a `Variant` resolves to and what a launch ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Family {
    /// The sm_80+ mma.sync kernel (`Launched::default()`'s).
    #[default]
    Portable,
    /// The sm_90a wgmma/TMA kernel.
    Hopper,
}

impl Family {
    /// Both families.
    pub const ALL: [Family; 2] = [Family::Portable, Family::Hopper];

    /// As `--variant` and the reports (`EntryRecord::variant`) name it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Portable => "portable",
            Family::Hopper => "hopper",
        }
    }

    /// The name stem of its forward entries for (precision, head dim, scores),
    /// `flash_fwd[_hopper]_<precision>_d<D>[_causal|_local][_softcap]`, which
    /// the geometries' suffixes (`entry_names`) and `_persistent` extend.
    ///
    /// ```
    /// use kernel_ffi::{Band, Dtype, Family, Precision, Scores};
    ///
    /// let causal = Scores { band: Band::Causal, softcap: None };
    /// assert_eq!(Family::Hopper.entry_stem(Dtype::Bf16, 128, causal), "flash_fwd_hopper_bf16_d128_causal");
    /// assert_eq!(Family::Portable.entry_stem(Dtype::F16, 64, Scores::default()), "flash_fwd_f16_d64");
    /// let capped = Scores { band: Band::Local { left: 8, right: 0 }, softcap: Some(50.0) };
    /// assert_eq!(Family::Portable.entry_stem(Dtype::F16, 64, capped), "flash_fwd_f16_d64_local_softcap");
    /// let fp8 = Precision { input: Dtype::E4m3, output: Dtype::Bf16 };
    /// assert_eq!(Family::Portable.entry_stem(fp8, 128, causal), "flash_fwd_e4m3_bf16_d128_causal");
    /// ```
    pub fn entry_stem(self, precision: impl Into<Precision>, head_dim: usize, scores: Scores) -> String {
        let family = match self {
            Family::Portable => "flash_fwd",
            Family::Hopper => "flash_fwd_hopper",
        };
        format!("{family}_{}_d{head_dim}{}", precision.into().name(), scores.suffix())
    }

    /// The forward entries a stem may have, one per tile geometry, one-group
    /// entries first, fewest rows first where the stem names: `_m64` (64 rows),
    /// the stem itself (128 rows; Hopper non-causal D=64: 192), `_m192` (192
    /// rows), `_kg2` (two key groups). Each may also have a `_persistent` twin.
    pub fn entry_names(stem: &str) -> [String; 4] {
        ["_m64", "", "_m192", "_kg2"].map(|suffix| format!("{stem}{suffix}"))
    }
}

/// A forward call's element types, its inputs' and its output's: one dtype, or
/// e4m3 inputs with f16 or bf16 output. What an entry's name says of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Precision {
    /// q, k and v.
    pub input: Dtype,
    /// out.
    pub output: Dtype,
}

impl Precision {
    /// `input` with the output a call of it writes unless told otherwise: its
    /// own dtype, bf16 for e4m3 (FA3's).
    pub fn default_for(input: Dtype) -> Precision {
        Precision { input, output: if input.is_output() { input } else { Dtype::Bf16 } }
    }

    /// The precision of the entries that run a call of this one: its own
    /// where a kernel has entries of it for the call's head dim and scores
    /// (`native`), else e4m3 inputs run dequantised to the output's dtype
    /// (windows and softcap, which no e4m3 entry compiles in; the Hopper kernel
    /// at head dim 64).
    ///
    /// ```
    /// use kernel_ffi::{Dtype, Precision};
    ///
    /// let fp8 = Precision { input: Dtype::E4m3, output: Dtype::Bf16 };
    /// assert_eq!(fp8.run_as(|| true), fp8);
    /// assert_eq!(fp8.run_as(|| false), Precision::from(Dtype::Bf16));
    /// ```
    pub fn run_as(self, native: impl FnOnce() -> bool) -> Precision {
        if self.input == self.output || native() { self } else { Precision::from(self.output) }
    }

    /// `dequantise_e4m3_<output>`: the entry that turns e4m3 inputs into this
    /// precision's output dtype for calls that run dequantised.
    pub fn dequantise_entry(self) -> String {
        format!("dequantise_e4m3_{}", self.output.name())
    }

    /// `f16`, `bf16`, or `e4m3_<output>`.
    pub fn name(self) -> String {
        if self.input == self.output {
            self.input.name().to_string()
        } else {
            format!("{}_{}", self.input.name(), self.output.name())
        }
    }
}

impl From<Dtype> for Precision {
    fn from(dtype: Dtype) -> Precision {
        Precision { input: dtype, output: dtype }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_round_trip_and_unknown_ones_say_what_is_accepted() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>(), Ok(v));
        }
        let err = "wgmma".parse::<Variant>().unwrap_err();
        assert!(err.contains("`wgmma`") && err.contains("auto, portable or hopper"), "{err}");
        assert_eq!(Variant::default(), Variant::Auto);
    }

    #[test]
    fn hopper_entries_rows_and_threads_follow_their_names() {
        // A launch whose threads disagree with the entry's consumers traps on the
        // GPU (hopper_start); this catches a manifest entry declared wrong here.
        let m = crate::manifest::Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let mut seen = 0;
        for k in m.sources.iter().flat_map(|s| &s.kernels) {
            let Some(stem) = k.entry.strip_prefix("flash_fwd_hopper_") else { continue };
            let stem = stem.strip_suffix("_persistent").unwrap_or(stem);
            let launch = k.launch.unwrap();
            let rows = if stem.ends_with("_m64") {
                64
            } else if stem.ends_with("_m192") || matches!(stem, "f16_d64" | "bf16_d64") {
                192
            } else {
                128
            };
            assert_eq!((launch.block_m, launch.threads), (rows, 128 * (rows / 64 + 1)), "{}", k.entry);
            seen += 1;
        }
        assert!(seen > 100, "{seen} Hopper entries");
    }
}

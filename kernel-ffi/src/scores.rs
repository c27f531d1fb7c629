//! Which scores a forward call keeps and what they are before the softmax:
//! FlashAttention's `causal`, `window_size` and `softcap`, resolved per problem
//! into the mask policy and score modifier the kernels take as types
//! (`kernels/mask.cuh`), and the entry-name suffix that selects them.

use std::ops::Range;

use crate::error::{Result, invalid};

/// FlashAttention's `window_size = (left, right)`: the keys a query row sees
/// left and right of its diagonal, bottom-right aligned like causal (row i's
/// diagonal is key i + seqlen_k − seqlen_q); `None` is unbounded (FlashAttention's −1).
///
/// ```
/// use kernel_ffi::Window;
///
/// assert_eq!("256,0".parse::<Window>(), Ok(Window { left: Some(256), right: Some(0) }));
/// assert_eq!("-1,-1".parse::<Window>(), Ok(Window::default()));
/// assert!("4096".parse::<Window>().unwrap_err().contains("LEFT,RIGHT"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Keys before the diagonal a row sees.
    pub left: Option<u32>,
    /// Keys after the diagonal a row sees.
    pub right: Option<u32>,
}

impl Window {
    /// From FlashAttention's pair, −1 meaning unbounded; other negatives are errors.
    pub fn from_pair(left: i64, right: i64) -> std::result::Result<Window, String> {
        let side = |x: i64, name: &str| match x {
            -1 => Ok(None),
            x if x >= 0 => u32::try_from(x).map(Some).map_err(|_| format!("window {name} {x} is past 2^32 − 1")),
            x => Err(format!("window {name} is {x}; use −1 (unbounded) or a key count ≥ 0")),
        };
        Ok(Window { left: side(left, "left")?, right: side(right, "right")? })
    }
}

impl Window {
    /// FlashAttention's pair, −1 for unbounded; `None` for no window at all.
    pub fn pair(self) -> Option<[i64; 2]> {
        let side = |x: Option<u32>| x.map_or(-1, i64::from);
        (self != Window::default()).then(|| [side(self.left), side(self.right)])
    }

    /// A name part, `-w<left>_<right>` (`inf` for unbounded); empty for no window.
    pub fn label(self) -> String {
        let side = |x: Option<u32>| x.map_or_else(|| "inf".to_string(), |v| v.to_string());
        self.pair().map_or(String::new(), |_| format!("-w{}_{}", side(self.left), side(self.right)))
    }
}

/// `LEFT,RIGHT` as FlashAttention writes `window_size`, −1 for unbounded.
impl std::str::FromStr for Window {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Window, String> {
        let parse = |x: &str| x.trim().parse::<i64>().map_err(|_| format!("`{x}` is not a key count"));
        match s.split_once(',') {
            Some((l, r)) => Window::from_pair(parse(l)?, parse(r)?),
            None => Err(format!("window `{s}`: expected LEFT,RIGHT (key counts, −1 for unbounded), e.g. 4096,0")),
        }
    }
}

/// The keys each row sees, resolved for one problem's lengths: the mask policy
/// an entry compiles in (`NoMask`, `CausalMask`, `LocalMask` in mask.cuh).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Band {
    /// Every key.
    #[default]
    Full,
    /// Keys up to the diagonal.
    Causal,
    /// Keys from `left` before the diagonal to `right` after it, each at most
    /// the length past which it bounds nothing (seqlen_k, seqlen_q).
    Local {
        /// Keys before the diagonal.
        left: u32,
        /// Keys after it.
        right: u32,
    },
}

impl Band {
    /// The keys row `i` sees, `sq` query rows on `sk` keys.
    ///
    /// ```
    /// use kernel_ffi::Band;
    ///
    /// assert_eq!(Band::Causal.keys(0, 4, 6), 0..3); // bottom-right: row 0's diagonal is key 2
    /// assert_eq!(Band::Local { left: 1, right: 0 }.keys(3, 4, 6), 4..6);
    /// assert_eq!(Band::Local { left: 0, right: 0 }.keys(0, 8, 4), 0..0); // its diagonal is before key 0
    /// ```
    pub fn keys(self, i: usize, sq: usize, sk: usize) -> Range<usize> {
        let diag = i as i64 + sk as i64 - sq as i64; // row i's diagonal key
        let (lo, hi) = match self {
            Band::Full => (0, sk as i64 - 1),
            Band::Causal => (0, diag),
            Band::Local { left, right } => (diag - i64::from(left), diag + i64::from(right)),
        };
        let (lo, end) = (lo.clamp(0, sk as i64) as usize, (hi + 1).clamp(0, sk as i64) as usize);
        lo..end.max(lo)
    }

    /// The entry-name part of the mask: ``, `_causal` or `_local`.
    pub fn suffix(self) -> &'static str {
        match self {
            Band::Full => "",
            Band::Causal => "_causal",
            Band::Local { .. } => "_local",
        }
    }

    /// The window the `_local` entries read (FlashParams::window_left, _right); 0 elsewhere.
    pub fn window(self) -> (i32, i32) {
        match self {
            Band::Local { left, right } => (left as i32, right as i32),
            _ => (0, 0),
        }
    }
}

/// How a call's scores are formed: the band of keys and Gemma 2's logit
/// softcap (scores become c · tanh(score / c) after scaling).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Scores {
    /// The keys each row sees.
    pub band: Band,
    /// The cap c, finite and > 0; `None`: scores as they are.
    pub softcap: Option<f32>,
}

impl Scores {
    /// `causal`, `window` and `softcap` for `sq` query rows on `sk` keys. Causal
    /// bounds the right side at 0, as FlashAttention does; a side that bounds no
    /// row is unbounded, so a window that covers every key is no mask and one of
    /// (∞, 0) is causal. A softcap must be finite and positive (FlashAttention's
    /// 0, none, is `None`).
    ///
    /// ```
    /// use kernel_ffi::{Band, Scores, Window};
    ///
    /// let w = |left, right| Window { left, right };
    /// assert_eq!(Scores::resolve(true, w(None, None), None, 8, 8).unwrap().band, Band::Causal);
    /// assert_eq!(Scores::resolve(false, w(None, Some(0)), None, 8, 8).unwrap().band, Band::Causal);
    /// assert_eq!(Scores::resolve(false, w(Some(99), Some(99)), None, 8, 8).unwrap().band, Band::Full);
    /// assert_eq!(Scores::resolve(true, w(Some(2), Some(5)), None, 8, 8).unwrap().band, Band::Local { left: 2, right: 0 });
    /// assert!(Scores::resolve(false, w(None, None), Some(0.0), 8, 8).unwrap_err().to_string().contains("softcap"));
    /// ```
    pub fn resolve(causal: bool, window: Window, softcap: Option<f32>, sq: usize, sk: usize) -> Result<Scores> {
        if let Some(c) = softcap
            && !(c.is_finite() && c > 0.0)
        {
            invalid!("softcap is {c}; it must be finite and > 0 (leave it out for none)");
        }
        let right = if causal { Some(0) } else { window.right };
        // Row i's first key is i + (sk − sq) − left: every row starts at key 0 from
        // left ≥ sk − 1 on; its last is i + (sk − sq) + right: every row ends at
        // the last key from right ≥ sq − 1 on.
        let left = window.left.filter(|&l| (l as usize) < sk.saturating_sub(1));
        let right = right.filter(|&r| (r as usize) < sq.saturating_sub(1));
        let band = match (left, right) {
            (None, None) => Band::Full,
            (None, Some(0)) => Band::Causal,
            (left, right) => {
                // The kernels form a block's last row + diagonal + window (at most
                // seqlen_q + seqlen_k + a block of rows) in 32 bits.
                if sq as u64 + sk as u64 + 256 >= 1 << 31 {
                    invalid!(
                        "a window needs seqlen_q + seqlen_k + 256 < 2^31 (the kernels form row + diagonal ± window \
                         in 32 bits); they are {sq} and {sk}"
                    );
                }
                Band::Local { left: left.unwrap_or(sk as u32), right: right.unwrap_or(sq as u32) }
            }
        };
        Ok(Scores { band, softcap })
    }

    /// The entry-name part of mask and modifier, e.g. `_causal_softcap`.
    pub fn suffix(self) -> String {
        format!("{}{}", self.band.suffix(), if self.softcap.is_some() { "_softcap" } else { "" })
    }

    /// What the kernels take in FlashParams for softmax scale `scale`:
    /// (scale_log2, softcap_pre). With a softcap c the kernel forms
    /// tanh(score · scale / c), and the softmax scales that by c · log2 e.
    pub fn kernel_scales(self, scale: f32) -> (f32, f32) {
        let log2e = std::f32::consts::LOG2_E;
        match self.softcap {
            Some(c) => (c * log2e, scale / c),
            None => (scale * log2e, 0.0),
        }
    }

    /// Score `dot · scale` as the mask keeps it (f64, for the reference).
    pub fn modify(self, scaled: f64) -> f64 {
        match self.softcap {
            Some(c) => f64::from(c) * (scaled / f64::from(c)).tanh(),
            None => scaled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Row i sees key j by the definition, on every small shape and window.
    #[test]
    fn band_keys_follow_the_definition() {
        for (sq, sk) in [(1, 1), (3, 7), (7, 3), (5, 5), (1, 9), (9, 1), (4, 0)] {
            for left in [None, Some(0), Some(1), Some(3), Some(20)] {
                for right in [None, Some(0), Some(2), Some(20)] {
                    for causal in [false, true] {
                        let s = Scores::resolve(causal, Window { left, right }, None, sq, sk).unwrap();
                        let right = if causal { Some(0) } else { right };
                        for i in 0..sq {
                            let diag = i as i64 + sk as i64 - sq as i64;
                            let sees = |j: i64| {
                                left.is_none_or(|l| j >= diag - i64::from(l))
                                    && right.is_none_or(|r| j <= diag + i64::from(r))
                            };
                            let want: Vec<usize> = (0..sk).filter(|&j| sees(j as i64)).collect();
                            let got: Vec<usize> = s.band.keys(i, sq, sk).collect();
                            assert_eq!(got, want, "{sq}x{sk} row {i} causal {causal} window {left:?},{right:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn suffixes_name_the_entries() {
        let s = |band, softcap| Scores { band, softcap }.suffix();
        assert_eq!(s(Band::Full, None), "");
        assert_eq!(s(Band::Causal, Some(30.0)), "_causal_softcap");
        assert_eq!(s(Band::Local { left: 1, right: 0 }, None), "_local");
        assert_eq!(s(Band::Full, Some(50.0)), "_softcap");
    }

    #[test]
    fn windows_name_and_pair_themselves() {
        let w = Window { left: Some(40), right: None };
        assert_eq!((w.pair(), w.label()), (Some([40, -1]), "-w40_inf".to_string()));
        assert_eq!((Window::default().pair(), Window::default().label()), (None, String::new()));
    }

    #[test]
    fn windows_parse_as_flash_attention_writes_them() {
        assert_eq!(Window::from_pair(-1, 0), Ok(Window { left: None, right: Some(0) }));
        assert!(Window::from_pair(-2, 0).unwrap_err().contains("−1 (unbounded)"));
        assert!("a,0".parse::<Window>().unwrap_err().contains("`a`"));
    }

    #[test]
    fn softcap_scales_fold_the_cap_into_the_softmax() {
        let (scale_log2, pre) = Scores { band: Band::Full, softcap: Some(50.0) }.kernel_scales(0.125);
        assert!((scale_log2 - 50.0 * std::f32::consts::LOG2_E).abs() < 1e-4 && (pre - 0.0025).abs() < 1e-9);
        let none = Scores::default().kernel_scales(0.125);
        assert_eq!(none, (0.125 * std::f32::consts::LOG2_E, 0.0));
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(Scores::resolve(false, Window::default(), Some(bad), 4, 4).is_err(), "{bad}");
        }
    }
}

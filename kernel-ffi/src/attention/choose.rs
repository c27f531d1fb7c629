//! Which loaded entry runs a call, and its split plan: the caller's
//! `KernelChoice` where it names one, else `planner`'s measured rules.

use super::{Attention, Chosen, Family, Kernel, Options, Precision, Splits, Variant};
use crate::error::{Error, Result, invalid};
use crate::planner::{self, Plan};
use crate::scores::{Band, Scores};
use crate::tensor::{Dtype, Problem};

impl Attention {
    /// The family `forward` runs for this problem: `Auto` takes the Hopper kernel
    /// where loaded, compiled for the head dim and measured faster
    /// (`planner::prefer_hopper`). e4m3 inputs run dequantised to the output's
    /// dtype where it has no e4m3 entry for the call (`forward_descaled_on`).
    pub fn resolve(&self, p: &Problem, variant: Variant) -> Result<Family> {
        let hopper_dim = self.has_head_dim(Family::Hopper, p.head_dim);
        match variant {
            Variant::Auto if self.has_hopper() && hopper_dim && planner::prefer_hopper(p.seqlen_k) => {
                Ok(Family::Hopper)
            }
            Variant::Auto | Variant::Portable => Ok(Family::Portable),
            Variant::Hopper if self.has_hopper() && !hopper_dim => Err(Error::Unsupported(format!(
                "the Hopper kernel has no head dim {} entries; use the portable variant (or auto)",
                p.head_dim
            ))),
            Variant::Hopper if self.has_hopper() => Ok(Family::Hopper),
            Variant::Hopper => Err(Error::Unsupported(format!(
                "the Hopper kernel needs compute capability 9.0 (sm_90a fatbins); {} is {}; use the portable variant",
                self.device.name, self.device.compute_capability
            ))),
        }
    }

    /// Whether a family's dense forward entries of head dim `d` are loaded (of
    /// any precision).
    fn has_head_dim(&self, family: Family, d: usize) -> bool {
        let e4m3 = |output| Precision { input: Dtype::E4m3, output };
        [Dtype::F16.into(), Dtype::Bf16.into(), e4m3(Dtype::F16), e4m3(Dtype::Bf16)].into_iter().any(|p: Precision| {
            let stem = family.entry_stem(p, d, Scores::default());
            self.kernels.keys().any(|name| name == &stem || name.starts_with(&format!("{stem}_")))
        })
    }

    /// The precision of the loaded entries that run a call of `precision` on
    /// `family` (`Precision::run_as`: e4m3 inputs with no e4m3 entry run
    /// dequantised).
    pub(super) fn entry_precision(&self, family: Family, precision: Precision, d: usize, scores: Scores) -> Precision {
        precision.run_as(|| !self.fwd_entries(family, precision, d, scores).1.is_empty())
    }

    /// The split plan `forward` would use for this problem.
    pub fn plan(&self, p: &Problem, precision: impl Into<Precision>, opts: &Options) -> Result<Plan> {
        let family = self.resolve(p, opts.choice.variant)?;
        let scores = opts.scores(p.seqlen_q, p.seqlen_k)?;
        let precision = self.entry_precision(family, precision.into(), p.head_dim, scores);
        Ok(self.choose_entry(family, precision, p, opts)?.plan)
    }

    /// (query rows per CTA, key groups, persistent) of the loaded entries for
    /// (dtype, head dim, scores) and their persistent twins: what
    /// `KernelChoice::block_m`, `KernelChoice::key_groups` and
    /// `KernelChoice::persistent` may name.
    pub fn geometries(
        &self,
        family: Family,
        precision: impl Into<Precision>,
        head_dim: usize,
        scores: Scores,
    ) -> Vec<(u32, u32, bool)> {
        let precision = precision.into();
        let runs = self.entry_precision(family, precision, head_dim, scores);
        // Dequantised calls need the dequantisation entry too.
        if runs.input != precision.input && !self.kernels.contains_key(&precision.dequantise_entry()) {
            return Vec::new();
        }
        let entries = self.fwd_entries(family, runs, head_dim, scores).1;
        let mut out = Vec::new();
        for (name, k) in entries {
            out.push((k.launch.block_m, k.launch.key_groups, k.launch.persistent));
            if let Some(twin) = self.persistent_twin(&name) {
                out.push((twin.launch.block_m, twin.launch.key_groups, true));
            }
        }
        out
    }

    /// The loaded forward entries of a family for (dtype, head dim, scores), in
    /// `Family::entry_names`' order, and their common name stem.
    fn fwd_entries(
        &self,
        family: Family,
        precision: Precision,
        head_dim: usize,
        scores: Scores,
    ) -> (String, Vec<(String, &Kernel)>) {
        let base = family.entry_stem(precision, head_dim, scores);
        let loaded = Family::entry_names(&base)
            .into_iter()
            .filter_map(|name| self.kernels.get(&name).map(|k| (name, k)))
            .collect();
        (base, loaded)
    }

    /// The persistent twin of a non-persistent entry, where loaded.
    fn persistent_twin(&self, name: &str) -> Option<&Kernel> {
        self.kernels.get(&format!("{name}_persistent")).filter(|k| k.launch.persistent)
    }

    /// Query blocks × batch × heads: the grid of an unsplit launch of `k`.
    fn work_ctas(k: &Kernel, p: &Problem) -> u64 {
        (p.batch * p.heads) as u64 * (p.seqlen_q as u64).div_ceil(u64::from(k.launch.block_m))
    }

    /// The forward entry for this problem: `flash_fwd[_hopper]_<dtype>_d<D>[_causal]`
    /// or the same with `_m64` (64-row CTAs), `_m192` (192-row CTAs) or `_kg2` (two
    /// key groups: 32-row CTAs at D=64, 64-row ones at D=128), whichever is loaded.
    /// Rows per CTA: `block_m`, or else `planner::prefer_m64` between the one-group
    /// entries (Hopper against a 192-row entry: `planner::prefer_m192`; Hopper
    /// causal D=64: `planner::prefer_wide_causal_d64`); then
    /// key groups: `key_groups`, or else `choose_groups`. With the entry's split
    /// plan (the twin's, where that was already made).
    pub(super) fn choose_entry(
        &self,
        family: Family,
        precision: Precision,
        p: &Problem,
        opts: &Options,
    ) -> Result<Chosen<'_>> {
        let scores = opts.scores(p.seqlen_q, p.seqlen_k)?;
        let causal = scores.band == Band::Causal;
        let (base, loaded) = self.fwd_entries(family, precision, p.head_dim, scores);
        let single: Vec<&Kernel> = loaded.iter().map(|(_, k)| *k).filter(|k| k.launch.key_groups == 1).collect();
        let slots = |k: &Kernel| u64::from(self.device.sm_count) * u64::from(k.ctas_per_sm.max(1));
        let rows = opts.choice.block_m.or_else(|| match single.as_slice() {
            [narrow, wide] => {
                let r = |k: &Kernel| u64::from(k.launch.block_m);
                let ctas = Self::work_ctas(narrow, p);
                let m64 = if family == Family::Hopper && (p.head_dim == 64 || wide.launch.block_m == 192) {
                    let (units, wide_slots) = (Self::work_ctas(wide, p), slots(wide));
                    if causal {
                        !planner::prefer_wide_causal_d64(units, wide_slots, p.seqlen_k)
                    } else {
                        !planner::prefer_m192(units, wide_slots, p.seqlen_q, p.seqlen_k)
                    }
                } else {
                    planner::prefer_m64(causal, ctas, slots(narrow), r(narrow), slots(wide), r(wide))
                };
                let wide = (wide.launch.block_m, wide.launch.persistent);
                Some(Self::rows(m64, narrow.launch.block_m, wide, opts.choice.persistent))
            }
            _ => None,
        });
        let Groups { rows, groups, twin_plan } = match opts.choice.key_groups {
            // A forced group count without forced rows takes that entry's own rows.
            Some(g) => {
                Groups { rows: opts.choice.block_m.or(rows.filter(|_| g == 1)), groups: Some(g), twin_plan: None }
            }
            None => self.choose_groups(family, &loaded, &single, rows, p, opts, scores.band),
        };
        let found: Vec<(u32, u32)> = loaded.iter().map(|(_, k)| (k.launch.block_m, k.launch.key_groups)).collect();
        let (name, kern) = loaded
            .into_iter()
            .find(|(_, k)| rows.is_none_or(|m| k.launch.block_m == m) && groups.is_none_or(|g| k.launch.key_groups == g))
            .ok_or_else(|| {
                if found.is_empty() {
                    let names = Family::entry_names(&base).join(", ");
                    Error::MissingKernels(format!("no entry of {names} is in the loaded fatbins"))
                } else {
                    let shown = |x: Option<u32>| x.map_or_else(|| "any".to_string(), |v| v.to_string());
                    Error::Invalid(format!(
                        "block_m {}, key_groups {}: {base} is loaded with (rows, key groups) {found:?}; pick one of those or leave it to the planner",
                        shown(rows),
                        shown(groups)
                    ))
                }
            })?;
        // The planner counts one useful CTA per SM, so the twin's plan is the chosen
        // entry's wherever both tile the problem alike.
        let plan = match twin_plan {
            Some((tiles, plan)) if tiles == (kern.launch.block_m, kern.launch.block_n) => plan,
            _ => self.plan_for(family, kern, p, opts, scores.band)?,
        };
        // A persistent twin runs the same tiles and plan: taken for grids over a wave.
        let twin = self.persistent_twin(&name);
        let persistent = match opts.choice.persistent {
            Some(want) if want != kern.launch.persistent && (!want || twin.is_none()) => invalid!(
                "persistent {want}: {name} is loaded {} a persistent twin; leave it to the planner",
                if kern.launch.persistent { "as persistent, without" } else { "without" }
            ),
            Some(want) => want && !kern.launch.persistent,
            None => {
                twin.is_some()
                    && planner::prefer_persistent(Self::work_ctas(kern, p) * u64::from(plan.num_splits), slots(kern))
            }
        };
        match twin {
            Some(twin) if persistent => Ok(Chosen { name: format!("{name}_persistent"), kern: twin, plan, scores }),
            _ => Ok(Chosen { name, kern, plan, scores }),
        }
    }

    /// Key groups for a call whose rows per CTA are `rows` (`None`: any), and the
    /// rows that go with them: a two-group entry of the same rows as the 64-row
    /// one-group entry is its twin (`planner::prefer_key_groups`, from the twin's
    /// plan, which is returned); one of fewer rows replaces it
    /// (`planner::prefer_narrow_key_groups`, from its unsplit grid).
    #[allow(clippy::too_many_arguments)]
    fn choose_groups(
        &self,
        family: Family,
        loaded: &[(String, &Kernel)],
        single: &[&Kernel],
        rows: Option<u32>,
        p: &Problem,
        opts: &Options,
        band: Band,
    ) -> Groups {
        let any = Groups { rows, groups: None, twin_plan: None };
        let grouped = loaded.iter().map(|(_, k)| *k).find(|k| k.launch.key_groups > 1);
        let narrow = single.iter().min_by_key(|k| k.launch.block_m);
        let (Some(grouped), Some(narrow)) = (grouped, narrow) else { return any };
        let (g, n) = (grouped.launch, narrow.launch);
        if rows.is_some_and(|m| m != n.block_m) {
            return any;
        }
        if Self::narrow_grouped(grouped) {
            let blocks = (p.seqlen_k as u32).div_ceil(n.block_n.max(1));
            let prefer = planner::prefer_narrow_key_groups(Self::work_ctas(narrow, p), self.device.sm_count, blocks);
            return Groups::narrow(rows, opts.choice.block_m.is_some(), prefer, (g.block_m, g.key_groups));
        }
        if g.block_m != n.block_m {
            return any;
        }
        let Ok(plan) = self.plan_for(family, narrow, p, opts, band) else { return any };
        let ctas = Self::work_ctas(narrow, p) * u64::from(plan.num_splits);
        let blocks = plan.keys_per_split / n.block_n.max(1);
        let groups = if planner::prefer_key_groups(ctas, self.device.sm_count, blocks) { g.key_groups } else { 1 };
        Groups { rows, groups: Some(groups), twin_plan: Some(((n.block_m, n.block_n), plan)) }
    }

    /// Rows per CTA between a narrow and a wide one-group entry: the narrow one
    /// where the planner prefers it (`m64`), or where the caller asked for CTAs
    /// that are not persistent and the wide entry is persistent only (the Hopper
    /// D=64 192-row one), so that `--persistent false` alone still runs.
    /// `wide` is (rows, persistent).
    fn rows(m64: bool, narrow: u32, (wide, wide_persistent): (u32, bool), persistent: Option<bool>) -> u32 {
        if m64 || (persistent == Some(false) && wide_persistent) { narrow } else { wide }
    }

    /// A two-group entry of fewer rows than the 64-row one-group entry (the portable
    /// D=64 `_kg2`): it replaces that entry rather than twinning it, and plans its
    /// own splits (`planner::plan_grouped`).
    fn narrow_grouped(k: &Kernel) -> bool {
        k.launch.key_groups > 1 && k.launch.block_m < 64
    }

    /// A launch of `k` for this problem as the planner sees it.
    pub(super) fn launch_grid(k: &Kernel, p: &Problem, causal: bool) -> planner::LaunchGrid {
        planner::LaunchGrid {
            causal,
            heads: (p.batch * p.heads) as u64,
            seqlen_q: p.seqlen_q as u32,
            seqlen_k: p.seqlen_k as u32,
            block_m: k.launch.block_m,
            block_n: k.launch.block_n,
            ctas_per_sm: k.ctas_per_sm,
            persistent: k.launch.persistent,
        }
    }

    /// The split plan of entry `k` of `family` for this problem: `opts.splits`, or
    /// the model and constants `planner::grid_cost` picks for the family. A
    /// windowed call takes one split: splits of the key range do not divide a
    /// band, whose rows each see a window's keys wherever it lies.
    fn plan_for(&self, family: Family, k: &Kernel, p: &Problem, opts: &Options, band: Band) -> Result<Plan> {
        let block_n = k.launch.block_n;
        let plan = match opts.splits {
            Splits::Fixed(0) => invalid!("a fixed split count must be at least 1"),
            Splits::Fixed(n) => planner::plan_fixed(n, p.seqlen_k as u32, block_n),
            Splits::Auto if matches!(band, Band::Local { .. }) => planner::plan_fixed(1, p.seqlen_k as u32, block_n),
            Splits::Auto => match planner::grid_cost(family == Family::Hopper, p.head_dim, band == Band::Causal) {
                Some(cost) => {
                    let grid = Self::launch_grid(k, p, band == Band::Causal);
                    // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
                    let mut plans = self.sim_plans.lock().unwrap_or_else(|e| e.into_inner());
                    *plans
                        .entry((grid, family))
                        .or_insert_with(|| planner::plan_simulated(self.device.sm_count, &grid, &cost))
                }
                // A two-group entry of 64 rows gets its one-group twin's plan (the
                // planner counts one useful CTA per SM either way), the plan
                // prefer_key_groups chose it by; one of fewer rows its own.
                None if Self::narrow_grouped(k) => planner::plan_grouped(
                    self.device.sm_count,
                    k.ctas_per_sm,
                    Self::work_ctas(k, p),
                    p.seqlen_k as u32,
                    block_n,
                    k.launch.key_groups,
                ),
                None => planner::plan(
                    self.device.sm_count,
                    k.ctas_per_sm,
                    Self::work_ctas(k, p),
                    p.seqlen_k as u32,
                    block_n,
                ),
            },
        };
        Ok(plan)
    }
}

/// `Attention::choose_groups`' answer: rows per CTA and key groups (`None`: any
/// loaded), and the twin's plan by (rows, key tile) where one was made.
#[derive(Debug, PartialEq)]
struct Groups {
    rows: Option<u32>,
    groups: Option<u32>,
    twin_plan: Option<((u32, u32), Plan)>,
}

impl Groups {
    /// Beside the narrow one-group entry chosen for `rows`: the two-group entry of
    /// fewer rows, `grouped` = (rows, key groups), where the planner `prefer`s it
    /// and the caller did not force the rows; else one group at those rows.
    fn narrow(rows: Option<u32>, forced_rows: bool, prefer: bool, grouped: (u32, u32)) -> Groups {
        if prefer && !forced_rows {
            Groups { rows: Some(grouped.0), groups: Some(grouped.1), twin_plan: None }
        } else {
            Groups { rows, groups: Some(1), twin_plan: None }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Attention, Groups};

    #[test]
    fn not_persistent_alone_takes_the_narrow_entry_beside_a_persistent_only_wide_one() {
        // Hopper D=64 non-causal: 64-row entry (with a persistent twin) beside the
        // persistent-only 192-row one, which the planner prefers (m64 false).
        assert_eq!(Attention::rows(false, 64, (192, true), Some(false)), 64);
        assert_eq!(Attention::rows(false, 64, (192, true), None), 192);
        assert_eq!(Attention::rows(false, 64, (192, true), Some(true)), 192);
        assert_eq!(Attention::rows(true, 64, (192, true), None), 64);
        // A wide entry that is not persistent keeps the planner's choice.
        assert_eq!(Attention::rows(false, 64, (128, false), Some(false)), 128);
    }

    #[test]
    fn forced_rows_are_never_traded_for_the_narrow_two_group_entry() {
        let one = |rows| Groups { rows, groups: Some(1), twin_plan: None };
        // `--block-m 64` on B1 H1 S128 D64, where the planner prefers 32-row two-group CTAs.
        assert_eq!(Groups::narrow(Some(64), true, true, (32, 2)), one(Some(64)));
        assert_eq!(
            Groups::narrow(Some(64), false, true, (32, 2)),
            Groups { rows: Some(32), groups: Some(2), twin_plan: None }
        );
        assert_eq!(Groups::narrow(Some(64), false, false, (32, 2)), one(Some(64)));
    }
}

//! Spreading the correctness matrix: `--shard I/N` (a deterministic part, for a
//! CI matrix over runners), the order `--gpus` deals cases in (longest first), and
//! the merge of shard reports. Pure: names and work in, names out.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use fa_schema::schema::ListedCase;

/// `--shard I/N`: the I-th of N parts, counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Shard, String> {
        let rule = "a shard is I/N with 1 ≤ I ≤ N, e.g. 2/4";
        let (i, n) = s.split_once('/').ok_or(rule)?;
        let (index, count): (u32, u32) = (i.trim().parse().map_err(|_| rule)?, n.trim().parse().map_err(|_| rule)?);
        if index == 0 || index > count { Err(rule.into()) } else { Ok(Shard { index, count }) }
    }
}

/// Cases longest first, ties by name: the order both the partition and the queue deal in.
pub fn longest_first(cases: &[ListedCase]) -> Vec<&ListedCase> {
    let mut sorted: Vec<&ListedCase> = cases.iter().collect();
    let work = |c: &ListedCase| if c.work.is_finite() { c.work.max(0.0) } else { 0.0 };
    sorted.sort_by(|a, b| work(b).total_cmp(&work(a)).then_with(|| a.name.cmp(&b.name)));
    sorted
}

/// `n` parts of near-equal work (longest first, each to the lightest part so far,
/// the lowest index on a tie): the same parts for the same cases on every runner.
pub fn partition(cases: &[ListedCase], n: u32) -> Vec<Vec<String>> {
    let n = n.max(1) as usize;
    let mut parts = vec![(0.0_f64, Vec::new()); n];
    for c in longest_first(cases) {
        let lightest = (0..n).min_by(|&a, &b| parts[a].0.total_cmp(&parts[b].0)).unwrap_or(0);
        parts[lightest].0 += if c.work.is_finite() { c.work.max(0.0) } else { 0.0 } + 1.0;
        parts[lightest].1.push(c.name.clone());
    }
    parts.into_iter().map(|(_, names)| names).collect()
}

/// What a shard's report says about its part: merge checks the parts against each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub shard: Shard,
    /// Every case of the run before partitioning, sorted.
    pub universe: Vec<String>,
    /// This shard's cases.
    pub assigned: Vec<String>,
}

/// Checks that `parts` are the N shards of one universe, each once, and that
/// their results name every assigned case once (the caller's `ran` per part).
pub fn check_parts(parts: &[(ShardRecord, Vec<String>)]) -> Result<(), String> {
    let Some((first, _)) = parts.first() else { return Err("no shard reports to merge".into()) };
    let count = first.shard.count;
    let mut seen_index = BTreeSet::new();
    let mut owner: BTreeMap<&str, u32> = BTreeMap::new();
    for (rec, ran) in parts {
        if rec.shard.count != count || rec.universe != first.universe {
            return Err(format!(
                "shard {}/{} is from another run (shard count or case list differs from shard {}/{count})",
                rec.shard.index, rec.shard.count, first.shard.index
            ));
        }
        if !seen_index.insert(rec.shard.index) {
            return Err(format!("shard {}/{count} appears twice", rec.shard.index));
        }
        for name in &rec.assigned {
            if let Some(other) = owner.insert(name, rec.shard.index) {
                return Err(format!("case {name} is in shards {other} and {}", rec.shard.index));
            }
        }
        let mut ran_once = BTreeSet::new();
        for name in ran {
            if !ran_once.insert(name.as_str()) {
                return Err(format!("case {name} ran twice in shard {}", rec.shard.index));
            }
            if !rec.assigned.contains(name) {
                return Err(format!("shard {} reports case {name}, which was not its to run", rec.shard.index));
            }
        }
    }
    for (rec, ran) in parts {
        let unreported: Vec<&str> =
            rec.assigned.iter().map(String::as_str).filter(|n| !ran.iter().any(|r| r == n)).collect();
        if !unreported.is_empty() {
            return Err(format!(
                "shard {}/{count} reports {} of its {} cases; missing: {}",
                rec.shard.index,
                rec.assigned.len() - unreported.len(),
                rec.assigned.len(),
                first_ten(&unreported)
            ));
        }
    }
    let missing_shards: Vec<String> =
        (1..=count).filter(|i| !seen_index.contains(i)).map(|i| format!("{i}/{count}")).collect();
    if !missing_shards.is_empty() {
        return Err(format!("missing shard report(s): {}", missing_shards.join(", ")));
    }
    let missing: Vec<&str> = first.universe.iter().map(String::as_str).filter(|n| !owner.contains_key(n)).collect();
    if !missing.is_empty() {
        return Err(format!("no shard holds case(s): {}", first_ten(&missing)));
    }
    Ok(())
}

/// Up to ten names, and how many more there are.
pub fn first_ten(names: &[&str]) -> String {
    let more = if names.len() > 10 { format!(" and {} more", names.len() - 10) } else { String::new() };
    format!("{}{more}", names[..names.len().min(10)].join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cases(works: &[f64]) -> Vec<ListedCase> {
        works.iter().enumerate().map(|(i, &work)| ListedCase { name: format!("c{i}"), work }).collect()
    }

    #[test]
    fn shards_parse_or_say_the_rule() {
        assert_eq!("2/4".parse::<Shard>(), Ok(Shard { index: 2, count: 4 }));
        for bad in ["0/4", "5/4", "4", "a/b", "1/0", ""] {
            assert!(bad.parse::<Shard>().unwrap_err().contains("I/N"), "{bad}");
        }
    }

    #[test]
    fn parts_balance_work_and_are_the_same_every_time() {
        let cs = cases(&[100.0, 1.0, 1.0, 1.0, 50.0, 50.0, f64::NAN, -3.0]);
        let parts = partition(&cs, 2);
        assert_eq!(parts, partition(&cs, 2));
        assert_eq!(parts[0][0], "c0");
        assert_eq!(parts[1][..2], ["c4", "c5"]);
        assert_eq!(partition(&cs, 0).len(), 1);
        assert!(partition(&[], 3).iter().all(Vec::is_empty));
    }

    fn record(cs: &[ListedCase], shard: Shard, assigned: Vec<String>) -> ShardRecord {
        let mut universe: Vec<String> = cs.iter().map(|c| c.name.clone()).collect();
        universe.sort();
        ShardRecord { shard, universe, assigned }
    }

    #[test]
    fn merge_rejects_gaps_duplicates_and_strangers() {
        let cs = cases(&[5.0, 4.0, 3.0, 2.0, 1.0]);
        let parts = partition(&cs, 3);
        let all: Vec<(ShardRecord, Vec<String>)> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| (record(&cs, Shard { index: i as u32 + 1, count: 3 }, p.clone()), p.clone()))
            .collect();
        assert_eq!(check_parts(&all), Ok(()));
        assert!(check_parts(&all[..2]).unwrap_err().contains("missing shard report(s): 3/3"));
        let twice = vec![all[0].clone(), all[0].clone(), all[1].clone(), all[2].clone()];
        assert!(check_parts(&twice).unwrap_err().contains("appears twice"));
        let mut dup_case = all.clone();
        let again = dup_case[1].1[0].clone();
        dup_case[1].1.push(again);
        assert!(check_parts(&dup_case).unwrap_err().contains("ran twice"));
        let mut stranger = all.clone();
        stranger[0].1.push(all[1].1[0].clone());
        assert!(check_parts(&stranger).unwrap_err().contains("not its to run"));
        let mut overlap = all.clone();
        overlap[0].0.assigned.push(all[1].0.assigned[0].clone());
        assert!(check_parts(&overlap).unwrap_err().contains("is in shards"));
        let mut unreported = all.clone();
        unreported[1].1.pop();
        let why = check_parts(&unreported).unwrap_err();
        assert!(why.contains(&format!("shard 2/3 reports 1 of its 2 cases; missing: {}", all[1].1[1])), "{why}");
        let mut silent = all.clone();
        silent[2].1.clear();
        assert!(check_parts(&silent).unwrap_err().contains("shard 3/3 reports 0 of its 2 cases"));
        let mut lost = all.clone();
        lost[2].0.assigned.clear();
        lost[2].1.clear();
        assert!(check_parts(&lost).unwrap_err().contains("no shard holds"));
        let mut other_run = all.clone();
        other_run[1].0.universe.pop();
        assert!(check_parts(&other_run).unwrap_err().contains("another run"));
        assert!(check_parts(&[]).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, rng_seed: proptest::test_runner::RngSeed::Fixed(27), ..ProptestConfig::default() })]
        #[test]
        fn every_partition_is_complete_and_disjoint(works in proptest::collection::vec(-1e3f64..1e12, 0..300), n in 1u32..17) {
            let cs = cases(&works);
            let parts = partition(&cs, n);
            prop_assert_eq!(parts.len(), n as usize);
            let mut all: Vec<&String> = parts.iter().flatten().collect();
            all.sort();
            let mut names: Vec<&String> = cs.iter().map(|c| &c.name).collect();
            names.sort();
            prop_assert_eq!(all, names);
        }
    }
}

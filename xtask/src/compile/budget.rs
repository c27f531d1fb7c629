//! Resource budgets: pure checks of ptxas records against the manifest.

use serde::{Deserialize, Serialize};

use crate::parse::ptxas::{KernelResources, WgmmaSerialized};
use crate::parse::sass::LOCAL_MEMORY;
use fa_schema::manifest::{Arch, Kernel, Manifest};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breach {
    pub kernel: String,
    pub arch: String,
    pub what: String,
    pub value: u64,
    pub budget: u64,
    /// What to do about it.
    pub hint: String,
}

/// What to change for one ptxas wgmma-serialisation notice.
fn serialization_advice(w: &WgmmaSerialized) -> String {
    match w.code.as_str() {
        "C7510" => "no calls (printf, non-inlined functions) inside the wgmma pipeline".into(),
        "C7511" => "keep each accumulator array whole and cut registers live across the wgmmas".into(),
        "C7515" => "no non-wgmma write to an accumulator while a wgmma may be in flight on any path \
                    (fence freshly initialised accumulators with wgmma_fence_operands before the first wgmma)"
            .into(),
        _ => format!("ptxas: {}", w.reason),
    }
}

/// Checks one record against its kernel's budget and its arch's limits.
pub fn check(res: &KernelResources, kernel: &Kernel, arch: &Arch, static_smem_limit: u32) -> Vec<Breach> {
    let mut out = Vec::new();
    let mut breach = |what: &str, value: u32, budget: u32, hint: &str| {
        out.push(Breach {
            kernel: res.name.clone(),
            arch: res.arch.clone(),
            what: what.to_string(),
            value: value.into(),
            budget: budget.into(),
            hint: hint.to_string(),
        })
    };
    if res.spill_bytes() > 0 && !kernel.may_spill(&res.arch) {
        breach(
            "spill bytes",
            res.spill_bytes(),
            0,
            "cut live registers (smaller tiles, fewer accumulators) or set allow_spills",
        );
    }
    if res.stack_frame > 0 && !kernel.may_use_stack(&res.arch) {
        breach(
            "stack frame bytes",
            res.stack_frame,
            0,
            "index register arrays only with compile-time constants, or set allow_stack",
        );
    }
    if res.registers > kernel.max_registers {
        breach(
            "registers/thread",
            res.registers,
            kernel.max_registers,
            "lower register pressure or raise max_registers (check occupancy first)",
        );
    }
    if !res.wgmma_serialized.is_empty() {
        let codes: Vec<&str> = res.wgmma_serialized.iter().map(|w| w.code.as_str()).collect();
        let advice: Vec<String> = res.wgmma_serialized.iter().map(serialization_advice).collect();
        breach(&format!("wgmma serialized (ptxas {})", codes.join(", ")), 1, 0, &advice.join("; "));
    }
    if res.smem_static > static_smem_limit {
        breach("static smem bytes", res.smem_static, static_smem_limit, "move the buffer to dynamic shared memory");
    }
    let total = res.smem_static.saturating_add(kernel.dynamic_smem);
    if total > arch.smem_optin_limit {
        breach(
            "static+dynamic smem bytes",
            total,
            arch.smem_optin_limit,
            "over the arch's smem_optin_limit (opt-in shared memory per block): shrink tiles or pipeline \
             stages for this arch",
        );
    }
    out
}

/// How a record's local memory (spills, stack frame, LDL/STL in its SASS) stands
/// against its entry's budget on its arch, by the rules of [`check`] and [`check_sass`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalMemory {
    Unused,
    /// Used, and the manifest allows it here: the switch that does.
    Allowed(&'static str),
    /// Used without leave: a breach.
    OverBudget,
}

pub fn local_memory(res: &KernelResources, kernel: &Kernel, local_instructions: u32) -> LocalMemory {
    let arch = res.arch.as_str();
    let (spills, stack, sass) = (res.spill_bytes() > 0, res.stack_frame > 0, local_instructions > 0);
    if !(spills || stack || sass) {
        return LocalMemory::Unused;
    }
    let (may_spill, may_stack) = (kernel.may_spill(arch), kernel.may_use_stack(arch));
    if (spills && !may_spill) || (stack && !may_stack) || (sass && !may_spill && !may_stack) {
        return LocalMemory::OverBudget;
    }
    LocalMemory::Allowed(if kernel.local_memory_on.iter().any(|a| a == arch) {
        "local_memory_on"
    } else if spills && stack {
        "allow_spills + allow_stack"
    } else if spills || (!stack && kernel.allow_spills) {
        "allow_spills"
    } else {
        "allow_stack"
    })
}

/// Checks every record, and that the report and the manifest name the same
/// entries: an entry without a budget, or a budgeted entry ptxas never compiled,
/// is a breach too.
pub fn check_all(manifest: &Manifest, records: &[KernelResources]) -> Vec<Breach> {
    let mut out = Vec::new();
    for res in records {
        let arch = manifest.archs.get(&res.arch);
        match (manifest.kernel(&res.name), arch) {
            (Some(kernel), Some(arch)) => out.extend(check(res, kernel, arch, manifest.static_smem_limit)),
            (None, _) => out.push(Breach {
                kernel: res.name.clone(),
                arch: res.arch.clone(),
                what: "entry without a budget".into(),
                value: 0,
                budget: 0,
                hint: "add it to kernels/manifest.json".into(),
            }),
            (_, None) => out.push(Breach {
                kernel: res.name.clone(),
                arch: res.arch.clone(),
                what: "arch not in manifest".into(),
                value: 0,
                budget: 0,
                hint: "add the arch under \"archs\"".into(),
            }),
        }
    }
    for src in &manifest.sources {
        for arch in &src.archs {
            for k in &src.kernels {
                if !records.iter().any(|r| r.name == k.entry && &r.arch == arch) {
                    out.push(Breach {
                        kernel: k.entry.clone(),
                        arch: arch.clone(),
                        what: "entry missing from ptxas report".into(),
                        value: 0,
                        budget: 0,
                        hint: format!("is `{}` an extern \"C\" __global__ in {}?", k.entry, src.file),
                    });
                }
            }
        }
    }
    out
}

/// One entry's SASS opcode counts for one arch (from `cuobjdump -sass`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SassRecord {
    pub kernel: String,
    pub arch: String,
    pub opcodes: std::collections::BTreeMap<String, u32>,
}

/// Every manifest entry's SASS: the opcodes it requires are there, and no local
/// memory instruction is, unless the entry allows spills or a stack.
pub fn check_sass(manifest: &Manifest, records: &[SassRecord]) -> Vec<Breach> {
    let mut out = Vec::new();
    for rec in records {
        let Some(kernel) = manifest.kernel(&rec.kernel) else { continue };
        let breach = |what: String, value: u32, budget: u32, hint: &str| Breach {
            kernel: rec.kernel.clone(),
            arch: rec.arch.clone(),
            what,
            value: value.into(),
            budget: budget.into(),
            hint: hint.to_string(),
        };
        for op in kernel.sass_requires.iter().chain(kernel.sass_requires_on.get(&rec.arch).into_iter().flatten()) {
            if rec.opcodes.get(op).copied().unwrap_or(0) == 0 {
                out.push(breach(
                    format!("SASS {op} instructions"),
                    0,
                    1,
                    "the instruction the kernel is written for did not survive compilation: check the \
                     -gencode (wgmma needs sm_90a) and the inline asm wrappers",
                ));
            }
        }
        let local: u32 = LOCAL_MEMORY.iter().filter_map(|op| rec.opcodes.get(*op)).sum();
        if local > 0 && !kernel.may_spill(&rec.arch) && !kernel.may_use_stack(&rec.arch) {
            out.push(breach(
                "SASS local memory instructions (LDL/STL)".into(),
                local,
                0,
                "registers spilled or an array is indexed at run time; see the ptxas line of this entry",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::ptxas;

    fn manifest() -> Manifest {
        Manifest::parse(
            r#"{"static_smem_limit": 49152,
            "archs": {"sm_89": {"gencode": "arch=compute_89,code=sm_89", "smem_optin_limit": 101376},
                      "sm_90": {"gencode": "arch=compute_90,code=sm_90", "smem_optin_limit": 232448},
                      "sm_90a": {"gencode": "arch=compute_90a,code=sm_90a", "smem_optin_limit": 232448}},
            "sources": [{"file": "f.cu", "archs": ["sm_89", "sm_90", "sm_90a"], "kernels": [
                {"entry": "_Z5templILi64EEvPKfPf", "max_registers": 32},
                {"entry": "tiles", "max_registers": 32, "dynamic_smem": 1024},
                {"entry": "spilly", "max_registers": 64}]}]}"#,
        )
        .unwrap()
    }

    fn fixture() -> Vec<KernelResources> {
        ptxas::parse(include_str!("../../tests/data/ptxas-verbose-sm89-sm90-sm90a.txt")).kernels
    }

    #[test]
    fn stack_frame_in_fixture_is_a_breach_per_arch() {
        let breaches = check_all(&manifest(), &fixture());
        assert_eq!(breaches.len(), 3, "{breaches:#?}");
        assert!(breaches.iter().all(|b| b.kernel == "spilly" && b.what == "stack frame bytes"));
        assert!(breaches.iter().all(|b| b.value == 1024 && b.budget == 0));
    }

    #[test]
    fn allowed_stack_passes() {
        let mut m = manifest();
        m.sources[0].kernels[2].allow_stack = true;
        assert!(check_all(&m, &fixture()).is_empty());
    }

    #[test]
    fn local_memory_allowed_per_arch() {
        let mut m = manifest();
        m.sources[0].kernels[2].local_memory_on = vec!["sm_90".into(), "sm_90a".into()];
        let b = check_all(&m, &fixture());
        // The fixture's stack frame stays a breach on sm_89 only.
        assert_eq!(b.len(), 1, "{b:#?}");
        assert_eq!((b[0].arch.as_str(), b[0].what.as_str()), ("sm_89", "stack frame bytes"));
    }

    #[test]
    fn local_memory_names_the_switch_that_allows_it() {
        let mut m = manifest();
        let spilly = |m: &Manifest| m.sources[0].kernels[2].clone();
        let on = |arch: &str| fixture().into_iter().find(|r| r.name == "spilly" && r.arch == arch).unwrap();
        // The fixture's `spilly` has a 1024-byte stack frame and no spills on every arch.
        assert_eq!(local_memory(&on("sm_89"), &spilly(&m), 0), LocalMemory::OverBudget);
        m.sources[0].kernels[2].local_memory_on = vec!["sm_90".into()];
        assert_eq!(local_memory(&on("sm_90"), &spilly(&m), 4), LocalMemory::Allowed("local_memory_on"));
        assert_eq!(local_memory(&on("sm_90a"), &spilly(&m), 0), LocalMemory::OverBudget);
        m.sources[0].kernels[2].allow_stack = true;
        assert_eq!(local_memory(&on("sm_90a"), &spilly(&m), 4), LocalMemory::Allowed("allow_stack"));
        let spilled = KernelResources { spill_stores: 8, ..on("sm_89") };
        assert_eq!(local_memory(&spilled, &spilly(&m), 0), LocalMemory::OverBudget);
        m.sources[0].kernels[2].allow_spills = true;
        assert_eq!(local_memory(&spilled, &spilly(&m), 0), LocalMemory::Allowed("allow_spills + allow_stack"));
        let clean = KernelResources { stack_frame: 0, ..on("sm_89") };
        assert_eq!(local_memory(&clean, &spilly(&m), 0), LocalMemory::Unused);
        assert_eq!(local_memory(&clean, &spilly(&m), 2), LocalMemory::Allowed("allow_spills"));
        // Every row the table calls over budget is a breach, and no row it calls allowed is.
        let mut m = manifest();
        m.sources[0].kernels[2].local_memory_on = vec!["sm_90".into()];
        let breached: Vec<String> = check_all(&m, &fixture()).into_iter().map(|b| b.arch).collect();
        for r in fixture().iter().filter(|r| r.name == "spilly") {
            let over = local_memory(r, &spilly(&m), 0) == LocalMemory::OverBudget;
            assert_eq!(over, breached.contains(&r.arch), "{}", r.arch);
        }
    }

    #[test]
    fn planted_spill_registers_and_smem_breaches() {
        let m = manifest();
        let planted = KernelResources {
            name: "tiles".into(),
            arch: "sm_89".into(),
            registers: 40,
            smem_static: 100_000,
            spill_stores: 8,
            wgmma_serialized: vec![WgmmaSerialized {
                code: "C7511".into(),
                reason: "insufficient register resources for the wgmma pipeline".into(),
            }],
            ..Default::default()
        };
        let what: Vec<_> = check_all(&m, std::slice::from_ref(&planted))
            .into_iter()
            .filter(|b| b.kernel == "tiles" && b.arch == "sm_89")
            .map(|b| (b.what, b.value, b.budget))
            .collect();
        // 100_000 static + 1024 dynamic stays under sm_89's 101_376 opt-in limit.
        let expected: Vec<(String, u64, u64)> = vec![
            ("spill bytes".into(), 8, 0),
            ("registers/thread".into(), 40, 32),
            ("wgmma serialized (ptxas C7511)".into(), 1, 0),
            ("static smem bytes".into(), 100_000, 49152),
        ];
        assert_eq!(what, expected);
    }

    #[test]
    fn dynamic_smem_over_optin_limit() {
        let mut m = manifest();
        m.sources[0].kernels[1].dynamic_smem = 100 * 1024;
        let b = check_all(&m, &fixture());
        let smem: Vec<_> = b.iter().filter(|b| b.what == "static+dynamic smem bytes").collect();
        // 9216 static + 102400 dynamic exceeds 99 KB on sm_89 only.
        assert_eq!(smem.len(), 1);
        assert_eq!((smem[0].arch.as_str(), smem[0].value), ("sm_89", 9216 + 102_400));
    }

    /// Every committed entry's dynamic shared memory fits the opt-in limit of each
    /// arch it builds for; static smem on top of the 96 KB `_d128_kg2` tiles breaks
    /// sm_86's 99 KB limit first, with a breach that names the limit.
    #[test]
    fn committed_dynamic_smem_fits_every_arch_it_builds_for() {
        let m = Manifest::parse(include_str!("../../../kernels/manifest.json")).unwrap();
        let record = |k: &Kernel, arch: &str, smem_static| KernelResources {
            name: k.entry.clone(),
            arch: arch.into(),
            smem_static,
            ..Default::default()
        };
        let mut checked = 0;
        for src in &m.sources {
            for arch in &src.archs {
                for k in &src.kernels {
                    let b = check(&record(k, arch, 0), k, &m.archs[arch], m.static_smem_limit);
                    assert!(b.is_empty(), "{} on {arch}: {b:#?}", k.entry);
                    checked += 1;
                }
            }
        }
        assert!(checked > 0);
        let kg2 = m.kernel("flash_fwd_f16_d128_kg2").unwrap();
        assert_eq!(kg2.dynamic_smem, 98_304);
        let b = check(&record(kg2, "sm_86", 4096), kg2, &m.archs["sm_86"], m.static_smem_limit);
        assert_eq!(b.len(), 1, "{b:#?}");
        assert_eq!((b[0].what.as_str(), b[0].value, b[0].budget), ("static+dynamic smem bytes", 102_400, 101_376));
        assert!(b[0].hint.contains("smem_optin_limit"), "{}", b[0].hint);
        // The same tiles fit sm_80's 163 KB.
        assert!(check(&record(kg2, "sm_80", 4096), kg2, &m.archs["sm_80"], m.static_smem_limit).is_empty());
    }

    #[test]
    fn unbudgeted_and_missing_entries() {
        let mut m = manifest();
        m.sources[0].kernels.retain(|k| k.entry != "tiles");
        m.sources[0].kernels.push(Kernel {
            entry: "ghost".into(),
            max_registers: 1,
            dynamic_smem: 0,
            allow_spills: false,
            allow_stack: true,
            local_memory_on: Vec::new(),
            sass_requires: Vec::new(),
            sass_requires_on: Default::default(),
            launch: None,
        });
        let b = check_all(&m, &fixture());
        assert_eq!(b.iter().filter(|b| b.what == "entry without a budget").count(), 3);
        assert_eq!(b.iter().filter(|b| b.what == "entry missing from ptxas report").count(), 3);
    }

    #[test]
    fn missing_tensor_core_instructions_and_local_memory_in_real_sass() {
        let mut m = manifest();
        m.sources[0].kernels[1].sass_requires = vec!["HGMMA".into(), "UTMALDG".into()];
        m.sources[0].kernels[2].sass_requires = vec!["HMMA".into()];
        let counts =
            crate::parse::sass::opcode_counts(include_str!("../../tests/data/sass/flash-fwd-sm90a-excerpt.sass"))
                .unwrap();
        let record = |kernel: &str, from: &str| SassRecord {
            kernel: kernel.into(),
            arch: "sm_90a".into(),
            opcodes: counts[from].clone(),
        };
        // The Hopper kernel's SASS satisfies HGMMA + UTMALDG; the portable one's lacks HGMMA.
        assert!(check_sass(&m, &[record("tiles", "flash_fwd_hopper_f16_d64")]).is_empty());
        let b = check_sass(&m, &[record("tiles", "flash_fwd_f16_d64")]);
        assert_eq!(b.len(), 2, "{b:#?}");
        assert!(b.iter().any(|b| b.what == "SASS HGMMA instructions" && b.value == 0 && b.budget == 1));
        // Local memory is a breach unless the entry allows spills or a stack.
        let mut spilled = record("spilly", "flash_fwd_f16_d64");
        spilled.opcodes.insert("STL".into(), 3);
        spilled.opcodes.insert("LDL".into(), 2);
        let b = check_sass(&m, std::slice::from_ref(&spilled));
        assert_eq!(b.len(), 1, "{b:#?}");
        assert_eq!((b[0].what.as_str(), b[0].value), ("SASS local memory instructions (LDL/STL)", 5));
        m.sources[0].kernels[2].allow_spills = true;
        assert!(check_sass(&m, &[spilled]).is_empty());
        // An opcode required on one arch only (e4m3 mma.sync: QMMA on sm_89).
        m.sources[0].kernels[2].sass_requires_on.insert("sm_89".into(), vec!["QMMA".into()]);
        let on = |arch: &str| SassRecord { arch: arch.into(), ..record("spilly", "flash_fwd_f16_d64") };
        assert!(check_sass(&m, &[on("sm_90a")]).is_empty());
        let b = check_sass(&m, &[on("sm_89")]);
        assert_eq!((b.len(), b[0].what.as_str(), b[0].arch.as_str()), (1, "SASS QMMA instructions", "sm_89"), "{b:#?}");
    }
}

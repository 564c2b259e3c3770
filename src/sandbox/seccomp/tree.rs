//! The allowlist's syscall dispatch as a balanced binary search instead of seccompiler's
//! linear chain of `jeq` tests, with seccompiler's own rule semantics.
//!
//! seccompiler compiles a filter into: the architecture check, a load of the syscall
//! number, one block per syscall in ascending order (`jeq nr` then the rules), and the
//! mismatch action. The kernel pays for that chain twice: when the filter is loaded it runs
//! the program once per syscall number of every architecture to build its table of
//! syscalls that are always allowed (a chain of ~300 syscalls makes that ~300×900 steps),
//! and each system call that the table does not cover walks the chain up to its number.
//!
//! Here the profile's `successor` filter is split in two, each compiled by seccompiler:
//! the rules that match on the syscall number alone (a regular shape whose numbers and
//! actions [`decode_flat`] reads back, checking every instruction) and the rules with
//! argument conditions. The program is then: seccompiler's architecture check, a load of
//! the number, a binary search over the intervals of numbers that share an outcome
//! (`jge`, depth about log2 of the intervals), whose leaves return the match action, return
//! the mismatch action, or jump to the tail; and as the tail seccompiler's whole program
//! for the rules with argument conditions (which checks the architecture and dispatches on
//! the number again). A syscall's outcome is its rules' alone, so each syscall gets the
//! same answer as from seccompiler's program of the whole filter (the tests run both on
//! every number and on argument cases).

use super::super::sys::Insn;

const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JA: u16 = 0x05; // BPF_JMP | BPF_JA
const RET_K: u16 = 0x06; // BPF_RET | BPF_K
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const NR_OFFSET: u32 = 0;
const ARCH_OFFSET: u32 = 4;
/// The longest forward distance of a conditional jump (jt/jf are one byte).
const MAX_SHORT_JUMP: usize = u8::MAX as usize;

/// What seccompiler compiled for a filter whose rules all match on the number alone.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Flat {
    /// The architecture check (load arch, `jeq` the audit arch, return its action).
    arch_check: [Insn; 3],
    /// The syscall numbers, ascending.
    pub(super) nrs: Vec<u32>,
    /// The return value of a match (None when there are no rules).
    match_ret: Option<u32>,
    /// The return value of a mismatch.
    mismatch_ret: u32,
}

impl std::fmt::Debug for Insn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "({:#06x}, {}, {}, {:#x})",
            self.0, self.1, self.2, self.3
        )
    }
}

/// Reads back seccompiler's program of a filter without argument conditions, checking
/// every instruction against the shape seccompiler 0.5 emits:
/// `ld arch; jeq AUDIT,1,0; ret KILL; ld nr; {jeq NR,0,1; ja 1; ja 2; ret M; ret D}*; ret D`
/// (or `ld arch; jeq; ret; ret D` with no rules). None if it differs in any way.
pub(super) fn decode_flat(p: &[Insn]) -> Option<Flat> {
    let arch_check: [Insn; 3] = p.get(..3)?.try_into().ok()?;
    let [Insn(LD_W_ABS, 0, 0, ARCH_OFFSET), Insn(JEQ_K, 1, 0, _), Insn(RET_K, 0, 0, _)] =
        arch_check
    else {
        return None;
    };
    match &p[3..] {
        [Insn(RET_K, 0, 0, d)] => Some(Flat {
            arch_check,
            nrs: Vec::new(),
            match_ret: None,
            mismatch_ret: *d,
        }),
        [Insn(LD_W_ABS, 0, 0, NR_OFFSET), blocks @ .., Insn(RET_K, 0, 0, d)]
            if !blocks.is_empty() && blocks.len() % 5 == 0 =>
        {
            let mut nrs = Vec::with_capacity(blocks.len() / 5);
            let mut match_ret = None;
            for b in blocks.chunks_exact(5) {
                let [Insn(JEQ_K, 0, 1, nr), Insn(JA, 0, 0, 1), Insn(JA, 0, 0, 2), Insn(RET_K, 0, 0, m), Insn(RET_K, 0, 0, bd)] =
                    *b
                else {
                    return None;
                };
                if bd != *d || *match_ret.get_or_insert(m) != m || nrs.last() >= Some(&nr) {
                    return None;
                }
                nrs.push(nr);
            }
            Some(Flat {
                arch_check,
                nrs,
                match_ret,
                mismatch_ret: *d,
            })
        }
        _ => None,
    }
}

/// The outcome of a run of syscall numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leaf {
    Ret(u32),
    Tail,
}

/// Builds the program: `allowed`'s numbers return its match action, `conditional`'s
/// numbers (ascending, none of `allowed`'s) go to `tail` (seccompiler's program of the
/// rules with argument conditions), every other number returns `allowed`'s mismatch action.
/// None if the two sets overlap or `tail` is missing while needed.
pub(super) fn build(
    allowed: &Flat,
    conditional: &[u32],
    tail: Option<&[Insn]>,
) -> Option<Vec<Insn>> {
    let mut points: Vec<(u32, Leaf)> = Vec::new();
    for nr in &allowed.nrs {
        points.push((*nr, Leaf::Ret(allowed.match_ret?)));
    }
    for nr in conditional {
        tail?;
        points.push((*nr, Leaf::Tail));
    }
    points.sort_by_key(|(nr, _)| *nr);
    if points.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    // Runs of numbers that share an outcome: (first number, outcome) from 0 up.
    let deny = Leaf::Ret(allowed.mismatch_ret);
    let mut runs: Vec<(u32, Leaf)> = vec![(0, deny)];
    let mut set = |start: u32, leaf: Leaf| match runs.last_mut() {
        Some(last) if last.0 == start => last.1 = leaf,
        _ => runs.push((start, leaf)),
    };
    for (nr, leaf) in points {
        set(nr, leaf);
        if let Some(next) = nr.checked_add(1) {
            set(next, deny);
        }
    }
    runs.dedup_by(|later, earlier| later.1 == earlier.1);
    let mut out: Vec<Insn> = allowed.arch_check.to_vec();
    out.push(Insn(LD_W_ABS, 0, 0, NR_OFFSET));
    let tree_start = out.len();
    let tail_start = tree_start + size(&runs);
    emit(&runs, tail_start, &mut out);
    debug_assert_eq!(out.len(), tail_start);
    if let Some(tail) = tail.filter(|_| !conditional.is_empty()) {
        out.extend_from_slice(tail);
    }
    Some(out)
}

/// The instructions [`emit`] writes for `runs`.
fn size(runs: &[(u32, Leaf)]) -> usize {
    if runs.len() == 1 {
        return 1;
    }
    let (left, right) = runs.split_at(runs.len() / 2);
    let l = size(left);
    1 + usize::from(l > MAX_SHORT_JUMP) + l + size(right)
}

/// Writes the search over `runs` (the accumulator holds the syscall number): a leaf is one
/// return or one jump to the tail; a node is `jge first-of-right-half`, then the left half,
/// then the right half (a `ja` bridges a left half too long for a one-byte jump).
fn emit(runs: &[(u32, Leaf)], tail_start: usize, out: &mut Vec<Insn>) {
    if let [(_, leaf)] = runs {
        out.push(match *leaf {
            Leaf::Ret(k) => Insn(RET_K, 0, 0, k),
            // `ja` jumps k instructions past the next one.
            Leaf::Tail => Insn(JA, 0, 0, (tail_start - out.len() - 1) as u32),
        });
        return;
    }
    let (left, right) = runs.split_at(runs.len() / 2);
    let l = size(left);
    if l > MAX_SHORT_JUMP {
        // true: the `ja` over the left half; false: skip the `ja`.
        out.push(Insn(JGE_K, 0, 1, right[0].0));
        out.push(Insn(JA, 0, 0, l as u32));
    } else {
        out.push(Insn(JGE_K, l as u8, 0, right[0].0));
    }
    emit(left, tail_start, out);
    emit(right, tail_start, out);
}

const FLAT: &str = "fork:flat";
const NAMES: &str = "fork:names";
const TAIL: &str = "fork:tail";

/// A filter of the JSON given to seccompiler: one of the profile's as it is, or the
/// allowlist's fields with only some of its rules (or only their syscall names).
enum Part<'a> {
    Whole(&'a serde_json::Value),
    Rules(
        &'a serde_json::Map<String, serde_json::Value>,
        Vec<&'a serde_json::Value>,
    ),
    Names(
        &'a serde_json::Map<String, serde_json::Value>,
        Vec<&'a serde_json::Value>,
    ),
}

/// The named filters, as a JSON object.
struct Parts<'a>(Vec<(&'a str, Part<'a>)>);

impl serde::Serialize for Parts<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// `{"syscall": name}`.
struct Name<'a>(&'a serde_json::Value);

impl serde::Serialize for Name<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry(
            "syscall",
            self.0.get("syscall").unwrap_or(&serde_json::Value::Null),
        )?;
        m.end()
    }
}

impl serde::Serialize for Part<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (fields, rules) = match self {
            Part::Whole(v) => return v.serialize(s),
            Part::Rules(f, r) | Part::Names(f, r) => (f, r),
        };
        // Every field as the profile has it (seccompiler refuses unknown ones), `filter`
        // with these rules.
        let mut m = s.serialize_map(Some(fields.len()))?;
        for (k, v) in fields.iter() {
            if k != "filter" {
                m.serialize_entry(k, v)?;
            }
        }
        match self {
            Part::Names(..) => {
                let names: Vec<Name<'_>> = rules.iter().map(|r| Name(r)).collect();
                m.serialize_entry("filter", &names)?;
            }
            _ => m.serialize_entry("filter", rules)?,
        }
        m.end()
    }
}

/// The profile's programs in install order ([`super::FILTER_NAMES`]): the `successor`
/// filter as a binary search, the others as seccompiler compiles them; all from one
/// seccompiler compilation (of the profile's filters and the allowlist's two halves, so the
/// syscall names are looked up once). `profile` is the JSON seccompiler compiles, for
/// `arch`. None where the search cannot be built with certainty (seccompiler rejects a
/// part, or emits another shape, or the allowlist has no number-only rule to search): the
/// caller then compiles the profile as it is.
pub(super) fn compile(
    profile: &serde_json::Value,
    arch: seccompiler::TargetArch,
) -> Option<Vec<Vec<Insn>>> {
    let filters = profile.as_object()?;
    let successor = filters.get(super::FILTER_NAMES[0])?.as_object()?;
    let rules = successor.get("filter")?.as_array()?;
    let (conditional, unconditional): (Vec<&serde_json::Value>, Vec<_>) =
        rules.iter().partition(|r| r.get("args").is_some());
    if unconditional.is_empty() {
        // Nothing to search: seccompiler's program is the tail alone.
        return None;
    }
    // Written from borrowed parts (no copy of the profile's values).
    let mut parts: Vec<(&str, Part<'_>)> = filters
        .iter()
        .filter(|(name, _)| *name != super::FILTER_NAMES[0])
        .map(|(name, filter)| (name.as_str(), Part::Whole(filter)))
        .collect();
    parts.push((FLAT, Part::Rules(successor, unconditional)));
    if !conditional.is_empty() {
        // The numbers of the syscalls with conditions: the same names without `args`.
        parts.push((NAMES, Part::Names(successor, conditional.clone())));
        parts.push((TAIL, Part::Rules(successor, conditional)));
    }
    let json = serde_json::to_string(&Parts(parts)).ok()?;
    let mut map = seccompiler::compile_from_json(json.as_bytes(), arch).ok()?;
    let mut take = |name: &str| -> Option<Vec<Insn>> {
        Some(
            map.remove(name)?
                .into_iter()
                .map(|i| Insn(i.code, i.jt, i.jf, i.k))
                .collect(),
        )
    };
    let allowed = decode_flat(&take(FLAT)?)?;
    let search = match take(TAIL) {
        None => build(&allowed, &[], None)?,
        Some(tail) => build(&allowed, &decode_flat(&take(NAMES)?)?.nrs, Some(&tail))?,
    };
    let mut programs = vec![search];
    for name in &super::FILTER_NAMES[1..] {
        programs.push(take(name)?);
    }
    Some(programs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter for the instructions seccomp programs use: the return
    /// value for `seccomp_data` (nr, arch, args). Panics on anything else, on a jump out of
    /// the program, and on running off its end.
    fn run(p: &[Insn], nr: u32, arch: u32, args: &[u64; 6]) -> u32 {
        run_traced(p, nr, arch, args).0
    }

    /// [`run`], and whether the program read an argument on the way.
    fn run_traced(p: &[Insn], nr: u32, arch: u32, args: &[u64; 6]) -> (u32, bool) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut a, mut pc, mut read_args) = (0u32, 0usize, false);
        loop {
            let Insn(code, jt, jf, k) = p[pc];
            pc += 1;
            let jump = |cond: bool| usize::from(if cond { jt } else { jf });
            match code {
                LD_W_ABS => {
                    let o = k as usize;
                    read_args |= o >= 16;
                    a = u32::from_ne_bytes(data[o..o + 4].try_into().expect("in seccomp_data"));
                }
                0x54 => a &= k,         // BPF_ALU | BPF_AND | BPF_K
                JA => pc += k as usize, // BPF_JMP | BPF_JA
                JEQ_K => pc += jump(a == k),
                0x25 => pc += jump(a > k), // BPF_JGT | BPF_K
                JGE_K => pc += jump(a >= k),
                0x45 => pc += jump(a & k != 0), // BPF_JSET | BPF_K
                RET_K => return (k, read_args),
                other => panic!("instruction {other:#x} at {}", pc - 1),
            }
            assert!(pc < p.len(), "jumped past the end");
        }
    }

    /// The numbers, ascending, with their outcome looked up directly.
    fn lookup(points: &[(u32, u32)], nr: u32, deny: u32) -> u32 {
        points
            .iter()
            .find(|(n, _)| *n == nr)
            .map_or(deny, |(_, r)| *r)
    }

    fn flat(nrs: Vec<u32>) -> Flat {
        Flat {
            arch_check: [
                Insn(LD_W_ABS, 0, 0, ARCH_OFFSET),
                Insn(JEQ_K, 1, 0, 0xc000_003e),
                Insn(RET_K, 0, 0, 0x8000_0000),
            ],
            nrs,
            match_ret: Some(0x7fff_0000),
            mismatch_ret: 0x0005_0001,
        }
    }

    /// The search alone, on synthetic sets: every number 0..=max+2 and the extremes get
    /// exactly their set's outcome, and long halves are bridged (here thousands of runs).
    #[test]
    fn search_gives_each_number_its_outcome() {
        let tail = [Insn(RET_K, 0, 0, 0xdead)];
        let sets: Vec<(Vec<u32>, Vec<u32>)> = vec![
            (vec![], vec![]),
            (vec![0], vec![]),
            (vec![], vec![0]),
            (vec![u32::MAX], vec![u32::MAX - 1]),
            (vec![1, 2, 3, 7], vec![5]),
            (
                (0..3000).step_by(2).collect(),
                (1..3000).step_by(6).collect(),
            ),
            ((0..700).filter(|n| n % 3 != 0).collect(), vec![]),
        ];
        for (allow, cond) in sets {
            let f = flat(allow.clone());
            let p = build(&f, &cond, Some(&tail)).expect("builds");
            let mut points: Vec<(u32, u32)> = allow.iter().map(|n| (*n, 0x7fff_0000)).collect();
            points.extend(cond.iter().map(|n| (*n, 0xdead)));
            let max = points.iter().map(|p| p.0).max().unwrap_or(0);
            let mut nrs: Vec<u32> = (0..=max.saturating_add(2).min(10_000)).collect();
            nrs.extend([max, u32::MAX, u32::MAX - 1, 0x4000_0000, 0x8000_0000]);
            for nr in nrs {
                let got = run(&p, nr, 0xc000_003e, &[0; 6]);
                assert_eq!(got, lookup(&points, nr, 0x0005_0001), "nr {nr}");
                assert_eq!(run(&p, nr, 0x4000_0003, &[0; 6]), 0x8000_0000, "arch check");
            }
            // log2 depth: a few instructions per number, not hundreds.
            assert!(
                p.len() <= 4 + 3 * (allow.len() + cond.len()) * 2 + 2,
                "{}",
                p.len()
            );
        }
    }

    #[test]
    fn overlapping_sets_and_a_missing_tail_are_refused() {
        let tail = [Insn(RET_K, 0, 0, 0)];
        assert!(build(&flat(vec![1, 2]), &[2], Some(&tail)).is_none());
        assert!(build(&flat(vec![1, 2]), &[3], None).is_none());
        assert!(build(&flat(vec![1, 2]), &[], None).is_some());
    }

    #[test]
    fn only_seccompilers_exact_shape_is_decoded() {
        let f = flat(vec![3, 9]);
        let mut p = f.arch_check.to_vec();
        p.push(Insn(LD_W_ABS, 0, 0, NR_OFFSET));
        for nr in [3, 9] {
            p.extend([
                Insn(JEQ_K, 0, 1, nr),
                Insn(JA, 0, 0, 1),
                Insn(JA, 0, 0, 2),
                Insn(RET_K, 0, 0, 0x7fff_0000),
                Insn(RET_K, 0, 0, 0x0005_0001),
            ]);
        }
        p.push(Insn(RET_K, 0, 0, 0x0005_0001));
        assert_eq!(decode_flat(&p), Some(flat(vec![3, 9])));
        // Any instruction changed is not seccompiler's shape, except the audit arch and
        // the action on another architecture (copied as they are) and a syscall number
        // (another set, if still ascending).
        for i in 0..p.len() {
            let mut q = p.clone();
            q[i].3 ^= 0x100;
            match i {
                1 | 2 => assert!(decode_flat(&q).is_some_and(|d| d.nrs == [3, 9])),
                9 => assert!(decode_flat(&q).is_some_and(|d| d.nrs == [3, 9 ^ 0x100])),
                _ => assert!(decode_flat(&q).is_none(), "changed k at {i}"),
            }
            let mut q = p.clone();
            q[i].1 ^= 1;
            assert!(decode_flat(&q).is_none(), "changed jt at {i}");
        }
        let mut q = p.clone();
        q[4].3 = 10;
        assert!(decode_flat(&q).is_none(), "numbers out of order");
        assert!(decode_flat(&p[..p.len() - 1]).is_none());
    }

    use super::super::{compile_with, Arch, Dispatch};

    fn shipped_profile() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/seccomp/default.json")
    }

    /// Runs both programs of `json`'s allowlist (binary search and seccompiler's linear one)
    /// through a BPF interpreter: every syscall number below 1100, the x32 and out-of-range
    /// numbers, other architectures, and for the syscalls with argument rules each argument
    /// set to every constant of the program and its neighbours plus pseudo-random mixes.
    /// Returns the two programs' lengths.
    fn assert_same_decisions(json: &str, arch: Arch) -> (usize, usize) {
        let tree = compile_with("t", "t", json.as_bytes(), arch, Dispatch::BinarySearch)
            .expect("compiles");
        let linear =
            compile_with("t", "t", json.as_bytes(), arch, Dispatch::Linear).expect("compiles");
        let (t, l) = (&tree.programs.0[0], &linear.programs.0[0]);
        assert_eq!(
            tree.programs.0[1], linear.programs.0[1],
            "successor_enosys as it was"
        );
        let audit = match arch {
            Arch::X86_64 => 0xc000_003e,
            Arch::Aarch64 => 0xc000_00b7,
            Arch::Riscv64 => 0xc000_00f3,
        };
        let mut consts: Vec<u64> = vec![0, 1, u64::MAX, 0xffff_ffff, 0x1_0000_0000];
        for Insn(code, _, _, k) in l.iter().copied() {
            if code & 0x07 == 0x05 && code != 0x05 {
                let k = u64::from(k);
                consts.extend([
                    k,
                    k.wrapping_sub(1),
                    k + 1,
                    k | 0xffff_ffff_0000_0000,
                    k << 32,
                ]);
            }
        }
        let mut nrs: Vec<u32> = (0..1100).collect();
        nrs.extend((0..1100).map(|n| n | 0x4000_0000));
        nrs.extend([u32::MAX, u32::MAX - 1, 0x7fff_ffff, 0x8000_0000, 0xffff]);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for nr in nrs {
            for arch_value in [audit, 0x4000_0003, 0, 0xc000_003e, 0xc000_00b7] {
                let zero = [0u64; 6];
                let want = run(l, nr, arch_value, &zero);
                assert_eq!(run(t, nr, arch_value, &zero), want, "nr {nr}");
            }
            // Argument cases only where the linear program reads an argument.
            if !run_traced(l, nr, audit, &[0; 6]).1 {
                continue;
            }
            let probe = [0x5a5a_5a5a_5a5a_5a5au64; 6];
            let mut cases: Vec<[u64; 6]> = Vec::new();
            for i in 0..6 {
                for c in &consts {
                    let mut a = probe;
                    a[i] = *c;
                    cases.push(a);
                    let mut z = [0u64; 6];
                    z[i] = *c;
                    cases.push(z);
                }
            }
            for _ in 0..3000 {
                let mut a = [0u64; 6];
                for v in &mut a {
                    *v = consts[(next() % consts.len() as u64) as usize];
                }
                cases.push(a);
            }
            for a in cases {
                assert_eq!(
                    run(t, nr, audit, &a),
                    run(l, nr, audit, &a),
                    "nr {nr} args {a:x?}"
                );
            }
        }
        (t.len(), l.len())
    }

    /// The shipped profile: the same decision for every syscall number and argument case
    /// as seccompiler's program, in a fraction of the instructions; on aarch64 too.
    #[test]
    fn binary_search_decides_as_seccompilers_program() {
        let json = std::fs::read_to_string(shipped_profile()).unwrap();
        let (t, l) = assert_same_decisions(&json, Arch::X86_64);
        assert!(t * 3 < l, "binary search {t} instructions, linear {l}");
        let (t, l) = assert_same_decisions(&json, Arch::Aarch64);
        assert!(
            t * 3 < l,
            "aarch64: binary search {t} instructions, linear {l}"
        );
    }

    /// Other shapes of profile: only argument rules, no argument rules, another mismatch
    /// action, syscalls allowed one in two (hundreds of runs: long jumps in the search),
    /// and a rule with conditions on two arguments.
    #[test]
    fn binary_search_decides_as_seccompiler_on_other_profiles() {
        let shipped: serde_json::Value =
            serde_json::from_slice(&std::fs::read(shipped_profile()).unwrap()).unwrap();
        let rules = shipped["successor"]["filter"].as_array().unwrap().clone();
        let plain: Vec<serde_json::Value> = rules
            .iter()
            .filter(|r| r.get("args").is_none())
            .cloned()
            .collect();
        let with_args: Vec<serde_json::Value> = rules
            .iter()
            .filter(|r| r.get("args").is_some())
            .cloned()
            .collect();
        let every_other: Vec<serde_json::Value> = plain.iter().step_by(2).cloned().collect();
        let two_args = vec![serde_json::json!({"syscall": "syslog", "args": [
            {"index": 1, "type": "dword", "op": "eq", "val": 2},
            {"index": 2, "type": "qword", "op": "gt", "val": 4294967296u64}]})];
        let enosys = shipped["successor_enosys"].clone();
        let profile = |filter: Vec<serde_json::Value>, mismatch: serde_json::Value| {
            serde_json::json!({
                "successor": {"mismatch_action": mismatch, "match_action": "allow", "filter": filter},
                "successor_enosys": enosys,
            })
            .to_string()
        };
        let eperm = serde_json::json!({"errno": 1});
        for (what, filter, mismatch) in [
            ("argument rules only", with_args.clone(), eperm.clone()),
            ("no argument rules", plain.clone(), eperm.clone()),
            (
                "kill_process",
                rules.clone(),
                serde_json::json!("kill_process"),
            ),
            ("one in two", every_other.clone(), eperm.clone()),
            (
                "one in two with arguments",
                [every_other, with_args, two_args].concat(),
                serde_json::json!({"errno": 13}),
            ),
            ("empty", vec![], eperm.clone()),
        ] {
            let (t, l) = assert_same_decisions(&profile(filter, mismatch), Arch::X86_64);
            assert!(t <= l + 8, "{what}: binary search {t}, linear {l}");
        }
    }
}

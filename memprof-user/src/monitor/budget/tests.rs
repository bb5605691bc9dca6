//! `Budget`'s tests: costs from call rates, and the kernel's counts kept
//! for each image across execs, ends and reused pids.
use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use memprof_common::{
    images::{ProcessCalls, ProcessImage},
    sites::{AllocKey, AllocStats},
};

use super::{Budget, KernelCounts};
use crate::probes::Scopes;

fn site(tgid: u32, count: u64) -> (AllocKey, AllocStats) {
    image_site(tgid, 0, count)
}

fn image_site(tgid: u32, generation: u32, count: u64) -> (AllocKey, AllocStats) {
    (
        AllocKey {
            tgid,
            generation,
            ..AllocKey::default()
        },
        AllocStats {
            count,
            ..AllocStats::default()
        },
    )
}

fn counted(calls: u64) -> ProcessCalls {
    ProcessCalls {
        calls,
        bytes: calls * 10,
        traps: calls,
        end_cpu_ns: 0,
    }
}

fn by_tgid(tgid: u32, count: ProcessCalls) -> KernelCounts {
    KernelCounts {
        by_tgid: HashMap::from([(tgid, count)]),
        ..KernelCounts::default()
    }
}

#[test]
fn a_process_costs_its_call_rate_times_the_cost_per_call() {
    let mut scopes = Scopes::default();
    let mut budget = Budget::new(1.0, 500.0, false);
    let (exact, current) = (KernelCounts::default(), HashMap::new());
    budget.tick(
        &[site(7, 1_000)],
        &exact,
        &current,
        &HashMap::new(),
        &mut scopes,
    );
    std::thread::sleep(Duration::from_millis(100));
    budget.tick(
        &[site(7, 101_000), site(8, 5)],
        &exact,
        &current,
        &HashMap::new(),
        &mut scopes,
    );
    let image = |tgid| ProcessImage {
        tgid,
        generation: 0,
    };
    // 100,000 calls in ~0.1 s at 500 ns each: ~0.5 of a CPU.
    let cost = budget.overheads()[&image(7)];
    assert!((0.3..0.51).contains(&cost), "{cost}");
    // First seen now: measured from now on.
    assert_eq!(budget.overheads().get(&image(8)), None);
    assert_eq!(budget.duty_cycles()[&image(7)], 1.0);
}

#[test]
fn an_image_counted_by_the_kernel_keeps_that_count_after_its_process_ends() {
    let mut scopes = Scopes::default();
    let mut budget = Budget::new(1.0, 500.0, false);
    let image = ProcessImage {
        tgid: 7,
        generation: 0,
    };
    // Its samples say 10 calls, the kernel 1,000.
    let kernel = ProcessCalls {
        calls: 1_000,
        bytes: 64_000,
        traps: 1_000,
        end_cpu_ns: 0,
    };
    let current = HashMap::from([(7, 0)]);
    budget.tick(
        &[site(7, 10)],
        &by_tgid(7, kernel),
        &current,
        &HashMap::new(),
        &mut scopes,
    );
    std::thread::sleep(Duration::from_millis(100));
    // It has ended (its entry gone) and made no call since: its
    // samples' estimate (here 50,000) must not stand in.
    budget.tick(
        &[site(7, 50_000)],
        &KernelCounts::default(),
        &HashMap::new(),
        &HashMap::new(),
        &mut scopes,
    );
    assert_eq!(budget.overheads()[&image], 0.0);
}

#[test]
fn an_image_exec_d_over_another_counts_from_zero() {
    let mut scopes = Scopes::default();
    let mut budget = Budget::new(1.0, 500.0, false);
    let kernel = |calls| by_tgid(7, counted(calls));
    let site = |generation, count| image_site(7, generation, count);
    let at = |generation| HashMap::from([(7, generation)]);
    budget.tick(
        &[site(0, 3)],
        &kernel(100),
        &at(0),
        &HashMap::new(),
        &mut scopes,
    );
    // The shell exec'd its program, not sampled yet: the kernel counts
    // the program's calls from zero; they are not the shell's.
    budget.tick(
        &[site(0, 3)],
        &kernel(80),
        &at(1),
        &HashMap::new(),
        &mut scopes,
    );
    let both = [site(0, 3), site(1, 9)];
    budget.tick(&both, &kernel(150), &at(1), &HashMap::new(), &mut scopes);
    budget.tick(&both, &kernel(300), &at(1), &HashMap::new(), &mut scopes);
    // It ended; a new process took its pid (its count starts afresh).
    let three = [site(0, 3), site(1, 9), site(5_000, 2)];
    budget.tick(
        &three,
        &kernel(20),
        &at(5_000),
        &HashMap::new(),
        &mut scopes,
    );
    let counted: HashMap<u32, u64> = budget
        .exact_sites()
        .into_iter()
        .map(|(key, stats)| (key.generation, stats.count))
        .collect();
    assert_eq!(counted, HashMap::from([(0, 100), (1, 300), (5_000, 20)]));
}

#[test]
fn an_image_exec_d_over_has_its_whole_count_from_the_exec() {
    let mut scopes = Scopes::default();
    let mut budget = Budget::new(1.0, 500.0, false);
    let site = |generation, count| image_site(7, generation, count);
    let image = |generation| ProcessImage {
        tgid: 7,
        generation,
    };
    let at = |generation| HashMap::from([(7, generation)]);
    budget.tick(
        &[site(0, 3)],
        &by_tgid(7, counted(100)),
        &at(0),
        &HashMap::new(),
        &mut scopes,
    );
    // It made 40 more calls, then exec'd; the notices are behind, and
    // the pid's count is the new image's (5).
    let whole = KernelCounts {
        by_tgid: HashMap::from([(7, counted(5))]),
        before_exec: HashMap::from([(image(0), counted(140))]),
        ..KernelCounts::default()
    };
    budget.tick(&[site(0, 4)], &whole, &at(0), &HashMap::new(), &mut scopes);
    assert_eq!(budget.exact_calls[&image(0)], counted(140));
    // A report now, the new image seen: each its own count.
    let both = [site(0, 4), site(1, 2)];
    let now = KernelCounts {
        by_tgid: HashMap::from([(7, counted(9))]),
        ..whole
    };
    let totals = budget.counted_totals(&both, &now, &at(1), &HashMap::new());
    assert_eq!(totals[&image(0)].count, 140);
    assert_eq!(totals[&image(1)].count, 9);
    // An image first seen after its exec: its whole count too.
    let mut fresh = Budget::new(1.0, 500.0, false);
    let late = KernelCounts {
        by_tgid: HashMap::from([(7, counted(9))]),
        before_exec: HashMap::from([(image(0), counted(140))]),
        ..KernelCounts::default()
    };
    fresh.tick(&both, &late, &at(1), &HashMap::new(), &mut scopes);
    assert_eq!(fresh.exact_calls[&image(0)], counted(140));
    assert_eq!(fresh.exact_calls[&image(1)], counted(9));
    // Long after, the new image never sampled, the process ended (the
    // notices forget its pid): the pid's last count is the new
    // image's, never the old one's.
    for _ in 0..6 {
        let ended = by_tgid(7, counted(500));
        budget.tick(
            &[site(0, 4)],
            &ended,
            &HashMap::new(),
            &HashMap::new(),
            &mut scopes,
        );
    }
    assert_eq!(budget.exact_calls[&image(0)], counted(140));
}

/// A process none of whose calls was sampled is one image with no
/// site; once it ended, its last count stays its own, also when its
/// pid runs a new process already (announced, not counted yet).
#[test]
fn an_unsampled_process_s_count_is_its_own_after_its_pid_is_reused() {
    let budget = Budget::new(1.0, 500.0, false);
    let image = |generation| ProcessImage {
        tgid: 7,
        generation,
    };
    let running = by_tgid(7, counted(50));
    let current = HashMap::from([(7, 1)]);
    let listed = budget.unsampled_images(&[], &running, &current, &HashMap::new());
    assert_eq!(listed, HashSet::from([image(1)]));
    // Its pid now runs generation 2; the count is the ended one's.
    let ended = KernelCounts {
        ended: HashSet::from([7]),
        ..running
    };
    let current = HashMap::from([(7, 2)]);
    let last = HashMap::from([(7, 1)]);
    let listed = budget.unsampled_images(&[], &ended, &current, &last);
    assert_eq!(listed, HashSet::from([image(1)]));
    // Sampled: an image with a site is no unsampled one.
    let listed = budget.unsampled_images(&[image_site(7, 1, 1)], &ended, &current, &last);
    assert!(listed.is_empty());
}

//! The stack walk and the call-site tables: frames far apart on the
//! stack, and more distinct sites than the per-CPU slots hold.
use serde_json::Value;
use tests::*;

fn leaf_stacks(report: &Value) -> Vec<Value> {
    stacks_at(&processes_with(report, "leaf")[0], "leaf")
}

#[test]
fn frames_beyond_the_copied_window_are_walked() {
    let _serial = serial();
    let program = fixture("stacks", "fp", frame_pointers());
    let (output, report) = trace_json(&[], &[program.to_str().unwrap(), "deep"]);
    assert!(output.status.success());
    let stacks = leaf_stacks(&report);
    assert_eq!(stacks.len(), 1, "{stacks:?}");
    assert_eq!(
        (stacks[0]["bytes"].as_u64(), stacks[0]["count"].as_u64()),
        (Some(5 * 24), Some(5))
    );
    let mut expected = vec!["leaf".to_string()];
    expected.extend(std::iter::repeat_n("descend".to_string(), 12));
    expected.push("main".to_string());
    assert_eq!(frame_functions(&stacks[0])[..14], expected[..]);
    assert_eq!(report["lost"]["read_fault"], 0);
    assert_nothing_loaded();
}

#[test]
fn more_sites_than_slots_are_all_exact() {
    let _serial = serial();
    let program = fixture("stacks", "fp", frame_pointers());
    // Nearly twice the 512 slots of a CPU (trace_json shows the top 1000).
    let sites = 990u64;
    let (output, report) = trace_json(
        &[],
        &[program.to_str().unwrap(), "wide", &sites.to_string()],
    );
    assert!(output.status.success());
    let stacks = leaf_stacks(&report);
    assert_eq!(stacks.len() as u64, sites);
    for stack in &stacks {
        assert_eq!(
            (stack["bytes"].as_u64(), stack["count"].as_u64()),
            (Some(120), Some(3)),
            "{stack}"
        );
    }
    for cause in ["map_full", "stack_collision", "stack_error"] {
        assert_eq!(report["lost"][cause], 0, "{cause}");
    }
    assert_nothing_loaded();
}

//! Golden orders: 1F1B and interleaved 1F1B for P = 4, M = 8 (V = 2), written out from the published
//! algorithms (Megatron-Core `forward_backward_pipelining_without_interleaving` /
//! `..._with_interleaving` and its `get_schedule_table`; PyTorch pipelining `Schedule1F1B` /
//! `ScheduleInterleaved1F1B`), not from pipefill's generators.

use pipefill_host::schedule::validate::validate;
use pipefill_host::schedule::{families, Item, Params, Schedule};

fn lists(s: &Schedule) -> Vec<String> {
    s.actions
        .iter()
        .map(|l| l.iter().map(Item::to_string).collect::<Vec<_>>().join(" "))
        .collect()
}

/// 1F1B, rank r: P-r-1 warm-up forwards, then F/B pairs, then the remaining backwards.
#[test]
fn one_f_one_b_p4_m8() {
    let s = families::generate("1f1b", &Params::new(4, 8)).unwrap();
    let expected = [
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7",
    ];
    assert_eq!(lists(&s), expected);
    assert_eq!(validate(&s).unwrap().peak_in_flight, vec![4, 3, 2, 1]);
}

/// Interleaved 1F1B, P = 4, V = 2, M = 8, group size 4 (Megatron default = PyTorch's microbatches
/// per round). Rank r holds stages r and 4 + r. Virtual microbatches (table): 0-3 -> mb 0-3 chunk 0,
/// 4-7 -> mb 0-3 chunk 1, 8-11 -> mb 4-7 chunk 0, 12-15 -> mb 4-7 chunk 1; backward i uses chunk
/// 1 - chunk(i). Warm-up = 2*(P-r-1) + (V-1)*4 = 10, 8, 6, 4.
#[test]
fn interleaved_1f1b_p4_m8_v2() {
    let s = families::generate("interleaved-1f1b", &Params::new(4, 8).with_chunks(2)).unwrap();
    let expected = [
        concat!(
            "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 0F4 0F5 ",
            "0F6 4B0 0F7 4B1 4F4 4B2 4F5 4B3 4F6 0B0 4F7 0B1 ",
            "0B2 0B3 4B4 4B5 4B6 4B7 0B4 0B5 0B6 0B7"
        ),
        concat!(
            "1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 ",
            "1F4 5B0 1F5 5B1 1F6 5B2 1F7 5B3 5F4 1B0 5F5 1B1 5F6 1B2 5F7 1B3 ",
            "5B4 5B5 5B6 5B7 1B4 1B5 1B6 1B7"
        ),
        concat!(
            "2F0 2F1 2F2 2F3 6F0 6F1 ",
            "6F2 6B0 6F3 6B1 2F4 6B2 2F5 6B3 2F6 2B0 2F7 2B1 6F4 2B2 6F5 2B3 6F6 6B4 6F7 6B5 ",
            "6B6 6B7 2B4 2B5 2B6 2B7"
        ),
        concat!(
            "3F0 3F1 3F2 3F3 ",
            "7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 3F4 3B0 3F5 3B1 3F6 3B2 3F7 3B3 ",
            "7F4 7B4 7F5 7B5 7F6 7B6 7F7 7B7 ",
            "3B4 3B5 3B6 3B7"
        ),
    ];
    assert_eq!(lists(&s), expected);
    // Peak: rank r holds its warm-up forwards plus the first steady forward before any backward.
    assert_eq!(validate(&s).unwrap().peak_in_flight, vec![11, 9, 7, 5]);
}

/// Megatron-Core's own example in `get_schedule_table`'s comment: PP 2, group 3, M 5, VP 2 gives
/// microbatches 0 1 2 0 1 2 3 4 3 4 on chunks 0 0 0 1 1 1 0 0 1 1.
#[test]
fn interleaved_table_matches_megatron_example() {
    let s = families::generate(
        "interleaved-1f1b",
        &Params::new(2, 5).with_chunks(2).with_group_size(3),
    )
    .unwrap();
    // Rank 1 holds stages 1 (chunk 0) and 3 (chunk 1); its forwards follow the table.
    let forwards: Vec<String> = s.actions[1]
        .iter()
        .map(Item::to_string)
        .filter(|t| t.contains('F'))
        .collect();
    assert_eq!(
        forwards,
        ["1F0", "1F1", "1F2", "3F0", "3F1", "3F2", "1F3", "1F4", "3F3", "3F4"]
    );
    validate(&s).unwrap();
}

/// GPipe and looped BFS: forwards in order, then backwards (BFS: local stages last to first, each in
/// reverse microbatch order, as PyTorch's `ScheduleLoopedBFS`).
#[test]
fn gpipe_and_looped_bfs_p2_m2() {
    let g = families::generate("gpipe", &Params::new(2, 2)).unwrap();
    assert_eq!(lists(&g), ["0F0 0F1 0B0 0B1", "1F0 1F1 1B0 1B1"]);
    let b = families::generate("looped-bfs", &Params::new(2, 2).with_chunks(2)).unwrap();
    assert_eq!(
        lists(&b),
        [
            "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0",
            "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0"
        ]
    );
    assert_eq!(validate(&b).unwrap().peak_in_flight, vec![4, 4]);
}

/// A last group smaller than P can deadlock; the refusal names group sizes that work, and they do.
#[test]
fn interleaved_refuses_deadlocking_groups_and_advice_works() {
    let p = Params::new(9, 10).with_chunks(3);
    let e = families::generate("interleaved-1f1b", &p).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("deadlocks") && msg.contains("G in {10}"),
        "{msg}"
    );
    validate(&families::generate("interleaved-1f1b", &p.with_group_size(10)).unwrap()).unwrap();
    // M < P: the order from G = P may still run (with bubbles); when it does not, the advice is M >= P.
    for m in 1..9 {
        match families::generate("interleaved-1f1b", &Params::new(9, m).with_chunks(3)) {
            Ok(s) => assert!(validate(&s).is_ok()),
            Err(e) => assert!(e.to_string().contains("use M >= P"), "{e}"),
        }
    }
}

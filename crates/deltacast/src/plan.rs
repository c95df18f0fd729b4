//! The deterministic planners: every rank (and a receiver checking a sender) cuts the same
//! sequence of sizes into the same consecutive groups, so collective calls and frames line up
//! without anyone sending the plan.
//!
//! One cut underlies the sync's groups, [`cut_when_full`]: a group closes once it holds a
//! threshold. The gather's rounds ([`plan_rounds`]) use it as is; the GPU's stages
//! ([`plan_stages`]) use it with a threshold of equal shares, after keeping a small last stage
//! apart. The gather's sub-rounds ([`plan_sub_rounds`]) differ on purpose: their budget is a
//! cap (what the leader holds at once), so a group closes *before* it would exceed it.

use std::ops::Range;

/// Groups closed by [`cut_when_full`] and what was left over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// Consecutive groups, each holding at least the threshold.
    pub closed: Vec<Range<usize>>,
    /// The items after the last closed group (empty when the last item closed a group).
    pub rest: Range<usize>,
    /// Bytes of `rest`.
    pub rest_bytes: u64,
}

/// Cuts `sizes` into consecutive groups, closing each once it holds `threshold` bytes (a
/// threshold of 0 closes a group after every item). Sums saturate.
pub fn cut_when_full(sizes: impl IntoIterator<Item = u64>, threshold: u64) -> Cut {
    let mut closed = Vec::new();
    let (mut start, mut held, mut n) = (0usize, 0u64, 0usize);
    for (i, b) in sizes.into_iter().enumerate() {
        held = held.saturating_add(b);
        n = i + 1;
        if held >= threshold {
            closed.push(start..n);
            (start, held) = (n, 0);
        }
    }
    Cut {
        closed,
        rest: start..n,
        rest_bytes: held,
    }
}

/// The gather's rounds: groups of parameters (`sizes[p]`: the bytes of parameter `p`'s slots
/// in the full model, the same on every rank), each closed once it holds `round_bytes`, the
/// remainder a round of its own. No rounds for no parameters.
pub fn plan_rounds(sizes: impl IntoIterator<Item = u64>, round_bytes: u64) -> Vec<Range<usize>> {
    let cut = cut_when_full(sizes, round_bytes);
    let mut rounds = cut.closed;
    if !cut.rest.is_empty() {
        rounds.push(cut.rest);
    }
    rounds
}

/// Cuts slots of `slot_bytes` each into consecutive stages of whole slots: a last stage of
/// the fewest trailing slots that hold half of `stage_bytes` (the receiver's work on it is
/// what the sync waits for after the sender's last diff, so it is kept small), and before it
/// as few stages of about equal size as keep each near `stage_bytes`: each closed once it
/// holds its share (`ceil(bytes before the last stage / stage_bytes)` shares), a remainder
/// under half a share joining the stage before it. `stage_bytes` 0 gives one stage. Always
/// at least one stage (`0..0` for no slots).
#[allow(clippy::single_range_in_vec_init)] // a list of one stage, not of its slots
pub fn plan_stages(slot_bytes: &[u64], stage_bytes: u64) -> Vec<Range<usize>> {
    let n = slot_bytes.len();
    if stage_bytes == 0 || n == 0 {
        return vec![0..n];
    }
    let mut tail = n;
    let mut held = 0u64;
    while tail > 0 && (held < stage_bytes.div_ceil(2) || tail == n) {
        tail -= 1;
        held = held.saturating_add(slot_bytes[tail]);
    }
    let before = slot_bytes[..tail]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b));
    let share = before.div_ceil(before.div_ceil(stage_bytes).max(1)).max(1);
    let cut = cut_when_full(slot_bytes[..tail].iter().copied(), share);
    let mut stages = cut.closed;
    if !cut.rest.is_empty() {
        match stages.last_mut() {
            Some(last) if cut.rest_bytes < share.div_ceil(2) => last.end = tail,
            _ => stages.push(cut.rest),
        }
    }
    stages.push(tail..n);
    stages
}

/// Packs the (slot, rank) pieces with bytes into sub-rounds of at most `budget` bytes (a piece
/// larger than the budget travels alone), in slot-major order; pieces of 0 bytes are left
/// out. Pure function of the matrix, so every rank derives the same sub-rounds.
pub fn plan_sub_rounds(
    slots: usize,
    world: usize,
    budget: u64,
    bytes: impl Fn(usize, usize) -> u64,
) -> Vec<Vec<(usize, usize)>> {
    let mut plan: Vec<Vec<(usize, usize)>> = Vec::new();
    let mut current = Vec::new();
    let mut used = 0u64;
    for s in 0..slots {
        for r in 0..world {
            let b = bytes(r, s);
            if b == 0 {
                continue;
            }
            if !current.is_empty() && used.saturating_add(b) > budget {
                plan.push(std::mem::take(&mut current));
                used = 0;
            }
            current.push((s, r));
            used = used.saturating_add(b);
        }
    }
    if !current.is_empty() {
        plan.push(current);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded LCG: the same cases on every run.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *state >> 11
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn rounds_close_once_full() {
        assert_eq!(plan_rounds([], 10), Vec::<Range<usize>>::new());
        assert_eq!(plan_rounds([5, 5, 5], 10), vec![0..2, 2..3]);
        assert_eq!(plan_rounds([5, 5, 5], 0), vec![0..1, 1..2, 2..3]);
        assert_eq!(plan_rounds([0, 0], 0), vec![0..1, 1..2]);
        assert_eq!(plan_rounds([0, 0], 1), vec![0..2]);
        assert_eq!(plan_rounds([20, 1, 9, 0, 0], 10), vec![0..1, 1..3, 3..5]);
        assert_eq!(
            plan_rounds([u64::MAX, u64::MAX, 1], u64::MAX),
            vec![0..1, 1..2, 2..3]
        );
        let mut state = 5u64;
        for _ in 0..2000 {
            let n = (lcg(&mut state) % 30) as usize;
            let sizes: Vec<u64> = (0..n).map(|_| lcg(&mut state) % 100).collect();
            let target = lcg(&mut state) % 400;
            let rounds = plan_rounds(sizes.iter().copied(), target);
            let sum = |r: &Range<usize>| sizes[r.clone()].iter().sum::<u64>();
            // Consecutive, covering every parameter, none empty.
            assert_eq!(rounds.first().map_or(0, |r| r.start), 0);
            assert_eq!(rounds.last().map_or(0, |r| r.end), n);
            for w in rounds.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(rounds.iter().all(|r| !r.is_empty()));
            // Every round but the last is full, and would not be without its last parameter.
            for (i, r) in rounds.iter().enumerate() {
                let full = sum(r) >= target;
                assert!(
                    full || i + 1 == rounds.len(),
                    "{sizes:?} {target} {rounds:?}"
                );
                if full {
                    assert!(
                        r.len() == 1 || sum(&(r.start..r.end - 1)) < target,
                        "{sizes:?} {target} {rounds:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn sub_rounds_stay_under_the_budget_in_slot_major_order() {
        let mut state = 9u64;
        for _ in 0..2000 {
            let slots = (lcg(&mut state) % 12) as usize;
            let world = 1 + (lcg(&mut state) % 5) as usize;
            // A third of the pieces empty, some larger than the budget.
            let cells: Vec<u64> = (0..slots * world)
                .map(|_| match lcg(&mut state) % 3 {
                    0 => 0,
                    _ => lcg(&mut state) % 300,
                })
                .collect();
            let budget = lcg(&mut state) % 400;
            let bytes = |r: usize, s: usize| cells[s * world + r];
            let plan = plan_sub_rounds(slots, world, budget, bytes);
            let expected: Vec<(usize, usize)> = (0..slots)
                .flat_map(|s| (0..world).map(move |r| (s, r)))
                .filter(|&(s, r)| bytes(r, s) > 0)
                .collect();
            assert_eq!(plan.concat(), expected);
            let sum = |sub: &[(usize, usize)]| sub.iter().map(|&(s, r)| bytes(r, s)).sum::<u64>();
            for (i, sub) in plan.iter().enumerate() {
                assert!(!sub.is_empty());
                assert!(sum(sub) <= budget || sub.len() == 1, "{cells:?} {budget}");
                // Greedy: the next sub-round's first piece did not fit in this one.
                if let Some(next) = plan.get(i + 1) {
                    assert!(sum(sub) + sum(&next[..1]) > budget, "{cells:?} {budget}");
                }
            }
        }
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn stages_are_planned_whole_and_in_order() {
        assert_eq!(plan_stages(&[], 10), vec![0..0]);
        assert_eq!(plan_stages(&[5, 5, 5], 0), vec![0..3]);
        assert_eq!(plan_stages(&[100], 10), vec![0..1]);
        // The last stage: the fewest trailing slots with half a stage; before it, equal
        // shares (25 bytes in 3 shares of 9; 17 in 2 of 9; 30 in 3 of 10), a remainder of
        // half a share or more a stage of its own.
        assert_eq!(
            plan_stages(&[5, 5, 5, 5, 5, 5], 10),
            vec![0..2, 2..4, 4..5, 5..6]
        );
        assert_eq!(
            plan_stages(&[4, 4, 4, 4, 1, 1, 4], 10),
            vec![0..3, 3..5, 5..7]
        );
        assert_eq!(plan_stages(&[3; 12], 10), vec![0..4, 4..8, 8..10, 10..12]);
        // A remainder under half a share joins the stage before it.
        assert_eq!(plan_stages(&[6, 6, 1, 6], 10), vec![0..3, 3..4]);
        assert_eq!(plan_stages(&[1, 100, 1, 7], 10), vec![0..3, 3..4]);
        assert_eq!(plan_stages(&[100, 1, 1], 10), vec![0..3]);
        let mut state = 3u64;
        for _ in 0..2000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (state >> 40) as usize % 40;
            let bytes: Vec<u64> = (0..n as u64).map(|i| (state >> (i % 30)) % 1000).collect();
            let target = (state >> 20) % 3000;
            let stages = plan_stages(&bytes, target);
            // Consecutive, covering every slot, none empty unless there are no slots.
            assert_eq!(stages[0].start, 0);
            assert_eq!(stages.last().map(|r| r.end), Some(n));
            for w in stages.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(stages.iter().all(|r| !r.is_empty()) || n == 0);
            assert!(stages.len() <= n.max(1));
            if target == 0 {
                assert_eq!(stages.len(), 1);
                continue;
            }
            let sum = |r: &std::ops::Range<usize>| bytes[r.clone()].iter().sum::<u64>();
            // The last stage holds half a stage (unless it is everything), and without its
            // first slot it would not.
            let (last, rest) = stages.split_last().expect("a stage");
            assert!(sum(last) >= target.div_ceil(2) || last.start == 0);
            if last.len() > 1 {
                let without_first = sum(&(last.start + 1..n));
                assert!(
                    without_first < target.div_ceil(2),
                    "{bytes:?} {target} {stages:?}"
                );
            }
            // No more stages before it than shares, plus one for a remainder; none of them
            // fuller than a stage and a half plus one slot.
            let before: u64 = rest.iter().map(sum).sum();
            assert!(
                rest.len() as u64 <= before.div_ceil(target) + 1,
                "{bytes:?} {target}"
            );
            let biggest = bytes.iter().copied().max().unwrap_or(0);
            assert!(rest.iter().all(|r| sum(r) <= target + target / 2 + biggest));
        }
    }
}

//! How the room below the peak is shared out among the shards: [`share_slack`].
//!
//! Every shard may raise its value up to its limit without the lock. As long as the limits
//! add up to at most the peak, no combination of lock-free updates can take the sum of the
//! values above the peak, so the peak stays exact without anyone looking at the sum. The room
//! `peak - sum` (the slack) is what the limits can hand out; this module decides who gets it
//! when a shard runs out and a scan recomputes the sum.

/// Recomputes the limits after a scan. `values[i]` are the shards' current values (a
/// consistent snapshot, the requester's own update included), `limits[i]` their limits before
/// the scan and `requester` the shard that ran out of room; `peak` must be at least the sum
/// of `values`.
///
/// On return every `limits[i] >= values[i]` and the limits add up to at most `peak`. The other
/// shards keep the room they had above their values when it all fits in the slack, and the
/// requester gets what is left; when it does not fit, the requester gets half the slack and
/// the others' room is scaled down to fit the other half. So two threads churning below the
/// peak settle on limits that cover both (and stop scanning), while room left with shards of
/// threads that went quiet drains, halving at each scan, towards the threads that need it.
pub(super) fn share_slack(values: &[i64], limits: &mut [i64], requester: usize, peak: i64) {
    debug_assert_eq!(values.len(), limits.len());
    let sum: i128 = values.iter().map(|&v| i128::from(v)).sum();
    let slack = (i128::from(peak) - sum).max(0);
    let room = |limit: i64, value: i64| (i128::from(limit) - i128::from(value)).max(0);
    let others: i128 = (0..values.len())
        .filter(|&i| i != requester)
        .map(|i| room(limits[i], values[i]))
        .sum();
    // What the others may keep in all.
    let keep = if others > slack { slack / 2 } else { others };
    let mut kept = 0i128;
    for i in 0..values.len() {
        if i == requester {
            continue;
        }
        let own = room(limits[i], values[i]);
        let r = if others <= keep {
            own
        } else {
            // others > keep >= 0, so others > 0; the scaled shares add up to at most `keep`.
            // (Only absurd counts overflow the product; no room is the safe answer then.)
            own.checked_mul(keep).map_or(0, |p| p / others)
        };
        kept += r;
        limits[i] = to_limit(values[i], r);
    }
    if let Some(&v) = values.get(requester) {
        limits[requester] = to_limit(v, slack - kept);
    }
}

/// `value + room`, clamped into `i64` (only absurd byte counts get near the edge; clamping
/// down keeps the sum of the limits within the peak).
fn to_limit(value: i64, room: i128) -> i64 {
    i64::try_from(i128::from(value) + room.max(0)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn total(xs: &[i64]) -> i128 {
        xs.iter().map(|&x| i128::from(x)).sum()
    }

    #[test]
    fn lone_thread_gets_all_the_slack() {
        let values = [0, 40, 0];
        let mut limits = [0, 10, 0];
        share_slack(&values, &mut limits, 1, 100);
        assert_eq!(limits, [0, 100, 0]);
    }

    #[test]
    fn two_churning_threads_settle() {
        // Peak 512 reached with both holding 256; A scans while B is between pairs.
        let values = [256, 0];
        let mut limits = [0, 256];
        share_slack(&values, &mut limits, 0, 512);
        assert_eq!(limits, [256, 256], "B keeps its room, A gets the rest");
    }

    #[test]
    fn idle_room_drains_to_the_requester() {
        let values = [500, 0];
        let mut limits = [400, 1000];
        share_slack(&values, &mut limits, 0, 1500);
        // The others' room fits the slack exactly: kept.
        assert_eq!(limits, [500, 1000]);
        let values = [600, 0];
        share_slack(&values, &mut limits, 0, 1500);
        // Slack 900, others' room 1000: halved.
        assert_eq!(limits, [1050, 450]);
        let values = [1100, 0];
        share_slack(&values, &mut limits, 0, 1500);
        assert_eq!(limits, [1300, 200]);
    }

    #[test]
    fn no_slack_means_tight_limits() {
        let values = [300, 200, -50];
        let mut limits = [100, 900, 0];
        share_slack(&values, &mut limits, 0, 450);
        assert_eq!(limits, [300, 200, -50]);
    }

    #[test]
    fn absurd_values_clamp_without_panicking() {
        let values = [i64::MAX, i64::MIN + 1];
        let mut limits = [0, i64::MAX];
        share_slack(&values, &mut limits, 0, i64::MAX);
        assert_eq!(limits[0], i64::MAX);
        assert!(limits[1] >= values[1]);
        // Each other shard's room near 2^64, the room they may keep 2^64: the product
        // overflows i128.
        let values = [i64::MIN, i64::MIN, i64::MIN, i64::MIN, i64::MAX];
        let mut limits = [i64::MAX, i64::MAX, i64::MAX, i64::MAX, 0];
        share_slack(&values, &mut limits, 4, i64::MAX);
        assert!(
            limits.iter().zip(&values).all(|(l, v)| l >= v),
            "{limits:?}"
        );
    }

    proptest! {
        #[test]
        fn limits_cover_values_and_fit_the_peak(
            shards in proptest::collection::vec((-1000i64..1000, 0i64..1000), 1..8),
            pick in 0usize..8,
            extra in 0i64..5000,
        ) {
            let values: Vec<i64> = shards.iter().map(|s| s.0).collect();
            let requester = pick % values.len();
            // Old limits: room above each value (the requester overflowed its own).
            let mut limits: Vec<i64> = shards.iter().map(|s| s.0 + s.1).collect();
            limits[requester] = values[requester] - 1;
            let sum = total(&values);
            let peak = i64::try_from(sum.max(0) + i128::from(extra)).unwrap();
            let before = limits.clone();
            share_slack(&values, &mut limits, requester, peak);
            let slack = i128::from(peak) - sum;
            let others: i128 = (0..values.len())
                .filter(|&i| i != requester)
                .map(|i| i128::from(before[i] - values[i]))
                .sum();
            for i in 0..values.len() {
                prop_assert!(limits[i] >= values[i]);
                if i != requester {
                    // Others never gain room, and keep all of it when it fits.
                    prop_assert!(limits[i] <= before[i]);
                    if others <= slack {
                        prop_assert_eq!(limits[i], before[i]);
                    }
                }
            }
            prop_assert!(total(&limits) <= i128::from(peak));
            let got = i128::from(limits[requester] - values[requester]);
            let owed = if others > slack { slack / 2 } else { slack - others };
            prop_assert!(got >= owed, "got {} owed {}", got, owed);
        }
    }
}

//! [`Counter`]: the current, peak and total of one statistic.

/// The current, peak and total value of one statistic (bytes or allocation count), as RMM's
/// `statistics_resource_adaptor::counter` (all `i64`).
///
/// `value` may go negative when memory not allocated through the adaptor is freed through it;
/// `peak` starts at 0 and so never goes below it.
#[doc(alias = "rmm::mr::statistics_resource_adaptor::counter")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Counter {
    /// Current value.
    pub value: i64,
    /// Largest `value` seen (0 at the start).
    pub peak: i64,
    /// Sum of everything ever added.
    pub total: i64,
}

impl Counter {
    /// A counter with the given fields.
    pub const fn new(value: i64, peak: i64, total: i64) -> Counter {
        Counter { value, peak, total }
    }

    /// Adds `amount` to the value and the total and raises the peak if needed (RMM's
    /// `operator+=`). Arithmetic wraps rather than panicking.
    pub fn add(&mut self, amount: i64) {
        self.value = self.value.wrapping_add(amount);
        self.total = self.total.wrapping_add(amount);
        self.peak = self.peak.max(self.value);
    }

    /// Subtracts `amount` from the value (RMM's `operator-=`).
    pub fn sub(&mut self, amount: i64) {
        self.value = self.value.wrapping_sub(amount);
    }

    /// Folds in the counter of a block tracked inside this one (RMM's
    /// `add_counters_from_tracked_sub_block`): the child's peak is shifted by this counter's
    /// value when the child started, `peak = max(peak, value + child.peak)`, then the child's
    /// value and total are added.
    pub fn add_counters_from_tracked_sub_block(&mut self, child: &Counter) {
        self.peak = self.peak.max(self.value.wrapping_add(child.peak));
        self.value = self.value.wrapping_add(child.value);
        self.total = self.total.wrapping_add(child.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_sub_follow_rmm() {
        let mut c = Counter::default();
        c.add(10);
        c.add(5);
        c.sub(12);
        c.add(4);
        assert_eq!(c, Counter::new(7, 15, 19));
        c.sub(20);
        assert_eq!(c, Counter::new(-13, 15, 19));
    }

    #[test]
    fn peak_starts_at_zero_even_when_value_goes_negative() {
        let mut c = Counter::default();
        c.sub(5);
        c.add(3);
        assert_eq!(c, Counter::new(-2, 0, 3));
    }

    #[test]
    fn merge_shifts_child_peak_by_parent_value() {
        // Parent: value 100, earlier peak 120. Child: peak 50 above its start, net +30.
        let mut parent = Counter::new(100, 120, 300);
        parent.add_counters_from_tracked_sub_block(&Counter::new(30, 50, 70));
        assert_eq!(parent, Counter::new(130, 150, 370));
        // A child whose shifted peak stays below the parent's keeps the parent's peak.
        let mut parent = Counter::new(10, 120, 10);
        parent.add_counters_from_tracked_sub_block(&Counter::new(-5, 20, 0));
        assert_eq!(parent, Counter::new(5, 120, 10));
    }
}

//! The exporter's record of what it exported: pure bookkeeping, no socket, no CUDA.
//!
//! An export is *outstanding* from the moment its id is handed out until the importer's
//! release arrives (then it is *released*, waiting for its owner to take it back) or the
//! connection ends (then every outstanding export is *orphaned*: the importing process closed
//! its end, which rmm-rs's importer does only after its last release, or it ended). Only a
//! released or orphaned export may be freed.

use std::collections::HashMap;

/// How an export came back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Returned<T> {
    /// The importer released it.
    Released(T),
    /// The connection ended while it was outstanding.
    Orphaned(T),
}

/// What [`Ledger::take`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take<T> {
    /// The export, back.
    Back(Returned<T>),
    /// Still outstanding: wait for the next message.
    Wait,
    /// No export has this id (never made, or already taken).
    Unknown,
}

/// See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Ledger<T> {
    next_id: u64,
    outstanding: HashMap<u64, T>,
    released: HashMap<u64, T>,
    closed: bool,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Self {
            next_id: 1,
            outstanding: HashMap::new(),
            released: HashMap::new(),
            closed: false,
        }
    }
}

impl<T> Ledger<T> {
    /// Records `item` as outstanding under a new id.
    pub(crate) fn insert(&mut self, item: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.outstanding.insert(id, item);
        id
    }

    /// Takes back an export that was never sent (its message failed): nothing imported it.
    pub(crate) fn cancel(&mut self, id: u64) -> Option<T> {
        self.outstanding.remove(&id)
    }

    /// The importer released `id`. An id that is not outstanding is the importer's error.
    pub(crate) fn release(&mut self, id: u64) -> Result<(), String> {
        match self.outstanding.remove(&id) {
            Some(item) => {
                self.released.insert(id, item);
                Ok(())
            }
            None => Err(format!(
                "the importer released export {id}, which is not outstanding"
            )),
        }
    }

    /// The connection ended: every outstanding export is orphaned.
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    /// Whether the connection ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Takes export `id` back if it was released or orphaned.
    pub(crate) fn take(&mut self, id: u64) -> Take<T> {
        if let Some(item) = self.released.remove(&id) {
            return Take::Back(Returned::Released(item));
        }
        if !self.outstanding.contains_key(&id) {
            return Take::Unknown;
        }
        if self.closed {
            if let Some(item) = self.outstanding.remove(&id) {
                return Take::Back(Returned::Orphaned(item));
            }
        }
        Take::Wait
    }

    /// Exports not yet released.
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Everything that may be freed now: the released exports, and the outstanding ones too
    /// once the connection ended.
    pub(crate) fn drain_returned(&mut self) -> Vec<T> {
        let mut out: Vec<T> = self.released.drain().map(|(_, v)| v).collect();
        if self.closed {
            out.extend(self.outstanding.drain().map(|(_, v)| v));
        }
        out
    }

    /// Everything still recorded, whatever its state (for a drop that must leak it).
    pub(crate) fn drain_all(&mut self) -> Vec<T> {
        let mut out: Vec<T> = self.released.drain().map(|(_, v)| v).collect();
        out.extend(self.outstanding.drain().map(|(_, v)| v));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_comes_back_only_after_its_release() {
        let mut l = Ledger::default();
        let a = l.insert("a");
        let b = l.insert("b");
        assert_ne!(a, b);
        assert_eq!(l.take(a), Take::Wait);
        assert_eq!(l.outstanding(), 2);
        l.release(a).unwrap();
        assert_eq!(l.outstanding(), 1);
        assert_eq!(l.take(a), Take::Back(Returned::Released("a")));
        assert_eq!(l.take(a), Take::Unknown);
        assert!(
            l.release(a).is_err(),
            "a second release is the importer's error"
        );
        assert!(l.release(99).is_err());
        assert_eq!(l.take(b), Take::Wait);
        assert!(l.drain_returned().is_empty());
    }

    #[test]
    fn a_closed_connection_orphans_what_is_outstanding() {
        let mut l = Ledger::default();
        let a = l.insert(1);
        let b = l.insert(2);
        let c = l.insert(3);
        l.release(a).unwrap();
        assert_eq!(l.cancel(c), Some(3));
        assert!(!l.is_closed());
        l.close();
        assert!(l.is_closed());
        assert_eq!(l.take(b), Take::Back(Returned::Orphaned(2)));
        assert_eq!(l.take(a), Take::Back(Returned::Released(1)));
        assert_eq!(l.take(c), Take::Unknown);
        assert_eq!(l.outstanding(), 0);
    }

    #[test]
    fn drains_free_only_what_may_be_freed() {
        let mut l = Ledger::default();
        let a = l.insert(1);
        let _b = l.insert(2);
        l.release(a).unwrap();
        assert_eq!(l.drain_returned(), vec![1]);
        assert_eq!(l.outstanding(), 1);
        l.close();
        assert_eq!(l.drain_returned(), vec![2]);
        let _c = l.insert(3);
        assert_eq!(l.drain_all(), vec![3]);
    }
}

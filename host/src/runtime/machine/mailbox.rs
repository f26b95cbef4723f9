//! A rank's mailbox: the data waiting for its consumer on this rank, by [`Edge`], and for data that
//! crossed from another rank, how it came; the transfer is recorded when the consumer takes it.

use crate::runtime::key_map::KeyMap;
use crate::schedule::deps::Edge;
use crate::schedule::Action;
use crate::timeline::Transfer;

/// How data crossed from another rank.
pub(crate) struct Arrival {
    /// The sending rank.
    pub from: usize,
    /// The producing action.
    pub producer: Action,
    /// When it was sent, in seconds since the step began.
    pub sent_at: f64,
    /// When it was received.
    pub received_at: f64,
    /// Its size.
    pub bytes: usize,
}

/// Data waiting for its consumer, with where it came from if it crossed ranks.
struct Mail<P> {
    data: P,
    arrival: Option<Arrival>,
}

/// The data waiting on one rank, and the transfers its consumers took.
pub(super) struct Mailbox<P> {
    waiting: KeyMap<Edge, Mail<P>>,
    transfers: Vec<Transfer>,
}

impl<P> Default for Mailbox<P> {
    fn default() -> Self {
        Mailbox {
            waiting: KeyMap::default(),
            transfers: Vec::new(),
        }
    }
}

impl<P> Mailbox<P> {
    #[inline(always)]
    pub(super) fn put(&mut self, edge: Edge, data: P) {
        self.waiting.insert(
            edge,
            Mail {
                data,
                arrival: None,
            },
        );
    }

    #[inline(always)]
    pub(super) fn arrived(&mut self, edge: Edge, data: P, arrival: Arrival) {
        let arrival = Some(arrival);
        self.waiting.insert(edge, Mail { data, arrival });
    }

    pub(super) fn has(&self, edge: Edge) -> bool {
        self.waiting.contains_key(&edge)
    }

    pub(super) fn remove(&mut self, edge: Edge) -> Option<P> {
        self.waiting.remove(&edge).map(|m| m.data)
    }

    /// Takes the data of `edge` for `consumer` on rank `rank`, recording its transfer if it
    /// crossed ranks.
    #[inline(always)]
    pub(super) fn take(&mut self, edge: Edge, rank: usize, consumer: Action) -> Option<P> {
        let mail = self.waiting.remove(&edge)?;
        if let Some(a) = mail.arrival {
            self.transfers.push(Transfer::new(
                a.from,
                rank,
                a.producer,
                consumer,
                a.sent_at,
                a.received_at,
                a.bytes as f64,
            ));
        }
        Some(mail.data)
    }

    pub(super) fn take_transfers(&mut self) -> Vec<Transfer> {
        std::mem::take(&mut self.transfers)
    }
}

//! Event correlation as client-go's `EventCorrelator` does it (`tools/record/events_cache.go`), so that repeats
//! cost a count bump or nothing instead of a new Event each (issue 26: a third of the controllers' writes were Events).
//!
//! Three stages, in client-go's order, for each Event a controller records:
//! 1. **Aggregation**: Events with the same source, object, type and reason but different messages are similar; from
//!    the [`CorrelationSettings::aggregate_max_events`]th different message within
//!    [`CorrelationSettings::aggregate_interval`] on, they become one aggregate Event whose message starts with
//!    [`COMBINED_PREFIX`].
//! 2. **Dedup**: an Event identical to one recorded before (same source, object, type, reason and message, or the
//!    same aggregate) is written as a patch of the earlier Event's `count`, `lastTimestamp` and `message`.
//! 3. **Spam filter**: each source and object has a token bucket ([`CorrelationSettings::spam_burst`] tokens, one
//!    more per [`CorrelationSettings::spam_refill`]); an Event without a token is dropped.
//!
//! Pure: the caller passes the time and does the write [`Correlator::observe`] returns.

use std::{
    collections::{BTreeSet, HashMap},
    hash::Hash,
    time::Duration,
};

use jiff::Timestamp;

/// The message prefix of an aggregate Event (client-go's `EventAggregatorByReasonMessageFunc`).
pub const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// The correlator's limits; the defaults are client-go's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CorrelationSettings {
    /// How many different messages of similar Events are written as they are before they are aggregated (10).
    pub aggregate_max_events: usize,
    /// How long similar Events count towards aggregation after the last one (10 minutes).
    pub aggregate_interval: Duration,
    /// How many Events one source may write about one object at once (25).
    pub spam_burst: u32,
    /// How often a source gets one more token for an object (one per 5 minutes).
    pub spam_refill: Duration,
    /// How many keys each of the three stages remembers (4096, client-go's LRU size); older keys are forgotten.
    pub cache_entries: usize,
}

impl Default for CorrelationSettings {
    fn default() -> Self {
        Self {
            aggregate_max_events: 10,
            aggregate_interval: Duration::from_mins(10),
            spam_burst: 25,
            spam_refill: Duration::from_mins(5),
            cache_entries: 4096,
        }
    }
}

/// What identifies an Event for correlation: its source (component), object, type, reason and message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventIdentity {
    /// The recording component (`source.component`).
    pub component: String,
    /// The object: `apiVersion`, kind, namespace, name and uid joined (client-go joins the same fields).
    pub object: String,
    /// `Normal` or `Warning`.
    pub event_type: String,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// What to write for an observed Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Correlated {
    /// Create a new Event with this message (the original, or the aggregate's), count 1.
    Create {
        /// The message to write.
        message: String,
    },
    /// Patch the earlier Event `name` (the one [`Correlator::created`] reported): its count, lastTimestamp and
    /// message.
    Bump {
        /// The earlier Event's name.
        name: String,
        /// Its new count.
        count: i32,
        /// The message to write.
        message: String,
    },
    /// Drop it: the spam filter has no token for its source and object.
    Skip,
}

/// A map that forgets what was not touched lately, in O(1): two generations, the older dropped when the newer is full
/// (an approximation of client-go's LRU that needs no crate).
#[derive(Debug)]
struct Bounded<K, V> {
    current: HashMap<K, V>,
    previous: HashMap<K, V>,
    generation: usize,
}

impl<K: Eq + Hash + Clone, V> Bounded<K, V> {
    fn new(entries: usize) -> Self {
        Self {
            current: HashMap::new(),
            previous: HashMap::new(),
            generation: (entries / 2).max(1),
        }
    }

    /// The entry of `key`, moved to the newer generation.
    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        if !self.current.contains_key(key) {
            let value = self.previous.remove(key)?;
            self.insert(key.clone(), value);
        }
        self.current.get_mut(key)
    }

    fn insert(&mut self, key: K, value: V) {
        if self.current.len() >= self.generation && !self.current.contains_key(&key) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, value);
    }
}

/// Similar Events of one aggregate key: their messages and the last time one came.
#[derive(Debug)]
struct Similar {
    messages: BTreeSet<String>,
    last: Timestamp,
}

/// An Event written before: its name, count and first time.
#[derive(Clone, Debug)]
struct Logged {
    name: Option<String>,
    count: i32,
}

/// A token bucket of one source and object.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

/// The key of the dedup stage: an identical Event, or an aggregate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum LogKey {
    Identical(EventIdentity),
    Aggregate(EventIdentity),
}

/// The correlator of one recorder.
#[derive(Debug)]
pub struct Correlator {
    settings: CorrelationSettings,
    similar: Bounded<EventIdentity, Similar>,
    logged: Bounded<LogKey, Logged>,
    spam: Bounded<(String, String), Bucket>,
}

/// A ticket from [`Correlator::observe`] for [`Correlator::created`]: which Event a new name belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket(LogKey);

impl Correlator {
    /// A correlator with these limits.
    pub fn new(settings: CorrelationSettings) -> Self {
        Self {
            settings,
            similar: Bounded::new(settings.cache_entries),
            logged: Bounded::new(settings.cache_entries),
            spam: Bounded::new(settings.cache_entries),
        }
    }

    /// What to write for `event` at `now`; after a [`Correlated::Create`], report the new Event's name with
    /// [`Correlator::created`] and the ticket, so that its repeats patch it.
    pub fn observe(&mut self, event: &EventIdentity, now: Timestamp) -> (Correlated, Ticket) {
        let (key, message) = self.aggregate(event, now);
        let ticket = Ticket(key.clone());
        let (count, name) = if let Some(logged) = self.logged.get_mut(&key) {
            logged.count = logged.count.saturating_add(1);
            (logged.count, logged.name.clone())
        } else {
            self.logged.insert(key, Logged { name: None, count: 1 });
            (1, None)
        };
        if !self.take_token(event, now) {
            return (Correlated::Skip, ticket);
        }
        let correlated = match name {
            Some(name) => Correlated::Bump { name, count, message },
            None => Correlated::Create { message },
        };
        (correlated, ticket)
    }

    /// Records the name of the Event written for `ticket` (count 1): its repeats become patches of it. A failed
    /// create is reported as `None`: the next repeat creates anew.
    pub fn created(&mut self, ticket: &Ticket, name: Option<String>) {
        match (self.logged.get_mut(&ticket.0), name) {
            (Some(logged), Some(name)) => {
                logged.name = Some(name);
                logged.count = 1;
            }
            (Some(logged), None) => logged.name = None,
            (None, _) => {}
        }
    }

    /// Forgets the Event of `ticket` (its patch met a 404: it expired); the next repeat creates anew.
    pub fn forget(&mut self, ticket: &Ticket) {
        if let Some(logged) = self.logged.get_mut(&ticket.0) {
            logged.name = None;
            logged.count = 0;
        }
    }

    /// Stage 1: the dedup key and the message to write.
    fn aggregate(&mut self, event: &EventIdentity, now: Timestamp) -> (LogKey, String) {
        let similar_key = EventIdentity {
            message: String::new(),
            ..event.clone()
        };
        let interval = self.settings.aggregate_interval;
        let fresh = |similar: &Similar| now.duration_since(similar.last).unsigned_abs() <= interval;
        let messages = match self.similar.get_mut(&similar_key) {
            Some(similar) if fresh(similar) => {
                similar.last = now;
                similar.messages.insert(event.message.clone());
                similar.messages.len()
            }
            _ => {
                let messages = BTreeSet::from([event.message.clone()]);
                self.similar
                    .insert(similar_key.clone(), Similar { messages, last: now });
                1
            }
        };
        if messages < self.settings.aggregate_max_events {
            return (LogKey::Identical(event.clone()), event.message.clone());
        }
        // Do not grow the set beyond the limit (client-go pops one too).
        if let Some(similar) = self.similar.get_mut(&similar_key) {
            similar.messages.pop_first();
        }
        (
            LogKey::Aggregate(similar_key),
            format!("{COMBINED_PREFIX}{}", event.message),
        )
    }

    /// Stage 3: whether the source may write about the object now.
    fn take_token(&mut self, event: &EventIdentity, now: Timestamp) -> bool {
        let burst = f64::from(self.settings.spam_burst);
        let refill = self.settings.spam_refill.as_secs_f64();
        let key = (event.component.clone(), event.object.clone());
        if self.spam.get_mut(&key).is_none() {
            self.spam.insert(
                key.clone(),
                Bucket {
                    tokens: burst,
                    at: now,
                },
            );
        }
        let Some(bucket) = self.spam.get_mut(&key) else {
            return true;
        };
        let elapsed = now.duration_since(bucket.at).as_secs_f64().max(0.0);
        if refill > 0.0 {
            bucket.tokens = (bucket.tokens + elapsed / refill).min(burst);
        } else {
            bucket.tokens = burst;
        }
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(object: &str, reason: &str, message: &str) -> EventIdentity {
        EventIdentity {
            component: "machineset-controller".into(),
            object: object.into(),
            event_type: "Normal".into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    /// Observes and, for a create, reports a name as the recorder does; returns what was to be written.
    fn record(c: &mut Correlator, e: &EventIdentity, now: Timestamp, name: &str) -> Correlated {
        let (correlated, ticket) = c.observe(e, now);
        if matches!(correlated, Correlated::Create { .. }) {
            c.created(&ticket, Some(name.into()));
        }
        correlated
    }

    #[test]
    fn an_identical_event_bumps_the_count_of_the_first() {
        let mut c = Correlator::new(CorrelationSettings::default());
        let e = event("m1", "DrainFailed", "pod p blocked by its PDB");
        assert_eq!(
            record(&mut c, &e, at(0), "m1.1"),
            Correlated::Create {
                message: e.message.clone()
            }
        );
        assert_eq!(
            record(&mut c, &e, at(5), "m1.2"),
            Correlated::Bump {
                name: "m1.1".into(),
                count: 2,
                message: e.message.clone()
            }
        );
        assert_eq!(
            record(&mut c, &e, at(9), "m1.3"),
            Correlated::Bump {
                name: "m1.1".into(),
                count: 3,
                message: e.message.clone()
            }
        );
    }

    #[test]
    fn different_reasons_of_one_object_are_all_written() {
        let mut c = Correlator::new(CorrelationSettings::default());
        for (i, reason) in ["Created", "Running", "Terminating", "Drained", "Deleted"]
            .iter()
            .enumerate()
        {
            let got = record(&mut c, &event("m1", reason, "text"), at(0), &format!("m1.{i}"));
            assert_eq!(
                got,
                Correlated::Create {
                    message: "text".into()
                },
                "{reason}"
            );
        }
    }

    #[test]
    fn the_tenth_similar_message_starts_an_aggregate_that_later_ones_bump() {
        let mut c = Correlator::new(CorrelationSettings {
            spam_burst: 1000,
            ..CorrelationSettings::default()
        });
        for i in 0..9 {
            let got = record(
                &mut c,
                &event("set", "SuccessfulCreate", &format!("created m{i}")),
                at(i),
                "x",
            );
            assert_eq!(
                got,
                Correlated::Create {
                    message: format!("created m{i}")
                }
            );
        }
        let tenth = record(
            &mut c,
            &event("set", "SuccessfulCreate", "created m9"),
            at(9),
            "set.agg",
        );
        assert_eq!(
            tenth,
            Correlated::Create {
                message: format!("{COMBINED_PREFIX}created m9")
            }
        );
        let eleventh = record(
            &mut c,
            &event("set", "SuccessfulCreate", "created m10"),
            at(10),
            "y",
        );
        assert_eq!(
            eleventh,
            Correlated::Bump {
                name: "set.agg".into(),
                count: 2,
                message: format!("{COMBINED_PREFIX}created m10")
            }
        );
    }

    #[test]
    fn similar_events_apart_by_more_than_the_interval_start_over() {
        let mut c = Correlator::new(CorrelationSettings::default());
        for i in 0..9 {
            record(
                &mut c,
                &event("set", "SuccessfulCreate", &format!("m{i}")),
                at(i),
                "x",
            );
        }
        let late = record(&mut c, &event("set", "SuccessfulCreate", "m9"), at(9 + 601), "x");
        assert_eq!(late, Correlated::Create { message: "m9".into() });
    }

    #[test]
    fn the_spam_filter_lets_a_burst_through_then_one_per_refill() {
        let mut c = Correlator::new(CorrelationSettings {
            aggregate_max_events: 1000,
            ..CorrelationSettings::default()
        });
        let written = (0..40)
            .filter(|i| {
                record(
                    &mut c,
                    &event("set", "SuccessfulCreate", &format!("m{i}")),
                    at(0),
                    "x",
                ) != Correlated::Skip
            })
            .count();
        assert_eq!(written, 25);
        assert_eq!(
            record(&mut c, &event("set", "SuccessfulCreate", "m40"), at(299), "x"),
            Correlated::Skip
        );
        assert_ne!(
            record(&mut c, &event("set", "SuccessfulCreate", "m41"), at(300), "x"),
            Correlated::Skip
        );
        // Another object has its own bucket.
        assert_ne!(
            record(&mut c, &event("other", "SuccessfulCreate", "m0"), at(300), "x"),
            Correlated::Skip
        );
    }

    #[test]
    fn a_forgotten_event_is_created_anew() {
        let mut c = Correlator::new(CorrelationSettings::default());
        let e = event("m1", "DrainFailed", "blocked");
        record(&mut c, &e, at(0), "m1.1");
        let (got, ticket) = c.observe(&e, at(1));
        assert!(matches!(got, Correlated::Bump { .. }));
        c.forget(&ticket);
        assert_eq!(
            record(&mut c, &e, at(2), "m1.2"),
            Correlated::Create {
                message: "blocked".into()
            }
        );
    }

    #[test]
    fn the_caches_stay_bounded() {
        let mut c = Correlator::new(CorrelationSettings {
            cache_entries: 8,
            ..CorrelationSettings::default()
        });
        for i in 0..100 {
            record(&mut c, &event(&format!("m{i}"), "Created", "x"), at(i), "n");
        }
        assert!(c.logged.current.len() + c.logged.previous.len() <= 8);
        assert!(c.similar.current.len() + c.similar.previous.len() <= 8);
        assert!(c.spam.current.len() + c.spam.previous.len() <= 8);
    }
}

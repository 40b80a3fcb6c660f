//! What one simulated run looks like: its sizes, its fault rates and the fault
//! schedule, all drawn from the seed so that a seed names one exact run.
//!
//! Every duration is in simulated milliseconds and every probability in per
//! mille, so the whole run is integer arithmetic (no float rounding to differ
//! between machines).

use crate::rng::Rng;

/// Whether the arbiter applies the fencing rule or the control's accept-all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// The real `leasefence_core::admit` rule, strict mode.
    Strict,
    /// Accept every effect: the control that shows the faults do bite.
    Off,
}

/// How a run is set up beyond its seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub fencing: Fencing,
    /// A deliberately broken coordinator that answers grants before they are
    /// durable. Only for proving that the checker catches token reuse.
    pub answer_before_durable: bool,
    /// Several coordinators over one shared store, one leading at a time
    /// (`None`: the single coordinator with its own store).
    pub leadership: Option<Leadership>,
}

/// A leadership run's switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// Every write is conditional on the writer's epoch (`writer(epoch).apply`).
    /// `false` is the control: writes land whatever the epoch, and the checker
    /// must catch what a deposed leader's writes do.
    pub epoch_fencing: bool,
    /// A leader answers nothing once `leader_deadline(leader_ttl)` has passed
    /// since the send time of its last successful renewal. `false` is a
    /// deliberately broken leader, only for proving that the checker catches
    /// a deposed leader that answers.
    pub self_fencing: bool,
}

impl Options {
    pub fn new(fencing: Fencing) -> Options {
        Options {
            fencing,
            answer_before_durable: false,
            leadership: None,
        }
    }

    /// A leadership run (the arbiter fences strictly).
    pub fn leadership(epoch_fencing: bool) -> Options {
        Options {
            leadership: Some(Leadership {
                epoch_fencing,
                self_fencing: true,
            }),
            ..Options::new(Fencing::Strict)
        }
    }
}

/// Sizes and fault rates of one run (drawn from the seed by [`RunConfig::draw`]).
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub fencing: Fencing,
    pub clients: usize,
    pub resources: usize,
    pub ttl_ms: u64,
    /// Faults are injected in `0..heal_at_ms`; after it the run is fault-free.
    pub heal_at_ms: u64,
    /// The run ends here; every client must have made progress after `heal_at_ms`.
    pub end_ms: u64,
    pub loss_per_mille: u32,
    pub dup_per_mille: u32,
    /// Share of messages held back far longer than usual (reordering, late effects).
    pub slow_per_mille: u32,
    /// Share of grants after which the holder stalls 1.5–10× TTL before its effect.
    pub pause_per_mille: u32,
    pub faults: Vec<(u64, Fault)>,
    /// Per client: how fast its clock runs, in per mille of real time.
    pub clock_rate_per_mille: Vec<u64>,
    pub leadership: Option<LeadershipConfig>,
}

/// The coordinators of a leadership run and their shared store.
#[derive(Clone, Debug)]
pub struct LeadershipConfig {
    pub peers: usize,
    /// How long a leadership lasts in the store without a renewal.
    pub leader_ttl_ms: u64,
    pub epoch_fencing: bool,
    pub self_fencing: bool,
    /// Share of peer ↔ store messages held back far longer than usual.
    pub store_slow_per_mille: u32,
}

/// A fault scheduled at a simulated time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The coordinator loses its memory and unsynced writes; back after `down_ms`.
    /// `mid_fsync`: wait for the next group commit and crash before it lands, the
    /// moment that loses mutations (a crash at a random time rarely hits it).
    CoordinatorCrash { down_ms: u64, mid_fsync: bool },
    /// Messages on the named directed links are dropped for `for_ms`.
    Partition { client: usize, links: Links, for_ms: u64 },
    /// A client's clock jumps by `delta_ms` (negative: backwards).
    ClockStep { client: usize, delta_ms: i64 },
    /// The coordinator that believes it leads stops for `for_ms` (a GC stall,
    /// SIGSTOP), then carries on where it was. `mid_commit`: wait for its next
    /// group commit and stop just before the write leaves, so that the write
    /// goes out on waking.
    LeaderPause { for_ms: u64, mid_commit: bool },
    /// A peer's links to the store are cut for `for_ms` (`peer` `None`: the
    /// one that leads when the fault fires).
    StorePartition {
        peer: Option<usize>,
        links: StoreLinks,
        for_ms: u64,
    },
}

/// Which directions of a peer's link to the store a partition cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreLinks {
    pub to_store: bool,
    pub from_store: bool,
}

/// Which directions of a client's links a partition cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Links {
    pub to_coordinator: bool,
    pub from_coordinator: bool,
    pub to_arbiter: bool,
    pub from_arbiter: bool,
}

/// Bounds of every run (the limits the seeds draw within).
pub const CLIENTS_MIN: usize = 3;
pub const CLIENTS_MAX: usize = 5;
pub const TTL_MS_MIN: u64 = 300;
pub const TTL_MS_MAX: u64 = 1_500;
/// Fault phase length, in TTLs.
const FAULT_PHASE_TTLS: u64 = 80;
/// Fault-free phase length, in TTLs: long enough for the longest pause (10 TTL),
/// orphaned waiter grants and retries to drain.
const HEAL_PHASE_TTLS: u64 = 60;

/// Coordinators in a leadership run.
pub const PEERS_MIN: usize = 2;
pub const PEERS_MAX: usize = 3;

impl RunConfig {
    pub fn draw(rng: &mut Rng, options: &Options) -> RunConfig {
        let fencing = options.fencing;
        let clients = usize::try_from(rng.range(CLIENTS_MIN as u64, CLIENTS_MAX as u64)).unwrap_or(CLIENTS_MIN);
        let ttl_ms = rng.range(TTL_MS_MIN, TTL_MS_MAX);
        let heal_at_ms = ttl_ms * FAULT_PHASE_TTLS;
        let clock_rate_per_mille = (0..clients)
            .map(|_| if rng.chance(500) { 1_000 } else { rng.range(500, 1_500) })
            .collect();
        let mut config = RunConfig {
            fencing,
            clients,
            resources: usize::try_from(rng.range(1, 2)).unwrap_or(1),
            ttl_ms,
            heal_at_ms,
            end_ms: heal_at_ms + ttl_ms * HEAL_PHASE_TTLS,
            loss_per_mille: u32::try_from(rng.range(0, 60)).unwrap_or(0),
            dup_per_mille: u32::try_from(rng.range(0, 60)).unwrap_or(0),
            slow_per_mille: u32::try_from(rng.range(0, 60)).unwrap_or(0),
            pause_per_mille: u32::try_from(rng.range(50, 300)).unwrap_or(50),
            faults: Vec::new(),
            clock_rate_per_mille,
            leadership: None,
        };
        config.faults = draw_faults(rng, &config);
        // Drawn after everything else, so a seed without leadership stays the run it was.
        if let Some(l) = options.leadership {
            let peers = usize::try_from(rng.range(PEERS_MIN as u64, PEERS_MAX as u64)).unwrap_or(PEERS_MIN);
            // Often shorter than the lease TTL, as in practice (a leader TTL of
            // seconds, leases of tens of seconds): leases then outlive takeovers.
            let leader_ttl_ms = if rng.chance(500) {
                rng.range((ttl_ms / 4).max(150), (ttl_ms / 2).max(150))
            } else {
                rng.range((ttl_ms / 2).max(150), 2 * ttl_ms)
            };
            let leadership = LeadershipConfig {
                peers,
                leader_ttl_ms,
                epoch_fencing: l.epoch_fencing,
                self_fencing: l.self_fencing,
                store_slow_per_mille: u32::try_from(rng.range(0, 10)).unwrap_or(0),
            };
            let extra = draw_leadership_faults(rng, &config, &leadership);
            config.faults.extend(extra);
            config.leadership = Some(leadership);
        }
        config
    }
}

fn draw_leadership_faults(rng: &mut Rng, c: &RunConfig, l: &LeadershipConfig) -> Vec<(u64, Fault)> {
    let mut faults = Vec::new();
    let lt = l.leader_ttl_ms;
    let at = |rng: &mut Rng| rng.range(c.ttl_ms, c.heal_at_ms - 1);
    for _ in 0..rng.range(1, 5) {
        // Mostly well past the leader TTL (a takeover happens meanwhile); some
        // shorter, which may or may not outlast the self-fencing deadline.
        let for_ms = if rng.chance(750) {
            rng.range(3 * lt / 2, 6 * lt)
        } else {
            rng.range(lt / 5, lt)
        };
        let mid_commit = rng.chance(500);
        faults.push((at(rng), Fault::LeaderPause { for_ms, mid_commit }));
    }
    for _ in 0..rng.range(0, 4) {
        let peer = if rng.chance(600) {
            None
        } else {
            Some(rng.index(l.peers))
        };
        let mut links = StoreLinks {
            to_store: rng.chance(600),
            from_store: rng.chance(600),
        };
        if !(links.to_store || links.from_store) {
            links = StoreLinks {
                to_store: true,
                from_store: true,
            };
        }
        let for_ms = rng.range(lt / 2, 4 * lt);
        faults.push((at(rng), Fault::StorePartition { peer, links, for_ms }));
    }
    faults
}

fn draw_faults(rng: &mut Rng, c: &RunConfig) -> Vec<(u64, Fault)> {
    let mut faults = Vec::new();
    let at = |rng: &mut Rng| rng.range(c.ttl_ms, c.heal_at_ms - 1);
    for _ in 0..rng.range(0, 4) {
        let down_ms = rng.range(c.ttl_ms / 5, 3 * c.ttl_ms);
        let mid_fsync = rng.chance(500);
        faults.push((at(rng), Fault::CoordinatorCrash { down_ms, mid_fsync }));
    }
    for _ in 0..rng.range(0, 6) {
        let client = rng.index(c.clients);
        let links = Links {
            to_coordinator: rng.chance(500),
            from_coordinator: rng.chance(500),
            to_arbiter: rng.chance(300),
            from_arbiter: rng.chance(300),
        };
        let for_ms = rng.range(c.ttl_ms / 2, 5 * c.ttl_ms);
        faults.push((at(rng), Fault::Partition { client, links, for_ms }));
    }
    for _ in 0..rng.range(0, 4) {
        let client = rng.index(c.clients);
        let size = i64::try_from(rng.range(c.ttl_ms / 2, 3 * c.ttl_ms)).unwrap_or(0);
        let delta_ms = if rng.chance(500) { -size } else { size };
        faults.push((at(rng), Fault::ClockStep { client, delta_ms }));
    }
    faults
}

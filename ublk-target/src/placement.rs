//! Where the queue threads run.
//!
//! libublk pins each queue thread to the CPUs of its blk-mq queue (one
//! CPU a queue when there is a queue per CPU), so a page that a task on
//! CPU 0 swaps out is compressed on CPU 0: in direct reclaim the faulting
//! task waits for it as it would for zram, and pays a context switch on
//! top. A userspace device can do what zram cannot: compress on a CPU
//! that is not running the workload. [`QueueCpus::Other`] pins each
//! queue's thread to the CPUs *outside* its queue's mask, so that the
//! request a task submits is served on another CPU while the task goes
//! on; [`QueueCpus::Any`] lets the scheduler choose (which, waking the
//! thread beside its waker, mostly keeps it on the submitting CPU).
//!
//! The choice is applied once the queue threads have started, from the
//! thread that runs the device ([`apply`]); the CPU sets are computed by
//! the pure [`cpus_for`].

use serde::{Deserialize, Serialize};

/// CPUs a `cpu_set_t` can name.
const SET_CPUS: usize = 8 * std::mem::size_of::<libc::cpu_set_t>();

/// Where each queue thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueCpus {
    /// On its queue's CPUs, as libublk pins it.
    #[default]
    Queue,
    /// On every allowed CPU but its queue's (its queue's when there is no
    /// other).
    Other,
    /// On every allowed CPU.
    Any,
}

/// The CPUs a queue thread is to run on under `how`, given its queue's
/// CPUs (`queue`, as libublk set them) and the CPUs the daemon may use
/// (`allowed`); `None` to leave the thread as it is.
pub fn cpus_for(how: QueueCpus, queue: &[usize], allowed: &[usize]) -> Option<Vec<usize>> {
    let cpus: Vec<usize> = match how {
        QueueCpus::Queue => return None,
        QueueCpus::Any => allowed.to_vec(),
        QueueCpus::Other => allowed
            .iter()
            .copied()
            .filter(|c| !queue.contains(c))
            .collect(),
    };
    (!cpus.is_empty() && cpus != queue).then_some(cpus)
}

/// Applies `how` to the queue threads `tids` (thread ids, as `gettid`
/// gives them); logs, and leaves as it is, a thread it cannot move.
pub fn apply(how: QueueCpus, tids: &[libc::pid_t]) {
    let Some(allowed) = affinity(0) else {
        return log::warn!("queue placement: cannot read the daemon's CPU mask");
    };
    for &tid in tids {
        let Some(queue) = affinity(tid) else {
            log::warn!("queue placement: cannot read thread {tid}'s CPU mask");
            continue;
        };
        if let Some(cpus) = cpus_for(how, &queue, &allowed) {
            set_affinity(tid, &cpus);
        }
    }
}

/// The CPUs thread `tid` (0: the calling thread) may run on.
fn affinity(tid: libc::pid_t) -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain bits; all zeros is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads bit c < SET_CPUS of a valid set.
    Some(
        (0..SET_CPUS)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect(),
    )
}

/// Pins thread `tid` to `cpus`; logs a failure.
fn set_affinity(tid: libc::pid_t, cpus: &[usize]) {
    // SAFETY: as in `affinity`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < SET_CPUS) {
        // SAFETY: bit c < SET_CPUS of a valid set.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size given.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    if r != 0 {
        log::warn!(
            "queue placement: thread {tid} to CPUs {cpus:?}: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_leaves_threads_alone() {
        assert_eq!(cpus_for(QueueCpus::Queue, &[0], &[0, 1]), None);
    }

    #[test]
    fn other_is_the_complement() {
        assert_eq!(cpus_for(QueueCpus::Other, &[0], &[0, 1]), Some(vec![1]));
        assert_eq!(
            cpus_for(QueueCpus::Other, &[1], &[0, 1, 2]),
            Some(vec![0, 2])
        );
    }

    #[test]
    fn other_without_another_cpu_stays() {
        assert_eq!(cpus_for(QueueCpus::Other, &[0], &[0]), None);
        assert_eq!(cpus_for(QueueCpus::Other, &[0, 1], &[0, 1]), None);
    }

    #[test]
    fn any_is_every_allowed_cpu() {
        assert_eq!(cpus_for(QueueCpus::Any, &[1], &[0, 1]), Some(vec![0, 1]));
        assert_eq!(cpus_for(QueueCpus::Any, &[0, 1], &[0, 1]), None);
    }
}

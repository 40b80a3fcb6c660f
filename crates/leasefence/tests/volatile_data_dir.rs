//! A data dir that a reboot empties: `serve` and `gateway` start on one (a
//! test may want that) but warn that their fencing tokens will not survive a
//! reboot; on a disk they say nothing of it.

mod common;

use std::path::Path;

use common::spawn_listening_logged;

const WARNING: &str = "which a reboot empties";

/// Whether /dev/shm is a tmpfs here, by /proc/mounts.
fn shm_is_tmpfs() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.get(1) == Some(&"/dev/shm") && f.get(2) == Some(&"tmpfs")
            })
        })
        .unwrap_or(false)
}

/// Starts `leasefence COMMAND` on `dir`, stops it, returns what it logged.
fn logs_of(command: &str, prefix: &str, dir: &Path) -> String {
    spawn_listening_logged(command, dir, &[], prefix).0.logs()
}

#[test]
fn a_data_dir_in_memory_is_warned_about_and_one_on_disk_is_not() {
    if !shm_is_tmpfs() {
        assert!(
            std::env::var_os("CI").is_none(),
            "/dev/shm is not a tmpfs on this CI machine"
        );
        eprintln!("skipped: /dev/shm is not a tmpfs here");
        return;
    }
    for (command, prefix) in [
        ("serve", "leasefence listening on "),
        ("gateway", "leasefence gateway listening on "),
    ] {
        let shm = tempfile::tempdir_in("/dev/shm").expect("tempdir in /dev/shm");
        let logs = logs_of(command, prefix, shm.path());
        assert!(
            logs.contains(WARNING) && logs.contains("tmpfs") && logs.contains("fencing tokens"),
            "{command} on /dev/shm warns that its tokens do not survive a reboot: {logs}"
        );
        // The build's own scratch space is on the disk that holds the build.
        let disk = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir on disk");
        let logs = logs_of(command, prefix, disk.path());
        assert!(
            !logs.contains(WARNING),
            "{command} on a disk says nothing of it: {logs}"
        );
    }
}

//! Engine unit tests that need its private lock.

use super::*;
use leasefence_store::MemoryStore;

#[tokio::test]
async fn subscribing_to_watch_does_not_take_the_engine_lock() {
    let committer = Committer::start(MemoryStore::new(), 16);
    let engine = Engine::start(Config::default(), Duration::from_secs(1), committer, Vec::new());
    let held = engine.lock();
    let e = engine.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let filter = Filter {
            resource: String::new(),
            prefix: true,
        };
        let _ = tx.send(e.watch(&filter, None, "").is_ok());
    });
    let subscribed = rx.recv_timeout(Duration::from_secs(2));
    drop(held);
    assert_eq!(subscribed, Ok(true), "a watcher waited for the engine's lock");
}

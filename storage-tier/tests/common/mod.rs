//! A storage node run in-process on a loopback port, for the integration tests.

#![allow(dead_code)]

#[path = "../../../tests/support/run.rs"]
mod run;
#[allow(unused_imports)] // each test file uses some
pub use run::python_with;

use std::net::SocketAddr;

use sluice_storage::StorageConfig;
use tokio_util::sync::CancellationToken;

pub struct Node {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Node {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Cancels the token and waits for `run` to return.
    pub fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Binds port 0 and runs `sluice_storage::run` on its own runtime thread.
pub fn start(config: StorageConfig) -> Node {
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            sluice_storage::run(listener, config, sluice_daemon::metrics_handle(), token)
                .await
                .unwrap();
        });
    });
    Node {
        addr: rx.recv().unwrap(),
        shutdown,
        thread: Some(thread),
    }
}

//! A TCP proxy on 127.0.0.1 in front of one node, for network partitions.
//!
//! * [`Proxy::heal`] (and at start): bytes flow both ways (the default).
//! * [`Proxy::blackhole`]: every connection stays open but no byte gets
//!   through, in either direction, and new connections are accepted (the
//!   client's connect succeeds) but not connected onward. Nothing is reset
//!   or closed: to both ends it looks like packets that stopped arriving.
//!   Bytes sent meanwhile are held, as TCP would keep retransmitting them.
//! * [`Proxy::heal`]: back to passing; the held bytes are delivered late, in
//!   order per connection (not across connections), as after a real
//!   partition heals.
//!
//! Plain threads (two per connection), independent of the test's runtime.
//! Dropping the proxy closes every connection it carries.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub struct Proxy {
    /// Where clients connect: 127.0.0.1:`port`.
    pub port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

struct Shared {
    upstream: u16,
    blackholed: Mutex<bool>,
    changed: Condvar,
    stop: AtomicBool,
    /// Every socket the proxy holds, to close them all on drop.
    sockets: Mutex<Vec<TcpStream>>,
    /// Chunks of bytes that reached the proxy while it was blackholed.
    held_chunks: AtomicU64,
    /// Connections accepted while blackholed.
    held_connections: AtomicU64,
}

impl Shared {
    /// Waits while blackholed; false once the proxy is stopping.
    fn wait_passing(&self) -> bool {
        let mut blackholed = self.blackholed.lock().unwrap();
        while *blackholed && !self.stop.load(Ordering::SeqCst) {
            blackholed = self.changed.wait(blackholed).unwrap();
        }
        !self.stop.load(Ordering::SeqCst)
    }

    fn is_blackholed(&self) -> bool {
        *self.blackholed.lock().unwrap()
    }

    fn keep(&self, s: &TcpStream) {
        if let Ok(c) = s.try_clone() {
            self.sockets.lock().unwrap().push(c);
        }
    }
}

impl Proxy {
    /// A proxy in front of 127.0.0.1:`upstream`, passing traffic.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            blackholed: Mutex::new(false),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            held_chunks: AtomicU64::new(0),
            held_connections: AtomicU64::new(0),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::spawn(move || accept_loop(listener, shared))
        };
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Cuts the node off: connections stay open, bytes are held.
    pub fn blackhole(&self) {
        *self.shared.blackholed.lock().unwrap() = true;
    }

    /// Lets traffic through again, held bytes first.
    pub fn heal(&self) {
        *self.shared.blackholed.lock().unwrap() = false;
        self.shared.changed.notify_all();
    }

    /// Chunks of bytes (reads) and connections that arrived while blackholed.
    pub fn held(&self) -> (u64, u64) {
        (
            self.shared.held_chunks.load(Ordering::SeqCst),
            self.shared.held_connections.load(Ordering::SeqCst),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.blackholed.lock().unwrap();
            self.shared.changed.notify_all();
        }
        for s in self.shared.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the acceptor out of accept().
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let _ = client.set_nodelay(true);
        shared.keep(&client);
        let shared = shared.clone();
        std::thread::spawn(move || connect_onward(client, shared));
    }
}

/// One client connection: (once passing) connect to the node, then pump
/// bytes both ways.
fn connect_onward(client: TcpStream, shared: Arc<Shared>) {
    if shared.is_blackholed() {
        shared.held_connections.fetch_add(1, Ordering::SeqCst);
    }
    if !shared.wait_passing() {
        return;
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", shared.upstream)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = server.set_nodelay(true);
    shared.keep(&server);
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let back = {
        let shared = shared.clone();
        std::thread::spawn(move || pump(server2, client2, shared))
    };
    pump(client, server, shared);
    let _ = back.join();
}

/// Copies `from` to `to`, holding each chunk while blackholed. At the end
/// of `from` the write side of `to` is shut (a half close, passed on); on
/// an error both sockets are closed, which ends the other direction too.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: Arc<Shared>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(_) => break,
        };
        if shared.is_blackholed() {
            shared.held_chunks.fetch_add(1, Ordering::SeqCst);
        }
        if !shared.wait_passing() || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

//! A free port of 127.0.0.1 for a server to listen on.

use std::net::TcpListener;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

//! Datagram sizes and socket buffers both QUIC endpoints use: the tiers apply the sizes to
//! their own quinn endpoints, and (feature `udp`) grow their sockets' buffers with
//! [`grow_buffer`].

/// The largest UDP payload a QUIC endpoint sends or accepts, and the ceiling of path MTU
/// discovery.
///
/// quinn hands the kernel up to ten datagrams in one GSO `sendmsg`, and Linux refuses a GSO
/// send over 64 KiB with `EMSGSIZE`, which quinn-udp drops without a word (it expects that
/// only of MTU probes). Every batch of full-size packets is then lost. Measured on loopback:
/// with packets fixed at 8,972 bytes (jumbo frames) the connection stalled; with discovery
/// allowed up to 65,527, black-hole detection dropped it to 1,200-byte packets, slower than
/// the default 1,472. Ten datagrams of 6,500 bytes fit one send (65,000 of the 65,487 bytes
/// IPv6 leaves), so discovery may climb this far wherever the path allows, and only there.
pub const MAX_UDP_PAYLOAD: u16 = 6_500;

/// Datagrams quinn 0.11 puts in one GSO send (`MAX_TRANSMIT_SEGMENTS` in quinn's
/// `connection.rs`); check it again when quinn is upgraded.
pub const GSO_SEGMENTS: usize = 10;

// Ten datagrams and the IPv6 and UDP headers within the 64 KiB a GSO send may carry.
const _: () = assert!(GSO_SEGMENTS * MAX_UDP_PAYLOAD as usize + 40 + 8 <= 65_535);

/// The receive buffer the client asks for on its UDP socket, and the send buffer the worker
/// asks for on its own. The kernel's default (208 KiB) holds a quarter of a millisecond of
/// one connection's tensors, so a client thread that is descheduled briefly drops packets
/// and the sender's congestion window halves. Linux caps the request at
/// `net.core.rmem_max` / `wmem_max`; the tiers log what they got.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// Which buffer of a UDP socket: the worker grows its send buffer, the client its receive
/// buffer.
#[cfg(feature = "udp")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    Send,
    Receive,
}

/// Asks for [`SOCKET_BUFFER_BYTES`] of `which` on `socket`. A smaller buffer only costs
/// speed, so this does not fail: it returns why the buffer is smaller, for the caller's log,
/// or `None` when it was granted in full.
#[cfg(feature = "udp")]
pub fn grow_buffer(socket: impl std::os::fd::AsFd, which: Buffer) -> Option<String> {
    use rustix::net::sockopt;
    let (fd, wanted) = (socket.as_fd(), SOCKET_BUFFER_BYTES);
    let (got, name, limit) = match which {
        Buffer::Send => (
            sockopt::set_socket_send_buffer_size(fd, wanted)
                .and_then(|()| sockopt::socket_send_buffer_size(fd)),
            "send",
            "net.core.wmem_max",
        ),
        Buffer::Receive => (
            sockopt::set_socket_recv_buffer_size(fd, wanted)
                .and_then(|()| sockopt::socket_recv_buffer_size(fd)),
            "receive",
            "net.core.rmem_max",
        ),
    };
    match got {
        // Linux reports twice what it granted (the other half is its bookkeeping).
        Ok(got) => {
            let got = if cfg!(target_os = "linux") {
                got / 2
            } else {
                got
            };
            (got < wanted).then(|| {
                format!(
                    "UDP {name} buffer of {got} bytes, not {wanted}: capped by {limit}; \
                     raise it for full QUIC speed"
                )
            })
        }
        Err(e) => Some(format!("UDP {name} buffer left at the kernel default: {e}")),
    }
}

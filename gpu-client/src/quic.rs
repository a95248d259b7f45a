//! The client's QUIC shell: quinn-proto's connections, driven by a task of ours over one UDP
//! socket.
//!
//! Datagrams are received (`recvmmsg`, GRO where the kernel coalesces) straight into buffers
//! quinn-proto then keeps ([`receive`]): it decrypts each packet in place and a stream's chunks
//! are slices of the packets, so a sample's bytes are copied once on the client, by the
//! coordinator into the batch. Congestion control, TLS and the wire protocol are quinn-proto's,
//! the same as the workers' (which run quinn).
//!
//! One task, the driver, owns the socket: it receives, hands each connection its packets and
//! timeouts, sends what the connections have to send, and wakes the tasks waiting on them.
//! Those tasks read and write their streams under the same lock ([`stream`]) and wake the
//! driver when what they did has something to send (stream credit, data, a close).

mod receive;
mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

use quinn_proto as proto;
use quinn_proto::{ConnectionError, ConnectionHandle, DatagramEvent, StreamEvent, StreamId};
use quinn_udp::UdpSocketState;
use tokio::io::Interest;
use tokio::sync::Notify;

pub(crate) use stream::{Connecting, Connection, RecvStream};

/// Datagrams one send may carry (GSO), as quinn sends them.
const MAX_TRANSMIT_SEGMENTS: usize = 10;

/// Transmits one connection may send per turn of the driver before the others get theirs.
const TRANSMITS_PER_TURN: usize = 32;

/// The client's QUIC endpoint. Clones share it; the driver stops once the last is gone and
/// its connections have closed.
#[derive(Clone)]
pub(crate) struct Endpoint {
    handle: Arc<EndpointHandle>,
}

struct EndpointHandle {
    shared: Arc<Shared>,
}

/// What the driver and the connections' handles share.
struct Shared {
    state: Mutex<State>,
    /// Wakes the driver: there is something to send, or a connection to close.
    wake: Notify,
    socket: tokio::net::UdpSocket,
    udp: UdpSocketState,
    /// The socket is IPv6 (dual-stack): an IPv4 peer is dialed, and heard from, as its
    /// IPv4-mapped address.
    ipv6: bool,
}

struct State {
    endpoint: proto::Endpoint,
    connections: HashMap<ConnectionHandle, Conn>,
    /// The last `Endpoint` is gone: the driver stops once no connection is left.
    closing: bool,
    /// A datagram the socket would not take yet; nothing else is sent before it.
    unsent: Option<Unsent>,
    send_buffer: Vec<u8>,
    /// Responses quinn-proto makes to datagrams of no connection (stateless resets).
    response_buffer: Vec<u8>,
}

/// A connection as the driver keeps it.
struct Conn {
    proto: proto::Connection,
    connected: bool,
    /// Why it ended, once it has.
    error: Option<ConnectionError>,
    /// Handles to it (the connection's and its streams'); at 0 it is closed.
    handles: usize,
    /// The task waiting for the handshake.
    connecting: Option<Waker>,
    /// Tasks waiting to open a stream.
    opening: Vec<Waker>,
    readers: HashMap<StreamId, Waker>,
    writers: HashMap<StreamId, Waker>,
    timer: Option<Instant>,
}

/// What quinn-proto made to send, and its bytes.
struct Unsent {
    transmit: proto::Transmit,
    contents: Vec<u8>,
}

impl Endpoint {
    /// An endpoint on `socket`, its driver spawned on the current Tokio runtime.
    pub(crate) fn new(
        config: proto::EndpointConfig,
        socket: std::net::UdpSocket,
    ) -> io::Result<Self> {
        socket.set_nonblocking(true)?;
        let ipv6 = socket.local_addr()?.is_ipv6();
        let udp = UdpSocketState::new((&socket).into())?;
        let socket = tokio::net::UdpSocket::from_std(socket)?;
        let max_datagram = config.get_max_udp_payload_size().min(65_527) as usize;
        let endpoint = proto::Endpoint::new(Arc::new(config), None, !udp.may_fragment(), None);
        let receiver = receive::Receiver::new(udp.gro_segments(), max_datagram);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                endpoint,
                connections: HashMap::new(),
                closing: false,
                unsent: None,
                send_buffer: Vec::new(),
                response_buffer: Vec::new(),
            }),
            wake: Notify::new(),
            socket,
            udp,
            ipv6,
        });
        tokio::spawn(drive(shared.clone(), receiver));
        Ok(Endpoint {
            handle: Arc::new(EndpointHandle { shared }),
        })
    }

    /// Starts a connection to `addr`, asking for `server_name`'s certificate.
    pub(crate) fn connect_with(
        &self,
        config: proto::ClientConfig,
        addr: SocketAddr,
        server_name: &str,
    ) -> Result<Connecting, proto::ConnectError> {
        let shared = &self.handle.shared;
        let addr = match addr {
            SocketAddr::V6(_) if !shared.ipv6 => {
                return Err(proto::ConnectError::InvalidRemoteAddress(addr))
            }
            SocketAddr::V4(v4) if shared.ipv6 => SocketAddr::V6(std::net::SocketAddrV6::new(
                v4.ip().to_ipv6_mapped(),
                v4.port(),
                0,
                0,
            )),
            addr => addr,
        };
        let mut state = shared.lock();
        let (handle, proto) = state
            .endpoint
            .connect(Instant::now(), config, addr, server_name)?;
        state.connections.insert(handle, Conn::new(proto));
        drop(state);
        shared.wake.notify_one();
        Ok(Connecting::new(Connection::new(shared.clone(), handle)))
    }
}

impl Drop for EndpointHandle {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
    }
}

impl Shared {
    /// The state, whichever task held it last (quinn-proto's calls do not leave it half
    /// changed on a panic of ours).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a datagram (or a GSO run of them); `WouldBlock` when the socket is full.
    fn send(&self, t: &proto::Transmit, contents: &[u8]) -> io::Result<()> {
        let transmit = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t.ecn.map(udp_ecn),
            contents,
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        self.socket.try_io(Interest::WRITABLE, || {
            self.udp.send((&self.socket).into(), &transmit)
        })
    }
}

impl Conn {
    fn new(proto: proto::Connection) -> Self {
        Conn {
            proto,
            connected: false,
            error: None,
            handles: 0,
            connecting: None,
            opening: Vec::new(),
            readers: HashMap::new(),
            writers: HashMap::new(),
            timer: None,
        }
    }

    /// The connection ended: everyone waiting on it learns why.
    fn ended(&mut self, error: ConnectionError, wakers: &mut Vec<Waker>) {
        if self.error.is_none() {
            self.error = Some(error);
        }
        wakers.extend(self.connecting.take());
        wakers.append(&mut self.opening);
        wakers.extend(self.readers.drain().map(|(_, w)| w));
        wakers.extend(self.writers.drain().map(|(_, w)| w));
    }

    /// Hands the tasks waiting on the connection what quinn-proto says happened.
    fn app_events(&mut self, wakers: &mut Vec<Waker>) {
        while let Some(event) = self.proto.poll() {
            use proto::Event;
            match event {
                Event::Connected => {
                    self.connected = true;
                    wakers.extend(self.connecting.take());
                }
                Event::ConnectionLost { reason } => self.ended(reason, wakers),
                Event::Stream(StreamEvent::Readable { id }) => {
                    wakers.extend(self.readers.remove(&id))
                }
                Event::Stream(
                    StreamEvent::Writable { id }
                    | StreamEvent::Finished { id }
                    | StreamEvent::Stopped { id, .. },
                ) => wakers.extend(self.writers.remove(&id)),
                Event::Stream(StreamEvent::Available {
                    dir: proto::Dir::Bi,
                }) => {
                    wakers.append(&mut self.opening);
                }
                // The worker opens no streams and sends no datagrams to a client.
                Event::HandshakeDataReady
                | Event::Stream(StreamEvent::Opened { .. } | StreamEvent::Available { .. })
                | Event::DatagramReceived
                | Event::DatagramsUnblocked => {}
            }
        }
    }
}

impl State {
    /// One turn over every connection: timeouts, what they tell the endpoint, what they have
    /// to send, and the tasks to wake. `true` when a connection has more to send now.
    fn drive(&mut self, shared: &Shared, now: Instant, wakers: &mut Vec<Waker>) -> bool {
        let State {
            endpoint,
            connections,
            unsent,
            send_buffer,
            ..
        } = self;
        if let Some(u) = unsent.take() {
            if shared.send(&u.transmit, &u.contents).is_err() {
                *unsent = Some(u);
            }
        }
        let segments = shared
            .udp
            .max_gso_segments()
            .clamp(1, MAX_TRANSMIT_SEGMENTS);
        let mut more = false;
        for (&handle, conn) in connections.iter_mut() {
            if conn.timer.is_some_and(|t| t <= now) {
                conn.proto.handle_timeout(now);
            }
            forward_endpoint_events(endpoint, handle, conn);
            let mut transmits = 0;
            while unsent.is_none() {
                if transmits == TRANSMITS_PER_TURN {
                    more = true;
                    break;
                }
                send_buffer.clear();
                let Some(t) = conn.proto.poll_transmit(now, segments, send_buffer) else {
                    break;
                };
                transmits += 1;
                if shared.send(&t, &send_buffer[..t.size]).is_err() {
                    let contents = send_buffer[..t.size].to_vec();
                    *unsent = Some(Unsent {
                        transmit: t,
                        contents,
                    });
                }
            }
            forward_endpoint_events(endpoint, handle, conn);
            conn.app_events(wakers);
            conn.timer = conn.proto.poll_timeout();
        }
        connections.retain(|_, c| {
            if c.proto.is_drained() {
                c.ended(ConnectionError::LocallyClosed, wakers);
            }
            !(c.proto.is_drained() && c.handles == 0)
        });
        more
    }

    /// A received datagram (or coalesced run of them), to its connection.
    fn handle(
        &mut self,
        shared: &Shared,
        now: Instant,
        meta: &quinn_udp::RecvMeta,
        mut data: bytes::BytesMut,
    ) {
        while !data.is_empty() {
            let packet = data.split_to(meta.stride.clamp(1, data.len()));
            self.response_buffer.clear();
            let event = self.endpoint.handle(
                now,
                meta.addr,
                meta.dst_ip,
                meta.ecn.map(proto_ecn),
                packet,
                &mut self.response_buffer,
            );
            match event {
                Some(DatagramEvent::ConnectionEvent(handle, event)) => {
                    if let Some(conn) = self.connections.get_mut(&handle) {
                        conn.proto.handle_event(event);
                    }
                }
                Some(DatagramEvent::Response(t)) => {
                    // Best effort, as any stateless answer.
                    let _ = shared.send(&t, &self.response_buffer[..t.size]);
                }
                // A client accepts no connections.
                Some(DatagramEvent::NewConnection(incoming)) => self.endpoint.ignore(incoming),
                None => {}
            }
        }
    }

    /// When the driver must next look at a connection's timers.
    fn next_timeout(&self) -> Option<Instant> {
        self.connections.values().filter_map(|c| c.timer).min()
    }

    /// The connection behind a handle: its entry stays while a handle does.
    fn conn(&mut self, handle: ConnectionHandle) -> &mut Conn {
        self.connections
            .get_mut(&handle)
            .expect("a connection's entry outlives its handles")
    }
}

fn forward_endpoint_events(
    endpoint: &mut proto::Endpoint,
    handle: ConnectionHandle,
    conn: &mut Conn,
) {
    while let Some(event) = conn.proto.poll_endpoint_events() {
        if let Some(event) = endpoint.handle_event(handle, event) {
            conn.proto.handle_event(event);
        }
    }
}

/// The driver: receives, drives the connections, sleeps until the socket, a timer or a
/// connection's task wants it.
async fn drive(shared: Arc<Shared>, mut receiver: receive::Receiver) {
    let sleep = tokio::time::sleep(Duration::from_secs(3600));
    tokio::pin!(sleep);
    let mut wakers = Vec::new();
    loop {
        let (deadline, blocked, more) = {
            let mut state = shared.lock();
            let more = state.drive(&shared, Instant::now(), &mut wakers);
            if state.closing && state.connections.is_empty() {
                return;
            }
            (state.next_timeout(), state.unsent.is_some(), more)
        };
        for w in wakers.drain(..) {
            w.wake();
        }
        if more {
            tokio::task::yield_now().await;
            continue;
        }
        let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        sleep
            .as_mut()
            .reset(tokio::time::Instant::from_std(deadline));
        tokio::select! {
            biased;
            ready = shared.socket.readable() => match ready {
                Ok(()) => receive(&shared, &mut receiver),
                Err(e) => {
                    tracing::warn!("QUIC socket: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = shared.wake.notified() => {}
            _ = &mut sleep => {}
            _ = shared.socket.writable(), if blocked => {}
        }
    }
}

/// Receives one batch of datagrams and hands them to their connections.
fn receive(shared: &Shared, receiver: &mut receive::Receiver) {
    let received = shared.socket.try_io(Interest::READABLE, || {
        receiver.recv(&shared.udp, &shared.socket)
    });
    match received {
        // The lock is taken per coalesced run (at most 64 KiB to decrypt), so that the tasks
        // reading streams are not held up for a whole batch.
        Ok(_) => {
            let now = Instant::now();
            while let Some((meta, data)) = receiver.next() {
                shared.lock().handle(shared, now, &meta, data);
            }
        }
        // Nothing there after all, or an ICMP error a peer's packet caused (undefined in QUIC).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionReset
            ) => {}
        Err(e) => tracing::warn!("QUIC socket: receiving: {e}"),
    }
}

fn proto_ecn(ecn: quinn_udp::EcnCodepoint) -> proto::EcnCodepoint {
    match ecn {
        quinn_udp::EcnCodepoint::Ect0 => proto::EcnCodepoint::Ect0,
        quinn_udp::EcnCodepoint::Ect1 => proto::EcnCodepoint::Ect1,
        quinn_udp::EcnCodepoint::Ce => proto::EcnCodepoint::Ce,
    }
}

fn udp_ecn(ecn: proto::EcnCodepoint) -> quinn_udp::EcnCodepoint {
    match ecn {
        proto::EcnCodepoint::Ect0 => quinn_udp::EcnCodepoint::Ect0,
        proto::EcnCodepoint::Ect1 => quinn_udp::EcnCodepoint::Ect1,
        proto::EcnCodepoint::Ce => quinn_udp::EcnCodepoint::Ce,
    }
}

//! TCP between the ranks of a group: the rendezvous behind a unique id, a
//! full mesh of connections, and framed messages.
//!
//! The unique id names a rendezvous server: `get_unique_id` binds a
//! listener on this host's address toward the other hosts ([`super::iface`])
//! and serves one group from a thread (as NCCL's bootstrap root does), and
//! the id carries that address, its port and a random session token. Every
//! rank binds a data listener of its own on its address toward the
//! rendezvous, tells the server its rank, address and port, and receives
//! every rank's; rank `i` then connects to each rank below it and accepts
//! from each rank above it. Every connection opens with the token, so a
//! stray process cannot join. Ranks on one host (a loopback rendezvous)
//! stay on loopback.
//!
//! Every message starts with a header describing the operation the sender
//! is running (kind, dtype, count, op, root), which the receiver compares
//! with its own: ranks that issue different collectives, counts or dtypes
//! get an error naming both sides instead of garbage or a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::iface;
use crate::error::{Error, Result};
use crate::runtime::stream::lock;

/// Identifies a sim unique id (and its layout version: 2 carries an
/// address, 1 was loopback only).
const ID_MAGIC: &[u8; 8] = b"TFLSIMC2";
const MSG_MAGIC: u32 = 0x5446_4c43; // "TFLC"
/// A socket address on the wire: family (4 or 6), 16 address bytes (IPv4
/// in the first 4), port (little-endian).
const ADDR_BYTES: usize = 1 + 16 + 2;
/// token, world size, rank, the rank's data address.
const HELLO: usize = 16 + 4 + 4 + ADDR_BYTES;

fn encode_addr(a: SocketAddr) -> [u8; ADDR_BYTES] {
    let mut b = [0u8; ADDR_BYTES];
    match a.ip() {
        IpAddr::V4(v4) => {
            b[0] = 4;
            b[1..5].copy_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            b[0] = 6;
            b[1..17].copy_from_slice(&v6.octets());
        }
    }
    b[17..19].copy_from_slice(&a.port().to_le_bytes());
    b
}

fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    let b: &[u8; ADDR_BYTES] = b.get(..ADDR_BYTES)?.try_into().ok()?;
    let port = u16::from_le_bytes([b[17], b[18]]);
    let ip = match b[0] {
        4 => IpAddr::V4(Ipv4Addr::new(b[1], b[2], b[3], b[4])),
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[1..17]);
            IpAddr::V6(Ipv6Addr::from(o))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// What a unique id carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdInfo {
    /// The rendezvous server.
    pub addr: SocketAddr,
    pub token: [u8; 16],
}

impl IdInfo {
    pub(crate) fn encode(&self) -> [u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES] {
        let mut b = [0u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(ID_MAGIC);
        b[8..8 + ADDR_BYTES].copy_from_slice(&encode_addr(self.addr));
        b[8 + ADDR_BYTES..24 + ADDR_BYTES].copy_from_slice(&self.token);
        b
    }

    pub(crate) fn decode(b: &[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES]) -> Result<Self> {
        let foreign = || {
            Error::invalid(
                "sim: comm_init_rank: the unique id was not made by this simulator's get_unique_id (every rank must \
                 run the same torch-fl release)",
            )
        };
        if &b[..8] != ID_MAGIC {
            return Err(foreign());
        }
        let addr = decode_addr(&b[8..]).ok_or_else(foreign)?;
        let mut token = [0u8; 16];
        token.copy_from_slice(&b[8 + ADDR_BYTES..24 + ADDR_BYTES]);
        Ok(Self { addr, token })
    }
}

/// A random session token: not cryptographic, only unguessable enough that
/// two groups on one host never join each other.
fn random_token() -> [u8; 16] {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

fn io_error(what: &str, e: &std::io::Error, timeout: Duration) -> Error {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => Error::precondition(format!(
            "sim: {what}: timed out after {:.0} s (the communicator's timeout: the process group's, which \
             TORCH_FL_SIM_COLL_TIMEOUT overrides in seconds)",
            timeout.as_secs_f64()
        )),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted => {
            Error::precondition(format!(
                "sim: {what}: the peer closed its connection (its process exited, or it aborted or destroyed its \
                 communicator)"
            ))
        }
        _ => Error::precondition(format!("sim: {what}: {e}")),
    }
}

/// Starts the rendezvous server of a new group and returns its id. The
/// server thread serves one group and exits, after `timeout` at the latest.
pub(crate) fn start_rendezvous(timeout: Duration) -> Result<IdInfo> {
    let ip = iface::listen_addr(None)?;
    let listener = TcpListener::bind((ip, 0)).map_err(|e| {
        Error::precondition(format!(
            "sim: get_unique_id: cannot listen on {ip}: {e} (set {} to the interface that reaches the other hosts)",
            iface::IFNAME_ENV
        ))
    })?;
    let addr = listener.local_addr().map_err(|e| Error::internal(format!("sim: get_unique_id: {e}")))?;
    let info = IdInfo { addr, token: random_token() };
    std::thread::Builder::new()
        .name("sim-coll-rendezvous".to_owned())
        .spawn(move || serve_rendezvous(&listener, info.token, timeout))
        .map_err(|e| {
            Error::internal(format!("sim: get_unique_id: cannot start the rendezvous thread: {e}"))
        })?;
    Ok(info)
}

/// Accepts on a nonblocking listener until `deadline`.
fn accept_until(listener: &TcpListener, deadline: Instant) -> std::io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(ErrorKind::TimedOut, "accept timed out"));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    }
}

fn serve_rendezvous(listener: &TcpListener, token: [u8; 16], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut members: Vec<(TcpStream, u32, [u8; ADDR_BYTES])> = Vec::new();
    let mut world = None;
    while world.is_none_or(|w| members.len() < w as usize) {
        let Ok(mut s) = accept_until(listener, deadline) else { return };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut hello = [0u8; HELLO];
        if s.read_exact(&mut hello).is_err() || hello[..16] != token {
            continue; // not a member of this group
        }
        let w = u32::from_le_bytes([hello[16], hello[17], hello[18], hello[19]]);
        let rank = u32::from_le_bytes([hello[20], hello[21], hello[22], hello[23]]);
        let mut addr = [0u8; ADDR_BYTES];
        addr.copy_from_slice(&hello[24..24 + ADDR_BYTES]);
        if *world.get_or_insert(w) != w || rank >= w || members.iter().any(|m| m.1 == rank) {
            // A rank that disagrees on the world size or repeats a rank:
            // closing its connection fails its comm_init_rank.
            continue;
        }
        members.push((s, rank, addr));
    }
    let mut table = vec![0u8; members.len() * ADDR_BYTES];
    for (_, rank, addr) in &members {
        let at = *rank as usize * ADDR_BYTES;
        table[at..at + ADDR_BYTES].copy_from_slice(addr);
    }
    for (mut s, _, _) in members {
        let _ = s.write_all(&table);
    }
}

/// One connection to a peer. Reads and writes have their own locks, so
/// that a rank can send to and receive from the same peer at once; `ctl`
/// is a third handle that abort shuts down to wake both.
#[derive(Debug)]
pub(crate) struct Peer {
    reader: Mutex<TcpStream>,
    writer: Mutex<TcpStream>,
    ctl: TcpStream,
}

impl Peer {
    fn new(s: TcpStream, timeout: Duration) -> std::io::Result<Self> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Self { reader: Mutex::new(s.try_clone()?), writer: Mutex::new(s.try_clone()?), ctl: s })
    }
}

/// The describing header of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// The operation (see `OpKind::code`).
    pub kind: u8,
    pub dtype: (u8, u8),
    pub op: u8,
    pub root: i32,
    pub count: u64,
}

const HEADER_BYTES: usize = 4 + 4 + 4 + 8 + 8;

impl Header {
    fn encode(&self, payload: u64) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..4].copy_from_slice(&MSG_MAGIC.to_le_bytes());
        b[4] = self.kind;
        b[5] = self.dtype.0;
        b[6] = self.dtype.1;
        b[7] = self.op;
        b[8..12].copy_from_slice(&self.root.to_le_bytes());
        b[12..20].copy_from_slice(&self.count.to_le_bytes());
        b[20..28].copy_from_slice(&payload.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER_BYTES]) -> Option<(Self, u64)> {
        let word = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(a)
        };
        if word(0..4) as u32 != MSG_MAGIC {
            return None;
        }
        let h = Self {
            kind: b[4],
            dtype: (b[5], b[6]),
            op: b[7],
            root: word(8..12) as u32 as i32,
            count: word(12..20),
        };
        Some((h, word(20..28)))
    }
}

/// A full mesh of connections among the ranks of one group.
#[derive(Debug)]
pub(crate) struct Mesh {
    pub rank: usize,
    pub world: usize,
    peers: Vec<Option<Peer>>,
    timeout: Duration,
    aborted: AtomicBool,
}

impl Mesh {
    /// Joins the group of `id` as `rank` of `world`: blocks until every rank
    /// has joined, or `timeout`.
    pub(crate) fn connect(id: IdInfo, world: usize, rank: usize, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let what = format!("comm_init_rank (rank {rank} of {world})");
        let io = |e: std::io::Error| io_error(&what, &e, timeout);
        let root = id.addr;
        let ip = iface::listen_addr(Some(root.ip()))?;
        let data = TcpListener::bind((ip, 0)).map_err(|e| {
            Error::precondition(format!(
                "sim: {what}: cannot listen on {ip}: {e} (set {} to the interface that reaches the other hosts)",
                iface::IFNAME_ENV
            ))
        })?;
        let mine = data.local_addr().map_err(io)?;
        let mut s = TcpStream::connect_timeout(&root, timeout).map_err(|e| {
            Error::precondition(format!(
                "sim: {what}: cannot reach the rendezvous of this unique id at {root} ({e}): the process that \
                 created the id has exited, the rendezvous already finished, or this host has no route to it \
                 ({} names the interface to use)",
                iface::IFNAME_ENV
            ))
        })?;
        s.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut hello = Vec::with_capacity(HELLO);
        hello.extend_from_slice(&id.token);
        hello.extend_from_slice(&(world as u32).to_le_bytes());
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        hello.extend_from_slice(&encode_addr(mine));
        s.write_all(&hello).map_err(io)?;
        let mut table = vec![0u8; ADDR_BYTES * world];
        s.read_exact(&mut table).map_err(|e| {
            let why = match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => "timed out".to_owned(),
                _ => e.to_string(),
            };
            Error::precondition(format!(
                "sim: {what}: not every rank joined within {:.0} s, or ranks disagree on the world size or \
                 repeat a rank (rendezvous: {why})",
                timeout.as_secs_f64()
            ))
        })?;
        let mut peers: Vec<Option<Peer>> = (0..world).map(|_| None).collect();
        for (j, entry) in table.chunks_exact(ADDR_BYTES).enumerate().take(rank) {
            let addr = decode_addr(entry)
                .ok_or_else(|| Error::internal(format!("sim: {what}: the rendezvous sent a bad address")))?;
            let mut c = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
                Error::precondition(format!(
                    "sim: {what}: cannot connect to rank {j} at {addr} ({e}): it exited, or this host has no route \
                     to it ({} names the interface each rank listens on)",
                    iface::IFNAME_ENV
                ))
            })?;
            let mut hi = id.token.to_vec();
            hi.extend_from_slice(&(rank as u32).to_le_bytes());
            c.write_all(&hi).map_err(io)?;
            peers[j] = Some(Peer::new(c, timeout).map_err(io)?);
        }
        for _ in rank + 1..world {
            let mut c = accept_until(&data, deadline).map_err(|e| {
                Error::precondition(format!("sim: {what}: a higher rank did not connect: {e}"))
            })?;
            c.set_read_timeout(Some(timeout)).map_err(io)?;
            let mut hi = [0u8; 20];
            c.read_exact(&mut hi).map_err(io)?;
            let j = u32::from_le_bytes([hi[16], hi[17], hi[18], hi[19]]) as usize;
            if hi[..16] != id.token || j <= rank || j >= world || peers[j].is_some() {
                return Err(Error::precondition(format!(
                    "sim: {what}: an unexpected connection joined the group"
                )));
            }
            peers[j] = Some(Peer::new(c, timeout).map_err(io)?);
        }
        Ok(Self { rank, world, peers, timeout, aborted: AtomicBool::new(false) })
    }

    fn peer(&self, j: usize) -> Result<&Peer> {
        self.peers
            .get(j)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::internal(format!("sim: no connection to rank {j}")))
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Wakes every blocked transfer and makes later ones fail.
    pub(crate) fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        for p in self.peers.iter().flatten() {
            let _ = p.ctl.shutdown(Shutdown::Both);
        }
    }

    fn fail(&self, what: &str, peer: usize, e: &std::io::Error) -> Error {
        if self.is_aborted() {
            return Error::precondition(format!("sim: {what}: the communicator was aborted"));
        }
        io_error(&format!("{what} (rank {} with rank {peer})", self.rank), e, self.timeout)
    }

    /// Sends `data` to rank `to`, described by `h`.
    pub(crate) fn send(&self, what: &str, to: usize, h: &Header, data: &[u8]) -> Result<()> {
        let p = self.peer(to)?;
        let mut w = lock(&p.writer);
        w.write_all(&h.encode(data.len() as u64)).map_err(|e| self.fail(what, to, &e))?;
        w.write_all(data).map_err(|e| self.fail(what, to, &e))
    }

    /// Receives exactly `out.len()` bytes from rank `from`, whose header must
    /// describe the same operation as `h` (`expect_kind` for send/recv pairs).
    pub(crate) fn recv(&self, what: &str, from: usize, h: &Header, out: &mut [u8]) -> Result<()> {
        let p = self.peer(from)?;
        let mut r = lock(&p.reader);
        let mut hb = [0u8; HEADER_BYTES];
        r.read_exact(&mut hb).map_err(|e| self.fail(what, from, &e))?;
        let Some((theirs, len)) = Header::decode(&hb) else {
            return Err(Error::internal(format!("sim: {what}: corrupt message from rank {from}")));
        };
        if theirs != *h || len != out.len() as u64 {
            return Err(Error::invalid(format!(
                "sim: {what}: mismatched collectives: rank {from} runs {} while rank {} runs {} (every rank must \
                 issue the same collectives in the same order, with the same count, dtype, op and root)",
                super::describe(&theirs),
                self.rank,
                super::describe(h)
            )));
        }
        r.read_exact(out).map_err(|e| self.fail(what, from, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_carry_ipv4_and_ipv6_rendezvous_addresses() {
        for addr in ["198.18.0.1:29500", "[2001:db8::7]:4242", "127.0.0.1:1"] {
            let info = IdInfo { addr: addr.parse().unwrap(), token: [7; 16] };
            assert_eq!(IdInfo::decode(&info.encode()).unwrap(), info, "{addr}");
        }
    }

    #[test]
    fn ids_of_other_layouts_are_refused() {
        let mut old = [0u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES];
        old[..8].copy_from_slice(b"TFLSIMC1");
        assert!(IdInfo::decode(&old).unwrap_err().message().contains("same torch-fl release"));
        let mut bad = IdInfo { addr: "127.0.0.1:5".parse().unwrap(), token: [1; 16] }.encode();
        bad[8] = 9; // no such address family
        assert!(IdInfo::decode(&bad).is_err());
    }
}

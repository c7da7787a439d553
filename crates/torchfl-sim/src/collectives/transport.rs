//! Loopback TCP between the ranks of a group: the rendezvous behind a
//! unique id, a full mesh of connections, and framed messages.
//!
//! The unique id names a rendezvous server: `get_unique_id` binds a
//! listener on 127.0.0.1 and serves one group from a thread (as NCCL's
//! bootstrap root does), and the id carries its port and a random session
//! token. Every rank binds a data listener of its own, tells the server its
//! rank and port, and receives every rank's port; rank `i` then connects to
//! each rank below it and accepts from each rank above it. Every connection
//! opens with the token, so a stray process cannot join.
//!
//! Every message starts with a header describing the operation the sender
//! is running (kind, dtype, count, op, root), which the receiver compares
//! with its own: ranks that issue different collectives, counts or dtypes
//! get an error naming both sides instead of garbage or a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::stream::lock;

/// Identifies a sim unique id (and its layout version).
const ID_MAGIC: &[u8; 8] = b"TFLSIMC1";
const MSG_MAGIC: u32 = 0x5446_4c43; // "TFLC"
const HELLO: usize = 16 + 4 + 4 + 2;

/// What a unique id carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdInfo {
    pub port: u16,
    pub token: [u8; 16],
}

impl IdInfo {
    pub(crate) fn encode(&self) -> [u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES] {
        let mut b = [0u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(ID_MAGIC);
        b[8..10].copy_from_slice(&self.port.to_le_bytes());
        b[10..26].copy_from_slice(&self.token);
        b
    }

    pub(crate) fn decode(b: &[u8; torchfl_ffi::TFL_UNIQUE_ID_BYTES]) -> Result<Self> {
        if &b[..8] != ID_MAGIC {
            return Err(Error::invalid(
                "sim: comm_init_rank: the unique id was not made by this simulator's get_unique_id",
            ));
        }
        let mut token = [0u8; 16];
        token.copy_from_slice(&b[10..26]);
        Ok(Self { port: u16::from_le_bytes([b[8], b[9]]), token })
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
            "sim: {what}: timed out after {:.0} s (TORCH_FL_SIM_COLL_TIMEOUT sets the timeout in seconds)",
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
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::precondition(format!("sim: get_unique_id: cannot listen on 127.0.0.1: {e}")))?;
    let port = listener.local_addr().map_err(|e| Error::internal(format!("sim: get_unique_id: {e}")))?.port();
    let info = IdInfo { port, token: random_token() };
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
    let mut members: Vec<(TcpStream, u32, u16)> = Vec::new();
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
        let port = u16::from_le_bytes([hello[24], hello[25]]);
        if *world.get_or_insert(w) != w || rank >= w || members.iter().any(|m| m.1 == rank) {
            // A rank that disagrees on the world size or repeats a rank:
            // closing its connection fails its comm_init_rank.
            continue;
        }
        members.push((s, rank, port));
    }
    let mut ports = vec![0u16; members.len()];
    for (_, rank, port) in &members {
        ports[*rank as usize] = *port;
    }
    let table: Vec<u8> = ports.iter().flat_map(|p| p.to_le_bytes()).collect();
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
        let data = TcpListener::bind("127.0.0.1:0").map_err(io)?;
        let my_port = data.local_addr().map_err(io)?.port();
        let root: SocketAddr = ([127, 0, 0, 1], id.port).into();
        let mut s = TcpStream::connect_timeout(&root, timeout).map_err(|e| {
            Error::precondition(format!(
                "sim: {what}: cannot reach the rendezvous of this unique id on port {} ({e}): the process that \
                 created the id has exited, or the rendezvous already finished",
                id.port
            ))
        })?;
        s.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut hello = Vec::with_capacity(HELLO);
        hello.extend_from_slice(&id.token);
        hello.extend_from_slice(&(world as u32).to_le_bytes());
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        hello.extend_from_slice(&my_port.to_le_bytes());
        s.write_all(&hello).map_err(io)?;
        let mut table = vec![0u8; 2 * world];
        s.read_exact(&mut table).map_err(|e| {
            Error::precondition(format!(
                "sim: {what}: not every rank joined within {:.0} s, or ranks disagree on the world size or \
                 repeat a rank (rendezvous: {e})",
                timeout.as_secs_f64()
            ))
        })?;
        let ports: Vec<u16> = table.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let mut peers: Vec<Option<Peer>> = (0..world).map(|_| None).collect();
        for (j, port) in ports.iter().enumerate().take(rank) {
            let addr: SocketAddr = ([127, 0, 0, 1], *port).into();
            let mut c = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
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

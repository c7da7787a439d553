//! The simulator's collectives across ranks, each rank a thread with its
//! own `Runtime` (its own simulated device, as each process has), talking
//! over loopback TCP exactly as separate processes do. Every operation is
//! checked against a CPU reference computed here; every wait is bounded by
//! a short communicator timeout, so a hang fails the test instead of
//! stalling it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use torchfl_ffi::{
    TFL_DType, TFL_REDUCE_AVG, TFL_REDUCE_MAX, TFL_REDUCE_MIN, TFL_REDUCE_PROD, TFL_REDUCE_SUM,
};
use torchfl_sim::runtime::collectives::{unique_id_with, CollArgs, CollOp, Comm};
use torchfl_sim::{Config, Mode, Runtime};

const TIMEOUT: Duration = Duration::from_secs(20);
const F32: TFL_DType = TFL_DType { code: torchfl_ffi::TFL_DTYPE_FLOAT, bits: 32, lanes: 1 };
const I64: TFL_DType = TFL_DType { code: torchfl_ffi::TFL_DTYPE_INT, bits: 64, lanes: 1 };

struct Rank {
    rt: Runtime,
    comm: Arc<Comm>,
    rank: usize,
}

impl Rank {
    fn upload_f32(&self, v: &[f32]) -> u64 {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
        let p = self.rt.allocate(0, bytes.len().max(1)).unwrap();
        self.rt.copy_to_device(0, p, &bytes, None).unwrap();
        p
    }
    fn download_f32(&self, p: u64, n: usize) -> Vec<f32> {
        let mut b = vec![0u8; n * 4];
        self.rt.copy_to_host(0, p, &mut b).unwrap();
        b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
    }
    #[allow(clippy::too_many_arguments)] // mirrors the ABI entry
    fn run(&self, which: CollOp, send: u64, recv: u64, count: usize, dtype: TFL_DType, op: i32, rank: i32) {
        let stream = Some(self.rt.default_stream(0).unwrap());
        let args = CollArgs { send, recv, count, dtype, op, rank, stream };
        self.rt.collective(&self.comm, which, &args).unwrap();
        self.rt.synchronize_device(0).unwrap();
    }
}

/// Runs `body` on `world` ranks (threads), each with its own runtime.
fn with_ranks(world: usize, mode: Mode, strict: bool, body: impl Fn(&Rank) + Sync) {
    let id = unique_id_with(TIMEOUT).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let body = &body;
                s.spawn(move || {
                    let rt = Runtime::new(Config {
                        devices: 1,
                        memory: 1 << 26,
                        mode,
                        strict,
                        ..Config::default()
                    })
                    .unwrap();
                    let comm = Comm::init_with(&id, world, rank, 0, TIMEOUT).unwrap();
                    body(&Rank { rt, comm, rank });
                })
            })
            .collect();
        for h in handles {
            h.join().expect("a rank failed");
        }
    });
}

/// Rank r's input: small integers so every reduction is exact in f32.
fn input(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 7 + rank * 3) % 11) as f32 - 5.0).collect()
}

fn reference(world: usize, n: usize, op: i32) -> Vec<f32> {
    let all: Vec<Vec<f32>> = (0..world).map(|r| input(r, n)).collect();
    (0..n)
        .map(|i| {
            let col = all.iter().map(|v| v[i]);
            match op {
                TFL_REDUCE_SUM => col.sum(),
                TFL_REDUCE_PROD => col.product(),
                TFL_REDUCE_MIN => col.fold(f32::INFINITY, f32::min),
                TFL_REDUCE_MAX => col.fold(f32::NEG_INFINITY, f32::max),
                _ => col.sum::<f32>() / world as f32,
            }
        })
        .collect()
}

fn every_collective_matches_the_cpu_reference(world: usize, mode: Mode, strict: bool) {
    // 13 elements: segments of unequal length, one empty for large worlds.
    let n = 13;
    with_ranks(world, mode, strict, |r| {
        let w = world as i32;
        for op in [TFL_REDUCE_SUM, TFL_REDUCE_PROD, TFL_REDUCE_MIN, TFL_REDUCE_MAX, TFL_REDUCE_AVG] {
            // In place, as DDP calls it.
            let buf = r.upload_f32(&input(r.rank, n));
            r.run(CollOp::AllReduce, buf, buf, n, F32, op, 0);
            assert_eq!(r.download_f32(buf, n), reference(world, n, op), "all_reduce op {op}");
            // reduce to the last rank, out of place.
            let send = r.upload_f32(&input(r.rank, n));
            let recv = r.upload_f32(&vec![0.0; n]);
            r.run(CollOp::Reduce, send, recv, n, F32, op, w - 1);
            let expect = if r.rank == world - 1 { reference(world, n, op) } else { vec![0.0; n] };
            assert_eq!(r.download_f32(recv, n), expect, "reduce op {op}");
        }
        // broadcast from rank 1
        let buf = r.upload_f32(&input(r.rank, n));
        r.run(CollOp::Broadcast, buf, buf, n, F32, 0, 1);
        assert_eq!(r.download_f32(buf, n), input(1, n));
        // all_gather
        let send = r.upload_f32(&input(r.rank, n));
        let recv = r.upload_f32(&vec![0.0; n * world]);
        r.run(CollOp::AllGather, send, recv, n, F32, 0, 0);
        let expect: Vec<f32> = (0..world).flat_map(|j| input(j, n)).collect();
        assert_eq!(r.download_f32(recv, n * world), expect);
        // reduce_scatter: block r of the sum of every rank's world*n input
        let send = r.upload_f32(&input(r.rank, n * world));
        let recv = r.upload_f32(&vec![0.0; n]);
        r.run(CollOp::ReduceScatter, send, recv, n, F32, TFL_REDUCE_SUM, 0);
        let full = reference(world, n * world, TFL_REDUCE_SUM);
        assert_eq!(r.download_f32(recv, n), full[r.rank * n..(r.rank + 1) * n]);
        // all_to_all: block j of rank r's send lands as block r of rank j's recv
        let send = r.upload_f32(&input(r.rank, n * world));
        let recv = r.upload_f32(&vec![0.0; n * world]);
        r.run(CollOp::AllToAll, send, recv, n, F32, 0, 0);
        let expect: Vec<f32> =
            (0..world).flat_map(|j| input(j, n * world)[r.rank * n..(r.rank + 1) * n].to_vec()).collect();
        assert_eq!(r.download_f32(recv, n * world), expect);
        // send/recv around the ring, as one group (an exchange)
        let (next, prev) = ((r.rank + 1) % world, (r.rank + world - 1) % world);
        let send = r.upload_f32(&input(r.rank, n));
        let recv = r.upload_f32(&vec![0.0; n]);
        let stream = Some(r.rt.default_stream(0).unwrap());
        r.rt.group_start(&r.comm).unwrap();
        let a = |b: u64, peer: usize| CollArgs {
            send: b,
            recv: b,
            count: n,
            dtype: F32,
            op: 0,
            rank: peer as i32,
            stream,
        };
        r.rt.collective(&r.comm, CollOp::Send, &a(send, next)).unwrap();
        r.rt.collective(&r.comm, CollOp::Recv, &a(recv, prev)).unwrap();
        r.rt.group_end(&r.comm).unwrap();
        r.rt.synchronize_device(0).unwrap();
        assert_eq!(r.download_f32(recv, n), input(prev, n));
        // integer average truncates, as NCCL's does
        let v: Vec<u8> = [r.rank as i64 + 2].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let p = r.rt.allocate(0, 8).unwrap();
        r.rt.copy_to_device(0, p, &v, None).unwrap();
        r.run(CollOp::AllReduce, p, p, 1, I64, TFL_REDUCE_AVG, 0);
        let mut back = [0u8; 8];
        r.rt.copy_to_host(0, p, &mut back).unwrap();
        let sum: i64 = (0..world as i64).map(|k| k + 2).sum();
        assert_eq!(i64::from_ne_bytes(back), sum / world as i64);
        assert!(r.comm.async_error().is_none());
    });
}

#[test]
fn two_ranks_async() {
    every_collective_matches_the_cpu_reference(2, Mode::Async, false);
}

#[test]
fn three_ranks_strict() {
    every_collective_matches_the_cpu_reference(3, Mode::Async, true);
}

#[test]
fn three_ranks_sync() {
    every_collective_matches_the_cpu_reference(3, Mode::Sync, false);
}

#[test]
fn a_large_all_reduce_does_not_deadlock_on_socket_buffers() {
    let n = 1 << 20; // 4 MiB per rank: far beyond a socket buffer
    with_ranks(2, Mode::Async, false, |r| {
        let buf = r.upload_f32(&vec![r.rank as f32 + 1.0; n]);
        r.run(CollOp::AllReduce, buf, buf, n, F32, TFL_REDUCE_SUM, 0);
        assert!(r.download_f32(buf, n).iter().all(|&x| x == 3.0));
    });
}

#[test]
fn a_dead_peer_is_an_error_not_a_hang() {
    let id = unique_id_with(TIMEOUT).unwrap();
    std::thread::scope(|s| {
        let dead = s.spawn(|| {
            let rt = Runtime::new(Config {
                devices: 1,
                memory: 1 << 20,
                mode: Mode::Async,
                strict: false,
                ..Config::default()
            })
            .unwrap();
            let comm = Comm::init_with(&id, 2, 1, 0, TIMEOUT).unwrap();
            drop((comm, rt)); // the rank "dies": its sockets close
        });
        let rt = Runtime::new(Config {
            devices: 1,
            memory: 1 << 20,
            mode: Mode::Async,
            strict: false,
            ..Config::default()
        })
        .unwrap();
        let comm = Comm::init_with(&id, 2, 0, 0, TIMEOUT).unwrap();
        dead.join().unwrap();
        let r = Rank { rt, comm, rank: 0 };
        let buf = r.upload_f32(&[1.0; 4]);
        let stream = Some(r.rt.default_stream(0).unwrap());
        let args =
            CollArgs { send: buf, recv: buf, count: 4, dtype: F32, op: TFL_REDUCE_SUM, rank: 0, stream };
        r.rt.collective(&r.comm, CollOp::AllReduce, &args).unwrap(); // queued: fails when it runs
        let e = r.rt.synchronize_device(0).unwrap_err();
        assert!(e.message().contains("closed its connection"), "{}", e.message());
        let sticky = r.comm.async_error().expect("the communicator keeps its failure");
        assert!(sticky.message().contains("rank 0 with rank 1"), "{}", sticky.message());
        // Later operations fail at once; the device stays usable.
        let e = r.rt.collective(&r.comm, CollOp::AllReduce, &args).unwrap_err();
        assert!(e.message().contains("failed earlier"), "{}", e.message());
        assert_eq!(r.download_f32(buf, 4), vec![1.0; 4]);
    });
}

#[test]
fn a_rank_that_never_joins_times_out_the_rendezvous() {
    let short = Duration::from_millis(300);
    let id = unique_id_with(short).unwrap();
    let e = Comm::init_with(&id, 2, 0, 0, Duration::from_secs(5)).unwrap_err();
    assert!(e.message().contains("not every rank joined"), "{}", e.message());
}

#[test]
fn mismatched_collectives_are_reported_and_abort_unblocks() {
    let id = unique_id_with(TIMEOUT).unwrap();
    std::thread::scope(|s| {
        for rank in 0..2usize {
            let id = &id;
            s.spawn(move || {
                let rt = Runtime::new(Config {
                    devices: 1,
                    memory: 1 << 20,
                    mode: Mode::Async,
                    strict: false,
                    ..Config::default()
                })
                .unwrap();
                let comm = Comm::init_with(id, 2, rank, 0, TIMEOUT).unwrap();
                let r = Rank { rt, comm, rank };
                let n = 4 + r.rank; // counts differ across ranks
                let buf = r.upload_f32(&vec![1.0; n]);
                let stream = Some(r.rt.default_stream(0).unwrap());
                let args = CollArgs {
                    send: buf,
                    recv: buf,
                    count: n,
                    dtype: F32,
                    op: TFL_REDUCE_SUM,
                    rank: 0,
                    stream,
                };
                r.rt.collective(&r.comm, CollOp::AllReduce, &args).unwrap();
                let e = r.rt.synchronize_device(0).unwrap_err();
                assert!(e.message().contains("mismatched collectives"), "{}", e.message());
                r.comm.abort();
                let e = r.rt.collective(&r.comm, CollOp::AllReduce, &args).unwrap_err();
                assert!(e.message().contains("aborted"), "{}", e.message());
            });
        }
    });
    // A rank blocked in a receive is woken by abort from another thread.
    let id = unique_id_with(TIMEOUT).unwrap();
    std::thread::scope(|s| {
        let peer = s.spawn(|| Comm::init_with(&id, 2, 1, 0, TIMEOUT).unwrap());
        let rt = Runtime::new(Config {
            devices: 1,
            memory: 1 << 20,
            mode: Mode::Async,
            strict: false,
            ..Config::default()
        })
        .unwrap();
        let comm = Comm::init_with(&id, 2, 0, 0, TIMEOUT).unwrap();
        let _peer_alive = peer.join().unwrap(); // connected, but never sends
        let r = Rank { rt, comm, rank: 0 };
        let buf = r.upload_f32(&[0.0; 4]);
        let stream = Some(r.rt.default_stream(0).unwrap());
        let args = CollArgs { send: 0, recv: buf, count: 4, dtype: F32, op: 0, rank: 1, stream };
        r.rt.collective(&r.comm, CollOp::Recv, &args).unwrap();
        std::thread::sleep(Duration::from_millis(50)); // let the receive block
        r.comm.abort();
        let e = r.rt.synchronize_device(0).unwrap_err();
        assert!(e.message().contains("aborted"), "{}", e.message());
    });
}

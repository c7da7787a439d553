//! Checks of the loaded plugin's memory: round trips, offsets, running out
//! of memory, statistics.

use torchfl_core::Error;

use super::{device_plugin, devices, Ctx, NotPassed, Outcome};

/// Sizes chosen to catch alignment and rounding bugs: odd, prime-ish, page
/// straddling, and one larger than a typical cache block.
const ROUND_TRIP_SIZES: &[usize] = &[1, 3, 64, 127, 4097, (1 << 20) + 7];

pub(super) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

pub(super) fn check_round_trip(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    for d in devices(&p) {
        let empty_a = p.allocate(d, 0).map_err(fail)?;
        let empty_b = p.allocate(d, 0).map_err(fail)?;
        if empty_a.as_ptr() == empty_b.as_ptr() {
            return Err(NotPassed::Fail(format!(
                "device {d}: two 0-byte allocations returned the same pointer"
            )));
        }
        for &n in ROUND_TRIP_SIZES {
            let a = p.allocate(d, n).map_err(fail)?;
            if a.as_ptr() as usize % 64 != 0 {
                return Err(NotPassed::Fail(format!(
                    "device {d}: allocation of {n} bytes is not 64-byte aligned"
                )));
            }
            let b = p.allocate(d, n).map_err(fail)?;
            let data = pattern(n, d as u8);
            p.copy_to_device(&a, 0, &data).map_err(fail)?;
            p.copy_device_to_device(&b, 0, &a, 0, n, None).map_err(fail)?;
            let mut back = vec![0u8; n];
            p.copy_to_host(&b, 0, &mut back).map_err(fail)?;
            if back != data {
                let at = back.iter().zip(&data).position(|(x, y)| x != y).unwrap_or(0);
                return Err(NotPassed::Fail(format!(
                    "device {d}: {n}-byte host->device->device->host round trip differs at byte {at}"
                )));
            }
            p.set_memory(&b, n / 2, 0xA5, n - n / 2, None).map_err(fail)?;
            p.copy_to_host(&b, 0, &mut back).map_err(fail)?;
            let expected: Vec<u8> =
                data[..n / 2].iter().copied().chain(std::iter::repeat_n(0xA5, n - n / 2)).collect();
            if back != expected {
                return Err(NotPassed::Fail(format!(
                    "device {d}: set_memory on the upper half of {n} bytes is wrong"
                )));
            }
        }
        if d > 0 {
            // Copies between devices of the same plugin.
            let src = p.allocate(0, 4097).map_err(fail)?;
            let dst = p.allocate(d, 4097).map_err(fail)?;
            let data = pattern(4097, 9);
            p.copy_to_device(&src, 0, &data).map_err(fail)?;
            p.copy_device_to_device(&dst, 0, &src, 0, 4097, None).map_err(fail)?;
            let mut back = vec![0u8; 4097];
            p.copy_to_host(&dst, 0, &mut back).map_err(fail)?;
            if back != data {
                return Err(NotPassed::Fail(format!("copy from device 0 to device {d} is wrong")));
            }
        }
    }
    Ok(format!("sizes {ROUND_TRIP_SIZES:?} on {} device(s)", p.device_count()))
}

pub(super) fn check_oom(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    for d in devices(&p) {
        let total = p.device_properties(d).map_err(|e| NotPassed::Fail(e.to_string()))?.total_memory;
        let request = usize::try_from(total.saturating_mul(2).max(1 << 40)).unwrap_or(usize::MAX / 2);
        match p.allocate(d, request) {
            Err(Error::OutOfMemory { .. }) => {}
            Err(e) => {
                return Err(NotPassed::Fail(format!(
                    "device {d}: an impossible allocation failed with {} instead of OUT_OF_MEMORY: {e}",
                    e.kind()
                )))
            }
            Ok(_) => {
                return Err(NotPassed::Fail(format!(
                    "device {d}: allocating {request} bytes (more than total_memory {total}) succeeded"
                )))
            }
        }
        // The device must still work afterwards.
        p.allocate(d, 4096).map_err(|e| NotPassed::Fail(format!("device {d} unusable after an OOM: {e}")))?;
    }
    Ok("OUT_OF_MEMORY status on every device, device usable afterwards".into())
}

pub(super) fn check_memory_stats(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    let stats = |d| p.memory_stats(d);
    match stats(0) {
        Err(Error::Unimplemented { .. }) => {
            return Err(NotPassed::Skip("memory_stats is not implemented".into()))
        }
        Err(e) => return Err(NotPassed::Fail(e.to_string())),
        Ok(_) => {}
    }
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    // Other threads do not allocate during verify, so deltas are exact.
    let before = stats(0).map_err(fail)?;
    let buf = p.allocate(0, 1 << 16).map_err(fail)?;
    let during = stats(0).map_err(fail)?;
    drop(buf);
    p.synchronize(0).map_err(fail)?;
    let after = stats(0).map_err(fail)?;
    if during.allocated_bytes < before.allocated_bytes + (1 << 16) {
        return Err(NotPassed::Fail(format!(
            "allocated_bytes went from {} to {} after allocating 65536 bytes",
            before.allocated_bytes, during.allocated_bytes
        )));
    }
    if during.peak_allocated_bytes < during.allocated_bytes || during.reserved_bytes < during.allocated_bytes
    {
        return Err(NotPassed::Fail("peak or reserved bytes below allocated bytes".into()));
    }
    if after.allocated_bytes != before.allocated_bytes || after.num_frees <= before.num_frees {
        return Err(NotPassed::Fail(format!(
            "after freeing, allocated_bytes is {} (was {}) and num_frees {} (was {})",
            after.allocated_bytes, before.allocated_bytes, after.num_frees, before.num_frees
        )));
    }
    Ok(format!("{} bytes allocated now, peak {}", after.allocated_bytes, after.peak_allocated_bytes))
}

/// (offset, length) pairs inside a buffer of [`OFFSET_BUFFER`] bytes:
/// odd offsets and lengths, page straddling, up to the last byte.
const OFFSETS: &[(usize, usize)] =
    &[(1, 1), (3, 3), (7, 4097), (4095, 2), (63, 1000), (OFFSET_BUFFER - 5, 5)];
const OFFSET_BUFFER: usize = 8192 + 64;

pub(super) fn check_offsets(ctx: &mut Ctx<'_>) -> Outcome {
    let p = device_plugin(ctx)?;
    let fail = |e: Error| NotPassed::Fail(e.to_string());
    for d in devices(&p) {
        let buf = p.allocate(d, OFFSET_BUFFER).map_err(fail)?;
        let other = p.allocate(d, OFFSET_BUFFER).map_err(fail)?;
        for &(offset, n) in OFFSETS {
            let data = pattern(n, 0x40 ^ offset as u8);
            p.set_memory(&buf, 0, 0, OFFSET_BUFFER, None).map_err(fail)?;
            p.copy_to_device(&buf, offset, &data).map_err(fail)?;
            let mut whole = vec![0xFFu8; OFFSET_BUFFER];
            p.copy_to_host(&buf, 0, &mut whole).map_err(fail)?;
            let mut expected = vec![0u8; OFFSET_BUFFER];
            expected[offset..offset + n].copy_from_slice(&data);
            if let Some(at) = whole.iter().zip(&expected).position(|(x, y)| x != y) {
                return Err(NotPassed::Fail(format!(
                    "device {d}: copying {n} bytes to offset {offset} left byte {at} wrong \
                     (0x{:02x}, expected 0x{:02x})",
                    whole[at], expected[at]
                )));
            }
            let mut part = vec![0u8; n];
            p.copy_to_host(&buf, offset, &mut part).map_err(fail)?;
            if part != data {
                return Err(NotPassed::Fail(format!(
                    "device {d}: reading {n} bytes back from offset {offset} differs"
                )));
            }
            // Device to device, from one odd offset to another.
            let dst_offset = (offset * 3 + 1) % (OFFSET_BUFFER - n + 1);
            p.set_memory(&other, 0, 0x5A, OFFSET_BUFFER, None).map_err(fail)?;
            p.copy_device_to_device(&other, dst_offset, &buf, offset, n, None).map_err(fail)?;
            p.set_memory(&other, dst_offset + n, 0x3C, OFFSET_BUFFER - dst_offset - n, None).map_err(fail)?;
            p.synchronize(d).map_err(fail)?;
            p.copy_to_host(&other, 0, &mut whole).map_err(fail)?;
            expected.fill(0x5A);
            expected[dst_offset..dst_offset + n].copy_from_slice(&data);
            expected[dst_offset + n..].fill(0x3C);
            if let Some(at) = whole.iter().zip(&expected).position(|(x, y)| x != y) {
                return Err(NotPassed::Fail(format!(
                    "device {d}: device-to-device copy of {n} bytes from offset {offset} to offset \
                     {dst_offset} (then set_memory after it) left byte {at} wrong"
                )));
            }
        }
    }
    Ok(format!("{} offset/length pairs on {} device(s)", OFFSETS.len(), p.device_count()))
}

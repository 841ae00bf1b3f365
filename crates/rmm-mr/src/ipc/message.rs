//! The messages of the IPC protocol and their framing: pure code, no socket, no CUDA.
//!
//! A frame is a 12-byte header, then the payload:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..4 | magic `b"RMMI"` |
//! | 4..6 | message kind (little-endian u16) |
//! | 6..8 | file descriptors sent with the frame (u16) |
//! | 8..12 | payload length in bytes (u32, at most [`MAX_PAYLOAD`]) |
//!
//! The payload's integers are little-endian; both processes run on one host, so the order only
//! has to be fixed. The descriptors travel as `SCM_RIGHTS` ancillary data of the frame's first
//! byte (`channel`).

use super::IpcError;

/// The first bytes of every frame.
pub(crate) const MAGIC: [u8; 4] = *b"RMMI";
/// The header's size.
pub(crate) const HEADER_LEN: usize = 12;
/// The largest payload a frame may carry (a VMM export of 4,096 chunks fits).
pub(crate) const MAX_PAYLOAD: usize = 1 << 20;
/// The most descriptors one frame may carry.
pub(crate) const MAX_FDS: usize = 253;

/// How the chunks of an exported VMM allocation travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChunkHandles {
    /// One POSIX file descriptor per chunk, in order, sent with the frame.
    PosixFds,
    /// One fabric handle per chunk, in the payload.
    Fabric(Vec<[u8; 64]>),
}

/// One message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// Exporter to importer: the driver pool `pool_id` of device `device`, as the one
    /// descriptor of the frame. Sent once per pool, before its first pointer.
    SharePool {
        /// The exporter's name for the pool.
        pool_id: u64,
        /// The pool's device.
        device: i32,
    },
    /// Exporter to importer: an allocation of the shared pool `pool_id`.
    PoolPointer {
        /// The export's id, which the release names.
        id: u64,
        /// The pool (sent before with [`Message::SharePool`]).
        pool_id: u64,
        /// The allocation's size in bytes.
        size: u64,
        /// `cuMemPoolExportPointer`'s bytes.
        data: [u8; 64],
    },
    /// Exporter to importer: an allocation of a VMM pool, as the chunks that hold it.
    Vmm {
        /// The export's id, which the release names.
        id: u64,
        /// The device of the physical memory.
        device: i32,
        /// The alignment the importer reserves its range with (the pool's granularity).
        alignment: u64,
        /// The size of the range the chunks span.
        span: u64,
        /// Where the allocation starts in that span.
        offset: u64,
        /// The allocation's size in bytes.
        size: u64,
        /// `(offset in the span, size)` of each chunk, in order.
        chunks: Vec<(u64, u64)>,
        /// How the chunks' memory travels.
        handles: ChunkHandles,
    },
    /// Importer to exporter: the export `id` is unmapped and its work is done; the exporter may
    /// free it.
    Release {
        /// The export's id.
        id: u64,
    },
}

const KIND_SHARE_POOL: u16 = 1;
const KIND_POOL_POINTER: u16 = 2;
const KIND_VMM_FDS: u16 = 3;
const KIND_VMM_FABRIC: u16 = 4;
const KIND_RELEASE: u16 = 5;

impl Message {
    /// How many descriptors travel with this message.
    pub(crate) fn fd_count(&self) -> usize {
        match self {
            Self::SharePool { .. } => 1,
            Self::Vmm {
                chunks,
                handles: ChunkHandles::PosixFds,
                ..
            } => chunks.len(),
            _ => 0,
        }
    }

    /// The frame: header and payload (the descriptors go beside it).
    pub(crate) fn encode(&self) -> Result<Vec<u8>, IpcError> {
        let mut p = Vec::new();
        let kind = match self {
            Self::SharePool { pool_id, device } => {
                put_u64(&mut p, *pool_id);
                put_i32(&mut p, *device);
                KIND_SHARE_POOL
            }
            Self::PoolPointer {
                id,
                pool_id,
                size,
                data,
            } => {
                put_u64(&mut p, *id);
                put_u64(&mut p, *pool_id);
                put_u64(&mut p, *size);
                p.extend_from_slice(data);
                KIND_POOL_POINTER
            }
            Self::Vmm {
                id,
                device,
                alignment,
                span,
                offset,
                size,
                chunks,
                handles,
            } => {
                put_u64(&mut p, *id);
                put_i32(&mut p, *device);
                put_u64(&mut p, *alignment);
                put_u64(&mut p, *span);
                put_u64(&mut p, *offset);
                put_u64(&mut p, *size);
                put_u64(&mut p, chunks.len() as u64);
                for (o, s) in chunks {
                    put_u64(&mut p, *o);
                    put_u64(&mut p, *s);
                }
                match handles {
                    ChunkHandles::PosixFds => KIND_VMM_FDS,
                    ChunkHandles::Fabric(h) => {
                        if h.len() != chunks.len() {
                            return Err(IpcError::Protocol(format!(
                                "{} fabric handles for {} chunks",
                                h.len(),
                                chunks.len()
                            )));
                        }
                        for one in h {
                            p.extend_from_slice(one);
                        }
                        KIND_VMM_FABRIC
                    }
                }
            }
            Self::Release { id } => {
                put_u64(&mut p, *id);
                KIND_RELEASE
            }
        };
        let fds = self.fd_count();
        if p.len() > MAX_PAYLOAD || fds > MAX_FDS {
            return Err(IpcError::Protocol(format!(
                "a message of {} bytes with {fds} descriptors is over the limits ({MAX_PAYLOAD} \
                 bytes, {MAX_FDS} descriptors)",
                p.len()
            )));
        }
        let mut frame = Vec::with_capacity(HEADER_LEN + p.len());
        frame.extend_from_slice(&MAGIC);
        frame.extend_from_slice(&kind.to_le_bytes());
        frame.extend_from_slice(&(fds as u16).to_le_bytes());
        frame.extend_from_slice(&(p.len() as u32).to_le_bytes());
        frame.extend_from_slice(&p);
        Ok(frame)
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: u16,
    pub(crate) fds: usize,
    pub(crate) len: usize,
}

/// Checks and decodes a header.
pub(crate) fn decode_header(h: &[u8; HEADER_LEN]) -> Result<Header, IpcError> {
    if h[0..4] != MAGIC {
        return Err(IpcError::Protocol(format!(
            "bad magic {:02x?} (expected {MAGIC:02x?})",
            &h[0..4]
        )));
    }
    let kind = u16::from_le_bytes([h[4], h[5]]);
    let fds = usize::from(u16::from_le_bytes([h[6], h[7]]));
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]) as usize;
    if len > MAX_PAYLOAD || fds > MAX_FDS {
        return Err(IpcError::Protocol(format!(
            "frame of {len} bytes with {fds} descriptors is over the limits"
        )));
    }
    Ok(Header { kind, fds, len })
}

/// Decodes a payload of `header.kind`; the descriptors received must number `header.fds`
/// (checked by the caller) and match what the message says.
pub(crate) fn decode(header: Header, payload: &[u8]) -> Result<Message, IpcError> {
    let mut r = Reader { p: payload };
    let m = match header.kind {
        KIND_SHARE_POOL => Message::SharePool {
            pool_id: r.u64()?,
            device: r.i32()?,
        },
        KIND_POOL_POINTER => Message::PoolPointer {
            id: r.u64()?,
            pool_id: r.u64()?,
            size: r.u64()?,
            data: r.bytes64()?,
        },
        KIND_VMM_FDS | KIND_VMM_FABRIC => {
            let id = r.u64()?;
            let device = r.i32()?;
            let alignment = r.u64()?;
            let span = r.u64()?;
            let offset = r.u64()?;
            let size = r.u64()?;
            let n = r.u64()?;
            // Each chunk takes at least 16 bytes: a count the payload cannot hold is refused
            // before anything is reserved for it.
            if n > (r.p.len() / 16) as u64 {
                return Err(IpcError::Protocol(format!(
                    "{n} chunks announced in {} bytes",
                    r.p.len()
                )));
            }
            let n = n as usize;
            let mut chunks = Vec::with_capacity(n);
            for _ in 0..n {
                chunks.push((r.u64()?, r.u64()?));
            }
            let handles = if header.kind == KIND_VMM_FDS {
                ChunkHandles::PosixFds
            } else {
                let mut h = Vec::with_capacity(n);
                for _ in 0..n {
                    h.push(r.bytes64()?);
                }
                ChunkHandles::Fabric(h)
            };
            let m = Message::Vmm {
                id,
                device,
                alignment,
                span,
                offset,
                size,
                chunks,
                handles,
            };
            check_vmm_geometry(&m)?;
            m
        }
        KIND_RELEASE => Message::Release { id: r.u64()? },
        other => return Err(IpcError::Protocol(format!("unknown message kind {other}"))),
    };
    if !r.p.is_empty() {
        return Err(IpcError::Protocol(format!(
            "{} bytes left after message kind {}",
            r.p.len(),
            header.kind
        )));
    }
    if m.fd_count() != header.fds {
        return Err(IpcError::Protocol(format!(
            "message kind {} comes with {} descriptors, expected {}",
            header.kind,
            header.fds,
            m.fd_count()
        )));
    }
    Ok(m)
}

/// That the chunks of a VMM export tile `[0, span)` in order, each a positive multiple of the
/// alignment, and that the allocation lies inside the span: what the importer maps must be
/// exactly the range it reserves.
fn check_vmm_geometry(m: &Message) -> Result<(), IpcError> {
    let Message::Vmm {
        alignment,
        span,
        offset,
        size,
        chunks,
        ..
    } = m
    else {
        return Ok(());
    };
    let bad = |why: &str| Err(IpcError::Protocol(format!("VMM export: {why}")));
    if *alignment == 0 || !alignment.is_power_of_two() {
        return bad("the alignment is not a power of two");
    }
    if chunks.is_empty() {
        return bad("no chunks");
    }
    let mut next = 0u64;
    for &(o, s) in chunks {
        if o != next || s == 0 || s % alignment != 0 {
            return bad("the chunks do not tile the span");
        }
        next = match o.checked_add(s) {
            Some(n) => n,
            None => return bad("a chunk overflows"),
        };
    }
    if next != *span {
        return bad("the chunks do not cover the span");
    }
    if *size == 0 || offset.checked_add(*size).is_none_or(|end| end > *span) {
        return bad("the allocation does not lie in the span");
    }
    Ok(())
}

fn put_u64(p: &mut Vec<u8>, v: u64) {
    p.extend_from_slice(&v.to_le_bytes());
}

fn put_i32(p: &mut Vec<u8>, v: i32) {
    p.extend_from_slice(&v.to_le_bytes());
}

struct Reader<'a> {
    p: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], IpcError> {
        if self.p.len() < N {
            return Err(IpcError::Protocol(format!(
                "payload too short: {} bytes left, {N} needed",
                self.p.len()
            )));
        }
        let (head, rest) = self.p.split_at(N);
        self.p = rest;
        let mut out = [0; N];
        out.copy_from_slice(head);
        Ok(out)
    }

    fn u64(&mut self) -> Result<u64, IpcError> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn i32(&mut self) -> Result<i32, IpcError> {
        self.take::<4>().map(i32::from_le_bytes)
    }

    fn bytes64(&mut self) -> Result<[u8; 64], IpcError> {
        self.take::<64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: Message) {
        let frame = m.encode().unwrap();
        let mut h = [0; HEADER_LEN];
        h.copy_from_slice(&frame[..HEADER_LEN]);
        let header = decode_header(&h).unwrap();
        assert_eq!(header.len, frame.len() - HEADER_LEN);
        assert_eq!(header.fds, m.fd_count());
        assert_eq!(decode(header, &frame[HEADER_LEN..]).unwrap(), m);
    }

    fn vmm(handles: ChunkHandles) -> Message {
        Message::Vmm {
            id: 7,
            device: 1,
            alignment: 2 << 20,
            span: 6 << 20,
            offset: (2 << 20) + 256,
            size: 3 << 20,
            chunks: vec![(0, 2 << 20), (2 << 20, 4 << 20)],
            handles,
        }
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(Message::SharePool {
            pool_id: 0xdead_beef,
            device: 3,
        });
        round_trip(Message::PoolPointer {
            id: 1,
            pool_id: 2,
            size: 1 << 30,
            data: [9; 64],
        });
        round_trip(vmm(ChunkHandles::PosixFds));
        round_trip(vmm(ChunkHandles::Fabric(vec![[1; 64], [2; 64]])));
        round_trip(Message::Release { id: u64::MAX });
        assert_eq!(vmm(ChunkHandles::PosixFds).fd_count(), 2);
        assert_eq!(
            vmm(ChunkHandles::Fabric(vec![[1; 64], [2; 64]])).fd_count(),
            0
        );
    }

    #[test]
    fn damaged_frames_are_errors() {
        let frame = Message::Release { id: 5 }.encode().unwrap();
        let mut h = [0; HEADER_LEN];
        h.copy_from_slice(&frame[..HEADER_LEN]);
        let header = decode_header(&h).unwrap();
        // Too short, too long, unknown kind, wrong descriptor count, bad magic, oversized.
        assert!(decode(header, &frame[HEADER_LEN..HEADER_LEN + 7]).is_err());
        let mut long = frame[HEADER_LEN..].to_vec();
        long.push(0);
        assert!(decode(header, &long).is_err());
        let unknown = Header { kind: 99, ..header };
        assert!(decode(unknown, &frame[HEADER_LEN..]).is_err());
        let with_fd = Header { fds: 1, ..header };
        assert!(decode(with_fd, &frame[HEADER_LEN..]).is_err());
        let mut bad = h;
        bad[0] = b'X';
        assert!(decode_header(&bad)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut huge = h;
        huge[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        assert!(decode_header(&huge).is_err());
    }

    /// Changes the chunks, the offset or the size of a VMM export.
    type Edit = dyn Fn(&mut Vec<(u64, u64)>, &mut u64, &mut u64);

    #[test]
    fn vmm_exports_must_tile_their_span() {
        let check = |f: &dyn Fn(&mut Message)| {
            let mut m = vmm(ChunkHandles::PosixFds);
            f(&mut m);
            let frame = m.encode().unwrap();
            let mut h = [0; HEADER_LEN];
            h.copy_from_slice(&frame[..HEADER_LEN]);
            decode(decode_header(&h).unwrap(), &frame[HEADER_LEN..])
        };
        assert!(check(&|_| {}).is_ok());
        let set = |m: &mut Message, f: &Edit| {
            if let Message::Vmm {
                chunks,
                offset,
                size,
                ..
            } = m
            {
                f(chunks, offset, size);
            }
        };
        // A gap, an overlap, a short cover, an allocation past the end, an empty one.
        assert!(check(&|m| set(m, &|c, _, _| c[1].0 += 2 << 20)).is_err());
        assert!(check(&|m| set(m, &|c, _, _| c[1].0 -= 1 << 20)).is_err());
        assert!(check(&|m| set(m, &|c, _, _| c[1].1 = 2 << 20)).is_err());
        assert!(check(&|m| set(m, &|_, o, _| *o = 5 << 20)).is_err());
        assert!(check(&|m| set(m, &|_, _, s| *s = 0)).is_err());
        // A chunk count the payload cannot hold is refused before any allocation.
        let mut frame = vmm(ChunkHandles::PosixFds).encode().unwrap();
        let count_at = HEADER_LEN + 8 + 4 + 8 * 4;
        frame[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut h = [0; HEADER_LEN];
        h.copy_from_slice(&frame[..HEADER_LEN]);
        let e = decode(decode_header(&h).unwrap(), &frame[HEADER_LEN..]).unwrap_err();
        assert!(e.to_string().contains("chunks announced"), "{e}");
    }
}

//! [`IpcChannel`]: framed messages and file descriptors over a Unix stream socket
//! (`SCM_RIGHTS`, through nix's `sendmsg`/`recvmsg`). No CUDA here.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};

use super::message::{self, Message, HEADER_LEN, MAX_FDS};
use super::IpcError;

/// One end of a connection between an exporting and an importing process: a Unix stream
/// socket that carries the protocol's messages and, beside them, file descriptors
/// (`SCM_RIGHTS`).
///
/// Build it from a connected [`UnixStream`] (`UnixListener::accept` in one process,
/// [`connect`](Self::connect) in the other, or [`pair`](Self::pair) for two threads), then hand
/// it to an [`IpcExporter`](crate::IpcExporter) or an [`IpcImporter`](crate::IpcImporter).
/// The channel owns the socket: the importer's end closes only after its last import was
/// released (see [`IpcExporter`](crate::IpcExporter) for why that matters).
#[derive(Debug)]
pub struct IpcChannel {
    stream: UnixStream,
}

impl IpcChannel {
    /// Connects to a listening socket at `path`.
    ///
    /// # Errors
    /// [`IpcError::Io`] when the connection fails.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, IpcError> {
        Ok(Self {
            stream: UnixStream::connect(path)?,
        })
    }

    /// Two connected channels (`socketpair`), for two threads of one process or a child that
    /// inherits one end.
    ///
    /// # Errors
    /// [`IpcError::Io`] when the socket pair cannot be made.
    pub fn pair() -> Result<(Self, Self), IpcError> {
        let (a, b) = UnixStream::pair()?;
        Ok((Self { stream: a }, Self { stream: b }))
    }

    /// A second handle of the same socket (`dup`), so that one thread may send while another
    /// blocks receiving; the socket closes when both are gone.
    pub(crate) fn try_clone(&self) -> Result<Self, IpcError> {
        Ok(Self {
            stream: self.stream.try_clone()?,
        })
    }

    /// Sends one frame with `fds` attached to its first byte. The descriptors stay the
    /// caller's (the receiver gets duplicates).
    pub(crate) fn send(&mut self, m: &Message, fds: &[BorrowedFd<'_>]) -> Result<(), IpcError> {
        if fds.len() != m.fd_count() {
            return Err(IpcError::Protocol(format!(
                "{} descriptors for a message that takes {}",
                fds.len(),
                m.fd_count()
            )));
        }
        let frame = m.encode()?;
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let sent = loop {
            let cmsg = [ControlMessage::ScmRights(&raw)];
            let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
            match sendmsg::<UnixAddr>(
                self.stream.as_raw_fd(),
                &[IoSlice::new(&frame)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(n) => break n,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(IpcError::Io(e.into())),
            }
        };
        // The descriptors went with the first bytes; the rest of a short send is plain data.
        self.stream.write_all(&frame[sent..])?;
        Ok(())
    }

    /// Receives one frame and its descriptors. The end of the stream before a frame starts is
    /// [`IpcError::PeerClosed`].
    pub(crate) fn recv(&mut self) -> Result<(Message, Vec<OwnedFd>), IpcError> {
        let mut header = [0u8; HEADER_LEN];
        let mut fds = Vec::new();
        let mut got = 0;
        while got == 0 {
            let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
            let mut iov = [IoSliceMut::new(&mut header)];
            let msg = match recvmsg::<UnixAddr>(
                self.stream.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Ok(msg) => msg,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(IpcError::Io(e.into())),
            };
            got = msg.bytes;
            let cmsgs = msg.cmsgs().map_err(|e| {
                IpcError::Protocol(format!("the descriptors sent did not fit ({e})"))
            })?;
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = c {
                    for fd in received {
                        // SAFETY: the kernel just installed this descriptor in our table for
                        // this message; nothing else owns it.
                        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
            if got == 0 {
                return Err(IpcError::PeerClosed);
            }
        }
        if got < HEADER_LEN {
            self.stream.read_exact(&mut header[got..])?;
        }
        let h = message::decode_header(&header)?;
        let mut payload = vec![0u8; h.len];
        self.stream.read_exact(&mut payload)?;
        if fds.len() != h.fds {
            return Err(IpcError::Protocol(format!(
                "{} descriptors received with a frame that announces {}",
                fds.len(),
                h.fds
            )));
        }
        Ok((message::decode(h, &payload)?, fds))
    }
}

impl From<UnixStream> for IpcChannel {
    fn from(stream: UnixStream) -> Self {
        Self { stream }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A socket's end travels to another thread; what is written into the other end is read
    /// from the received descriptor (a new descriptor of the same open file, whose
    /// first owner closed its own).
    #[test]
    fn a_descriptor_travels_between_threads() {
        let (mut a, mut b) = IpcChannel::pair().unwrap();
        // The "plain descriptor": one end of another socket pair, read where it arrives.
        let (reader, mut writer) = UnixStream::pair().unwrap();
        let reader: OwnedFd = reader.into();
        let t = std::thread::spawn(move || {
            let (m, mut fds) = b.recv().unwrap();
            assert_eq!(
                m,
                Message::SharePool {
                    pool_id: 42,
                    device: 0
                }
            );
            assert_eq!(fds.len(), 1);
            let fd = fds.pop().unwrap();
            let mut f = UnixStream::from(fd);
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            b.send(&Message::Release { id: s.len() as u64 }, &[])
                .unwrap();
            s
        });
        a.send(
            &Message::SharePool {
                pool_id: 42,
                device: 0,
            },
            &[reader.as_fd()],
        )
        .unwrap();
        drop(reader);
        writer.write_all(b"through SCM_RIGHTS").unwrap();
        drop(writer);
        assert_eq!(t.join().unwrap(), "through SCM_RIGHTS");
        let (m, fds) = a.recv().unwrap();
        assert_eq!((m, fds.len()), (Message::Release { id: 18 }, 0));
    }

    /// Several descriptors with one frame, frames back to back, and the end of the stream.
    #[test]
    fn frames_keep_their_descriptors_apart() {
        use crate::ipc::message::ChunkHandles;
        let (mut a, mut b) = IpcChannel::pair().unwrap();
        let files: Vec<OwnedFd> = (0..3)
            .map(|_| UnixStream::pair().unwrap().0.into())
            .collect();
        let vmm = Message::Vmm {
            id: 1,
            device: 0,
            alignment: 1 << 21,
            span: 3 << 21,
            offset: 0,
            size: 3 << 21,
            chunks: vec![(0, 1 << 21), (1 << 21, 1 << 21), (2 << 21, 1 << 21)],
            handles: ChunkHandles::PosixFds,
        };
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        a.send(&vmm, &borrowed).unwrap();
        a.send(&Message::Release { id: 9 }, &[]).unwrap();
        // A wrong descriptor count is refused before anything is sent.
        assert!(a.send(&Message::Release { id: 9 }, &borrowed[..1]).is_err());
        drop(a);
        let (m, fds) = b.recv().unwrap();
        assert_eq!((m, fds.len()), (vmm, 3));
        let (m, fds) = b.recv().unwrap();
        assert_eq!((m, fds.len()), (Message::Release { id: 9 }, 0));
        assert!(matches!(b.recv(), Err(IpcError::PeerClosed)));
    }

    /// Garbage on the socket is a protocol error, not a panic.
    #[test]
    fn garbage_is_a_protocol_error() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"GARBAGE GARBAGE").unwrap();
        let mut b = IpcChannel::from(b);
        let e = b.recv().unwrap_err();
        assert!(matches!(e, IpcError::Protocol(_)), "{e}");
    }
}

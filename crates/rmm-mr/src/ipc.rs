//! IPC between processes. The protocol and its safety contract are documented on
//! [`IpcExporter`](crate::IpcExporter), the public entry point.

mod channel;
mod export;
mod import;
mod ledger;
mod message;

pub use channel::IpcChannel;
pub use export::{ExportId, IpcAllocation, IpcExporter, Released};
pub use import::{ImportedAllocation, IpcImporter};

use std::fmt;

/// What can go wrong between the two processes.
#[derive(Debug)]
#[non_exhaustive]
pub enum IpcError {
    /// The socket failed.
    Io(std::io::Error),
    /// The other process ended the connection.
    PeerClosed,
    /// The other process sent something the protocol does not allow (or a message was over
    /// the limits); the text says what.
    Protocol(String),
    /// [`IpcExporter::wait_released`] was asked for an export that is not outstanding.
    UnknownExport(u64),
    /// An allocation, a synchronization or a driver call failed.
    Mr(crate::MrError),
}

impl fmt::Display for IpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "IPC socket error: {e}"),
            Self::PeerClosed => f.write_str("the other process closed the IPC connection"),
            Self::Protocol(why) => write!(f, "IPC protocol error: {why}"),
            Self::UnknownExport(id) => write!(f, "export {id} is not outstanding"),
            Self::Mr(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for IpcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            Self::Mr(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for IpcError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<crate::MrError> for IpcError {
    fn from(e: crate::MrError) -> Self {
        Self::Mr(e)
    }
}

//! Unit tests of the soft engine, with a `Pair`-style harness (quinn's
//! `quinn-proto/src/tests/util.rs` pattern): whole host-target conversations in memory,
//! deterministic, without sockets, sleeps or the wall clock.
//!
//! What is real here: `nvmf::tcp::HostQueue` on the host side; on the target side the
//! soft engine's own IO context ([`StaIo`]: command slots, the offload path, the TCP link
//! and its `nvmf::tcp::ControllerQueue`), a RAM backend, and `nvmf::target::Target`
//! answering what the engine hands up (Fabrics Connect, Property Get/Set, admin commands)
//! through a few lines of glue that do what the daemon's IO thread does. What stands in:
//! the socket is a [`MemPipe`], and time is a number the test moves (`Pair::advance`).
//! Bytes cross the pipe in pieces of `Conn::chunk` bytes per engine pass, so a test can
//! split every PDU at every byte boundary. A test that needs the engine's epoll path (a
//! full socket and its EPOLLOUT) sets `Pair::sockets`: its connections are then real
//! loopback TCP sockets, and waiting for the kernel to hand bytes over takes short sleeps,
//! bounded (`pair::SOCKET_WAIT`).

mod access;
mod data_path;
mod faults;
mod flush_list;
mod hostile;
mod lent;
mod pair;

/// An in-memory byte pipe standing in for a TCP socket.
#[derive(Default)]
pub(crate) struct MemPipe {
    pub to_target: std::collections::VecDeque<u8>,
    pub to_host: Vec<u8>,
    /// The host closed its end: the target reads EOF once `to_target` is drained.
    pub host_closed: bool,
    /// The target shut the connection down.
    pub target_closed: bool,
    /// Stand-in for the host's receive window: once this many bytes wait in `to_host`
    /// unread, the target's writes would block (a peer that stops reading).
    pub host_window: Option<usize>,
}

impl MemPipe {
    pub fn target_read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.to_target.is_empty() {
            return if self.host_closed {
                Ok(0)
            } else {
                Err(std::io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(self.to_target.len());
        for (d, s) in buf.iter_mut().zip(self.to_target.drain(..n)) {
            *d = s;
        }
        Ok(n)
    }

    pub fn target_write(&mut self, slices: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        if self.host_closed {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        let room = self
            .host_window
            .map_or(usize::MAX, |w| w.saturating_sub(self.to_host.len()));
        if room == 0 {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for s in slices {
            let take = s.len().min(room - n);
            self.to_host.extend_from_slice(&s[..take]);
            n += take;
            if n == room {
                break;
            }
        }
        Ok(n)
    }
}

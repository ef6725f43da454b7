//! Unit tests of the soft engine (filled in below).

/// An in-memory byte pipe standing in for a TCP socket.
#[derive(Default)]
pub(crate) struct MemPipe {
    pub to_target: std::collections::VecDeque<u8>,
    pub to_host: Vec<u8>,
    pub host_closed: bool,
    pub target_closed: bool,
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
        let mut n = 0;
        for s in slices {
            self.to_host.extend_from_slice(s);
            n += s.len();
        }
        Ok(n)
    }
}

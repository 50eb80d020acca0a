//! Passing a descriptor over a Unix socket (`SCM_RIGHTS`): how a daemon
//! hands its store's memfd to the keeper that outlives it, and how the
//! keeper hands it to whoever asks.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Bytes of control-message space for one descriptor.
const CMSG_SPACE: usize = 64;

/// An iovec over one byte.
fn one_byte(byte: &mut [u8; 1]) -> libc::iovec {
    libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    }
}

/// A message header over `iov` with `space` for control messages (the
/// pointers it holds are valid as long as `iov` and `space` are).
fn header(iov: &mut libc::iovec, space: &mut [u64; CMSG_SPACE / 8]) -> libc::msghdr {
    // SAFETY: msghdr is plain data, valid when zeroed.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_SPACE;
    msg
}

/// Sends `fd` with a one-byte message.
pub fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut byte = [b'F'];
    let mut iov = one_byte(&mut byte);
    let mut space = [0u64; CMSG_SPACE / 8];
    let mut msg = header(&mut iov, &mut space);
    // SAFETY: CMSG_SPACE computes a size; no memory is touched.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    // SAFETY: msg_control points at `space`, which is larger than
    // CMSG_SPACE(4), so the first header and its data fit in it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        libc::CMSG_DATA(c)
            .cast::<RawFd>()
            .write_unaligned(fd.as_raw_fd());
    }
    // SAFETY: msg and everything it points to live until sendmsg returns.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives one descriptor (close-on-exec) sent by [`send_fd`].
pub fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = one_byte(&mut byte);
    let mut space = [0u64; CMSG_SPACE / 8];
    let mut msg = header(&mut iov, &mut space);
    // SAFETY: msg points at live buffers of the sizes it states.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled msg_control up to msg_controllen; the
    // CMSG macros walk only within it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "no descriptor in the message",
            ));
        }
        let fd = libc::CMSG_DATA(c).cast::<RawFd>().read_unaligned();
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_crosses_a_socket_pair() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile();
        f.write_all(b"kept").unwrap();
        send_fd(&a, f.as_fd()).unwrap();
        let mut g = std::fs::File::from(recv_fd(&b).unwrap());
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "kept");
        drop(a);
        assert!(recv_fd(&b).is_err(), "end of stream carries no descriptor");
    }

    fn tempfile() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("zblk-fdpass-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f
    }
}

//! `uringrelay LISTEN UPSTREAM [THREADS]`: a TCP relay on tokio-uring (io_uring), one
//! current-thread runtime per thread, SO_REUSEPORT listeners, TCP_NODELAY both sides, a 16 KiB
//! buffer per direction. It inspects nothing. An experiment for docs/performance.md (does
//! io_uring's batching of reads and writes lower the kernel's CPU per request below an epoll
//! relay's?), not a tool: errors end a connection or panic at start.

use std::net::SocketAddr;
use std::rc::Rc;

use tokio_uring::buf::BoundedBuf;
use tokio_uring::net::{TcpListener, TcpStream};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: uringrelay LISTEN UPSTREAM [THREADS]";
    let listen: SocketAddr = args.next().expect(usage).parse().expect(usage);
    let upstream: SocketAddr = args.next().expect(usage).parse().expect(usage);
    let threads: usize = args.next().map_or(2, |t| t.parse().expect(usage));
    let loops: Vec<_> = (0..threads.max(1))
        .map(|_| std::thread::spawn(move || tokio_uring::start(serve(listen, upstream))))
        .collect();
    for l in loops {
        l.join().expect("a relay thread panicked");
    }
}

async fn serve(listen: SocketAddr, upstream: SocketAddr) {
    let s = socket2::Socket::new(socket2::Domain::for_address(listen), socket2::Type::STREAM, None)
        .expect("socket");
    s.set_reuse_port(true).expect("SO_REUSEPORT");
    s.set_reuse_address(true).expect("SO_REUSEADDR");
    // Accepted sockets inherit it on Linux.
    s.set_nodelay(true).expect("TCP_NODELAY");
    s.bind(&listen.into()).expect("bind");
    s.listen(1024).expect("listen");
    let listener = TcpListener::from_std(s.into());
    println!("uringrelay listening on {listen}");
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        tokio_uring::spawn(async move {
            let Ok(up) = connect(upstream) else { return };
            let (client, up) = (Rc::new(client), Rc::new(up));
            tokio_uring::spawn(copy(client.clone(), up.clone()));
            copy(up, client).await;
        });
    }
}

/// A blocking connect (loopback, at connection start only), then handed to io_uring.
fn connect(to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::for_address(to), socket2::Type::STREAM, None)?;
    s.set_nodelay(true)?;
    s.connect(&to.into())?;
    Ok(TcpStream::from_std(s.into()))
}

async fn copy(from: Rc<TcpStream>, to: Rc<TcpStream>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let (read, b) = from.read(buf).await;
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let (written, b) = to.write_all(b.slice(..n)).await;
        buf = b.into_inner();
        if written.is_err() {
            return;
        }
    }
}

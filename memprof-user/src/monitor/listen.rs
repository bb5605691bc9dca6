//! Where `monitor`'s HTTP endpoints listen (`--listen`): a TCP address, a
//! unix socket (`unix:/PATH`, mode 0660, `--listen-group`) or nowhere
//! (`none`). The endpoints show every profiled process's command lines,
//! paths and function names, so a connection is held to what an exporter
//! allows: at most [`MAX_CONNECTIONS`] at once, its request headers (the
//! first and each next one on a kept-alive connection) within
//! [`HEADER_TIMEOUT`], or it is closed.
use std::{
    fmt, net::SocketAddr, os::unix::fs::FileTypeExt as _, path::PathBuf, str::FromStr, sync::Arc,
    time::Duration,
};

use anyhow::Result;
use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::{mpsc, Semaphore},
};

use super::{
    http::{answer, ReportRequest, Settings},
    web_config::WebConfig,
};
use crate::human::error::UserError;

/// Connections served at once; more wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 64;

/// How long a client may take to send a request's headers, and how long
/// a kept-alive connection may stay idle.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Exit code when the address cannot be had (taken, say): a failure the
/// service manager may retry (EX_TEMPFAIL), unlike a bad option's 2.
pub const EXIT_CANNOT_LISTEN: i32 = 75;

/// `--listen`'s value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    Tcp(SocketAddr),
    Unix(PathBuf),
    None,
}

impl FromStr for ListenAddress {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "none" {
            return Ok(ListenAddress::None);
        }
        if let Some(path) = text.strip_prefix("unix:") {
            return match path.starts_with('/') {
                true => Ok(ListenAddress::Unix(PathBuf::from(path))),
                false => Err(format!(
                    "'{text}': a unix socket's path is absolute (unix:/PATH)"
                )),
            };
        }
        text.parse().map(ListenAddress::Tcp).map_err(|_| {
            format!(
                "'{text}' is not an address: give HOST:PORT (127.0.0.1:9464), unix:/PATH or none"
            )
        })
    }
}

impl fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddress::Tcp(address) => write!(f, "{address}"),
            ListenAddress::Unix(path) => write!(f, "unix:{}", path.display()),
            ListenAddress::None => write!(f, "none"),
        }
    }
}

/// The endpoints' socket, bound before the probes go in (an address that
/// cannot be had is a one-line error, not a profile without endpoints).
pub struct Listener {
    socket: Socket,
    /// Where it listens, as bound (a TCP port 0 made a real one).
    pub address: ListenAddress,
    settings: Settings,
    /// TLS and users (`--web-config`).
    web: Arc<WebConfig>,
}

enum Socket {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
    None,
}

impl Listener {
    pub fn bind(
        address: &ListenAddress,
        group: Option<&str>,
        web: WebConfig,
        settings: Settings,
    ) -> Result<Listener> {
        let cannot = |err: &dyn fmt::Display| {
            UserError::new(format!("cannot listen on {address}: {err}"))
                .with_exit_code(EXIT_CANNOT_LISTEN)
        };
        let (socket, address) = match address {
            ListenAddress::Tcp(at) => {
                let listener = std::net::TcpListener::bind(at).map_err(|err| cannot(&err))?;
                listener.set_nonblocking(true)?;
                let bound = listener.local_addr()?;
                let lacks = match (web.tls.is_some(), web.asks_for_users()) {
                    (true, true) => None,
                    (false, true) => Some("TLS"),
                    (true, false) => Some("authentication"),
                    (false, false) => Some("TLS or authentication"),
                };
                if let Some(lacks) = lacks.filter(|_| !bound.ip().is_loopback()) {
                    eprintln!(
                        "memprof: warning: serving on {bound} without {lacks}: anyone who \
                         reaches it reads every profiled process's command lines, paths and \
                         function names (--web-config, or listen on loopback or unix:/PATH)"
                    );
                }
                (Socket::Tcp(listener), ListenAddress::Tcp(bound))
            }
            ListenAddress::Unix(path) => {
                remove_stale_socket(path).map_err(|err| cannot(&err))?;
                let listener = bind_restricted(path).map_err(|err| cannot(&err))?;
                listener.set_nonblocking(true)?;
                if let Some(group) = group {
                    give_to_group(path, group).map_err(|err| cannot(&err))?;
                }
                (Socket::Unix(listener), ListenAddress::Unix(path.clone()))
            }
            ListenAddress::None => (Socket::None, ListenAddress::None),
        };
        Ok(Listener {
            socket,
            address,
            settings,
            web: Arc::new(web),
        })
    }

    /// True when it serves anything (not `--listen none`).
    pub fn serves(&self) -> bool {
        !matches!(self.socket, Socket::None)
    }

    /// Serves on the current runtime; reports are asked for on `requests`.
    pub fn spawn(self, requests: mpsc::Sender<ReportRequest>) -> Result<()> {
        let settings = self.settings;
        // One `?seconds=N` profile at a time.
        let deltas = Arc::new(Semaphore::new(1));
        let connection = Connection {
            requests,
            settings,
            deltas,
            web: self.web,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        };
        match self.socket {
            Socket::Tcp(listener) => {
                tokio::spawn(connection.accept_all(tokio::net::TcpListener::from_std(listener)?));
            }
            Socket::Unix(listener) => {
                tokio::spawn(connection.accept_all(tokio::net::UnixListener::from_std(listener)?));
            }
            Socket::None => {}
        }
        Ok(())
    }
}

/// A socket that hands out connections: TCP or unix.
trait Accept: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl std::future::Future<Output = std::io::Result<Self::Stream>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<Self::Stream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

/// What each connection is served with.
#[derive(Clone)]
struct Connection {
    requests: mpsc::Sender<ReportRequest>,
    settings: Settings,
    deltas: Arc<Semaphore>,
    web: Arc<WebConfig>,
    /// [`MAX_CONNECTIONS`] of them.
    slots: Arc<Semaphore>,
}

impl Connection {
    /// Takes connections as slots free, each served on a task of its own.
    async fn accept_all(self, listener: impl Accept) {
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            let Ok(stream) = listener.next().await else {
                // Out of descriptors, say: not a busy loop.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let connection = self.clone();
            tokio::spawn(async move {
                connection.serve(stream).await;
                drop(slot);
            });
        }
    }

    /// One connection, until it closes or its headers are late; through
    /// TLS when `web` has it (the handshake within [`HEADER_TIMEOUT`] too).
    async fn serve<I>(self, stream: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let tls = self.web.tls.clone();
        let service = service_fn(move |request| {
            answer(
                request,
                self.requests.clone(),
                self.settings,
                self.deltas.clone(),
                self.web.clone(),
            )
        });
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT);
        match tls {
            None => {
                let _ = http.serve_connection(TokioIo::new(stream), service).await;
            }
            Some(config) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                let handshake = tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream));
                let Ok(Ok(stream)) = handshake.await else {
                    return;
                };
                let _ = http.serve_connection(TokioIo::new(stream), service).await;
            }
        }
    }
}

/// A socket left at `path` by an earlier memprof goes; anything else
/// there is refused.
fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "something other than a socket is there",
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

/// A unix socket at `path`, made mode 0660 as it is made: under a umask
/// of 0117 for the moment of the bind (at start-up), not by a
/// chmod after it, which would follow a link swapped in meanwhile.
fn bind_restricted(path: &std::path::Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use nix::sys::stat::{umask, Mode};
    let before = umask(Mode::from_bits_truncate(0o117));
    let bound = std::os::unix::net::UnixListener::bind(path);
    umask(before);
    bound
}

/// The socket at `path` given to `group` (a name or a gid), not
/// following a link.
fn give_to_group(path: &std::path::Path, name: &str) -> std::io::Result<()> {
    let gid = match nix::unistd::Group::from_name(name) {
        Ok(Some(group)) => group.gid,
        _ => match name.parse::<u32>() {
            Ok(gid) => nix::unistd::Gid::from_raw(gid),
            Err(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no group {name}"),
                ))
            }
        },
    };
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        path,
        None,
        Some(gid),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_three_kinds_of_address() {
        assert_eq!(
            "127.0.0.1:9464".parse::<ListenAddress>(),
            Ok(ListenAddress::Tcp("127.0.0.1:9464".parse().unwrap()))
        );
        assert_eq!(
            "unix:/run/memprof.sock".parse::<ListenAddress>(),
            Ok(ListenAddress::Unix(PathBuf::from("/run/memprof.sock")))
        );
        assert_eq!("none".parse::<ListenAddress>(), Ok(ListenAddress::None));
        assert!("unix:relative".parse::<ListenAddress>().is_err());
        assert!("localhost".parse::<ListenAddress>().is_err());
    }
}

//! `monitor`'s endpoints held to what an exporter allows: connections
//! that never finish their headers are closed while scrapes are still
//! answered; a unix socket for those who may read; no listener at all;
//! TLS and users from an exporter-toolkit web config.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    os::unix::{fs::PermissionsExt as _, net::UnixStream},
    process::Child,
    time::{Duration, Instant},
};

use tests::{monitor::*, *};

/// A waiter fixture to attach to, killed on drop.
struct Waiter(Child);

impl Waiter {
    fn start() -> Waiter {
        Waiter(spawn_waiter(&fixture("waiter", "guards", frame_pointers())))
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A directory of its own under target/fixtures.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = workspace_root().join(format!("target/fixtures/monitor-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// 300 connections that send part of a request's headers and then
/// nothing: each is closed by the header timeout (10 s), at most 64 are
/// held at once, and a scrape made meanwhile is answered.
#[test]
fn half_open_connections_are_closed_while_a_scrape_is_answered() {
    let _serial = serial();
    let port = free_port();
    let target = Waiter::start();
    let monitor = start_monitor(&["--pid", &target.pid()], port);
    let started = Instant::now();
    let stalled: Vec<_> = (0..300)
        .map(|_| {
            std::thread::spawn(move || -> Option<Duration> {
                let address = format!("127.0.0.1:{port}").parse().unwrap();
                let mut stream =
                    TcpStream::connect_timeout(&address, Duration::from_secs(60)).ok()?;
                stream
                    .write_all(b"GET /metrics HTTP/1.1\r\nHost: memprof\r\n")
                    .ok()?;
                stream
                    .set_read_timeout(Some(Duration::from_secs(120)))
                    .unwrap();
                // Closed by memprof: end of stream (or a reset).
                let _ = stream.read_to_end(&mut Vec::new());
                Some(started.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let scrape = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .unwrap();
    assert!(scrape.status().is_success());
    assert!(scrape.text().unwrap().contains("memprof_"));
    let closed: Vec<Option<Duration>> = stalled.into_iter().map(|t| t.join().unwrap()).collect();
    let connected = closed.iter().flatten().count();
    assert_eq!(connected, 300, "every connection was made and then closed");
    // The first ones closed by the timeout, not held for long.
    let first = closed.iter().flatten().min().unwrap();
    assert!(*first >= Duration::from_secs(9), "closed after {first:?}");
    stop(monitor);
}

/// `--listen unix:/PATH`: a socket of mode 0660 in the group named,
/// serving /metrics.
#[test]
fn a_unix_socket_serves_its_group() {
    let _serial = serial();
    let dir = scratch("unix-socket");
    let socket = dir.join("memprof.sock");
    let target = Waiter::start();
    let (monitor, said) = start_monitor_on(
        &format!("unix:{}", socket.display()),
        &["--pid", &target.pid(), "--listen-group", "nogroup"],
    );
    assert!(
        said.contains(&format!("on the unix socket {}", socket.display())),
        "{said}"
    );
    let metadata = std::fs::metadata(&socket).unwrap();
    assert_eq!(metadata.permissions().mode() & 0o777, 0o660);
    let nogroup = nix::unistd::Group::from_name("nogroup").unwrap().unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::gid(&metadata),
        nogroup.gid.as_raw()
    );
    let mut stream = UnixStream::connect(&socket).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: memprof\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("memprof_"), "{reply}");
    stop(monitor);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--listen none`: no socket of memprof's listens; reports go to --out.
#[test]
fn listen_none_serves_nothing() {
    let _serial = serial();
    let dir = scratch("listen-none");
    let out = dir.join("out");
    let target = Waiter::start();
    let (monitor, said) = start_monitor_on(
        "none",
        &["--pid", &target.pid(), "--out", out.to_str().unwrap()],
    );
    assert!(!said.contains("serving"), "{said}");
    let own: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", monitor.id()))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.display().to_string();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let listens = fields.get(3) == Some(&"0A");
            let memprofs = fields
                .get(9)
                .is_some_and(|inode| own.iter().any(|o| o == inode));
            assert!(!(listens && memprofs), "memprof listens: {line}");
        }
    }
    stop(monitor);
    assert!(
        std::fs::read_dir(&out).unwrap().count() >= 1,
        "the final report is in --out"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--web-config`: TLS and a user, in the exporter-toolkit's format. A
/// real Prometheus scrapes through both; without credentials, 401.
#[test]
fn prometheus_scrapes_through_tls_and_basic_auth() {
    let _serial = serial();
    let dir = scratch("web-config");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-keyout",
            "server.key",
            "-out",
            "server.crt",
            "-subj",
            "/CN=memprof",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let hash = bcrypt::hash("secret", 6).unwrap();
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             basic_auth_users:\n  prometheus: '{hash}'\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let target = Waiter::start();
    let (monitor, _) = start_monitor_on(
        &format!("127.0.0.1:{port}"),
        &[
            "--pid",
            &target.pid(),
            "--web-config",
            web.to_str().unwrap(),
        ],
    );
    let url = format!("https://127.0.0.1:{port}/metrics");
    let curl = |extra: &[&str]| -> String {
        let output = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(dir.join("server.crt"))
            .args(extra)
            .arg(&url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    assert_eq!(curl(&[]), "401");
    assert_eq!(curl(&["-u", "prometheus:wrong"]), "401");
    assert_eq!(curl(&["-u", "prometheus:secret"]), "200");
    // Plain HTTP gets no answer.
    assert!(reqwest::blocking::get(format!("http://127.0.0.1:{port}/metrics")).is_err());

    let prometheus = Prometheus::start(
        &dir,
        &format!(
            "  - job_name: memprof\n    scheme: https\n    tls_config: {{ca_file: {}}}\n    \
             basic_auth: {{username: prometheus, password: secret}}\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n",
            dir.join("server.crt").display()
        ),
    );
    let value = prometheus.value_of("memprof_processes_profiled");
    drop(prometheus);
    assert!(
        value.is_some(),
        "Prometheus scraped nothing through TLS and basic auth"
    );
    stop(monitor);
    std::fs::remove_dir_all(&dir).unwrap();
}

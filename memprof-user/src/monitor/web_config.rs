//! `--web-config FILE`: TLS and basic authentication for `monitor`'s
//! endpoints, in the file format of Prometheus' exporter-toolkit
//! (node_exporter's `--web.config.file`), so that one file serves both:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: clients.crt                    # with client auth
//! basic_auth_users:
//!   prometheus: $2y$10$...                         # bcrypt hashes
//! ```
//!
//! Paths are relative to the file's directory. An unknown key is an
//! error: a misspelt one would leave the endpoints open.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::{bail, Context as _, Result};
use base64::Engine as _;
use rustls::{
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
use serde::Deserialize;

use crate::human::error::UserError;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    basic_auth_users: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    min_version: Option<String>,
}

/// What the endpoints ask of a client.
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    users: HashMap<String, String>,
    /// Credentials already checked (bcrypt takes tens of milliseconds on
    /// purpose): `user NUL password` → whether they matched.
    checked: Mutex<HashMap<String, bool>>,
    /// bcrypt runs off the loop that keeps the budget, two at a time.
    checking: tokio::sync::Semaphore,
}

/// Credentials remembered at most; past it the memory starts afresh.
const CHECKED_KEPT: usize = 64;

impl WebConfig {
    /// No TLS, no users: every request is answered.
    pub fn open() -> WebConfig {
        WebConfig {
            tls: None,
            users: HashMap::new(),
            checked: Mutex::new(HashMap::new()),
            checking: tokio::sync::Semaphore::new(2),
        }
    }

    /// Reads FILE; Err is one line, exit code 2 (a bad option).
    pub fn load(path: &Path) -> Result<WebConfig> {
        Self::read(path).map_err(|err| {
            UserError::new(format!("--web-config {}: {err:#}", path.display()))
                .with_exit_code(2)
                .into()
        })
    }

    fn read(path: &Path) -> Result<WebConfig> {
        let text = std::fs::read_to_string(path)?;
        let file: File = match text.trim().is_empty() {
            true => File::default(),
            false => serde_yaml_ng::from_str(&text)?,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        for (user, hash) in &file.basic_auth_users {
            if !hash.starts_with("$2") {
                bail!("the password of {user} is not a bcrypt hash ($2y$...)");
            }
        }
        let tls = file
            .tls_server_config
            .map(|tls| tls_config(&tls, dir))
            .transpose()?;
        Ok(WebConfig {
            tls,
            users: file.basic_auth_users,
            ..WebConfig::open()
        })
    }

    /// True when requests must carry a user's credentials.
    pub fn asks_for_users(&self) -> bool {
        !self.users.is_empty()
    }

    /// Whether a request's `Authorization` header value lets it in.
    pub async fn admits(&self, authorization: Option<&[u8]>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        let Some(hash) = self.users.get(&user).cloned() else {
            return false;
        };
        let key = format!("{user}\0{password}");
        if let Some(&admitted) = self.checked().get(&key) {
            return admitted;
        }
        let Ok(_turn) = self.checking.acquire().await else {
            return false;
        };
        let admitted = tokio::task::spawn_blocking(move || bcrypt::verify(&password, &hash))
            .await
            .is_ok_and(|verified| verified.unwrap_or(false));
        let mut checked = self.checked();
        if checked.len() >= CHECKED_KEPT {
            checked.clear();
        }
        checked.insert(key, admitted);
        admitted
    }

    fn checked(&self) -> std::sync::MutexGuard<'_, HashMap<String, bool>> {
        self.checked.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `Basic base64(user:password)`.
fn basic_credentials(header: &[u8]) -> Option<(String, String)> {
    let header = std::str::from_utf8(header).ok()?;
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn tls_config(tls: &TlsFile, dir: &Path) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let at = |path: &Path| dir.join(path);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(at(&tls.cert_file))
        .with_context(|| format!("cert_file {}", tls.cert_file.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("cert_file {}", tls.cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_file(at(&tls.key_file))
        .with_context(|| format!("key_file {}", tls.key_file.display()))?;
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version.as_deref() {
        None | Some("TLS12") => &[&rustls::version::TLS13, &rustls::version::TLS12],
        Some("TLS13") => &[&rustls::version::TLS13],
        Some(other) => bail!("min_version {other}: memprof offers TLS12 or TLS13"),
    };
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(versions)?;
    let client_roots = || -> Result<Arc<RootCertStore>> {
        let Some(file) = &tls.client_ca_file else {
            bail!(
                "client_auth_type {:?} needs client_ca_file",
                tls.client_auth_type
            );
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(at(file))
            .with_context(|| format!("client_ca_file {}", file.display()))?
        {
            roots.add(cert.with_context(|| format!("client_ca_file {}", file.display()))?)?;
        }
        Ok(Arc::new(roots))
    };
    let builder = match tls.client_auth_type.as_deref() {
        None | Some("NoClientCert") => builder.with_no_client_auth(),
        Some("VerifyClientCertIfGiven") => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(client_roots()?, provider)
                .allow_unauthenticated()
                .build()?,
        ),
        Some("RequireAndVerifyClientCert") => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(client_roots()?, provider).build()?,
        ),
        Some(other) => bail!(
            "client_auth_type {other}: memprof verifies client certificates \
             (NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert)"
        ),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("cert_file and key_file")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_checked_against_bcrypt_hashes() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let dir = std::env::temp_dir().join(format!("memprof-web-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web.yml");
        std::fs::write(
            &path,
            format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
        )
        .unwrap();
        let config = WebConfig::load(&path).unwrap();
        let header = |user_password: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(user_password)
            )
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let admits = |value: Option<String>| {
            runtime.block_on(config.admits(value.as_deref().map(str::as_bytes)))
        };
        assert!(admits(Some(header("prometheus:secret"))));
        assert!(!admits(Some(header("prometheus:wrong"))));
        assert!(!admits(Some(header("other:secret"))));
        assert!(!admits(None));
        // A misspelt key is an error, not an open endpoint.
        std::fs::write(&path, "basic_auth_user:\n  prometheus: x\n").unwrap();
        assert!(WebConfig::load(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

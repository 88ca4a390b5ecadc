//! Who may use a memory server: both ends prove they know a shared secret when a connection
//! opens (PROTOCOL.md, "Handshake"), by HMAC-SHA256 over nonces both chose, so the secret never
//! crosses the wire and a recorded handshake cannot be replayed.
//!
//! The secret comes from a file (`dlm-server --secret-file`) or the environment
//! ([`SECRET_ENV`]), never from a command line, where any user of the host can read it
//! (`/proc/PID/cmdline`). `pagewise run --spawn-servers` makes one per run ([`Secret::generate`]).
//!
//! This module is pure apart from reading the file and the environment and drawing nonces:
//! the messages themselves travel through [`crate::transport`] and [`crate::server`].

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::DlmError;

/// The environment variable holding the shared secret (servers, clients, and launchers that
/// pass a per-job secret, such as `pagewise run` and the MPI launcher).
pub const SECRET_ENV: &str = "PAGEWISE_DLM_SECRET";
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const PROOF_LEN: usize = 32;
/// Fewest bytes a secret may have: shorter ones can be guessed offline from one handshake.
pub const MIN_SECRET_LEN: usize = 16;

/// Domain separation: a proof made by one side can never stand for the other side's.
const SERVER_LABEL: &[u8] = b"pagewise-dlm v2 server proof";
const CLIENT_LABEL: &[u8] = b"pagewise-dlm v2 client proof";

/// A shared secret. Its bytes are never printed (`Debug` shows only its length).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes, not shown)", self.0.len())
    }
}

impl Secret {
    /// A secret from its text; surrounding whitespace (a file's final newline) is not part of it.
    pub fn new(text: impl AsRef<[u8]>) -> Result<Self, DlmError> {
        let t = text.as_ref().trim_ascii();
        if t.len() < MIN_SECRET_LEN {
            return Err(DlmError::Config(format!(
                "the DLM secret has {} bytes, fewer than {MIN_SECRET_LEN} (make one: head -c 32 /dev/urandom | base64)",
                t.len()
            )));
        }
        Ok(Secret(t.to_vec()))
    }

    /// Read the secret from `path`, which no other user may read or change (like ssh's keys:
    /// a secret others can read is no secret).
    pub fn from_file(path: &Path) -> Result<Self, DlmError> {
        use std::os::unix::fs::MetadataExt;
        let bad = |what: String| DlmError::Config(format!("secret file {}: {what}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(bad(format!(
                "mode {:04o} lets other users read or change it (chmod 600 {})",
                meta.mode() & 0o7777,
                path.display()
            )));
        }
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        Secret::new(text).map_err(|e| bad(e.to_string()))
    }

    /// The secret in [`SECRET_ENV`], if it is set.
    pub fn from_env() -> Result<Option<Self>, DlmError> {
        use std::os::unix::ffi::OsStrExt;
        match std::env::var_os(SECRET_ENV) {
            Some(v) => Secret::new(v.as_bytes()).map(Some).map_err(|e| DlmError::Config(format!("{SECRET_ENV}: {e}"))),
            None => Ok(None),
        }
    }

    /// A fresh random secret (32 bytes from getrandom(2), as 64 hex digits: it can be put in
    /// the environment or a file as it is).
    pub fn generate() -> Result<Self, DlmError> {
        let bytes = random_bytes::<32>()?;
        Ok(Secret(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>().into_bytes()))
    }

    /// The secret as an environment value (to hand it to a child process: never put it in
    /// argv).
    pub fn as_env_value(&self) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(&self.0)
    }

    fn mac(&self, label: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(label);
        m.update(first);
        m.update(second);
        m
    }

    /// The server's proof: it answers the client's nonce with its own.
    pub fn server_proof(&self, client_nonce: &[u8; NONCE_LEN], server_nonce: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
        self.mac(SERVER_LABEL, client_nonce, server_nonce).finalize().into_bytes().into()
    }

    /// The client's proof: it answers the server's nonce with its own.
    pub fn client_proof(&self, client_nonce: &[u8; NONCE_LEN], server_nonce: &[u8; NONCE_LEN]) -> [u8; PROOF_LEN] {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce).finalize().into_bytes().into()
    }

    /// Whether `proof` is the server's proof for these nonces (compared in constant time).
    pub fn verify_server(&self, client_nonce: &[u8; NONCE_LEN], server_nonce: &[u8; NONCE_LEN], proof: &[u8]) -> bool {
        self.mac(SERVER_LABEL, client_nonce, server_nonce).verify_slice(proof).is_ok()
    }

    /// Whether `proof` is the client's proof for these nonces (compared in constant time).
    pub fn verify_client(&self, client_nonce: &[u8; NONCE_LEN], server_nonce: &[u8; NONCE_LEN], proof: &[u8]) -> bool {
        self.mac(CLIENT_LABEL, server_nonce, client_nonce).verify_slice(proof).is_ok()
    }
}

/// A fresh nonce (getrandom(2)).
pub fn nonce() -> Result<[u8; NONCE_LEN], DlmError> {
    random_bytes::<NONCE_LEN>()
}

fn random_bytes<const N: usize>() -> Result<[u8; N], DlmError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| DlmError::Config(format!("getrandom failed: {e}")))?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Secret {
        Secret::new("correct horse battery staple").unwrap()
    }

    #[test]
    fn each_side_verifies_only_the_other_sides_proof() {
        let (s, c, n) = (secret(), [1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        assert!(s.verify_server(&c, &n, &s.server_proof(&c, &n)));
        assert!(s.verify_client(&c, &n, &s.client_proof(&c, &n)));
        // A server's proof replayed as a client's (a reflection) is refused, and so is one for
        // other nonces or from another secret.
        assert!(!s.verify_client(&c, &n, &s.server_proof(&c, &n)));
        assert!(!s.verify_client(&c, &[3u8; NONCE_LEN], &s.client_proof(&c, &n)));
        let other = Secret::new("another secret of enough length").unwrap();
        assert!(!s.verify_client(&c, &n, &other.client_proof(&c, &n)));
        assert!(!s.verify_client(&c, &n, &[]));
    }

    #[test]
    fn short_secrets_are_refused_and_whitespace_is_trimmed() {
        assert!(Secret::new("short").is_err());
        assert!(Secret::new("   \n").is_err());
        assert_eq!(Secret::new("0123456789abcdef\n").unwrap(), Secret::new("0123456789abcdef").unwrap());
        let g = Secret::generate().unwrap();
        assert_eq!(g.as_env_value().len(), 64);
        assert_ne!(g, Secret::generate().unwrap());
        assert!(!format!("{g:?}").contains(g.as_env_value().to_str().unwrap()));
    }

    #[test]
    fn a_secret_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = pagewise_kernel::private_dir::PrivateDir::new("secret-test").unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Secret::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(Secret::from_file(&path).unwrap(), Secret::new("0123456789abcdef0123").unwrap());
    }
}

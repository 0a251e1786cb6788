//! Certificates for TLS tests, made at test time with the `openssl` command-line tool: a CA, a
//! server certificate for `127.0.0.1`/`localhost` signed by it, a client certificate signed by it,
//! an unrelated second CA (what a client trusting the wrong CA has), and two server
//! certificates a client must refuse: one that expired, one for another host.
//!
//! Keys are P-256 (fast to generate); certificates live two days, in a temp dir removed on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::server::make_temp_dir;
use crate::ServerConfig;

/// Which certificate a test server presents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerCert {
    /// Signed by the CA, for `127.0.0.1` and `localhost`, valid for two days.
    Valid,
    /// Signed by the CA, for `127.0.0.1` and `localhost`, and expired.
    Expired,
    /// Signed by the CA, valid, for `elsewhere.invalid` only.
    Misnamed,
}

/// The files of one test PKI.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Generates a fresh PKI in a new temp dir.
    ///
    /// # Panics
    ///
    /// If `openssl` is missing or fails; the message quotes its output.
    pub fn generate() -> TestPki {
        let pki = TestPki {
            dir: make_temp_dir(),
        };
        pki.make_ca("ca", "distlock test CA");
        pki.make_ca("other-ca", "an unrelated CA");
        // Servers present it as clients too: to the nodes they replicate from, and on the
        // cluster bus, which always checks the connecting node's certificate.
        let local =
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n";
        pki.make_leaf("server", "localhost", local, "2");
        // Valid until a day before it was issued.
        pki.make_leaf("expired", "localhost", local, "-1");
        let elsewhere = "subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n";
        pki.make_leaf("misnamed", "elsewhere.invalid", elsewhere, "2");
        pki.make_leaf(
            "client",
            "distlock test client",
            "extendedKeyUsage=clientAuth\n",
            "2",
        );
        pki
    }

    /// The certificate and key a server presents: [`ServerCert::Valid`] is
    /// ([`server_cert`](Self::server_cert), [`server_key`](Self::server_key)).
    pub fn server(&self, which: ServerCert) -> (PathBuf, PathBuf) {
        let name = match which {
            ServerCert::Valid => "server",
            ServerCert::Expired => "expired",
            ServerCert::Misnamed => "misnamed",
        };
        (
            self.path(&format!("{name}.crt")),
            self.path(&format!("{name}.key")),
        )
    }

    /// The CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.crt")
    }

    /// The server's certificate (for `127.0.0.1` and `localhost`).
    pub fn server_cert(&self) -> PathBuf {
        self.path("server.crt")
    }

    /// The server's private key.
    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    /// A client certificate signed by [`TestPki::ca`].
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.crt")
    }

    /// The client certificate's private key.
    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    /// `config` plus a TLS listener on `tls_port` with this PKI's server certificate;
    /// `verify_clients`: `tls-auth-clients yes` (clients must present a certificate signed by
    /// the CA) or `no`.
    pub fn serve(&self, config: ServerConfig, tls_port: u16, verify_clients: bool) -> ServerConfig {
        self.serve_presenting(config, tls_port, verify_clients, ServerCert::Valid)
    }

    /// [`TestPki::serve`], the server presenting `which` certificate.
    pub fn serve_presenting(
        &self,
        config: ServerConfig,
        tls_port: u16,
        verify_clients: bool,
        which: ServerCert,
    ) -> ServerConfig {
        let (cert, key) = self.server(which);
        config
            .arg("tls-port", &tls_port.to_string())
            .arg("tls-cert-file", &cert.to_string_lossy())
            .arg("tls-key-file", &key.to_string_lossy())
            .arg("tls-ca-cert-file", &self.ca().to_string_lossy())
            .arg(
                "tls-auth-clients",
                if verify_clients { "yes" } else { "no" },
            )
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn make_ca(&self, name: &str, subject: &str) {
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={subject}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ],
        );
    }

    fn make_leaf(&self, name: &str, subject: &str, extensions: &str, days: &str) {
        let ext = format!("{name}.ext");
        std::fs::write(
            self.path(&ext),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{extensions}"),
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={subject}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                days,
                "-extfile",
                &ext,
                "-out",
                &format!("{name}.crt"),
            ],
        );
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (is it installed?): {e}"));
    assert!(
        output.status.success(),
        "openssl {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

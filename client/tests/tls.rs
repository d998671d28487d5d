//! TLS (`rediss://`) against a local TLS-enabled redis-server, with a
//! throwaway CA made by the test (issue 17: the client was built without
//! TLS, and managed Redis services require it).

use redis_lock_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Server;
use redis_lock_client::{LockClient, Options};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (apt-get install -y openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a certificate for 127.0.0.1 signed by it, in `dir`.
fn throwaway_ca(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=redis-lock test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "1",
            "-extfile",
            "ext",
        ],
    );
}

/// Whether this server binary was built with TLS (linked to libssl; a
/// build with TLS linked statically shows as without and is skipped).
fn has_tls(binary: &str) -> bool {
    // `ldd` wants a path; REDIS_SERVER may be a name on PATH.
    let path = Command::new("sh")
        .args(["-c", "command -v \"$0\"", binary])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Command::new("ldd")
        .arg(if path.is_empty() { binary } else { &path })
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libssl"))
}

/// A server with a TLS port, its certificates signed by a throwaway CA in a
/// directory of its own (`name`), asking clients for certificates if
/// `auth_clients`: the server, the directory and its `rediss://` URL. None
/// (counted as skipped) where the test cannot run.
fn tls_server(name: &str, auth_clients: bool) -> Option<(Server, PathBuf, String)> {
    if common::skip_unless(
        common::Needs::LocalProcess,
        "starts a TLS server with its own certificates",
    ) {
        return None;
    }
    let binary = common::server_binary();
    if !has_tls(&binary) {
        common::skip(
            common::Skip::ServerLacks,
            &format!("{binary} was built without TLS"),
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!("redis-lock-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    throwaway_ca(&dir);
    let tls_port = common::free_port();
    let path = |f: &str| dir.join(f).display().to_string();
    let s = Server::builder()
        .config("tls-port", &tls_port.to_string())
        .config("tls-cert-file", &path("server.pem"))
        .config("tls-key-file", &path("server.key"))
        .config("tls-ca-cert-file", &path("ca.pem"))
        .config("tls-auth-clients", if auth_clients { "yes" } else { "no" })
        .start();
    Some((s, dir, format!("rediss://127.0.0.1:{tls_port}/")))
}

#[test]
fn a_lock_over_tls_with_the_command_and_the_library() {
    let Some((s, dir, url)) = tls_server("tls", false) else {
        return;
    };
    let path = |f: &str| dir.join(f).display().to_string();

    // The command, trusting the throwaway CA (OpenSSL reads SSL_CERT_FILE).
    let fence = common::fence_of_a_run(BIN, &url, "tls:k", &[("SSL_CERT_FILE", &path("ca.pem"))]);
    assert!(fence > 0);
    assert!(s.info_field("grants") >= 1, "granted through the TLS port");

    // A certificate nobody vouches for is refused, and nothing runs.
    let out = Command::new(BIN)
        .args([
            "run", "--url", &url, "--key", "tls:k", "--ttl", "5s", "--", "true",
        ])
        .env("SSL_CERT_FILE", "/nonexistent")
        .env_remove("REDIS_LOCK_URL")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(69),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The library, through the application's own client, built with the
    // throwaway CA (this process's trust store is not changed).
    let certs = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(std::fs::read(dir.join("ca.pem")).unwrap()),
    };
    let client = redis::Client::build_with_tls(url.as_str(), certs).unwrap();
    let locks = LockClient::from_clients(vec![client], Options::default()).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let guard = locks
            .try_acquire("tls:lib", std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        assert_eq!(common::fence(&mut s.conn(), "tls:lib"), Some(guard.fence()));
        assert!(guard.release().await.unwrap());
    });
    assert_eq!(common::fence(&mut s.conn(), "tls:lib"), None);
}

/// A client certificate (CN `redis-lock client`) signed by the CA in `dir`.
fn client_certificate(dir: &Path) {
    // An extension makes it X.509 v3, which rustls requires.
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "client.key",
            "-out",
            "client.csr",
            "-subj",
            "/CN=redis-lock client",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.pem",
            "-days",
            "1",
            "-extfile",
            "client.ext",
        ],
    );
}

/// Issue 23, item 7: mutual TLS. A server with `tls-auth-clients yes`
/// refuses a client without a certificate (and the command says TLS, not
/// "is the module loaded"); `tls_cert`, `tls_key` and `tls_ca` in a
/// `rediss://` URL's query give the command and the library a client
/// certificate and a CA of their own.
#[test]
fn a_client_certificate_from_the_url() {
    let Some((s, dir, base)) = tls_server("mtls", true) else {
        return;
    };
    client_certificate(&dir);
    let path = |f: &str| dir.join(f).display().to_string();
    let run = |url: &str| {
        Command::new(BIN)
            .args([
                "run", "--url", url, "--key", "mtls:k", "--ttl", "5s", "--", "true",
            ])
            .env_remove("REDIS_LOCK_URL")
            .env_remove("SSL_CERT_FILE")
            .output()
            .unwrap()
    };
    // Without a certificate: refused, and said to be about TLS.
    let out = run(&format!("{base}?tls_ca={}", path("ca.pem")));
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{said}");
    assert!(
        said.contains("TLS") && said.contains("client certificate"),
        "{said}"
    );
    assert_eq!(s.info_field("grants"), 0);
    // With one.
    let url = format!(
        "{base}?tls_cert={}&tls_key={}&tls_ca={}",
        path("client.pem"),
        path("client.key"),
        path("ca.pem")
    );
    let out = run(&url);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(s.info_field("grants"), 1);
    // The library, from the same URL.
    let locks = LockClient::new(&[url.as_str()]).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let guard = locks
            .try_acquire("mtls:lib", std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        assert_eq!(
            common::fence(&mut s.conn(), "mtls:lib"),
            Some(guard.fence())
        );
        assert!(guard.release().await.unwrap());
    });
    // A key without its certificate is a usage error, named.
    let out = run(&format!("{base}?tls_key={}", path("client.key")));
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A client certificate the server's CA did not sign: made by a CA of its
/// own in `dir/other`.
fn foreign_certificate(dir: &Path) -> PathBuf {
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    throwaway_ca(&other);
    client_certificate(&other);
    other
}

/// Issue 31: what the library and the command say when TLS or the URL is
/// wrong. A missing or foreign client certificate said "Multiplexed
/// connection driver unexpectedly terminated"; now the error names the
/// node and the TLS setup. A misspelled parameter (`tls_crt`) was taken
/// for a missing one ("give tls_cert and tls_key together"), `#insecure`
/// exited 69 naming a cargo feature, a Sentinel URL with `?tls_cert=` said
/// "bad database number", and every bad URL ended "(expected
/// redis://host:port/)" even when it was well formed. Each is a usage
/// error (64) that says what is wrong.
#[test]
fn tls_and_url_mistakes_are_named() {
    let Some((s, dir, base)) = tls_server("mistakes", true) else {
        return;
    };
    client_certificate(&dir);
    let other = foreign_certificate(&dir);
    let path = |d: &Path, f: &str| d.join(f).display().to_string();
    let run = |url: &str| {
        let out = Command::new(BIN)
            .args([
                "run", "--url", url, "--key", "k", "--ttl", "5s", "--", "true",
            ])
            .env_remove("REDIS_LOCK_URL")
            .env_remove("SSL_CERT_FILE")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let library = |url: &str| -> String {
        match LockClient::new(&[url]) {
            Err(e) => e.to_string(),
            Ok(locks) => runtime.block_on(async {
                match locks
                    .try_acquire("k", std::time::Duration::from_secs(5))
                    .await
                {
                    Err(e) => e.to_string(),
                    Ok(g) => panic!("{url}: acquired {g:?}"),
                }
            }),
        }
    };
    // No client certificate, and one from another CA.
    let ca = path(&dir, "ca.pem");
    for url in [
        format!("{base}?tls_ca={ca}"),
        format!(
            "{base}?tls_cert={}&tls_key={}&tls_ca={ca}",
            path(&other, "client.pem"),
            path(&other, "client.key")
        ),
    ] {
        let said = library(&url);
        assert!(
            said.contains("TLS")
                && said.contains("client certificate")
                && said.contains("127.0.0.1"),
            "{url}: {said}"
        );
        let (code, said) = run(&url);
        assert_eq!(code, Some(69), "{said}");
        assert!(said.contains("client certificate"), "{said}");
    }
    // Mistakes in the URL: usage errors that say what is wrong.
    let port = base
        .trim_start_matches("rediss://127.0.0.1:")
        .trim_end_matches('/');
    for (url, says) in [
        (format!("{base}?tls_crt=x&tls_key=y"), "tls_crt"),
        (format!("{base}?tls_ca={ca}&colour=blue"), "colour"),
        (format!("{base}#insecure"), "#insecure"),
        (format!("{base}#other"), "#other"),
        (
            format!("redis-sentinel://127.0.0.1:{port}/mymaster?tls_cert=a"),
            "redis-sentinel://",
        ),
        (
            format!("redis-cluster://127.0.0.1:{port}/?tls_ca={ca}"),
            "redis-cluster://",
        ),
        (
            format!("redis://127.0.0.1:{port}/?tls_cert=a&tls_key=b"),
            "rediss://",
        ),
    ] {
        let (code, said) = run(&url);
        assert_eq!(code, Some(64), "{url}: {said}");
        assert!(said.contains(says), "{url}: {said}");
        assert!(
            !said.contains("expected redis://host:port/"),
            "{url}: {said}"
        );
        assert!(!said.contains("bad database number"), "{url}: {said}");
        let lib = library(&url);
        assert!(lib.contains(says), "{url}: {lib}");
    }
    // Only a URL that does not parse is told the expected form.
    let (code, said) = run("redis://:99999/");
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("expected redis://host:port/"), "{said}");
    assert_eq!(s.info_field("grants"), 0);
}

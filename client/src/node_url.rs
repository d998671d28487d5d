//! A node's URL read: the TLS files its query names, the mistakes caught
//! before they surface as something else, and its form for messages.

use crate::error::{Error, Result};

/// The TLS files a `rediss://` URL names in its query: `tls_cert` and
/// `tls_key` (a client certificate and its key, PEM, for a server with
/// `tls-auth-clients yes`) and `tls_ca` (the CA to trust instead of the
/// system's). Returns the URL without them and the certificates read, or
/// the URL as given if it names none.
pub(crate) fn tls_files(url: &str) -> Result<(String, Option<redis::TlsCertificates>)> {
    let (base, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let Some((address, query)) = base.split_once('?') else {
        return Ok((url.to_string(), None));
    };
    let (mut cert, mut key, mut ca) = (None, None, None);
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("tls_cert", path)) => cert = Some(path),
            Some(("tls_key", path)) => key = Some(path),
            Some(("tls_ca", path)) => ca = Some(path),
            _ => kept.push(pair),
        }
    }
    if cert.is_none() && key.is_none() && ca.is_none() {
        return Ok((url.to_string(), None));
    }
    let shown = address.rsplit_once('@').map_or(address, |(_, host)| host);
    if !address.starts_with("rediss://") {
        return Err(Error::Config(format!(
            "{shown}: tls_cert, tls_key and tls_ca are for rediss:// URLs"
        )));
    }
    let read = |what: &str, path: &str| {
        std::fs::read(path)
            .map_err(|e| Error::Config(format!("{shown}: cannot read {what} {path}: {e}")))
    };
    let client_tls = match (cert, key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("tls_cert", cert)?,
            client_key: read("tls_key", key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(Error::Config(format!(
                "{shown}: give tls_cert and tls_key together (a client certificate and its key)"
            )))
        }
    };
    let root_cert = ca.map(|ca| read("tls_ca", ca)).transpose()?;
    let mut rebuilt = address.to_string();
    if !kept.is_empty() {
        rebuilt = format!("{rebuilt}?{}", kept.join("&"));
    }
    if let Some(f) = fragment {
        rebuilt = format!("{rebuilt}#{f}");
    }
    Ok((
        rebuilt,
        Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }),
    ))
}

/// The URL scheme for a master found through Sentinel:
/// `redis-sentinel://host:port[,host:port...]/service[/db]`.
pub(crate) const SENTINEL_SCHEME: &str = "redis-sentinel://";

/// The URL scheme for a Redis Cluster: `redis-cluster://host:port[,...]/`.
pub(crate) const CLUSTER_SCHEME: &str = "redis-cluster://";

/// The query parameters a node URL may carry: this client's TLS files and
/// what the `redis` crate reads (`protocol`; `db`, `user` and `pass` for a
/// Unix socket).
const URL_PARAMETERS: [&str; 7] = [
    "tls_cert", "tls_key", "tls_ca", "protocol", "db", "user", "pass",
];

/// Mistakes in a node URL that would otherwise surface as something else:
/// an unknown (often misspelled) query parameter, which the `redis` crate
/// ignores; a fragment (`#insecure`, TLS without checking the server's
/// certificate, is not built in); parameters on a Sentinel or cluster URL,
/// whose hosts this client reaches without TLS.
pub(crate) fn check_url(url: &str) -> Result<()> {
    let shown = shown_url(url);
    let (base, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let query = base.split_once('?').map(|(_, q)| q);
    let scheme = [SENTINEL_SCHEME, CLUSTER_SCHEME]
        .into_iter()
        .find(|s| url.starts_with(s));
    if let Some(scheme) = scheme {
        if query.is_some() || fragment.is_some() {
            return Err(Error::Config(format!(
                "{shown}: a {scheme} URL takes no parameters (this client reaches Sentinel and cluster nodes without TLS)"
            )));
        }
        return Ok(());
    }
    match fragment {
        Some("insecure") => {
            return Err(Error::Config(format!(
                "{shown}: #insecure (TLS without checking the server's certificate) is not supported: trust the server's CA with ?tls_ca=ca.pem"
            )))
        }
        Some(f) => {
            return Err(Error::Config(format!(
                "{shown}: unknown URL fragment #{f}"
            )))
        }
        None => {}
    }
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        let name = pair.split_once('=').map_or(pair, |(n, _)| n);
        if !URL_PARAMETERS.contains(&name) {
            return Err(Error::Config(format!(
                "{shown}: unknown parameter '{name}' (the TLS files are tls_cert, tls_key and tls_ca)"
            )));
        }
    }
    Ok(())
}

/// A node URL for messages: without its credentials, query or fragment.
fn shown_url(url: &str) -> String {
    let end = url.find(['?', '#']).unwrap_or(url.len());
    let url = &url[..end];
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://{host}"),
        _ => url.to_string(),
    }
}

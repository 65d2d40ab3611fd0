//! The metrics server's TLS configuration: a certificate and key from PEM files, or a
//! self-signed certificate made at start (rcgen), served with rustls's ring provider (the one
//! kube's client already links).

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::config::TlsSource;
use crate::error::Error;

/// The names a self-signed certificate is issued for. A scraper cannot verify it anyway (no CA
/// vouches for it); these only make it well-formed and usable for a local check.
const SELF_SIGNED_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];

/// The server configuration for `source`, HTTP/1.1 only; a clear error when a file is missing
/// or holds no usable certificate or key.
pub(crate) fn server_config(source: &TlsSource) -> Result<Arc<ServerConfig>, Error> {
    let (chain, key) = match source {
        TlsSource::SelfSigned => self_signed()?,
        TlsSource::Files { cert, key } => {
            let read = |path: &std::path::Path, what: &str| {
                std::fs::read(path).map_err(|e| {
                    Error::Config(format!(
                        "reading the metrics TLS {what} {}: {e}",
                        path.display()
                    ))
                })
            };
            let chain = certificates(&read(cert, "certificate")?)
                .map_err(|e| Error::Config(format!("{}: {e}", cert.display())))?;
            let key = private_key(&read(key, "key")?)
                .map_err(|e| Error::Config(format!("{}: {e}", key.display())))?;
            (chain, key)
        }
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("metrics TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            Error::Config(format!(
                "the metrics TLS certificate and key do not make a usable pair: {e}"
            ))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Every certificate in a PEM text, leaf first; an error if there is none.
fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) in it".into());
    }
    Ok(chain)
}

/// The first private key in a PEM text (PKCS#8, PKCS#1 or SEC1).
fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            "no PEM private key (-----BEGIN PRIVATE KEY-----) in it".to_string()
        }
        e => format!("not a PEM private key: {e}"),
    })
}

fn self_signed() -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let names: Vec<String> = SELF_SIGNED_NAMES.iter().map(|n| n.to_string()).collect();
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| Error::Config(format!("generating a self-signed certificate: {e}")))?;
    let key = PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
    Ok((vec![made.cert.der().clone()], key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_made() {
        server_config(&TlsSource::SelfSigned).expect("made");
    }

    #[test]
    fn files_are_read_and_bad_ones_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("sdk-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let made =
            rcgen::generate_simple_self_signed(vec!["metrics.example".to_string()]).expect("made");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).expect("written");
        std::fs::write(&key, made.signing_key.serialize_pem()).expect("written");
        let files = |cert: &std::path::Path, key: &std::path::Path| TlsSource::Files {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        };
        server_config(&files(&cert, &key)).expect("a good pair");

        let missing = dir.join("missing.crt");
        let err = server_config(&files(&missing, &key)).expect_err("missing");
        assert!(
            err.to_string()
                .contains("reading the metrics TLS certificate")
                && err.to_string().contains("missing.crt"),
            "{err}"
        );
        // The key where the certificate belongs, and the other way round.
        let err = server_config(&files(&key, &key)).expect_err("no certificate");
        assert!(err.to_string().contains("no PEM certificate"), "{err}");
        let err = server_config(&files(&cert, &cert)).expect_err("no key");
        assert!(err.to_string().contains("no PEM private key"), "{err}");
        // A key of another certificate.
        let other = dir.join("other.key");
        let stranger = rcgen::KeyPair::generate().expect("key");
        std::fs::write(&other, stranger.serialize_pem()).expect("written");
        let err = server_config(&files(&cert, &other)).expect_err("mismatched");
        assert!(err.to_string().contains("usable pair"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The TLS provider both QUIC ends use. Key exchange (post-quantum groups among them),
//! signatures and randomness are aws-lc-rs's; the TLS 1.3 suites, and so QUIC packet
//! protection, are those of whichever AES-GCM is fastest on this CPU: aws-lc's or *ring*'s.
//! On a CPU with VAES but no AVX-512 (AMD Zen 3), aws-lc has no wide AES-GCM path
//! (aws-lc#2283) and *ring* has an AVX2 VAES one; with AVX-512, aws-lc has the wider.
//!
//! The choice is made once per process ([`chosen`]): by `SLUICE_AES_GCM` (`auto`, `aws-lc`,
//! `ring`) or, on `auto` (the default), by sealing QUIC-sized packets with each for a few
//! milliseconds, alternated, and taking the faster (*ring* only when it is clearly ahead).
//! It is logged once. Deployments that must stay within a FIPS module set `aws-lc`: every
//! primitive then comes from aws-lc.
//!
//! Both peers need not choose alike: the suite (TLS13_AES_256_GCM_SHA384 first) is agreed by
//! name, and each end seals and opens with its own implementation of it.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rustls::crypto::cipher::{AeadKey, Iv};
use rustls::crypto::CryptoProvider;
use rustls::quic::PacketKey;
use rustls::SupportedCipherSuite;

/// The environment variable that sets the choice.
pub const ENV: &str = "SLUICE_AES_GCM";

/// An AES-GCM implementation rustls can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AesGcm {
    AwsLc,
    Ring,
}

impl AesGcm {
    pub fn name(self) -> &'static str {
        match self {
            AesGcm::AwsLc => "aws-lc",
            AesGcm::Ring => "ring",
        }
    }

    /// Its TLS 1.3 suites, in rustls's order of preference.
    fn suites(self) -> Vec<SupportedCipherSuite> {
        match self {
            AesGcm::AwsLc => rustls::crypto::aws_lc_rs::DEFAULT_CIPHER_SUITES.to_vec(),
            AesGcm::Ring => rustls::crypto::ring::DEFAULT_CIPHER_SUITES.to_vec(),
        }
    }

    /// Its AES-256-GCM QUIC packet key, with a fixed key: for measuring, never for traffic.
    pub fn probe_key(self) -> Box<dyn PacketKey> {
        let suite = match self {
            AesGcm::AwsLc => rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
            AesGcm::Ring => rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
        };
        let quic = suite
            .tls13()
            .and_then(|s| s.quic)
            .expect("rustls's TLS 1.3 AES-256-GCM suites carry QUIC packet protection");
        quic.packet_key(AeadKey::from([7u8; 32]), Iv::new([3u8; 12]))
    }
}

/// The choice, and why it was made (for the log line and `sluice bench host-cost`).
#[derive(Clone, Debug)]
pub struct Choice {
    pub aes_gcm: AesGcm,
    pub why: String,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{ENV}={0:?}: expected auto, aws-lc or ring")]
    BadChoice(String),
}

/// Bytes of a QUIC packet's payload at Sluice's datagram size.
pub fn packet_bytes() -> usize {
    usize::from(sluice_wire::quic::MAX_UDP_PAYLOAD) - 64
}

/// GB/s at which `aes_gcm` seals `packets` packets of [`packet_bytes`] (the best of `rounds`).
pub fn seal_rate(aes_gcm: AesGcm, packets: u64, rounds: u32) -> f64 {
    let key = aes_gcm.probe_key();
    let mut payload = vec![0x5au8; packet_bytes()];
    let header = [0x40u8, 0, 0, 0, 1];
    let mut best = f64::INFINITY;
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        for pn in 0..packets {
            let tag = key.encrypt_in_place(pn, &header, &mut payload);
            std::hint::black_box(tag.is_ok());
        }
        best = best.min(started.elapsed().as_secs_f64());
    }
    (packets * payload.len() as u64) as f64 / best.max(1e-9) / 1e9
}

/// Decides from `setting` (the value of [`ENV`], if set), measuring on `auto`.
pub fn choose(setting: Option<&str>) -> Result<Choice, TlsError> {
    let set = |aes_gcm| Choice {
        aes_gcm,
        why: format!("set by {ENV}"),
    };
    match setting.map(str::trim) {
        Some("aws-lc") => Ok(set(AesGcm::AwsLc)),
        Some("ring") => Ok(set(AesGcm::Ring)),
        None | Some("") | Some("auto") => Ok(measured()),
        Some(other) => Err(TlsError::BadChoice(other.to_string())),
    }
}

/// *ring* must seal this much faster to be chosen over aws-lc (which keeps the FIPS path).
const RING_MARGIN: f64 = 1.05;

fn measured() -> Choice {
    // Alternated, best of each: about 3 ms in all at 3 GB/s, and a core busy with something
    // else for a moment hurts both alike.
    let (mut aws, mut ring) = (0f64, 0f64);
    for _ in 0..3 {
        aws = aws.max(seal_rate(AesGcm::AwsLc, 64, 1));
        ring = ring.max(seal_rate(AesGcm::Ring, 64, 1));
    }
    let aes_gcm = if ring > aws * RING_MARGIN {
        AesGcm::Ring
    } else {
        AesGcm::AwsLc
    };
    Choice {
        aes_gcm,
        why: format!("measured: aws-lc {aws:.2} GB/s, ring {ring:.2} GB/s"),
    }
}

/// This process's choice: made and logged on first use.
pub fn chosen() -> Result<&'static Choice, TlsError> {
    static CHOSEN: OnceLock<Result<Choice, TlsError>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let choice = choose(std::env::var(ENV).ok().as_deref())?;
            tracing::info!(
                "QUIC packet protection: {} AES-GCM ({})",
                choice.aes_gcm.name(),
                choice.why
            );
            Ok(choice)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// aws-lc-rs's provider with the chosen implementation's TLS 1.3 suites.
pub fn provider() -> Result<Arc<CryptoProvider>, TlsError> {
    let choice = chosen()?;
    Ok(Arc::new(provider_with(choice.aes_gcm)))
}

/// aws-lc-rs's provider with `aes_gcm`'s TLS 1.3 suites.
pub fn provider_with(aes_gcm: AesGcm) -> CryptoProvider {
    CryptoProvider {
        cipher_suites: aes_gcm.suites(),
        ..rustls::crypto::aws_lc_rs::default_provider()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_is_obeyed_and_a_bad_one_named() {
        assert_eq!(choose(Some("ring")).unwrap().aes_gcm, AesGcm::Ring);
        assert_eq!(choose(Some(" aws-lc ")).unwrap().aes_gcm, AesGcm::AwsLc);
        let e = choose(Some("openssl")).unwrap_err().to_string();
        assert!(e.contains(ENV) && e.contains("openssl"), "{e}");
        let auto = choose(Some("auto")).unwrap();
        assert!(auto.why.contains("measured"), "{}", auto.why);
    }

    #[test]
    fn both_implementations_seal_alike_and_open_each_others_packets() {
        let header = [0x41u8, 9, 9, 9];
        let (aws, ring) = (AesGcm::AwsLc.probe_key(), AesGcm::Ring.probe_key());
        let mut a = b"a sample's tensor bytes".to_vec();
        let mut b = a.clone();
        let tag_a = aws.encrypt_in_place(5, &header, &mut a).unwrap();
        let tag_b = ring.encrypt_in_place(5, &header, &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(tag_a.as_ref(), tag_b.as_ref());
        a.extend_from_slice(tag_a.as_ref());
        let opened = ring.decrypt_in_place(5, &header, &mut a).unwrap();
        assert_eq!(opened, b"a sample's tensor bytes");
    }

    #[test]
    fn the_provider_keeps_aws_lc_key_exchange_and_carries_quic_suites() {
        for aes_gcm in [AesGcm::AwsLc, AesGcm::Ring] {
            let p = provider_with(aes_gcm);
            let aws = rustls::crypto::aws_lc_rs::default_provider();
            let names =
                |p: &CryptoProvider| p.kx_groups.iter().map(|g| g.name()).collect::<Vec<_>>();
            assert_eq!(names(&p), names(&aws));
            assert!(p
                .cipher_suites
                .iter()
                .all(|s| s.tls13().is_some_and(|s| s.quic.is_some()) || s.tls13().is_none()));
        }
    }
}

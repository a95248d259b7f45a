//! The S3-compatible read path, path-style: `GET /{bucket}/{key}` (GetObject, with Range),
//! `HEAD /{bucket}/{key}` (HeadObject) and `GET /{bucket}?list-type=2` (ListObjectsV2), so any
//! S3 client (boto3, the CPU tier's `s3://` source, AIStore tooling) can read shards.
//!
//! Anonymous when no credentials are configured; otherwise every request must carry a valid
//! AWS Signature Version 4 (`Authorization: AWS4-HMAC-SHA256 ...`), checked here against the
//! configured access key and secret. Signature checks are pure functions over the request's
//! parts, tested against a request signed by botocore.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::listing::{collect_keys, query_param};
use crate::mountpath::{valid_bucket, valid_key};
use crate::objects::get;
use crate::routing::{full, Reply, State};

type HmacSha256 = Hmac<Sha256>;

/// Why a signed request is refused (all become 403 `SignatureDoesNotMatch` or
/// `InvalidAccessKeyId`, as S3 answers).
#[derive(Debug, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Malformed(&'static str),
    UnknownKey,
    BadSignature,
}

/// The parts of a request SigV4 covers.
pub struct SignedRequest<'a> {
    pub method: &'a str,
    /// The path as sent (already percent-encoded).
    pub raw_path: &'a str,
    /// The raw query string (without `?`).
    pub raw_query: &'a str,
    /// Header lookup by lower-case name.
    pub header: &'a dyn Fn(&str) -> Option<String>,
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC accepts keys of any length.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Percent-encodes as SigV4 requires (unreserved characters kept, `/` kept in paths).
fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Checks a SigV4 `Authorization` header against `access_key`/`secret`.
pub fn verify(req: &SignedRequest<'_>, access_key: &str, secret: &str) -> Result<(), AuthError> {
    let auth = (req.header)("authorization").ok_or(AuthError::Missing)?;
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or(AuthError::Malformed("not AWS4-HMAC-SHA256"))?;
    let mut credential = None;
    let mut signed_headers = None;
    let mut signature = None;
    for part in rest.split(',') {
        let (k, v) = part
            .trim()
            .split_once('=')
            .ok_or(AuthError::Malformed("authorization field"))?;
        match k {
            "Credential" => credential = Some(v),
            "SignedHeaders" => signed_headers = Some(v),
            "Signature" => signature = Some(v),
            _ => {}
        }
    }
    let (credential, signed_headers, signature) = match (credential, signed_headers, signature) {
        (Some(c), Some(h), Some(s)) => (c, h, s),
        _ => {
            return Err(AuthError::Malformed(
                "Credential, SignedHeaders and Signature are required",
            ))
        }
    };
    let mut scope = credential.splitn(2, '/');
    let key_id = scope.next().unwrap_or("");
    let scope = scope
        .next()
        .ok_or(AuthError::Malformed("credential scope"))?;
    if key_id != access_key {
        return Err(AuthError::UnknownKey);
    }
    let parts: Vec<&str> = scope.split('/').collect();
    let [date, region, service, terminator] = parts[..] else {
        return Err(AuthError::Malformed("credential scope"));
    };
    if terminator != "aws4_request" {
        return Err(AuthError::Malformed("credential scope"));
    }
    let amz_date = (req.header)("x-amz-date").ok_or(AuthError::Malformed("x-amz-date missing"))?;
    let payload = (req.header)("x-amz-content-sha256").unwrap_or_else(|| "UNSIGNED-PAYLOAD".into());

    // Canonical request.
    let canonical_uri = req
        .raw_path
        .split('/')
        .map(|seg| uri_encode(&decode(seg), false))
        .collect::<Vec<_>>()
        .join("/");
    let mut query: Vec<(String, String)> = req
        .raw_query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (uri_encode(&decode(k), false), uri_encode(&decode(v), false))
        })
        .collect();
    query.sort();
    let canonical_query = query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let mut canonical_headers = String::new();
    for name in signed_headers.split(';') {
        let value = (req.header)(name).ok_or(AuthError::Malformed("a signed header is missing"))?;
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        canonical_headers.push_str(&format!("{name}:{value}\n"));
    }
    let canonical = format!(
        "{}\n{canonical_uri}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\n{payload}",
        req.method
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{date}/{region}/{service}/aws4_request\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    let k_signing = hmac(&k_service, b"aws4_request");
    let expected = hex(&hmac(&k_signing, string_to_sign.as_bytes()));
    let same = expected.len() == signature.len()
        && expected
            .bytes()
            .zip(signature.bytes())
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(AuthError::BadSignature)
    }
}

/// Escapes text for XML.
pub fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A ListObjectsV2 response body; with `url_encoding` (the `encoding-type=url` boto3 sends),
/// keys and the prefix are percent-encoded as S3 does.
pub fn list_v2_xml(
    bucket: &str,
    prefix: &str,
    keys: &[(String, u64)],
    max_keys: usize,
    next: Option<&str>,
    token: Option<&str>,
    url_encoding: bool,
) -> String {
    let enc = |s: &str| {
        if url_encoding {
            uri_encode(s, true)
        } else {
            s.to_string()
        }
    };
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">");
    out.push_str(&format!(
        "<Name>{}</Name><Prefix>{}</Prefix><KeyCount>{}</KeyCount><MaxKeys>{max_keys}</MaxKeys><IsTruncated>{}</IsTruncated>",
        xml_escape(bucket),
        xml_escape(&enc(prefix)),
        keys.len(),
        next.is_some()
    ));
    if url_encoding {
        out.push_str("<EncodingType>url</EncodingType>");
    }
    if let Some(t) = token {
        out.push_str(&format!(
            "<ContinuationToken>{}</ContinuationToken>",
            xml_escape(t)
        ));
    }
    if let Some(n) = next {
        out.push_str(&format!(
            "<NextContinuationToken>{}</NextContinuationToken>",
            xml_escape(n)
        ));
    }
    for (key, size) in keys {
        out.push_str(&format!(
            "<Contents><Key>{}</Key><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>",
            xml_escape(&enc(key))
        ));
    }
    out.push_str("</ListBucketResult>");
    out
}

/// An S3 error body.
pub fn error_xml(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message></Error>",
        xml_escape(code),
        xml_escape(message)
    )
}

/// The S3-compatible read path (path-style `/{bucket}/{key}`), with S3's XML errors.
pub(crate) async fn s3_route(state: &Arc<State>, req: &Request<()>) -> Reply {
    let s3_error = |status: StatusCode, code: &str, message: &str| {
        let mut r = Response::new(full(Bytes::from(crate::s3::error_xml(code, message))));
        *r.status_mut() = status;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        r
    };
    if let (Some(key), Some(secret)) = (&state.config.s3_access_key, &state.config.s3_secret_key) {
        let headers = req.headers().clone();
        let lookup = move |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let signed = crate::s3::SignedRequest {
            method: req.method().as_str(),
            raw_path: req.uri().path(),
            raw_query: req.uri().query().unwrap_or(""),
            header: &lookup,
        };
        match crate::s3::verify(&signed, key, secret) {
            Ok(()) => {}
            Err(crate::s3::AuthError::UnknownKey) => {
                return Reply::Ready(s3_error(
                    StatusCode::FORBIDDEN,
                    "InvalidAccessKeyId",
                    "unknown access key",
                ))
            }
            Err(crate::s3::AuthError::Missing) => {
                return Reply::Ready(s3_error(
                    StatusCode::FORBIDDEN,
                    "AccessDenied",
                    "this store requires signed requests",
                ))
            }
            Err(_) => {
                return Reply::Ready(s3_error(
                    StatusCode::FORBIDDEN,
                    "SignatureDoesNotMatch",
                    "the request signature does not match",
                ))
            }
        }
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let Ok(rest) = percent_encoding::percent_decode_str(path.trim_start_matches('/')).decode_utf8()
    else {
        return Reply::Ready(s3_error(
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            "path is not UTF-8",
        ));
    };
    let (bucket, key) = match rest.split_once('/') {
        Some((b, k)) if !k.is_empty() => (b.to_string(), Some(k.to_string())),
        Some((b, _)) => (b.to_string(), None),
        None => (rest.to_string(), None),
    };
    if !valid_bucket(&bucket) {
        return Reply::Ready(s3_error(
            StatusCode::BAD_REQUEST,
            "InvalidBucketName",
            "invalid bucket name",
        ));
    }
    if !state.serves(&bucket) {
        return Reply::Ready(s3_error(
            StatusCode::NOT_FOUND,
            "NoSuchBucket",
            "the specified bucket does not exist",
        ));
    }
    match (req.method().clone(), key) {
        (Method::GET | Method::HEAD, Some(key)) => {
            if !valid_key(&key) {
                return Reply::Ready(s3_error(
                    StatusCode::BAD_REQUEST,
                    "InvalidArgument",
                    "invalid object key",
                ));
            }
            let resp = match get(state, req, &bucket, &key) {
                Reply::Ready(r) => r,
                other => return other,
            };
            let (code, message) = match resp.status() {
                StatusCode::NOT_FOUND => ("NoSuchKey", "the specified key does not exist"),
                StatusCode::RANGE_NOT_SATISFIABLE => {
                    ("InvalidRange", "the requested range is not satisfiable")
                }
                StatusCode::SERVICE_UNAVAILABLE => ("SlowDown", "the node is shutting down"),
                StatusCode::INTERNAL_SERVER_ERROR => {
                    ("InternalError", "the object could not be read")
                }
                _ => return Reply::Ready(resp),
            };
            let mut out = s3_error(resp.status(), code, message);
            if let Some(cr) = resp.headers().get(header::CONTENT_RANGE) {
                out.headers_mut().insert(header::CONTENT_RANGE, cr.clone());
            }
            Reply::Ready(out)
        }
        (Method::GET, None) if query_param(&query, "list-type").as_deref() == Some("2") => {
            let prefix = query_param(&query, "prefix").unwrap_or_default();
            let max = query_param(&query, "max-keys")
                .and_then(|m| m.parse::<usize>().ok())
                .unwrap_or(1000)
                .clamp(1, 1000);
            let token = query_param(&query, "continuation-token");
            let after = token.clone().or_else(|| query_param(&query, "start-after"));
            if !state.unavailable().is_empty() {
                return Reply::Ready(s3_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    "a mountpath of this node is unavailable; the listing would be incomplete",
                ));
            }
            let Some(found) =
                collect_keys(state, &bucket, prefix.clone(), after.clone(), max + 1).await
            else {
                return Reply::Ready(s3_error(
                    StatusCode::NOT_FOUND,
                    "NoSuchBucket",
                    "the specified bucket does not exist",
                ));
            };
            let mut page: Vec<(String, u64)> = found.into_iter().collect();
            let next = (page.len() > max).then(|| {
                page.truncate(max);
                page.last().map(|(k, _)| k.clone()).unwrap_or_default()
            });
            let url_encoding = query_param(&query, "encoding-type").as_deref() == Some("url");
            let body = crate::s3::list_v2_xml(
                &bucket,
                &prefix,
                &page,
                max,
                next.as_deref(),
                token.as_deref(),
                url_encoding,
            );
            let mut r = Response::new(full(Bytes::from(body)));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/xml"),
            );
            Reply::Ready(r)
        }
        _ if !state
            .mountpaths
            .iter()
            .any(|m| m.path.join(&bucket).is_dir()) =>
        {
            Reply::Ready(s3_error(
                StatusCode::NOT_FOUND,
                "NoSuchBucket",
                "the specified bucket does not exist",
            ))
        }
        _ => Reply::Ready(s3_error(
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            "this store serves GetObject, HeadObject and ListObjectsV2",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AWS documentation's GET Object example (Signature Version 4, "Example: GET Object").
    #[test]
    fn verifies_the_aws_documentation_example() {
        let headers = |name: &str| -> Option<String> {
            match name {
                "authorization" => Some("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41".into()),
                "host" => Some("examplebucket.s3.amazonaws.com".into()),
                "range" => Some("bytes=0-9".into()),
                "x-amz-content-sha256" => Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into()),
                "x-amz-date" => Some("20130524T000000Z".into()),
                _ => None,
            }
        };
        let req = SignedRequest {
            method: "GET",
            raw_path: "/test.txt",
            raw_query: "",
            header: &headers,
        };
        assert_eq!(
            verify(
                &req,
                "AKIAIOSFODNN7EXAMPLE",
                "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
            ),
            Ok(())
        );
        assert_eq!(
            verify(&req, "AKIAIOSFODNN7EXAMPLE", "wrong-secret"),
            Err(AuthError::BadSignature)
        );
        assert_eq!(verify(&req, "OTHERKEY", "x"), Err(AuthError::UnknownKey));
    }
}

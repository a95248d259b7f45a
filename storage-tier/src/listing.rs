//! Listings: `GET /v1/{bucket}?prefix=` (JSON) and the key walk the S3 API's ListObjectsV2
//! shares, across every mountpath, in key order.

use std::sync::Arc;

use hyper::{Response, StatusCode};

use crate::routing::{error, json, Body, State};

/// A query parameter, percent-decoded.
pub(crate) fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// The first `limit` objects of `bucket` (across mountpaths, sorted by key) whose key starts
/// with `prefix` and comes after `after`, with sizes; `None` when no mountpath has the bucket.
pub(crate) async fn collect_keys(
    state: &Arc<State>,
    bucket: &str,
    prefix: String,
    after: Option<String>,
    limit: usize,
) -> Option<std::collections::BTreeMap<String, u64>> {
    let roots: Vec<std::path::PathBuf> = state
        .mountpaths
        .iter()
        .map(|m| m.path.join(bucket))
        .collect();
    let listed = tokio::task::spawn_blocking(move || {
        let mut found = std::collections::BTreeMap::new();
        let mut any_bucket = false;
        for root in roots {
            if !root.is_dir() {
                continue;
            }
            any_bucket = true;
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with('.') {
                        continue; // temporary uploads and hidden files
                    }
                    let Ok(ft) = e.file_type() else { continue };
                    let path = e.path();
                    if ft.is_dir() {
                        stack.push(path);
                    } else if ft.is_file() {
                        let key = path
                            .strip_prefix(&root)
                            .map(|p| p.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        if key.starts_with(&prefix) && after.as_ref().is_none_or(|a| &key > a) {
                            let size = e.metadata().map(|m| m.len()).unwrap_or(0);
                            found.insert(key, size);
                            // Keep only the first `limit` keys: memory is bounded by the
                            // page, not by the bucket.
                            if found.len() > limit {
                                found.pop_last();
                            }
                        }
                    }
                }
            }
        }
        any_bucket.then_some(found)
    })
    .await;
    listed.ok().flatten()
}

pub(crate) async fn list(state: &Arc<State>, bucket: &str, query: &str) -> Response<Body> {
    let prefix = query_param(query, "prefix").unwrap_or_default();
    let max = state.config.limits.max_list_keys;
    if !state.unavailable().is_empty() {
        // A listing without that mountpath's objects would be wrong, not short.
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "a mountpath of this node is unavailable; the listing would be incomplete",
        );
    }
    let Some(found) = collect_keys(state, bucket, prefix, None, max + 1).await else {
        return error(StatusCode::NOT_FOUND, "no such bucket");
    };
    let truncated = found.len() > max;
    let objects: Vec<_> = found
        .into_iter()
        .take(max)
        .map(|(key, size)| serde_json::json!({"key": key, "size": size}))
        .collect();
    json(
        StatusCode::OK,
        serde_json::json!({"bucket": bucket, "objects": objects, "truncated": truncated}),
    )
}

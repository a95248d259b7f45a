//! The S3-compatible read path with boto3 as the client (the library most S3 users have):
//! ListObjectsV2 with pagination, GetObject whole and by range, HeadObject, a missing key, and
//! a request signed with the wrong secret refused. Skips without a Python that has boto3
//! (CI installs it and sets SLUICE_REQUIRE_PYTHON).

mod common;

use std::process::Command;

use sluice_storage::StorageConfig;

const CLIENT: &str = r#"
import hashlib, json, sys, boto3
from botocore.config import Config
from botocore.exceptions import ClientError
endpoint, secret = sys.argv[1], sys.argv[2]
def client(sec):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="AKIASLUICETEST",
                        aws_secret_access_key=sec, config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
s3 = client(secret)
out = {}
keys, token = [], None
while True:
    kw = {"Bucket": "b", "Prefix": "obj", "MaxKeys": 2}
    if token: kw["ContinuationToken"] = token
    page = s3.list_objects_v2(**kw)
    keys += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
    if not page["IsTruncated"]: break
    token = page["NextContinuationToken"]
out["keys"] = keys
whole = s3.get_object(Bucket="b", Key="obj 3.bin")["Body"].read()
out["whole_sha"] = hashlib.sha256(whole).hexdigest()
out["range"] = s3.get_object(Bucket="b", Key="obj 3.bin", Range="bytes=10-19")["Body"].read().hex()
out["head"] = s3.head_object(Bucket="b", Key="obj 3.bin")["ContentLength"]
try:
    s3.get_object(Bucket="b", Key="missing.bin"); out["missing"] = "found?"
except ClientError as e:
    out["missing"] = e.response["Error"]["Code"]
try:
    client("wrong-secret").list_objects_v2(Bucket="b"); out["wrong"] = "accepted"
except ClientError as e:
    out["wrong"] = e.response["Error"]["Code"]
print(json.dumps(out))
"#;

#[test]
fn boto3_lists_gets_ranges_and_heads() {
    let Some(python) = common::python_with("boto3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    std::fs::create_dir_all(root.join("b")).unwrap();
    let mut objects = Vec::new();
    for i in 0..5u32 {
        let data: Vec<u8> = (0..(1000 + i * 100)).map(|j| (j * 7 + i) as u8).collect();
        std::fs::write(root.join(format!("b/obj {i}.bin")), &data).unwrap();
        objects.push(data);
    }
    let config = StorageConfig {
        mountpaths: vec![root],
        s3_access_key: Some("AKIASLUICETEST".into()),
        s3_secret_key: Some("sluice-test-secret".into()),
        ..StorageConfig::default()
    };
    let node = common::start(config);
    let addr = node.addr;
    let out = Command::new(&python)
        .arg("-c")
        .arg(CLIENT)
        .arg(format!("http://{addr}"))
        .arg("sluice-test-secret")
        .output()
        .unwrap();
    node.stop();
    assert!(
        out.status.success(),
        "boto3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<(String, u64)> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k[0].as_str().unwrap().to_string(), k[1].as_u64().unwrap()))
        .collect();
    assert_eq!(
        keys,
        (0..5)
            .map(|i| (format!("obj {i}.bin"), 1000 + i * 100))
            .collect::<Vec<_>>()
    );
    use sha2::Digest;
    assert_eq!(
        v["whole_sha"],
        format!("{:x}", sha2::Sha256::digest(&objects[3]))
    );
    assert_eq!(
        v["range"],
        objects[3][10..20]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert_eq!(v["head"], 1300);
    assert_eq!(v["missing"], "NoSuchKey");
    assert_eq!(v["wrong"], "SignatureDoesNotMatch");
}

//! The `s3://` source against a real S3-compatible server on loopback (moto's server, from
//! PyPI): whole shards, sample ranges through the `.idx`, and a missing object. Skips without
//! a Python that has moto (CI installs it and sets SLUICE_REQUIRE_PYTHON).

mod common;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_cpu::source::S3Config;
use sluice_cpu::{ShardLocation, ShardSource, SourceConfig};
use sluice_shard::{ShardWriter, WriterConfig};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const UPLOAD: &str = r#"
import sys, boto3
endpoint, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
s3.create_bucket(Bucket=bucket)
for path in sys.argv[3:]:
    s3.upload_file(path, bucket, "train/" + path.rsplit("/", 1)[1])
"#;

#[test]
fn reads_shards_and_ranges_from_an_s3_compatible_store() {
    let Some(python) = common::python_with("moto.server, boto3") else {
        return;
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = Server(
        Command::new(&python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let endpoint = format!("http://127.0.0.1:{port}");

    let dir = tempfile::tempdir().unwrap();
    let mut w = ShardWriter::new(WriterConfig::new(format!(
        "{}/s-%02d.tar",
        dir.path().display()
    )))
    .unwrap();
    for i in 0..9u32 {
        w.write(
            &format!("k{i}"),
            &[("jpg", &common::jpeg(64, 48, i)), ("cls", b"3")],
        )
        .unwrap();
    }
    let shard = w.finish().unwrap().remove(0);
    let st = Command::new(&python)
        .arg("-c")
        .arg(UPLOAD)
        .args([&endpoint, "data"])
        .arg(&shard.path)
        .arg(&shard.index_path)
        .status()
        .unwrap();
    assert!(st.success());

    let config = SourceConfig {
        s3: S3Config {
            endpoint: Some(endpoint),
            region: Some("us-east-1".into()),
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            allow_http: true,
        },
        ..SourceConfig::default()
    };
    let source = ShardSource::new(config).unwrap();
    let loc = ShardLocation {
        tally: Default::default(),
        urls: vec!["s3://data/train/s-00.tar".into()],
        info: shard.info.clone(),
    };
    let keys = |start, end| -> Vec<String> {
        source
            .open_unit(&loc, start, end)
            .unwrap()
            .map(|s| s.unwrap().key)
            .collect()
    };
    assert_eq!(keys(0, 9).len(), 9);
    assert_eq!(keys(2, 5), ["k2", "k3", "k4"]);

    let missing = ShardLocation {
        tally: Default::default(),
        urls: vec!["s3://data/train/nope.tar".into()],
        info: shard.info,
    };
    let err = source.open_unit(&missing, 0, 9).err().unwrap().to_string();
    assert!(err.contains("nope.tar"), "{err}");
}

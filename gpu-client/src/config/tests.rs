use super::*;

#[test]
fn runtime_threads_follow_the_workers() {
    let dir = tempfile::tempdir().unwrap();
    // A worker on port 7345 serving a same-host socket in `dir`, one on 7346 not.
    let path = sluice_wire::shm::socket_path(dir.path(), 7345);
    let _socket = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let config = |workers: &[&str], same_host, io_threads| LoaderConfig {
        workers: workers.iter().map(|w| w.to_string()).collect(),
        same_host,
        same_host_dir: dir.path().to_path_buf(),
        io_threads,
        ..LoaderConfig::default()
    };
    let threads = |workers: &[&str], same_host, io_threads| {
        config(workers, same_host, io_threads).runtime_threads()
    };
    assert_eq!(threads(&["127.0.0.1:7345"], SameHost::Auto, 0), 1);
    assert_eq!(threads(&["127.0.0.1:7345"], SameHost::Require, 0), 1);
    // QUIC for any of them, or maybe (a name, a workers file): two.
    assert_eq!(threads(&["127.0.0.1:7345"], SameHost::Off, 0), 2);
    assert_eq!(
        threads(&["127.0.0.1:7345", "127.0.0.1:7346"], SameHost::Auto, 0),
        2
    );
    assert_eq!(threads(&["localhost:7345"], SameHost::Auto, 0), 1);
    assert_eq!(threads(&["gpu-7.local:7345"], SameHost::Auto, 0), 2);
    assert_eq!(threads(&["192.0.2.1:7345"], SameHost::Auto, 0), 2);
    let mut from_file = config(&["127.0.0.1:7345"], SameHost::Auto, 0);
    from_file.workers_file = Some(dir.path().join("workers"));
    assert_eq!(from_file.runtime_threads(), 2);
    // Given, it is what was given.
    assert_eq!(threads(&["127.0.0.1:7345"], SameHost::Auto, 3), 3);
    assert_eq!(threads(&["127.0.0.1:7346"], SameHost::Auto, 1), 1);
}

#[test]
fn a_default_job_name_fits_what_a_worker_accepts() {
    let long = format!(
        "http://storage:7000/v1/{}/manifest.json",
        "deep/".repeat(40)
    );
    let config = LoaderConfig {
        dataset_name: long,
        client_name: "gpu-7".into(),
        ..LoaderConfig::default()
    };
    let name = config.job_name();
    assert_eq!(name.chars().count(), 128);
    assert!(name.ends_with("manifest.json@gpu-7"), "{name}");
    let short = LoaderConfig {
        dataset_name: "train".into(),
        client_name: "gpu-7".into(),
        ..LoaderConfig::default()
    };
    assert_eq!(short.job_name(), "train@gpu-7");
}

#[test]
fn a_config_round_trips_through_the_text_python_passes() {
    let config = LoaderConfig {
        shuffle: ShufflePolicy::Partial(0.25),
        fields: FieldSelection::Named(vec!["txt".into(), "json".into()]),
        label: LabelSource::None,
        hedge_after: Duration::from_millis(1500),
        ..LoaderConfig::default()
    };
    let text = serde_json::to_string(&config).unwrap();
    assert!(text.contains(r#""shuffle":"partial:0.25""#), "{text}");
    assert!(text.contains(r#""label":null"#), "{text}");
    assert!(text.contains(r#""hedge_after":1.5"#), "{text}");
    let back: LoaderConfig = serde_json::from_str(&text).unwrap();
    assert_eq!(back, config);
    let partial: LoaderConfig =
        serde_json::from_str(r#"{"batch_size": 32, "shuffle": "none", "label": "json:y"}"#)
            .unwrap();
    assert_eq!(partial.batch_size, 32);
    assert_eq!(partial.shuffle, ShufflePolicy::Sequential);
    let err = serde_json::from_str::<LoaderConfig>(r#"{"batch_sise": 32}"#).unwrap_err();
    assert!(err.to_string().contains("batch_sise"), "{err}");
}

#[test]
fn validation_names_the_key_and_settles_what_follows_from_others() {
    let mut c = LoaderConfig {
        shuffle: ShufflePolicy::Sequential,
        batch_size: 600,
        ..LoaderConfig::default()
    };
    c.validate().unwrap();
    assert_eq!((c.mixing.window_units, c.mixing.buffer_samples), (1, 0));
    assert_eq!(c.lookahead, 1200);
    let mut c = LoaderConfig {
        workers: vec!["cpu-0:7100".into()],
        ..LoaderConfig::default()
    };
    let err = c.validate().unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Config {
                key: "trust_cert",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_size_past_what_a_process_may_allocate_is_refused_by_name_with_its_limit() {
    let mut c = LoaderConfig {
        mixture_round_samples: 1 << 40,
        epoch_samples: Some(1_000_000_000_000),
        ..LoaderConfig::default()
    };
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("mixture_round_samples") && err.contains("16777216"),
        "{err}"
    );
    let mut c = LoaderConfig {
        ring_batches: 1 << 20,
        ..LoaderConfig::default()
    };
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("ring_batches"));
    let mut c = LoaderConfig {
        mixture_round_samples: 1 << 24,
        ..LoaderConfig::default()
    };
    c.validate().unwrap();
}

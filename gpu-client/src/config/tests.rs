use super::*;

#[test]
fn runtime_threads_are_one_unless_connections_or_the_user_ask_for_more() {
    let config = |connections_per_worker, io_threads| LoaderConfig {
        workers: vec!["192.0.2.1:7345".into()],
        connections_per_worker,
        io_threads,
        ..LoaderConfig::default()
    };
    assert_eq!(config(1, 0).runtime_threads(), 1);
    // Added connections spread over as many threads.
    assert_eq!(config(4, 0).runtime_threads(), 4);
    // Given, it is what was given.
    assert_eq!(config(1, 3).runtime_threads(), 3);
    assert_eq!(config(4, 1).runtime_threads(), 1);
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

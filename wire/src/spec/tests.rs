use super::*;

#[test]
fn pixel_ops_come_after_the_geometry_with_their_arguments_in_range() {
    let spec: PipelineSpec = "decode | center_crop 8 | posterize 3 | invert"
        .parse()
        .unwrap();
    assert_eq!(spec.pixels, [PixelOp::Posterize(3), PixelOp::Invert]);
    let every = "decode | center_crop 8 | brightness 1 | contrast 1 | saturation 1 | hue 0 \
                 | solarize 1 | posterize 1 | equalize | autocontrast | sharpness 1 | invert \
                 | grayscale | color_jitter 0.4 | random_grayscale | gaussian_blur 3 | rotate 30 \
                 | shear_x 0.3 | shear_y -0.3 | translate_x 5 | translate_y -5 \
                 | rand_augment | trivial_augment | auto_augment | random_erasing";
    let names: Vec<&str> = every
        .parse::<PipelineSpec>()
        .unwrap()
        .pixels
        .iter()
        .map(PixelOp::name)
        .collect();
    assert_eq!(names, PixelOp::NAMES);
    for (text, says) in [
        (
            "decode | center_crop 8 | brightness",
            "brightness needs a factor",
        ),
        (
            "decode | center_crop 8 | brightness -1",
            "brightness: -1 is not a factor in [0, 1000]",
        ),
        (
            "decode | center_crop 8 | hue 0.6",
            "hue: 0.6 is not a hue factor in [-0.5, 0.5]",
        ),
        (
            "decode | center_crop 8 | solarize 256",
            "solarize: 256 is not a threshold in [0, 255]",
        ),
        (
            "decode | center_crop 8 | posterize 9",
            "posterize: 9 is not a number of bits in [0, 8]",
        ),
        (
            "decode | center_crop 8 | invert 1",
            "invert takes no argument",
        ),
        (
            "decode | center_crop 8 | contrast 1 2",
            "contrast: too many arguments",
        ),
        (
            "decode | center_crop 8 | sharpness f=2",
            "sharpness: unknown argument \"f\"",
        ),
        (
            "decode | center_crop 8 | invert | resize 4x4",
            "resize after invert: the pixel ops come after the geometry",
        ),
        (
            "decode | center_crop 8 | hflip | invert | hflip",
            "only a pipeline's one hflip may follow the pixel ops",
        ),
        (
            "decode | center_crop 8 | invert | hflip | equalize | hflip",
            "only a pipeline's one hflip may follow the pixel ops",
        ),
        (
            "decode | center_crop 8 | normalize mean=0,0,0 std=1,1,1 | invert",
            "invert after normalize",
        ),
        (
            "decode | center_crop 8 | brightness NaN",
            "brightness: NaN is not a factor",
        ),
        (
            "decode | center_crop 8 | rand_augment m=31",
            "rand_augment: m=31 is not a whole number in [0, 30]",
        ),
        (
            "decode | center_crop 8 | rand_augment n=2 m=10 bins=10",
            "rand_augment: m=10 is not a whole number in [0, 9]",
        ),
        (
            "decode | center_crop 8 | rand_augment bins=5",
            "rand_augment: m defaults to 9, outside [0, 4]: give m=",
        ),
        (
            "decode | center_crop 8 | rand_augment 2",
            "rand_augment takes no argument",
        ),
        (
            "decode | center_crop 8 | auto_augment cifar10",
            "auto_augment: policy \"cifar10\" is not one Sluice has (imagenet)",
        ),
        (
            "decode | center_crop 8 | translate_x 2.5",
            "translate_x: 2.5 is not a whole number of pixels",
        ),
        (
            "decode | center_crop 8 | rotate 400",
            "rotate: 400 is not an angle in degrees in [-360, 360]",
        ),
        (
            "decode | center_crop 8 | random_erasing p=2",
            "random_erasing: 2 is not a probability in [0, 1]",
        ),
        (
            "decode | center_crop 8 | random_erasing scale=0.5,0.1",
            "random_erasing: scale=0.5,0.1 is not A,B with 0 <= A <= B <= 1",
        ),
        (
            "decode | center_crop 8 | random_erasing value=random",
            "value=random is noise in normalized units",
        ),
        (
            "decode | center_crop 8 | random_erasing value=300",
            "value=300 before normalize is a byte",
        ),
        (
            "decode | center_crop 8 | normalize mean=0,0,0 std=1,1,1 | random_erasing | chw | random_erasing",
            "random_erasing appears twice after normalize",
        ),
        (
            "decode | center_crop 8 | chw | invert",
            "invert after chw: chw comes last (only random_erasing may follow it)",
        ),
    ] {
        let e = text.parse::<PipelineSpec>().unwrap_err().to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
}

#[test]
fn parses_the_usual_pipelines_and_round_trips() {
    for text in [
        "decode | random_resized_crop 224 | hflip 0.5",
        "decode | resize 256 | center_crop 224",
        "decode field=png | resize 32x48",
        "decode | random_resized_crop 176x144 scale=0.35,1 ratio=0.5,2 | hflip | normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225 dtype=f16 | chw",
        "decode | center_crop 224 | brightness 1.3 | contrast 0.7 | saturation 1.5 | hue -0.1 | solarize 128 | posterize 4 | equalize | autocontrast | sharpness 2 | invert | grayscale | normalize mean=0.5,0.5,0.5 std=0.5,0.5,0.5",
        "decode | random_resized_crop 224 | color_jitter 0.4 0.4 0.4 0.1 | random_grayscale p=0.2 | gaussian_blur 23 sigma=0.1,2",
        "decode | random_resized_crop 224 | rand_augment n=2 m=9 | hflip | normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225 | chw | random_erasing p=0.25",
        "decode | center_crop 224 | rotate -30.5 | shear_x 0.1 | shear_y -0.2 | translate_x -7 | translate_y 3 | trivial_augment bins=10 | auto_augment imagenet | random_erasing p=1 scale=0.1,0.2 ratio=1,2 value=128",
        "decode | center_crop 8 | normalize mean=0,0,0 std=1,1,1 | random_erasing value=random",
    ] {
        round_trips(text);
    }
    let spec: PipelineSpec = "decode | random_resized_crop 224 | hflip 0.5"
        .parse()
        .unwrap();
    assert_eq!(spec.output_size(), Some((224, 224)));
    assert_eq!(spec.output_bytes(), 224 * 224 * 3);
}

#[test]
fn invalid_specs_name_the_problem() {
    for (text, expect) in [
        ("random_resized_crop 224", "start with decode"),
        (
            "decode | blur 3",
            "unknown op \"blur\"; the ops are decode, clip, random_resized_crop, center_crop",
        ),
        ("decode | random_resized_crop", "needs a size"),
        ("decode | random_resized_crop 224 scale=0,1", "scale"),
        (
            "decode | random_resized_crop 224 colour=1",
            "unknown argument",
        ),
        ("decode | hflip 2", "probability"),
        ("decode | resize 256", "not fixed"),
        (
            "decode | center_crop 224 | normalize mean=1,2 std=1,1,1",
            "mean=R,G,B",
        ),
        ("decode | center_crop 224 | chw | hflip", "chw comes last"),
        ("decode | center_crop 224 ||", "empty"),
        ("decode | decode | center_crop 2", "twice"),
    ] {
        let e = text.parse::<PipelineSpec>().unwrap_err();
        assert!(e.to_string().contains(expect), "{text}: {e}");
    }
}

#[test]
fn a_clip_takes_frames_after_decode_and_counts_them_in_its_shape() {
    let spec: PipelineSpec =
        "decode field=mjpeg | clip 8 stride=2 | random_resized_crop 112 | hflip"
            .parse()
            .unwrap();
    let clip = spec.clip.unwrap();
    assert_eq!(
        (clip.frames, clip.stride, clip.start),
        (8, 2, ClipStart::Random)
    );
    let shape = spec.output_shape().unwrap();
    assert_eq!((shape.frames, shape.height, shape.width), (8, 112, 112));
    assert_eq!(shape.bytes(), 8 * 112 * 112 * 3);
    assert_eq!(spec.output_bytes() as u64, shape.bytes());
    for text in [
        "decode | clip 4 | center_crop 64",
        "decode field=mjpg | clip 16 stride=3 start=center | resize 64x48 | chw",
        "decode | clip 2 stride=1 start=random | center_crop 8",
    ] {
        round_trips(text);
    }
    for (text, expect) in [
        (
            "decode | center_crop 8 | clip 4",
            "clip comes right after decode",
        ),
        ("decode | clip | center_crop 8", "frame count"),
        ("decode | clip 0 | center_crop 8", "frame count"),
        ("decode | clip 2000 | center_crop 8", "frame count"),
        ("decode | clip 4 stride=0 | center_crop 8", "stride=0"),
        (
            "decode | clip 4 start=middle | center_crop 8",
            "start=middle",
        ),
        (
            "decode | clip 4 every=2 | center_crop 8",
            "unknown argument",
        ),
    ] {
        let e = text.parse::<PipelineSpec>().unwrap_err();
        assert!(e.to_string().contains(expect), "{text}: {e}");
    }
    // A clip's whole tensor must fit a frame.
    let big: PipelineSpec = "decode | clip 64 | center_crop 512".parse().unwrap();
    let e = big.shape_within(32 << 20).unwrap_err().to_string();
    assert!(
        e.contains("64x512x512x3") && e.contains("fewer frames"),
        "{e}"
    );
}

#[test]
fn a_clips_window_starts_where_drawn_or_centred_and_repeats_a_short_clips_last_frame() {
    let clip = |frames, stride, start| Clip {
        frames,
        stride,
        start,
        explicit_start: false,
    };
    let c = clip(4, 2, ClipStart::Center);
    assert_eq!(c.span(), 7);
    assert_eq!(c.first(11, |_| unreachable!()), 2);
    assert_eq!(
        c.window(11, |_| 0).indices().collect::<Vec<_>>(),
        [2, 4, 6, 8]
    );
    let r = clip(4, 2, ClipStart::Random);
    assert_eq!(r.first(11, |n| n - 1), 4, "the last start that fits");
    assert_eq!(r.first(11, |_| 0), 0);
    // Shorter than the window: from the first frame, the last repeated.
    assert_eq!(r.first(5, |_| unreachable!()), 0);
    assert_eq!(
        r.window(5, |_| 3).indices().collect::<Vec<_>>(),
        [0, 2, 4, 4]
    );
    let frames = crate::ClipFrames {
        first: 0,
        stride: 2,
        count: 4,
        total: 5,
    };
    assert_eq!(frames.indices().collect::<Vec<_>>(), [0, 2, 4, 4]);
}

/// `text` parses, and its printed form parses back to the same spec.
#[track_caller]
fn round_trips(text: &str) {
    let spec: PipelineSpec = text.parse().unwrap();
    let again: PipelineSpec = spec.to_string().parse().unwrap();
    assert_eq!(spec, again, "{text}");
}

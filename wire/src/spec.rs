//! The pipeline spec: what a worker does to each sample, as a small text language that travels
//! in the wire protocol and in configs:
//!
//! ```text
//! decode | random_resized_crop 224 | hflip 0.5
//! decode | resize 256 | center_crop 224 | normalize mean=0.485,0.456,0.406 std=0.229,0.224,0.225 dtype=f16 | chw
//! ```
//!
//! A clip (a field of concatenated JPEG frames, `mjpeg`) takes `clip N [stride=S]
//! [start=random|center]` right after `decode`: N frames S apart, every spatial op drawn once
//! per clip and applied to each frame; its tensor is T×H×W×3 (T×3×H×W with `chw`):
//!
//! ```text
//! decode field=mjpeg | clip 8 stride=2 | random_resized_crop 112 | hflip 0.5
//! ```
//!
//! Ops (torchvision semantics): `decode [field=jpg]`, `random_resized_crop SIZE [scale=A,B]
//! [ratio=A,B]`, `center_crop SIZE`, `resize SIZE` (shorter side) or `resize HxW`, `hflip [P]`,
//! the pixel ops after the geometry ([`PixelOp`]: `brightness F`, `contrast F`, ...,
//! `grayscale`), `normalize mean=R,G,B std=R,G,B [dtype=f32|f16]`, `chw`. SIZE is `N` or `HxW`. The output
//! must have a fixed size (end the geometry in a crop or an `HxW` resize), so batches stack.
//! `docs/pipeline.md` is the reference for users: every op, its arguments and defaults.
//!
//! It lives here, beside the protocol it travels in, so a client checks a spec (in
//! `Loader::build`) with the grammar workers use, without linking a decoder.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Every op the grammar knows, in the order a pipeline may use them (docs/pipeline.md).
pub const OPS: [&str; 31] = [
    "decode",
    "clip",
    "random_resized_crop",
    "center_crop",
    "resize",
    "hflip",
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "solarize",
    "posterize",
    "equalize",
    "autocontrast",
    "sharpness",
    "invert",
    "grayscale",
    "color_jitter",
    "random_grayscale",
    "gaussian_blur",
    "rotate",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rand_augment",
    "trivial_augment",
    "auto_augment",
    "random_erasing",
    "normalize",
    "chw",
];

/// An op on the pixels of the uint8 RGB output, after the geometry and before `normalize`,
/// as `torchvision.transforms.v2.functional` defines it on a uint8 image (its rounding and
/// clamping; docs/pipeline.md names each one's counterpart).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum PixelOp {
    /// `adjust_brightness`: each value times the factor (>= 0).
    Brightness(f64),
    /// `adjust_contrast`: blended with the image's mean grey by the factor (>= 0).
    Contrast(f64),
    /// `adjust_saturation`: blended with each pixel's grey by the factor (>= 0).
    Saturation(f64),
    /// `adjust_hue`: the hue turned by the factor, in [-0.5, 0.5] of a turn.
    Hue(f64),
    /// `solarize`: values at or above the threshold (0..=255) inverted.
    Solarize(f64),
    /// `posterize`: the top bits (0..=8) of each value kept.
    Posterize(u8),
    /// `equalize`: each channel's histogram equalized (PIL's scheme).
    Equalize,
    /// `autocontrast`: each channel stretched to 0..=255.
    Autocontrast,
    /// `adjust_sharpness`: blended with a 3x3 smoothing of the image by the factor (>= 0).
    Sharpness(f64),
    /// `invert`: 255 - value.
    Invert,
    /// `rgb_to_grayscale(num_output_channels=3)`: each pixel its grey, in all three channels.
    Grayscale,
    /// `ColorJitter(brightness, contrast, saturation, hue)`: each factor drawn per sample from
    /// `[max(0, 1 - x), 1 + x]` (hue from `[-x, x]`), a 0 leaving that op out, and the four
    /// applied in an order drawn per sample.
    ColorJitter {
        brightness: f64,
        contrast: f64,
        saturation: f64,
        hue: f64,
    },
    /// `RandomGrayscale(p)`: `grayscale` with probability `p`.
    RandomGrayscale(f64),
    /// `GaussianBlur(kernel, sigma=(a, b))`: sigma drawn per sample from `[a, b]`, the image
    /// padded by reflection and blurred with a `kernel`×`kernel` Gaussian, rounded.
    GaussianBlur { kernel: u32, sigma: (f64, f64) },
    /// `rotate(angle)`: turned counter-clockwise by the angle in degrees about the centre,
    /// nearest neighbour, the corners it uncovers 0.
    Rotate(f64),
    /// `affine(shear=[degrees(atan(s)), 0], center=[0, 0])`, RandAugment's `ShearX`: each row
    /// slid by `s` times its distance from the top, nearest neighbour, fill 0.
    ShearX(f64),
    /// RandAugment's `ShearY`: each column slid by `s` times its distance from the left.
    ShearY(f64),
    /// `affine(translate=[t, 0])`: moved right by `t` pixels (left when negative), fill 0.
    TranslateX(i32),
    /// `affine(translate=[0, t])`: moved down by `t` pixels (up when negative), fill 0.
    TranslateY(i32),
    /// `RandAugment(num_ops=n, magnitude=m, num_magnitude_bins=bins)`: `n` ops drawn per
    /// sample from its 14, each at magnitude bin `m`, its sign drawn.
    RandAugment { n: u32, m: u32, bins: u32 },
    /// `TrivialAugmentWide(num_magnitude_bins=bins)`: one op of its 14 and one magnitude bin,
    /// drawn per sample.
    TrivialAugment { bins: u32 },
    /// `AutoAugment(AutoAugmentPolicy.IMAGENET)`: one of the policy's 25 pairs, each op of the
    /// pair applied with its probability.
    AutoAugment,
    /// `RandomErasing(p, scale, ratio, value)`: with probability `p`, a rectangle of the
    /// image erased.
    RandomErasing(Erasing),
}

/// `random_erasing`'s arguments: torchvision's `RandomErasing`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Erasing {
    pub p: f64,
    /// The erased area's share of the image, drawn from `[a, b]`.
    pub scale: (f64, f64),
    /// Its aspect ratio, drawn log-uniformly from `[a, b]`.
    pub ratio: (f64, f64),
    pub value: EraseValue,
}

/// What an erased rectangle holds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum EraseValue {
    /// One value in every channel: a byte (0..=255) before `normalize`, a normalized value
    /// after it.
    Constant(f64),
    /// Per-pixel normal noise, N(0, 1) in normalized units (timm's `re_mode="pixel"`); before
    /// `normalize`, the bytes that `normalize` maps to that noise.
    Random,
}

impl fmt::Display for Erasing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "random_erasing p={} scale={},{} ratio={},{} value=",
            self.p, self.scale.0, self.scale.1, self.ratio.0, self.ratio.1
        )?;
        match self.value {
            EraseValue::Constant(v) => write!(f, "{v}"),
            EraseValue::Random => f.write_str("random"),
        }
    }
}

impl PixelOp {
    /// The op's name in the grammar.
    pub fn name(&self) -> &'static str {
        match self {
            PixelOp::Brightness(_) => "brightness",
            PixelOp::Contrast(_) => "contrast",
            PixelOp::Saturation(_) => "saturation",
            PixelOp::Hue(_) => "hue",
            PixelOp::Solarize(_) => "solarize",
            PixelOp::Posterize(_) => "posterize",
            PixelOp::Equalize => "equalize",
            PixelOp::Autocontrast => "autocontrast",
            PixelOp::Sharpness(_) => "sharpness",
            PixelOp::Invert => "invert",
            PixelOp::Grayscale => "grayscale",
            PixelOp::ColorJitter { .. } => "color_jitter",
            PixelOp::RandomGrayscale(_) => "random_grayscale",
            PixelOp::GaussianBlur { .. } => "gaussian_blur",
            PixelOp::Rotate(_) => "rotate",
            PixelOp::ShearX(_) => "shear_x",
            PixelOp::ShearY(_) => "shear_y",
            PixelOp::TranslateX(_) => "translate_x",
            PixelOp::TranslateY(_) => "translate_y",
            PixelOp::RandAugment { .. } => "rand_augment",
            PixelOp::TrivialAugment { .. } => "trivial_augment",
            PixelOp::AutoAugment => "auto_augment",
            PixelOp::RandomErasing(_) => "random_erasing",
        }
    }

    /// Whether the op draws from the sample's random stream.
    pub fn is_random(&self) -> bool {
        matches!(
            self,
            PixelOp::ColorJitter { .. }
                | PixelOp::RandomGrayscale(_)
                | PixelOp::GaussianBlur { .. }
                | PixelOp::RandAugment { .. }
                | PixelOp::TrivialAugment { .. }
                | PixelOp::AutoAugment
                | PixelOp::RandomErasing(_)
        )
    }

    /// Whether the op is rotate, shear or translate: one that moves pixels.
    pub fn is_affine(&self) -> bool {
        matches!(
            self,
            PixelOp::Rotate(_)
                | PixelOp::ShearX(_)
                | PixelOp::ShearY(_)
                | PixelOp::TranslateX(_)
                | PixelOp::TranslateY(_)
        )
    }

    /// The names of the pixel ops in the grammar: [`OPS`] between `hflip` and `normalize`.
    pub const NAMES: &'static [&'static str] = OPS.split_at(6).1.split_at(23).0;

    /// Op `name` (one of [`PixelOp::NAMES`]) with its arguments, checked.
    fn parse(name: &str, positional: &[&str], named: &[(&str, &str)]) -> Result<PixelOp, String> {
        let (keys, most): (&[&str], usize) = match name {
            "equalize" | "autocontrast" | "invert" | "grayscale" => (&[], 0),
            "color_jitter" => (&[], 4),
            "random_grayscale" => (&["p"], 0),
            "gaussian_blur" => (&["sigma"], 1),
            "rand_augment" => (&["n", "m", "bins"], 0),
            "trivial_augment" => (&["bins"], 0),
            "random_erasing" => (&["p", "scale", "ratio", "value"], 0),
            _ => (&[], 1),
        };
        if let Some((k, _)) = named.iter().find(|(k, _)| !keys.contains(k)) {
            return Err(format!("{name}: unknown argument {k:?}"));
        }
        if positional.len() > most {
            return Err(match most {
                0 => format!("{name} takes no argument (got {:?})", positional[0]),
                _ => format!("{name}: too many arguments"),
            });
        }
        let arg = positional.first().copied();
        let in_range = |a: &str, range: std::ops::RangeInclusive<f64>, what: &str| {
            a.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && range.contains(v))
                .ok_or_else(|| {
                    format!(
                        "{name}: {a} is not {what} in [{}, {}]",
                        range.start(),
                        range.end()
                    )
                })
        };
        let number = |range: std::ops::RangeInclusive<f64>, what: &str| -> Result<f64, String> {
            let a = arg.ok_or_else(|| format!("{name} needs {what}"))?;
            in_range(a, range, what)
        };
        // Factors above 1,000 only saturate every value: the bound keeps the arithmetic finite.
        let factor = |f: fn(f64) -> PixelOp| number(0.0..=1000.0, "a factor").map(f);
        let named_arg = |key: &str| named.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        Ok(match name {
            "brightness" => factor(PixelOp::Brightness)?,
            "contrast" => factor(PixelOp::Contrast)?,
            "saturation" => factor(PixelOp::Saturation)?,
            "sharpness" => factor(PixelOp::Sharpness)?,
            "hue" => PixelOp::Hue(number(-0.5..=0.5, "a hue factor")?),
            "solarize" => PixelOp::Solarize(number(0.0..=255.0, "a threshold")?),
            "posterize" => {
                let a = arg.ok_or_else(|| format!("{name} needs a number of bits"))?;
                let bits = a
                    .parse::<u8>()
                    .ok()
                    .filter(|b| *b <= 8)
                    .ok_or_else(|| format!("{name}: {a} is not a number of bits in [0, 8]"))?;
                PixelOp::Posterize(bits)
            }
            "equalize" => PixelOp::Equalize,
            "autocontrast" => PixelOp::Autocontrast,
            "invert" => PixelOp::Invert,
            "grayscale" => PixelOp::Grayscale,
            "color_jitter" => {
                let at = |i: usize, range: std::ops::RangeInclusive<f64>, what: &str| {
                    positional
                        .get(i)
                        .map_or(Ok(0.0), |a| in_range(a, range, what))
                };
                let amount = "an amount (brightness, contrast, saturation)";
                PixelOp::ColorJitter {
                    brightness: at(0, 0.0..=1000.0, amount)?,
                    contrast: at(1, 0.0..=1000.0, amount)?,
                    saturation: at(2, 0.0..=1000.0, amount)?,
                    hue: at(3, 0.0..=0.5, "a hue amount")?,
                }
            }
            "random_grayscale" => PixelOp::RandomGrayscale(match named_arg("p") {
                Some(p) => in_range(p, 0.0..=1.0, "a probability")?,
                None => 0.1,
            }),
            "gaussian_blur" => {
                let a = arg.ok_or_else(|| format!("{name} needs a kernel size"))?;
                let kernel = a
                    .parse::<u32>()
                    .ok()
                    .filter(|k| k % 2 == 1 && *k <= 255)
                    .ok_or_else(|| format!("{name}: {a} is not an odd kernel size in [1, 255]"))?;
                let sigma = match named_arg("sigma") {
                    Some(s) => parse_floats::<2>(s)
                        .filter(|[a, b]| 0.0 < *a && a <= b && *b <= 1000.0)
                        .ok_or_else(|| {
                            format!("{name}: sigma={s} is not A,B with 0 < A <= B <= 1000")
                        })?,
                    None => [0.1, 2.0],
                };
                PixelOp::GaussianBlur {
                    kernel,
                    sigma: (sigma[0], sigma[1]),
                }
            }
            "rotate" => PixelOp::Rotate(number(-360.0..=360.0, "an angle in degrees")?),
            "shear_x" | "shear_y" => {
                let s = number(-10.0..=10.0, "a shear (the tangent of its angle)")?;
                match name {
                    "shear_x" => PixelOp::ShearX(s),
                    _ => PixelOp::ShearY(s),
                }
            }
            "translate_x" | "translate_y" => {
                let a = arg.ok_or_else(|| format!("{name} needs a number of pixels"))?;
                let t = a
                    .parse::<i32>()
                    .ok()
                    .filter(|t| t.unsigned_abs() <= 16384)
                    .ok_or_else(|| {
                        format!("{name}: {a} is not a whole number of pixels in [-16384, 16384]")
                    })?;
                match name {
                    "translate_x" => PixelOp::TranslateX(t),
                    _ => PixelOp::TranslateY(t),
                }
            }
            "rand_augment" | "trivial_augment" => {
                let whole = |key: &str, default: u32, lo: u32, hi: u32| match named_arg(key) {
                    None if (lo..=hi).contains(&default) => Ok(default),
                    None => Err(format!(
                        "{name}: {key} defaults to {default}, outside [{lo}, {hi}]: give {key}="
                    )),
                    Some(v) => v
                        .parse::<u32>()
                        .ok()
                        .filter(|x| (lo..=hi).contains(x))
                        .ok_or_else(|| {
                            format!("{name}: {key}={v} is not a whole number in [{lo}, {hi}]")
                        }),
                };
                let bins = whole("bins", 31, 2, 1000)?;
                match name {
                    "trivial_augment" => PixelOp::TrivialAugment { bins },
                    _ => PixelOp::RandAugment {
                        n: whole("n", 2, 0, 16)?,
                        m: whole("m", 9, 0, bins - 1)?,
                        bins,
                    },
                }
            }
            "auto_augment" => match arg.unwrap_or("imagenet") {
                "imagenet" => PixelOp::AutoAugment,
                other => {
                    return Err(format!(
                        "{name}: policy {other:?} is not one Sluice has (imagenet)"
                    ))
                }
            },
            "random_erasing" => {
                let pair = |key: &str, default: [f64; 2], ok: fn(&[f64; 2]) -> bool, rule: &str| {
                    match named_arg(key) {
                        None => Ok((default[0], default[1])),
                        Some(v) => parse_floats::<2>(v)
                            .filter(ok)
                            .map(|[a, b]| (a, b))
                            .ok_or_else(|| format!("{name}: {key}={v} is not A,B with {rule}")),
                    }
                };
                let p = match named_arg("p") {
                    Some(p) => in_range(p, 0.0..=1.0, "a probability")?,
                    None => 0.5,
                };
                let scale = pair(
                    "scale",
                    [0.02, 0.33],
                    |[a, b]| 0.0 <= *a && a <= b && *b <= 1.0,
                    "0 <= A <= B <= 1",
                )?;
                let ratio = pair(
                    "ratio",
                    [0.3, 3.3],
                    |[a, b]| 0.0 < *a && a <= b && *b <= 1000.0,
                    "0 < A <= B <= 1000",
                )?;
                let value = match named_arg("value") {
                    None => EraseValue::Constant(0.0),
                    Some("random") => EraseValue::Random,
                    Some(v) => {
                        EraseValue::Constant(in_range(v, -1000.0..=1000.0, "a value (or random)")?)
                    }
                };
                PixelOp::RandomErasing(Erasing {
                    p,
                    scale,
                    ratio,
                    value,
                })
            }
            other => return Err(format!("{other} is not a pixel op")),
        })
    }
}

impl fmt::Display for PixelOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        match self {
            PixelOp::Brightness(v)
            | PixelOp::Contrast(v)
            | PixelOp::Saturation(v)
            | PixelOp::Hue(v)
            | PixelOp::Solarize(v)
            | PixelOp::Sharpness(v) => write!(f, " {v}"),
            PixelOp::Posterize(b) => write!(f, " {b}"),
            PixelOp::Equalize | PixelOp::Autocontrast | PixelOp::Invert | PixelOp::Grayscale => {
                Ok(())
            }
            PixelOp::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => write!(f, " {brightness} {contrast} {saturation} {hue}"),
            PixelOp::RandomGrayscale(p) => write!(f, " p={p}"),
            PixelOp::GaussianBlur { kernel, sigma } => {
                write!(f, " {kernel} sigma={},{}", sigma.0, sigma.1)
            }
            PixelOp::Rotate(v) | PixelOp::ShearX(v) | PixelOp::ShearY(v) => write!(f, " {v}"),
            PixelOp::TranslateX(t) | PixelOp::TranslateY(t) => write!(f, " {t}"),
            PixelOp::RandAugment { n, m, bins } => write!(f, " n={n} m={m} bins={bins}"),
            PixelOp::TrivialAugment { bins } => write!(f, " bins={bins}"),
            PixelOp::AutoAugment => f.write_str(" imagenet"),
            // The name again, from Erasing's Display: written without it here.
            PixelOp::RandomErasing(e) => {
                let text = e.to_string();
                f.write_str(text.strip_prefix("random_erasing").unwrap_or(&text))
            }
        }
    }
}

/// One geometric or flip op, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    RandomResizedCrop {
        h: u32,
        w: u32,
        scale: (f64, f64),
        ratio: (f64, f64),
    },
    CenterCrop {
        h: u32,
        w: u32,
    },
    /// Resize the shorter side to this length, keeping the aspect ratio.
    ResizeShorter(u32),
    /// Resize to exactly this size.
    Resize {
        h: u32,
        w: u32,
    },
    HFlip(f64),
}

/// Output element type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DType {
    #[default]
    U8,
    F16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

/// Per-channel normalization `(x / 255 - mean) / std`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Normalize {
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub dtype: DType,
}

/// Where a clip's frames start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClipStart {
    /// Drawn from the seed, the epoch and the sample.
    #[default]
    Random,
    /// The window's centre on the clip's centre (evaluation; `shuffle="none"`).
    Center,
}

/// `clip N stride=S start=...`: which frames of a clip become its tensor. A clip shorter than
/// `(N-1)·S+1` frames starts at its first frame and repeats its last to fill the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clip {
    pub frames: u32,
    pub stride: u32,
    pub start: ClipStart,
    /// `start` was written out (a loader that does not shuffle leaves an explicit choice).
    pub explicit_start: bool,
}

impl Clip {
    /// The most frames `clip` takes.
    pub const MAX_FRAMES: u32 = 1024;

    /// Frames the window spans in the source: `(N-1)·S+1`.
    pub fn span(&self) -> u64 {
        u64::from(self.frames.saturating_sub(1)) * u64::from(self.stride) + 1
    }

    /// The window's frames in a clip of `total` frames, `draw` giving a uniform number in
    /// `0..n` for the random start (its source frames: [`crate::ClipFrames::indices`]).
    pub fn window(&self, total: u32, draw: impl FnOnce(u64) -> u64) -> crate::ClipFrames {
        crate::ClipFrames {
            first: self.first(total, draw),
            stride: self.stride,
            count: self.frames,
            total,
        }
    }

    /// The first frame of the window in a clip of `total` frames, `draw` giving a uniform
    /// number in `0..n` for the random start.
    pub fn first(&self, total: u32, draw: impl FnOnce(u64) -> u64) -> u32 {
        let room = u64::from(total).saturating_sub(self.span());
        if u64::from(total) < self.span() {
            return 0;
        }
        match self.start {
            ClipStart::Center => (room / 2) as u32,
            ClipStart::Random => draw(room + 1) as u32,
        }
    }
}

/// A parsed, validated pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineSpec {
    /// The field holding the image; `None` picks the first of jpg, jpeg, png, webp, img (of
    /// mjpeg, mjpg for a clip).
    pub field: Option<String>,
    /// The pipeline makes clips: which frames.
    pub clip: Option<Clip>,
    pub ops: Vec<Op>,
    /// The pixel ops, in order, after the geometry.
    pub pixels: Vec<PixelOp>,
    /// `hflip` written after this many pixel ops (timm's and the issue's recipes put it after
    /// `rand_augment`): drawn with the geometry, as the last of [`PipelineSpec::ops`], and
    /// applied at that place among the pixel ops. `None`: in the geometry, before them.
    pub flip_after: Option<usize>,
    pub normalize: Option<Normalize>,
    /// `random_erasing` after `normalize` (or `chw`): on the finished tensor, in its dtype
    /// and layout.
    pub erasing: Option<Erasing>,
    /// Channels first (CHW) instead of HWC.
    pub chw: bool,
}

/// Why a spec is invalid; the message names the op.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid pipeline spec {spec:?}: {detail}")]
pub struct SpecError {
    pub spec: String,
    pub detail: String,
}

impl PipelineSpec {
    /// The output (height, width): fixed by the last crop or exact resize.
    pub fn output_size(&self) -> Option<(u32, u32)> {
        self.ops
            .iter()
            .rev()
            .find_map(|op| match op {
                Op::RandomResizedCrop { h, w, .. }
                | Op::CenterCrop { h, w }
                | Op::Resize { h, w } => Some((*h, *w)),
                Op::ResizeShorter(_) => Some((0, 0)),
                Op::HFlip(_) => None,
            })
            .filter(|&(h, w)| h > 0 && w > 0)
    }

    /// Whether a sample draws for its pixel ops (a seed of their own, after the geometry).
    pub fn draws_pixels(&self) -> bool {
        self.erasing.is_some() || self.pixels.iter().any(PixelOp::is_random)
    }

    pub fn dtype(&self) -> DType {
        self.normalize.as_ref().map_or(DType::U8, |n| n.dtype)
    }

    /// Bytes of one output tensor.
    pub fn output_bytes(&self) -> usize {
        let (h, w) = self.output_size().unwrap_or((0, 0));
        h as usize * w as usize * 3 * self.dtype().size() * self.frames() as usize
    }

    /// Frames in each output tensor: the clip's, 1 for an image.
    pub fn frames(&self) -> u32 {
        self.clip.map_or(1, |c| c.frames)
    }

    /// The shape of every tensor this pipeline makes, if it fixes one (it must, to batch).
    pub fn output_shape(&self) -> Option<crate::SampleShape> {
        let (height, width) = self.output_size()?;
        Some(crate::SampleShape {
            frames: self.frames(),
            height,
            width,
            channels: 3,
            elem_bytes: self.dtype().size() as u32,
            chw: self.chw,
        })
    }

    /// The output shape, checked to be fixed and to fit a frame of `max_payload` bytes: the
    /// rule a worker applies when a job opens and a client when its loader is built.
    pub fn shape_within(&self, max_payload: u64) -> Result<crate::SampleShape, SpecError> {
        let refuse = |detail: String| SpecError {
            spec: self.to_string(),
            detail,
        };
        let Some(shape) = self.output_shape() else {
            return Err(refuse(
                "it has no fixed output size, so its samples cannot be batched: end it with \
                 random_resized_crop, center_crop or an exact resize"
                    .into(),
            ));
        };
        if shape.bytes() > max_payload {
            let clip = match shape.frames {
                1 => String::new(),
                t => format!("{t}x"),
            };
            return Err(refuse(format!(
                "it makes {clip}{}x{}x3 tensors of {} bytes, over the largest frame a worker \
                 sends ({max_payload} bytes, limits.max_payload_bytes): choose a smaller output \
                 size{}",
                shape.height,
                shape.width,
                shape.bytes(),
                if shape.frames > 1 {
                    " or fewer frames"
                } else {
                    ""
                }
            )));
        }
        Ok(shape)
    }
}

fn parse_size(s: &str) -> Option<(u32, u32)> {
    let (h, w) = match s.split_once('x') {
        Some((h, w)) => (h.parse().ok()?, w.parse().ok()?),
        None => {
            let n = s.parse().ok()?;
            (n, n)
        }
    };
    (h > 0 && w > 0 && h <= 16384 && w <= 16384).then_some((h, w))
}

fn parse_floats<const N: usize>(s: &str) -> Option<[f64; N]> {
    let v: Vec<f64> = s
        .split(',')
        .map(|x| x.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .ok()?;
    let arr: [f64; N] = v.try_into().ok()?;
    arr.iter().all(|x| x.is_finite()).then_some(arr)
}

impl FromStr for PipelineSpec {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let err = |detail: String| SpecError {
            spec: text.to_string(),
            detail,
        };
        let mut spec = PipelineSpec {
            field: None,
            clip: None,
            ops: Vec::new(),
            pixels: Vec::new(),
            flip_after: None,
            normalize: None,
            erasing: None,
            chw: false,
        };
        let mut decoded = false;
        for (i, stage) in text.split('|').enumerate() {
            let mut words = stage.split_whitespace();
            let Some(name) = words.next() else {
                return Err(err(format!("stage {} is empty", i + 1)));
            };
            let mut positional = Vec::new();
            let mut named = Vec::new();
            for w in words {
                match w.split_once('=') {
                    Some((k, v)) => named.push((k, v)),
                    None => positional.push(w),
                }
            }
            let named_arg = |key: &str| named.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
            let allow = |keys: &[&str], max_pos: usize| -> Result<(), SpecError> {
                if let Some((k, _)) = named.iter().find(|(k, _)| !keys.contains(k)) {
                    return Err(err(format!("{name}: unknown argument {k:?}")));
                }
                if positional.len() > max_pos {
                    return Err(err(format!("{name}: too many arguments")));
                }
                Ok(())
            };
            if i == 0 && name != "decode" {
                return Err(err("the pipeline must start with decode".into()));
            }
            let finished = spec.normalize.is_some() || spec.chw;
            if name == "random_erasing" && finished {
                // On the finished tensor, as torchvision's recipes put it.
                if spec.erasing.is_some() {
                    return Err(err("random_erasing appears twice after normalize".into()));
                }
                match PixelOp::parse(name, &positional, &named).map_err(err)? {
                    PixelOp::RandomErasing(e) => spec.erasing = Some(e),
                    _ => unreachable!("random_erasing parses to RandomErasing"),
                }
                continue;
            }
            if spec.normalize.is_some() && name != "chw" {
                return Err(err(format!(
                    "{name} after normalize: normalize comes last (before chw; only \
                     random_erasing may follow it)"
                )));
            }
            if spec.chw {
                return Err(err(format!(
                    "{name} after chw: chw comes last (only random_erasing may follow it)"
                )));
            }
            let geometric = ["random_resized_crop", "center_crop", "resize"];
            if let (Some(last), true) = (spec.pixels.last(), geometric.contains(&name)) {
                return Err(err(format!(
                    "{name} after {}: the pixel ops come after the geometry",
                    last.name()
                )));
            }
            let flips = spec
                .ops
                .iter()
                .filter(|op| matches!(op, Op::HFlip(_)))
                .count();
            if name == "hflip"
                && (flips > 0 && !spec.pixels.is_empty() || spec.flip_after.is_some())
            {
                return Err(err(
                    "hflip after a pixel op: only a pipeline's one hflip may follow the pixel ops"
                        .into(),
                ));
            }
            if name == "hflip" && !spec.pixels.is_empty() {
                spec.flip_after = Some(spec.pixels.len());
            }
            if PixelOp::NAMES.contains(&name) {
                let op = PixelOp::parse(name, &positional, &named).map_err(err)?;
                spec.pixels.push(op);
                continue;
            }
            let size = |what: &str| -> Result<(u32, u32), SpecError> {
                positional
                    .first()
                    .and_then(|s| parse_size(s))
                    .ok_or_else(|| err(format!("{what} needs a size N or HxW (1..16384)")))
            };
            match name {
                "decode" => {
                    allow(&["field"], 0)?;
                    if decoded {
                        return Err(err("decode appears twice".into()));
                    }
                    decoded = true;
                    spec.field = named_arg("field").map(str::to_string);
                }
                "clip" => {
                    allow(&["stride", "start"], 1)?;
                    if i != 1 {
                        return Err(err("clip comes right after decode".into()));
                    }
                    let frames = positional
                        .first()
                        .and_then(|s| s.parse::<u32>().ok())
                        .filter(|n| (1..=Clip::MAX_FRAMES).contains(n))
                        .ok_or_else(|| {
                            err(format!(
                                "clip needs a frame count N (1..{})",
                                Clip::MAX_FRAMES
                            ))
                        })?;
                    let stride = match named_arg("stride") {
                        Some(s) => s
                            .parse::<u32>()
                            .ok()
                            .filter(|s| (1..=1024).contains(s))
                            .ok_or_else(|| err(format!("clip: stride={s} is not 1..1024")))?,
                        None => 1,
                    };
                    let start = match named_arg("start") {
                        None | Some("random") => ClipStart::Random,
                        Some("center") => ClipStart::Center,
                        Some(other) => {
                            return Err(err(format!("clip: start={other} is not random or center")))
                        }
                    };
                    spec.clip = Some(Clip {
                        frames,
                        stride,
                        start,
                        explicit_start: named_arg("start").is_some(),
                    });
                }
                "random_resized_crop" => {
                    allow(&["scale", "ratio"], 1)?;
                    let (h, w) = size(name)?;
                    let scale = match named_arg("scale") {
                        Some(s) => parse_floats::<2>(s)
                            .ok_or_else(|| err(format!("{name}: scale={s} is not A,B")))?,
                        None => [0.08, 1.0],
                    };
                    let ratio = match named_arg("ratio") {
                        Some(s) => parse_floats::<2>(s)
                            .ok_or_else(|| err(format!("{name}: ratio={s} is not A,B")))?,
                        None => [3.0 / 4.0, 4.0 / 3.0],
                    };
                    if !(0.0 < scale[0] && scale[0] <= scale[1] && scale[1] <= 1.0) {
                        return Err(err(format!("{name}: scale must satisfy 0 < A <= B <= 1")));
                    }
                    if !(0.0 < ratio[0] && ratio[0] <= ratio[1]) {
                        return Err(err(format!("{name}: ratio must satisfy 0 < A <= B")));
                    }
                    spec.ops.push(Op::RandomResizedCrop {
                        h,
                        w,
                        scale: (scale[0], scale[1]),
                        ratio: (ratio[0], ratio[1]),
                    });
                }
                "center_crop" => {
                    allow(&[], 1)?;
                    let (h, w) = size(name)?;
                    spec.ops.push(Op::CenterCrop { h, w });
                }
                "resize" => {
                    allow(&[], 1)?;
                    let arg = positional.first().copied().unwrap_or("");
                    let (h, w) = size(name)?;
                    spec.ops.push(if arg.contains('x') {
                        Op::Resize { h, w }
                    } else {
                        Op::ResizeShorter(h)
                    });
                }
                "hflip" => {
                    allow(&[], 1)?;
                    let p = match positional.first() {
                        Some(p) => p
                            .parse::<f64>()
                            .ok()
                            .filter(|p| (0.0..=1.0).contains(p))
                            .ok_or_else(|| {
                                err(format!("hflip: probability {p} is not in [0, 1]"))
                            })?,
                        None => 0.5,
                    };
                    spec.ops.push(Op::HFlip(p));
                }
                "normalize" => {
                    allow(&["mean", "std", "dtype"], 0)?;
                    let triple = |key: &str| -> Result<[f32; 3], SpecError> {
                        let v = named_arg(key)
                            .and_then(parse_floats::<3>)
                            .ok_or_else(|| err(format!("normalize needs {key}=R,G,B")))?;
                        Ok(v.map(|x| x as f32))
                    };
                    let (mean, std) = (triple("mean")?, triple("std")?);
                    if std.iter().any(|s| *s <= 0.0) {
                        return Err(err("normalize: std must be positive".into()));
                    }
                    let dtype = match named_arg("dtype").unwrap_or("f32") {
                        "f32" => DType::F32,
                        "f16" => DType::F16,
                        other => {
                            return Err(err(format!(
                                "normalize: dtype {other:?} is not f32 or f16"
                            )))
                        }
                    };
                    spec.normalize = Some(Normalize { mean, std, dtype });
                }
                "chw" => {
                    allow(&[], 0)?;
                    spec.chw = true;
                }
                other => {
                    return Err(err(format!(
                        "unknown op {other:?}; the ops are {} (docs/pipeline.md)",
                        OPS.join(", ")
                    )))
                }
            }
        }
        if spec.output_size().is_none() {
            return Err(err(
                "the output size is not fixed: end the geometry with random_resized_crop, center_crop or resize HxW".into(),
            ));
        }
        // An erasing on bytes: among the pixel ops, or after a `chw` with no `normalize`.
        let on_bytes = spec.pixels.iter().filter_map(|op| match op {
            PixelOp::RandomErasing(e) => Some(e),
            _ => None,
        });
        let on_bytes = on_bytes.chain(spec.erasing.iter().filter(|_| spec.normalize.is_none()));
        for e in on_bytes {
            match e.value {
                EraseValue::Random if spec.normalize.is_none() => {
                    return Err(err(
                        "random_erasing: value=random is noise in normalized units: put it \
                         after normalize, or normalize after it"
                            .into(),
                    ))
                }
                EraseValue::Constant(v) if !(0.0..=255.0).contains(&v) || v.fract() != 0.0 => {
                    return Err(err(format!(
                        "random_erasing: value={v} before normalize is a byte, a whole number \
                         in [0, 255]"
                    )))
                }
                _ => {}
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for PipelineSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "decode field={field}")?,
            None => f.write_str("decode")?,
        }
        if let Some(c) = &self.clip {
            write!(f, " | clip {} stride={}", c.frames, c.stride)?;
            if c.explicit_start {
                let start = match c.start {
                    ClipStart::Random => "random",
                    ClipStart::Center => "center",
                };
                write!(f, " start={start}")?;
            }
        }
        let late_flip = self.flip_after.and_then(|at| {
            let flip = self.ops.iter().rev().find_map(|op| match op {
                Op::HFlip(p) => Some(*p),
                _ => None,
            })?;
            Some((at, flip))
        });
        for op in &self.ops {
            if let (Op::HFlip(_), Some(_)) = (op, late_flip) {
                continue;
            }
            match op {
                Op::RandomResizedCrop { h, w, scale, ratio } => write!(
                    f,
                    " | random_resized_crop {h}x{w} scale={},{} ratio={},{}",
                    scale.0, scale.1, ratio.0, ratio.1
                )?,
                Op::CenterCrop { h, w } => write!(f, " | center_crop {h}x{w}")?,
                Op::ResizeShorter(s) => write!(f, " | resize {s}")?,
                Op::Resize { h, w } => write!(f, " | resize {h}x{w}")?,
                Op::HFlip(p) => write!(f, " | hflip {p}")?,
            }
        }
        for (i, op) in self.pixels.iter().enumerate() {
            if let Some((_, p)) = late_flip.filter(|(at, _)| *at == i) {
                write!(f, " | hflip {p}")?;
            }
            write!(f, " | {op}")?;
        }
        if let Some((_, p)) = late_flip.filter(|(at, _)| *at == self.pixels.len()) {
            write!(f, " | hflip {p}")?;
        }
        if let Some(n) = &self.normalize {
            let dtype = if n.dtype == DType::F16 { "f16" } else { "f32" };
            let [m0, m1, m2] = n.mean;
            let [s0, s1, s2] = n.std;
            write!(
                f,
                " | normalize mean={m0},{m1},{m2} std={s0},{s1},{s2} dtype={dtype}"
            )?;
        }
        if let Some(e) = &self.erasing {
            write!(f, " | {e}")?;
        }
        if self.chw {
            f.write_str(" | chw")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
            let spec: PipelineSpec = text.parse().unwrap();
            let again: PipelineSpec = spec.to_string().parse().unwrap();
            assert_eq!(spec, again, "{text}");
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
            let spec: PipelineSpec = text.parse().unwrap();
            let again: PipelineSpec = spec.to_string().parse().unwrap();
            assert_eq!(spec, again, "{text}");
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
}

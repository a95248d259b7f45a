//! The ops on the pixels of the uint8 RGB output ([`PixelOp`]) and `random_erasing`
//! ([`Erasing`]): their arguments, checks and text in the grammar.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{parse_floats, OPS};

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
    pub(super) fn parse(
        name: &str,
        positional: &[&str],
        named: &[(&str, &str)],
    ) -> Result<PixelOp, String> {
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

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

mod pixel;
pub use pixel::{EraseValue, Erasing, PixelOp};

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
mod tests;

//! JPEG decoding through libjpeg-turbo's TurboJPEG 3 API (built from source by
//! `turbojpeg-sys`, SIMD included), wrapped safely.
//!
//! Why libjpeg-turbo: it is the fastest decoder on this corpus, and it can decode only a
//! region of the image (`tj3SetCroppingRegion`: rows outside are skipped, columns outside are
//! not colour-converted) and scale in the DCT domain (1/8 … 8/8). A random-resized crop keeps
//! on average about half of the image, so decoding only the crop window is the largest saving
//! left once the decoder itself is fast.
//!
//! Hardening (DESIGN.md, "JPEG decoders panic and accept damage"): the pixel limit is checked
//! from the header before any buffer is sized, TurboJPEG's own pixel and progressive-scan
//! limits are set, warnings (such as "premature end of data") are errors, and the data must
//! end with an EOI marker, so a truncated file cannot pass as an image with a grey bottom.

use std::ffi::CStr;

use turbojpeg_sys as tj;

use crate::error::DecodeError;

/// A rectangle in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

/// What the header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JpegHeader {
    pub width: u32,
    pub height: u32,
    /// TurboJPEG subsampling code (`TJSAMP_*`), or -1 when unknown.
    pub subsamp: i32,
    /// Stored as CMYK or YCCK (converted to RGB by us).
    pub cmyk: bool,
}

/// A decoded region: `rect` in the scaled image's coordinates, RGB rows packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub rect: Rect,
    /// The DCT scale numerator (denominator 8).
    pub scale_num: u32,
}

/// Bounds on what one image may cost.
#[derive(Clone, Copy, Debug)]
pub struct DecodeLimits {
    pub max_pixels: u64,
    pub max_progressive_scans: u32,
    /// The most frames a clip field may hold (a longer one is a named skip).
    pub max_clip_frames: u32,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_pixels: 40_000_000,
            max_progressive_scans: 100,
            max_clip_frames: 10_000,
        }
    }
}

/// A TurboJPEG decompressor. One per thread; it is reused across images.
pub struct JpegDecoder {
    handle: tj::tjhandle,
    limits: DecodeLimits,
    cmyk_scratch: Vec<u8>,
    /// The rows below a restart marker, as a JPEG of their own (see [`crate::restart`]).
    sub: Vec<u8>,
}

// The handle is owned exclusively and TurboJPEG handles may move between threads.
unsafe impl Send for JpegDecoder {}

impl Drop for JpegDecoder {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.handle) }
    }
}

/// iMCU width per TurboJPEG subsampling code (444, 422, 420, gray, 440, 411, 441): a
/// `static` in turbojpeg.h, so not a linkable symbol.
const MCU_WIDTH: [u32; 7] = [8, 16, 16, 8, 8, 32, 8];

/// `TJSCALED(dim, num/8)`.
pub fn scaled(dim: u32, num: u32) -> u32 {
    (dim * num).div_ceil(8)
}

/// Whether `data` ends with an EOI marker (allowing trailing padding bytes).
pub fn has_eoi(data: &[u8]) -> bool {
    let tail = &data[data.len().saturating_sub(4096)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

/// Whether `data` has a frame header (SOF0–SOF15, not DHT, JPG or DAC) before its first scan
/// (SOS) or its end (EOI), walking the marker segments by their lengths. Anything it cannot
/// walk (no SOI, a stray byte, a segment past the end) counts as having one: TurboJPEG then
/// reads the stream and names what is wrong itself.
pub fn has_frame_header(data: &[u8]) -> bool {
    if !data.starts_with(&[0xFF, 0xD8]) {
        return true;
    }
    let mut i = 2;
    loop {
        if data.get(i) != Some(&0xFF) {
            return true;
        }
        while data.get(i + 1) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = data.get(i + 1) else {
            return true;
        };
        match code {
            0xC0..=0xCF if !matches!(code, 0xC4 | 0xC8 | 0xCC) => return true,
            0xDA | 0xD9 => return false,
            // Markers without a length.
            0x01 | 0xD0..=0xD7 => i += 2,
            _ => {
                let Some(len) = data.get(i + 2..i + 4) else {
                    return true;
                };
                let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
                if len < 2 {
                    return true;
                }
                i += 2 + len;
            }
        }
    }
}

impl JpegDecoder {
    pub fn new(limits: DecodeLimits) -> Result<Self, DecodeError> {
        let mut dec = JpegDecoder {
            handle: std::ptr::null_mut(),
            limits,
            cmyk_scratch: Vec::new(),
            sub: Vec::new(),
        };
        dec.init()?;
        Ok(dec)
    }

    /// (Re)creates the TurboJPEG handle. After a failed call a handle can stay in an error
    /// state (seen with libjpeg-turbo 3.1: every later header read repeats the old error), so
    /// a failure always starts the next image on a fresh handle.
    fn init(&mut self) -> Result<(), DecodeError> {
        // SAFETY: destroying null is a no-op; the old handle is not used again.
        unsafe { tj::tj3Destroy(self.handle) };
        // SAFETY: plain constructor; a null handle is checked.
        self.handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if self.handle.is_null() {
            return Err(DecodeError::Decoder("tj3Init failed".into()));
        }
        let limits = self.limits;
        let dec = &*self;
        let max_pixels = i32::try_from(limits.max_pixels).unwrap_or(i32::MAX);
        dec.set(tj::TJPARAM_TJPARAM_STOPONWARNING, 1)?;
        dec.set(tj::TJPARAM_TJPARAM_MAXPIXELS, max_pixels)?;
        dec.set(
            tj::TJPARAM_TJPARAM_SCANLIMIT,
            i32::try_from(limits.max_progressive_scans).unwrap_or(i32::MAX),
        )?;
        Ok(())
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<(), DecodeError> {
        // SAFETY: valid handle; TurboJPEG validates the parameter.
        if unsafe { tj::tj3Set(self.handle, param as i32, value) } != 0 {
            return Err(self.error());
        }
        Ok(())
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: valid handle.
        unsafe { tj::tj3Get(self.handle, param as i32) }
    }

    fn error(&self) -> DecodeError {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated static or per-handle buffer.
        let msg = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.handle)) };
        DecodeError::Corrupt(msg.to_string_lossy().into_owned())
    }

    /// The error of the last call, leaving a fresh handle for the next image.
    fn fail(&mut self) -> DecodeError {
        let err = self.error();
        if let Err(e) = self.init() {
            return e;
        }
        err
    }

    /// Reads the header; checks the pixel limit before anything is allocated. Everything it
    /// returns is this image's own: a stream with no frame header is refused before
    /// TurboJPEG reads it, since TurboJPEG reports success on one (a tables-only stream)
    /// and leaves the size, subsampling and colour space of the image before in place.
    pub fn header(&mut self, data: &[u8]) -> Result<JpegHeader, DecodeError> {
        if !has_frame_header(data) {
            return Err(DecodeError::Corrupt(
                "no frame header (SOF marker) before the first scan or the end: a tables-only \
                 stream or a damaged image"
                    .into(),
            ));
        }
        // SAFETY: the buffer pointer and length come from a live slice.
        if unsafe { tj::tj3DecompressHeader(self.handle, data.as_ptr(), data.len() as _) } != 0 {
            return Err(self.fail());
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 {
            return Err(DecodeError::Corrupt(format!("image size {width}x{height}")));
        }
        let (width, height) = (width as u32, height as u32);
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.limits.max_pixels {
            return Err(DecodeError::TooLarge {
                width,
                height,
                limit: self.limits.max_pixels,
            });
        }
        let cs = self.get(tj::TJPARAM_TJPARAM_COLORSPACE);
        Ok(JpegHeader {
            width,
            height,
            subsamp: self.get(tj::TJPARAM_TJPARAM_SUBSAMP),
            cmyk: cs == tj::TJCS_TJCS_CMYK as i32 || cs == tj::TJCS_TJCS_YCCK as i32,
        })
    }

    /// Decodes the part of the image covering `want` (in full-size pixel coordinates) at DCT
    /// scale `scale_num`/8 into `out` as packed RGB. The decoded rectangle (scaled
    /// coordinates) contains the scaled `want`; its left edge is aligned down to an iMCU
    /// column, as TurboJPEG requires. `header` must come from [`Self::header`] on `data`.
    pub fn decode_region(
        &mut self,
        data: &[u8],
        header: &JpegHeader,
        want: Rect,
        scale_num: u32,
        out: &mut Vec<u8>,
    ) -> Result<Decoded, DecodeError> {
        if !has_eoi(data) {
            return Err(DecodeError::Truncated);
        }
        if !(1..=8).contains(&scale_num) {
            return Err(DecodeError::Decoder(format!(
                "scale {scale_num}/8 is not 1/8..8/8"
            )));
        }
        // TurboJPEG matches factors in lowest terms (2/8 is 1/4).
        let g = [8, 4, 2, 1]
            .into_iter()
            .find(|g| scale_num % g == 0)
            .unwrap_or(1);
        let factor = tj::tjscalingfactor {
            num: (scale_num / g) as i32,
            denom: (8 / g) as i32,
        };
        let (sw, sh) = (
            scaled(header.width, scale_num),
            scaled(header.height, scale_num),
        );
        let full = Rect {
            x: 0,
            y: 0,
            w: sw,
            h: sh,
        };
        let rect = match usize::try_from(header.subsamp).ok().filter(|&s| s < 7) {
            Some(s) => {
                let mcu = scaled(MCU_WIDTH[s], scale_num).max(1);
                let x0 = (want.x * scale_num / 8) / mcu * mcu;
                let y0 = want.y * scale_num / 8;
                let x1 = scaled(want.x + want.w, scale_num).min(sw);
                let y1 = scaled(want.y + want.h, scale_num).min(sh);
                Rect {
                    x: x0,
                    y: y0,
                    w: x1.saturating_sub(x0).max(1),
                    h: y1.saturating_sub(y0).max(1),
                }
            }
            None => full,
        };
        // What lies outside the window is entropy-decoded unless restart markers let the
        // decoder skip it: then it decodes a JPEG of the intervals that cover the window and
        // `context` pixels around it. Fancy chroma upsampling replicates an image's edge rows
        // and columns where it would read past them; those are left outside the window, so
        // its pixels are those of a full decode.
        let context = 16 / scale_num;
        let mut sub = std::mem::take(&mut self.sub);
        let origin = match crate::restart::layout(data) {
            Some(l) if rect != full => {
                let around = (
                    want.x.saturating_sub(context),
                    want.y.saturating_sub(context),
                    (want.x + want.w + context).min(l.width),
                    (want.y + want.h + context).min(l.height),
                );
                crate::restart::sub_image(data, &l, around, &mut sub)
            }
            _ => None,
        };
        let result = match origin {
            Some((left, top)) => self.decode_from(
                &sub,
                header,
                factor,
                rect,
                full,
                (left * scale_num / 8, top * scale_num / 8),
                out,
            ),
            None => self.decode_from(data, header, factor, rect, full, (0, 0), out),
        };
        self.sub = sub;
        result.map(|()| Decoded { rect, scale_num })
    }

    /// Decodes `rect` (scaled coordinates of the whole image) of `src`, whose top left pixel
    /// is the image's scaled pixel `(left, top)`: the image itself (`(0, 0)`) or a
    /// [`crate::restart`] sub image of it.
    #[allow(clippy::too_many_arguments)]
    fn decode_from(
        &mut self,
        src: &[u8],
        header: &JpegHeader,
        factor: tj::tjscalingfactor,
        rect: Rect,
        full: Rect,
        (left, top): (u32, u32),
        out: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        // SAFETY: the buffer pointer and length come from a live slice.
        if (left, top) != (0, 0)
            && unsafe { tj::tj3DecompressHeader(self.handle, src.as_ptr(), src.len() as _) } != 0
        {
            return Err(self.fail());
        }
        // SAFETY: valid handle; the header of `src` was read on this handle.
        if unsafe { tj::tj3SetScalingFactor(self.handle, factor) } != 0 {
            return Err(self.fail());
        }
        let region = if rect == full {
            tj::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            }
        } else {
            tj::tjregion {
                x: (rect.x - left) as i32,
                y: (rect.y - top) as i32,
                w: rect.w as i32,
                h: rect.h as i32,
            }
        };
        // SAFETY: valid handle; the region lies within the scaled image.
        if unsafe { tj::tj3SetCroppingRegion(self.handle, region) } != 0 {
            return Err(self.fail());
        }
        let (w, h) = (rect.w as usize, rect.h as usize);
        // The decoder writes every byte of the region: a reused buffer keeps its old bytes
        // rather than being zeroed first.
        out.resize(w * h * 3, 0);
        if header.cmyk {
            self.cmyk_scratch.clear();
            self.cmyk_scratch.resize(w * h * 4, 0);
            // SAFETY: the destination holds w*h*4 bytes at pitch w*4.
            let rc = unsafe {
                tj::tj3Decompress8(
                    self.handle,
                    src.as_ptr(),
                    src.len() as _,
                    self.cmyk_scratch.as_mut_ptr(),
                    (w * 4) as i32,
                    tj::TJPF_TJPF_CMYK,
                )
            };
            if rc != 0 {
                return Err(self.fail());
            }
            // Adobe CMYK JPEGs store inverted values: R = C'·K'/255 (as Pillow converts).
            for (rgb, cmyk) in out
                .chunks_exact_mut(3)
                .zip(self.cmyk_scratch.chunks_exact(4))
            {
                let k = u32::from(cmyk[3]);
                for i in 0..3 {
                    rgb[i] = ((u32::from(cmyk[i]) * k + 127) / 255) as u8;
                }
            }
        } else {
            // SAFETY: the destination holds w*h*3 bytes at pitch w*3.
            let rc = unsafe {
                tj::tj3Decompress8(
                    self.handle,
                    src.as_ptr(),
                    src.len() as _,
                    out.as_mut_ptr(),
                    (w * 3) as i32,
                    tj::TJPF_TJPF_RGB,
                )
            };
            if rc != 0 {
                return Err(self.fail());
            }
        }
        Ok(())
    }
}

/// EXIF orientation (1–8) from a JPEG's APP1 segment, or 1 when absent or unreadable.
pub fn exif_orientation(data: &[u8]) -> u8 {
    let mut i = 2; // after SOI
    while i + 4 <= data.len() && data[i] == 0xFF {
        let marker = data[i + 1];
        if marker == 0xDA || marker == 0xD9 {
            break; // start of scan: no more metadata
        }
        let len = usize::from(u16::from_be_bytes([data[i + 2], data[i + 3]]));
        let end = i + 2 + len;
        if len < 2 || end > data.len() {
            break;
        }
        if marker == 0xE1 && data[i + 4..end].starts_with(b"Exif\0\0") {
            return tiff_orientation(&data[i + 10..end]).unwrap_or(1);
        }
        i = end;
    }
    1
}

fn tiff_orientation(tiff: &[u8]) -> Option<u8> {
    let le = match tiff.get(0..2)? {
        b"II" => true,
        b"MM" => false,
        _ => return None,
    };
    // An unsigned integer of `n` bytes at `o`, in the file's byte order.
    let int_at = |o: usize, n: usize| -> Option<u32> {
        let bytes = tiff.get(o..o.checked_add(n)?)?;
        let push = |v: u32, b: &u8| v << 8 | u32::from(*b);
        Some(match le {
            true => bytes.iter().rev().fold(0, push),
            false => bytes.iter().fold(0, push),
        })
    };
    let u16_at = |o: usize| int_at(o, 2).map(|v| v as u16);
    let u32_at = |o: usize| int_at(o, 4);
    let ifd = u32_at(4)? as usize;
    let count = usize::from(u16_at(ifd)?);
    for e in 0..count.min(512) {
        let at = ifd + 2 + e * 12;
        if u16_at(at)? == 0x0112 {
            let v = u16_at(at + 8)?;
            return (1..=8).contains(&v).then_some(v as u8);
        }
    }
    None
}

/// The restart interval, in MCUs, for a row of `mcus_per_row` MCUs: the smallest divisor of
/// it that leaves at most 32 intervals a row (every MCU on rows up to 512 pixels wide at
/// 4:2:0, so a window's columns can be decoded alone, for a few bytes a marker), or `None`
/// (a marker every row) when only 1 and the row divide it. On the ImageNet sample, `bench cpu
/// --threads 1`, three alternated runs each: at most 8 a row, 1,187-1,199 images/s, the files
/// 0.8% larger than without markers; 16, 1,220-1,222 and 1.2%; 32, 1,250-1,260 and 2.7%.
/// Decoding is the costly tier; the bytes are a few percent of what storage serves.
pub fn restart_interval(mcus_per_row: u32) -> Option<u32> {
    let least = mcus_per_row.div_ceil(32).max(1);
    (least..mcus_per_row).find(|d| mcus_per_row % d == 0)
}

/// `data` with restart markers up to 32 times a row ([`restart_interval`]; every MCU row when
/// its width allows no more), transformed losslessly (the same DCT coefficients, so every
/// decode gives the same pixels), for [`crate::restart`]'s seek index. `Ok(None)` for JPEGs
/// that it does not help: progressive, arithmetic-coded or lossless ones, and those that
/// already have a seek index. Extra markers
/// (EXIF, ICC) are kept; Huffman tables are optimized, so files barely grow.
pub fn with_restart_markers(
    data: &[u8],
    limits: DecodeLimits,
) -> Result<Option<Vec<u8>>, DecodeError> {
    if crate::restart::layout(data).is_some() {
        return Ok(None);
    }
    struct Handle(tj::tjhandle);
    impl Drop for Handle {
        fn drop(&mut self) {
            // SAFETY: the handle came from tj3Init and is destroyed once.
            unsafe { tj::tj3Destroy(self.0) }
        }
    }
    // SAFETY: plain constructor; a null handle is checked.
    let h = Handle(unsafe { tj::tj3Init(tj::TJINIT_TJINIT_TRANSFORM as i32) });
    if h.0.is_null() {
        return Err(DecodeError::Decoder("tj3Init failed".into()));
    }
    let error = |h: &Handle| {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated static or per-handle buffer.
        let msg = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(h.0)) };
        DecodeError::Corrupt(msg.to_string_lossy().into_owned())
    };
    let set = |param: tj::TJPARAM, value: i32| {
        // SAFETY: valid handle; TurboJPEG checks the parameter and value.
        match unsafe { tj::tj3Set(h.0, param as i32, value) } {
            0 => Ok(()),
            _ => Err(error(&h)),
        }
    };
    set(tj::TJPARAM_TJPARAM_STOPONWARNING, 1)?;
    set(
        tj::TJPARAM_TJPARAM_MAXPIXELS,
        i32::try_from(limits.max_pixels).unwrap_or(i32::MAX),
    )?;
    // SAFETY: the buffer pointer and length come from a live slice.
    if unsafe { tj::tj3DecompressHeader(h.0, data.as_ptr(), data.len() as _) } != 0 {
        return Err(error(&h));
    }
    // SAFETY: valid handle after a header read.
    let get = |param: tj::TJPARAM| unsafe { tj::tj3Get(h.0, param as i32) };
    if get(tj::TJPARAM_TJPARAM_PROGRESSIVE) == 1
        || get(tj::TJPARAM_TJPARAM_ARITHMETIC) == 1
        || get(tj::TJPARAM_TJPARAM_LOSSLESS) == 1
    {
        return Ok(None);
    }
    let subsamp = usize::try_from(get(tj::TJPARAM_TJPARAM_SUBSAMP)).ok();
    let mcu_w = subsamp.and_then(|s| MCU_WIDTH.get(s)).copied();
    let width = u32::try_from(get(tj::TJPARAM_TJPARAM_JPEGWIDTH)).unwrap_or(0);
    match mcu_w.map(|w| restart_interval(width.div_ceil(w))) {
        Some(Some(mcus)) => set(tj::TJPARAM_TJPARAM_RESTARTBLOCKS, mcus as i32)?,
        _ => set(tj::TJPARAM_TJPARAM_RESTARTROWS, 1)?,
    }
    set(tj::TJPARAM_TJPARAM_OPTIMIZE, 1)?;
    let transform = whole_image(0);
    let mut dst: *mut u8 = std::ptr::null_mut();
    let mut size: tj::size_t = 0;
    // SAFETY: one transform, one destination; TurboJPEG allocates `dst` (freed below).
    let rc = unsafe {
        tj::tj3Transform(
            h.0,
            data.as_ptr(),
            data.len() as _,
            1,
            &mut dst,
            &mut size,
            &transform,
        )
    };
    let out = if rc == 0 && !dst.is_null() {
        // SAFETY: TurboJPEG wrote `size` bytes at `dst`.
        Ok(Some(
            unsafe { std::slice::from_raw_parts(dst, size as usize) }.to_vec(),
        ))
    } else {
        Err(error(&h))
    };
    // SAFETY: `dst` came from TurboJPEG's allocator (or is null).
    unsafe { tj::tj3Free(dst.cast()) };
    out
}

/// Entropy decoding alone: every DCT coefficient of a JPEG read (libjpeg-turbo's
/// `jpeg_read_coefficients`, through a lossless transform that writes nothing), with no IDCT,
/// colour conversion or resize. No decoder of whole images can beat its rate per core, so
/// `sluice bench cpu` prints the engine's rate as a fraction of it.
pub struct EntropyReader {
    handle: tj::tjhandle,
}

// The handle is owned exclusively and TurboJPEG handles may move between threads.
unsafe impl Send for EntropyReader {}

impl Drop for EntropyReader {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.handle) }
    }
}

impl EntropyReader {
    pub fn new() -> Result<Self, DecodeError> {
        // SAFETY: plain constructor; a null handle is checked.
        let handle = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_TRANSFORM as i32) };
        if handle.is_null() {
            return Err(DecodeError::Decoder("tj3Init (transform) failed".into()));
        }
        Ok(EntropyReader { handle })
    }

    /// Reads every coefficient of `data`; `Err` names what is wrong with it. After an error
    /// the next image starts on a fresh handle (as [`JpegDecoder`] does).
    pub fn read(&mut self, data: &[u8]) -> Result<(), DecodeError> {
        match self.transform(data, &whole_image(tj::TJXOPT_NOOUTPUT as i32))? {
            None => Ok(()),
            Some(warning) => Err(DecodeError::Corrupt(warning)),
        }
    }

    /// Runs `transform` over `data`: `Ok(Some(warning))` when it read everything but
    /// libjpeg-turbo warned (of damage it read past), `Err` when it stopped.
    fn transform(
        &mut self,
        data: &[u8],
        transform: &tj::tjtransform,
    ) -> Result<Option<String>, DecodeError> {
        let mut out: *mut u8 = std::ptr::null_mut();
        let mut size = 0;
        // SAFETY: the input is a live slice; one transform and one output slot, which
        // TJXOPT_NOOUTPUT leaves unallocated (freed below if it is not).
        let rc = unsafe {
            tj::tj3Transform(
                self.handle,
                data.as_ptr(),
                data.len() as _,
                1,
                &mut out,
                &mut size,
                transform,
            )
        };
        if !out.is_null() {
            // SAFETY: allocated by TurboJPEG for this call.
            unsafe { tj::tj3Free(out.cast()) };
        }
        if rc == 0 {
            return Ok(None);
        }
        // SAFETY: a NUL-terminated static or per-handle buffer.
        let msg = unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.handle)) };
        let msg = msg.to_string_lossy().into_owned();
        // SAFETY: a valid handle; reads the kind of its last error.
        let warning = unsafe { tj::tj3GetErrorCode(self.handle) } == tj::TJERR_TJERR_WARNING as i32;
        *self = EntropyReader::new()?;
        match warning {
            true => Ok(Some(msg)),
            false => Err(DecodeError::Corrupt(msg)),
        }
    }
}

extern "C" {
    /// In the vendored libjpeg-turbo (`vendor/README.md`): whether this thread's decoders keep
    /// the fast Huffman path in scans with restart markers.
    fn sluice_jdhuff_restart_fast(on: std::ffi::c_int);
}

/// Whether JPEGs this thread decodes from now on keep libjpeg-turbo's fast Huffman path in
/// scans with restart markers: Sluice's patch to the vendored decoder (`vendor/README.md`),
/// on unless turned off. Off, the thread decodes them as upstream libjpeg-turbo does, on
/// the slow path throughout, so tests and `sluice bench cpu` can hold the two side by side.
pub fn restart_fast_path(on: bool) {
    // SAFETY: sets a thread-local int in the vendored decoder; no other effect.
    unsafe { sluice_jdhuff_restart_fast(std::ffi::c_int::from(on)) }
}

/// Every DCT coefficient of a JPEG, component by component, each in block-row order (64 a
/// block, as libjpeg-turbo keeps them): what entropy decoding produced, before any IDCT,
/// read through damage as libjpeg-turbo does, with the last warning it gave. The tests
/// compare the patched decoder's with upstream's on them.
pub fn coefficients(data: &[u8]) -> Result<(Vec<i16>, Option<String>), DecodeError> {
    unsafe extern "C" fn append(
        coeffs: *mut std::ffi::c_short,
        array: tj::tjregion,
        _plane: tj::tjregion,
        _component: std::ffi::c_int,
        _transform_id: std::ffi::c_int,
        transform: *mut tj::tjtransform,
    ) -> std::ffi::c_int {
        // SAFETY: TurboJPEG hands one block row: `array.w` coefficient columns (8 a block)
        // times `array.h` (8) rows, contiguous, and `data` is the Vec `coefficients` owns.
        unsafe {
            let out = &mut *(*transform).data.cast::<Vec<i16>>();
            let n = array.w as usize * array.h as usize;
            out.extend_from_slice(std::slice::from_raw_parts(coeffs, n));
        }
        0
    }
    let mut reader = EntropyReader::new()?;
    let mut out: Vec<i16> = Vec::new();
    let mut transform = whole_image(tj::TJXOPT_NOOUTPUT as i32);
    transform.data = (&mut out as *mut Vec<i16>).cast();
    transform.customFilter = Some(append);
    let warning = reader.transform(data, &transform)?;
    Ok((out, warning))
}

/// A lossless transform of the whole image, as it is (no crop, flip or rotation), with
/// TurboJPEG's `options`.
fn whole_image(options: i32) -> tj::tjtransform {
    tj::tjtransform {
        r: tj::tjregion {
            x: 0,
            y: 0,
            w: 0,
            h: 0,
        },
        op: tj::TJXOP_TJXOP_NONE as i32,
        options,
        data: std::ptr::null_mut(),
        customFilter: None,
    }
}

//! An output tensor of the engine: its shape and type, and its bytes (or the place in the
//! client's batch it was written into).

use sluice_wire::spec::DType;

/// An output image.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Frames of a clip (T×H×W×3, frame after frame); 1 for an image.
    pub frames: u32,
    pub height: u32,
    pub width: u32,
    pub dtype: DType,
    /// Channels first (3×H×W) rather than H×W×3.
    pub chw: bool,
    /// Little-endian elements; empty when they were written into `placed`.
    pub data: Vec<u8>,
    /// The place in the client's batch the tensor was written into, if it was.
    pub placed: Option<u32>,
}

impl Tensor {
    /// Its shape and type, without its bytes.
    pub(crate) fn clone_header(&self) -> Tensor {
        Tensor {
            frames: self.frames,
            height: self.height,
            width: self.width,
            dtype: self.dtype,
            chw: self.chw,
            data: Vec::new(),
            placed: self.placed,
        }
    }
}

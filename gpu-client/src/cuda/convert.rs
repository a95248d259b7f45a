//! What a batch becomes on the GPU: uint8 as the workers made it, or normalized float16/float32
//! in NCHW, converted by a kernel compiled once with NVRTC.

use std::ffi::CString;

use cudarc::driver::{result, sys};

/// The CUDA bindings this module is built on, for callers that drive the device themselves
/// (benchmarks, the Python binding's stream handling).
pub use cudarc;

use super::{call, CudaError};

/// What the uploader hands the training code: raw uint8 as the workers made it, or converted
/// on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Convert {
    /// The batch as it is (uint8, the pipeline's layout).
    None,
    /// `(x / 255 - mean[c]) / std[c]` as f32, NCHW.
    F32 { mean: [f32; 3], std: [f32; 3] },
    /// The same as f16, NCHW.
    F16 { mean: [f32; 3], std: [f32; 3] },
}

impl Convert {
    /// ImageNet's per-channel mean and std (of x / 255), what pretrained models expect.
    pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

    /// The conversion to the element type `dtype` names as numpy and torch spell it (`uint8`,
    /// `float16`, `float32`), or `None` for another name.
    pub fn to_dtype(dtype: &str, mean: [f32; 3], std: [f32; 3]) -> Option<Convert> {
        match dtype {
            "uint8" => Some(Convert::None),
            "float16" => Some(Convert::F16 { mean, std }),
            "float32" => Some(Convert::F32 { mean, std }),
            _ => None,
        }
    }
}

/// Element type of a device batch's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    U8,
    F16,
    F32,
}

impl DType {
    pub fn bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

/// One thread per pixel of one image (`blockIdx.y`): it reads the pixel's channels and writes
/// one value to each channel plane, `x * scale[c] + bias[c]` (scale = 1 / (255 std),
/// bias = -mean / std). 32-bit arithmetic within an image, no division in the loop.
pub(crate) const KERNEL: &str = r#"
extern "C" __global__ void nhwc_u8_to_nchw(
    const unsigned char* src, void* dst, int hw, int c, int half,
    float k0, float k1, float k2, float b0, float b1, float b2)
{
    long long image = blockIdx.y;
    const unsigned char* in = src + image * hw * c;
    long long plane0 = image * c * (long long)hw;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < hw; p += blockDim.x * gridDim.x) {
        for (int ch = 0; ch < c; ++ch) {
            float k = ch == 0 ? k0 : (ch == 1 ? k1 : k2);
            float bias = ch == 0 ? b0 : (ch == 1 ? b1 : b2);
            float v = fmaf((float)in[p * c + ch], k, bias);
            long long o = plane0 + (long long)ch * hw + p;
            if (half) {
                unsigned short bits;
                asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(v));
                ((unsigned short*)dst)[o] = bits;
            } else {
                ((float*)dst)[o] = v;
            }
        }
    }
}
"#;

pub(crate) struct Kernel {
    pub(crate) module: sys::CUmodule,
    pub(crate) function: sys::CUfunction,
}

impl Kernel {
    /// Compiles the conversion kernel with NVRTC (once, at start-up).
    pub(crate) fn compile() -> Result<Kernel, CudaError> {
        let image =
            crate::nvrtc::compile_ptx(KERNEL, "sluice_convert.cu").map_err(CudaError::Nvrtc)?;
        // SAFETY: a NUL-terminated PTX image; the module lives as long as `Kernel`.
        let module = call("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        let name = CString::new("nhwc_u8_to_nchw").map_err(|e| CudaError::Nvrtc(e.to_string()))?;
        // SAFETY: the module was loaded above.
        let function = call("cuModuleGetFunction", unsafe {
            result::module::get_function(module, name)
        })?;
        Ok(Kernel { module, function })
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: loaded in `compile`, unloaded once.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

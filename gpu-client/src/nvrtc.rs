//! NVRTC, loaded at run time to compile the on-device conversion kernel.
//!
//! cudarc's loader (built against CUDA 12) looks for `libnvrtc.so` and `libnvrtc.so.12` and
//! older, but a CUDA 13 runtime installs `libnvrtc.so.13` only, and the toolkit's directory is
//! often off the loader's path. So this module tries every name CUDA has given the library,
//! then the toolkit's usual directories, and `SLUICE_NVRTC` (a path) before all of them.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

type Program = *mut c_void;
type Create = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type Compile = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type Get = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// Sonames, newest first (CUDA 11.2 and later; 11.x named it by major.minor).
const NAMES: &[&str] = &[
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
];

/// Where toolkits put it when the dynamic loader's path does not say.
fn toolkit_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            dirs.push(PathBuf::from(root).join("lib64"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    dirs.push("/usr/local/cuda/targets/sbsa-linux/lib".into());
    dirs
}

/// The library, and where it came from; or every place tried.
fn open() -> Result<(libloading::Library, String), String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    if let Some(p) = std::env::var_os("SLUICE_NVRTC").filter(|v| !v.is_empty()) {
        candidates.push(PathBuf::from(p).display().to_string());
    }
    candidates.extend(NAMES.iter().map(|n| n.to_string()));
    for dir in toolkit_dirs() {
        candidates.extend(NAMES.iter().map(|n| dir.join(n).display().to_string()));
    }
    for c in candidates {
        // SAFETY: loading NVRTC runs only its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(c.as_str()) } {
            Ok(lib) => return Ok((lib, c)),
            Err(_) => tried.push(c),
        }
    }
    Err(format!(
        "libnvrtc could not be loaded (tried {}); install the CUDA toolkit's NVRTC, set \
         SLUICE_NVRTC to its path, or ask for uint8 batches",
        tried.join(", ")
    ))
}

/// `name` from `lib` (a plain function pointer type `T`), or an error naming both.
///
/// # Safety
/// `T` must be the symbol's real signature.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, from: &str, name: &str) -> Result<T, String> {
    // SAFETY: the caller vouches for `T`.
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|_| format!("{from}: no symbol {name}"))
}

/// Compiles CUDA C++ `source` to PTX for the NVRTC's default architecture (PTX, so the driver
/// finishes it for whatever GPU it runs on).
pub(crate) fn compile_ptx(source: &str, name: &str) -> Result<CString, String> {
    let (lib, from) = open()?;
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let name = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: the symbols have the signatures of nvrtc.h (stable since CUDA 7); every buffer
    // passed is as large as NVRTC said, and the program is destroyed once.
    unsafe {
        let create: Create = symbol(&lib, &from, "nvrtcCreateProgram")?;
        let compile: Compile = symbol(&lib, &from, "nvrtcCompileProgram")?;
        let log_size: Size = symbol(&lib, &from, "nvrtcGetProgramLogSize")?;
        let get_log: Get = symbol(&lib, &from, "nvrtcGetProgramLog")?;
        let ptx_size: Size = symbol(&lib, &from, "nvrtcGetPTXSize")?;
        let get_ptx: Get = symbol(&lib, &from, "nvrtcGetPTX")?;
        let destroy: Destroy = symbol(&lib, &from, "nvrtcDestroyProgram")?;
        let error_string: ErrorString = symbol(&lib, &from, "nvrtcGetErrorString")?;
        let describe = |code: c_int| {
            let s = error_string(code);
            match s.is_null() {
                true => format!("NVRTC error {code}"),
                false => CStr::from_ptr(s).to_string_lossy().into_owned(),
            }
        };
        let mut prog: Program = std::ptr::null_mut();
        let r = create(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if r != 0 {
            return Err(format!("nvrtcCreateProgram: {}", describe(r)));
        }
        let result = (|| {
            let r = compile(prog, 0, std::ptr::null());
            if r != 0 {
                let mut n = 0usize;
                let mut log = String::new();
                if log_size(prog, &mut n) == 0 && n > 0 {
                    let mut buf = vec![0u8; n];
                    if get_log(prog, buf.as_mut_ptr().cast()) == 0 {
                        log = String::from_utf8_lossy(&buf)
                            .trim_end_matches('\0')
                            .trim()
                            .to_string();
                    }
                }
                return Err(format!("compiling {}: {}: {log}", from, describe(r)));
            }
            let mut n = 0usize;
            let r = ptx_size(prog, &mut n);
            if r != 0 || n == 0 {
                return Err(format!("nvrtcGetPTXSize: {}", describe(r)));
            }
            let mut buf = vec![0u8; n];
            let r = get_ptx(prog, buf.as_mut_ptr().cast());
            if r != 0 {
                return Err(format!("nvrtcGetPTX: {}", describe(r)));
            }
            // The size counts the terminating NUL.
            buf.truncate(buf.iter().position(|b| *b == 0).unwrap_or(buf.len()));
            CString::new(buf).map_err(|e| e.to_string())
        })();
        destroy(&mut prog);
        result
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_library_names_every_place_tried() {
        // Only where no NVRTC is installed; elsewhere the compile must succeed.
        match super::compile_ptx("extern \"C\" __global__ void k() {}", "k.cu") {
            Ok(ptx) => assert!(ptx.to_string_lossy().contains(".entry k")),
            Err(e) => {
                assert!(e.contains("libnvrtc.so.13"), "{e}");
                assert!(e.contains("SLUICE_NVRTC"), "{e}");
            }
        }
    }
}

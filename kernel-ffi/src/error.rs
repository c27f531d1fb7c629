//! The one error type of the safe API, and `Result` over it.

use cudarc::driver::DriverError;

/// Everything the safe API can refuse or fail at. Validation messages name the
/// offending value and the rule it breaks; every other message says what to do.
///
/// Refusals ([`Invalid`](Error::Invalid), [`Unsupported`](Error::Unsupported),
/// [`MissingKernels`](Error::MissingKernels)) are found before anything is
/// launched; a [`Cuda`](Error::Cuda) error comes from the driver.
///
/// ```
/// use kernel_ffi::tensor::{self, Arg, Desc, Dtype, Layout};
///
/// let desc = Desc::new([1, 2, 16, 80], Layout::Bhsd);
/// let t = |name| Arg { name, dtype: Dtype::F16, desc, len: desc.span() };
/// let e: kernel_ffi::Error = tensor::validate(t("q"), t("k"), t("v"), t("out"), None).unwrap_err().into();
/// assert!(matches!(e, kernel_ffi::Error::Invalid(_)));
/// assert_eq!(
///     e.to_string(),
///     "invalid argument: q head dim is 80; the kernels support head dims [64, 96, 128, 192, 256]"
/// );
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An argument breaks a rule of the launch API (shape, dtype, stride,
    /// buffer size, alignment, scale, a kernel choice no loaded entry has).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// This machine or device cannot run the call: no NVIDIA driver, no such
    /// GPU, an arch the kernel set was not built for, or the Hopper kernel on a
    /// device other than sm_90.
    #[error("unsupported device: {0}")]
    Unsupported(String),
    /// The kernel set is absent, incomplete or lacks an entry the call needs;
    /// the message names the folder and how to build or name one.
    #[error("compiled kernels not found: {0}")]
    MissingKernels(String),
    /// A CUDA driver call failed.
    #[error("CUDA error in {what}: {source}")]
    Cuda {
        /// What was being done, e.g. "copying a tensor to the device".
        what: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
}

impl From<fa_schema::tensor::Invalid> for Error {
    fn from(e: fa_schema::tensor::Invalid) -> Error {
        Error::Invalid(e.0)
    }
}

impl From<crate::kernel_dir::NotFound> for Error {
    fn from(e: crate::kernel_dir::NotFound) -> Error {
        Error::MissingKernels(e.reason().to_string())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches what was being done to a driver error, making it an [`Error::Cuda`].
/// (Not cudarc's `CudaContext`, which the crate root re-exports.)
pub trait CudaContext<T> {
    /// `Err(source)` becomes `Err(Error::Cuda { what, source })`.
    fn cuda(self, what: impl Into<String>) -> Result<T>;
}

impl<T> CudaContext<T> for std::result::Result<T, DriverError> {
    fn cuda(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|source| Error::Cuda { what: what.into(), source })
    }
}

macro_rules! invalid {
    ($($arg:tt)*) => { return Err($crate::error::Error::Invalid(format!($($arg)*))) };
}
pub(crate) use invalid;

#[cfg(test)]
mod tests {
    use super::Error;
    use crate::kernel_dir::{Places, search_for_library};

    #[test]
    fn a_kernel_folder_not_found_says_so_once() {
        let places = Places { cwd: Some("/tmp".into()), ..Places::default() };
        let e: Error = search_for_library(&places, |_| false).unwrap_err().into();
        let msg = e.to_string();
        assert!(msg.starts_with("compiled kernels not found: FA_KERNEL_DIR is not set;"), "{msg}");
        assert_eq!(msg.matches("compiled kernels not found").count(), 1, "{msg}");
    }
}

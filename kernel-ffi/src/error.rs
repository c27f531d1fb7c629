use cudarc::driver::DriverError;

/// Everything the safe API can refuse or fail at. Validation messages name the
/// offending value and the rule it breaks.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("unsupported device: {0}")]
    Unsupported(String),
    #[error("compiled kernels not found: {0}")]
    MissingKernels(String),
    #[error("CUDA error in {what}: {source}")]
    Cuda {
        what: String,
        #[source]
        source: DriverError,
    },
}

impl From<fa_schema::tensor::Invalid> for Error {
    fn from(e: fa_schema::tensor::Invalid) -> Error {
        Error::Invalid(e.0)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches what was being done to a driver error.
pub trait CudaContext<T> {
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

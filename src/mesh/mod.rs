/// `eprintln!` for the mesh's progress lines on stderr: what came from the bus in them (ids,
/// refusal reasons quoting a message's fields, file names) is shown with its control
/// characters spelled out, so a message cannot forge or hide a line of the terminal. (In
/// scope for the submodules below by being defined before them.)
macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::text::safe_text(&format!($($arg)*)))
    };
}

pub mod approve;
pub mod consensus;
pub mod messages;
pub mod propose;
pub mod serve;
pub mod steward;
pub mod transport;
pub mod wire;

use messages::MeshError;

/// Runs one of the mesh's futures to its end on a runtime of its own (current thread): the
/// blocking entry points the CLI calls.
pub(crate) fn block_on<T>(
    fut: impl std::future::Future<Output = Result<T, MeshError>>,
) -> Result<T, MeshError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| MeshError::Internal(format!("cannot start the async runtime: {e}")))?
        .block_on(fut)
}
